// Fuzz target: GPT-2 BPE tokenizer files (data/tokenizer_gpt2: encoder.json + vocab.bpe). The input
// is encoder.json, a NUL byte, then vocab.bpe (JSON text never holds a raw NUL). A vocabulary that
// loads must build a tokenizer or refuse, and then decode(encode(text)) == text for any text.
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/tokenizer_gpt2.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view enc = in.substr(0, nul);
  const std::string_view bpe = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  try {
    atl::Gpt2BpeTokenizer tok(atl::parse_gpt2_bpe(enc, bpe, "fuzz/encoder.json", "fuzz/vocab.bpe"));
    for (std::string_view text : {std::string_view("Hello world, it's 2024!\n  \xF0\x9F\x99\x82 caf\xC3\xA9"),
                                  bpe.substr(0, 256)}) {
      std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids) ATOLL_FUZZ_ASSERT(id >= 0 && id < tok.vocab_size() && id != tok.eot());
      ATOLL_FUZZ_ASSERT(tok.decode(ids) == text);
    }
  } catch (const atl::Error&) {
  }
  return 0;
}
