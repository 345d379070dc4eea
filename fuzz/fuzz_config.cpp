// Fuzz target: TOML configs (core/config: toml++ parsing, typed getters, overrides, finish()).
// The first line of the input is also tried as a command-line override "key=value".
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  atl::Config c;
  try {
    c = atl::Config::parse(text, "fuzz.toml");
  } catch (const atl::Error&) {
    return 0;
  }
  const size_t nl = text.find('\n');
  if (nl != std::string::npos) {
    try {
      c.set_override(text.substr(0, nl));
    } catch (const atl::Error&) {
    }
  }
  // Keys of every shape: top level, nested, and the ones the trainer reads.
  const char* keys[] = {"a", "a.b", "a.b.c", "train.steps", "model.preset", "optim.adamw.lr", "x"};
  for (const char* k : keys) {
    try { c.get_int(k, 1, -100, 100); } catch (const atl::Error&) {}
    try { c.get_float(k, 1.0, -1e9, 1e9); } catch (const atl::Error&) {}
    try { c.get_bool(k, false); } catch (const atl::Error&) {}
    try { c.get_string(k, "d", {}); } catch (const atl::Error&) {}
    try { c.get_string(k, "d", {"d", "e"}); } catch (const atl::Error&) {}
    try { c.get_float_list(k, {}); } catch (const atl::Error&) {}
    try { c.get_int_list(k, {}); } catch (const atl::Error&) {}
    (void)c.has(k);
    (void)c.where(k);
    (void)c.keys_under(k);
  }
  try {
    c.finish();
  } catch (const atl::Error&) {
  }
  return 0;
}
