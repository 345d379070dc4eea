#include "core/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "core/error.h"
#include "core/toml_guard.h"

namespace atl {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t bd = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < bd) { bd = d; best = c; }
  }
  return best;
}

struct Config::Impl {
  toml::table table;
  std::string source = "<none>";
  std::map<std::string, std::string> override_keys;  // key -> raw text, from the command line
  std::set<std::string> known;

  const toml::node* find(const std::string& key) const {
    toml::node_view<const toml::node> v = table.at_path(key);
    return v.node();
  }
  std::string where(const std::string& key) const {
    if (override_keys.count(key)) return "command line (--" + key + ")";
    const toml::node* n = find(key);
    if (!n) return "";
    const auto& s = n->source();
    if (s.begin.line == 0) return source;
    return fmt::format("{}:{}", source, s.begin.line);
  }
  [[noreturn]] void type_error(const std::string& key, const char* want, const toml::node* n) const {
    std::string got = n->is_string() ? "a string" : n->is_integer() ? "an integer"
                    : n->is_floating_point() ? "a float" : n->is_boolean() ? "a boolean"
                    : n->is_array() ? "an array" : n->is_table() ? "a table" : "another type";
    fail("config {}: key '{}' expects {}, got {}", where(key), key, want, got);
  }
  void leaves(const toml::table& t, const std::string& prefix, std::vector<std::string>& out) const {
    for (auto&& [k, v] : t) {
      std::string full = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (auto* sub = v.as_table()) leaves(*sub, full, out);
      else out.push_back(full);
    }
  }
};

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::~Config() = default;
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;

Config Config::parse(const std::string& text, const std::string& source_name) {
  Config c;
  c.impl_->source = source_name;
  if (std::string bad = toml_guard(text); !bad.empty()) fail("config {}:{}", source_name, bad);
  std::string masked = text;
  if (std::string bad = toml_mask(masked); !bad.empty()) fail("config {}: {}", source_name, bad);
  try {
    c.impl_->table = toml::parse(masked, source_name);
    toml_unmask(c.impl_->table);
  } catch (const toml::parse_error& e) {
    fail("config {}:{}:{}: {}", source_name, e.source().begin.line, e.source().begin.column,
         std::string(e.description()));
  }
  return c;
}

Config Config::load(const std::string& path) {
  std::error_code ec;
  // A directory opens as a stream on Linux and reads as empty: it must not pass for a config.
  ATOLL_CHECK(!std::filesystem::is_directory(path, ec),
              "config '{}' is a directory, not a TOML file; give the path of a .toml file (e.g. "
              "configs/default.toml)",
              path);
  std::ifstream in(path);
  ATOLL_CHECK(in.good(), "config file '{}' cannot be opened", path);
  std::stringstream ss;
  ss << in.rdbuf();
  Config c = parse(ss.str(), path);
  // An empty file (or one of comments only) would run everything on defaults, for training the
  // 124M model: a truncated or wrong file is far likelier than that wish.
  ATOLL_CHECK(!c.impl_->table.empty(),
              "config '{}' is empty (it sets no key), so every default would apply; give a "
              "config that sets at least one key (e.g. configs/default.toml)",
              path);
  return c;
}

void Config::set_override(const std::string& assignment) {
  auto eq = assignment.find('=');
  ATOLL_CHECK(eq != std::string::npos && eq > 0, "override '{}' must look like key=value", assignment);
  std::string key = assignment.substr(0, eq), val = assignment.substr(eq + 1);
  while (key.rfind("-", 0) == 0) key.erase(0, 1);
  toml::table parsed;
  try {
    std::string text = "v = " + val;
    if (!toml_guard(text).empty() || !toml_mask(text).empty()) throw std::invalid_argument("not TOML");
    parsed = toml::parse(text);
    toml_unmask(parsed);
  } catch (const std::exception&) {  // toml::parse_error, or refused by toml_guard
    parsed = toml::table{{"v", val}};  // bare words are strings
  }
  // Walk/create the parent tables, then set the leaf.
  toml::table* t = &impl_->table;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    if (dot == std::string::npos) break;
    std::string part = key.substr(start, dot - start);
    auto* node = t->get(part);
    if (!node) {
      t->insert(part, toml::table{});
      node = t->get(part);
    }
    ATOLL_CHECK(node->is_table(), "override '{}': '{}' is not a section", assignment, part);
    t = node->as_table();
    start = dot + 1;
  }
  t->insert_or_assign(key.substr(start), *parsed.get("v"));
  impl_->override_keys[key] = val;
}

bool Config::has(const std::string& key) const { return impl_->find(key) != nullptr; }
std::string Config::where(const std::string& key) const { return impl_->where(key); }
const std::string& Config::source() const { return impl_->source; }

std::string Config::canonical(const std::vector<std::string>& except) const {
  toml::table t = impl_->table;
  for (const std::string& key : except) {
    const size_t dot = key.rfind('.');
    toml::table* parent = &t;
    if (dot != std::string::npos) {
      toml::node* n = t.at_path(key.substr(0, dot)).node();
      parent = n ? n->as_table() : nullptr;
    }
    if (parent) parent->erase(dot == std::string::npos ? key : key.substr(dot + 1));
  }
  std::ostringstream os;
  os << t;
  return os.str();
}
void Config::accept(const std::string& key) { impl_->known.insert(key); }

int64_t Config::get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  if (!n->is_integer()) impl_->type_error(key, "an integer", n);
  int64_t v = n->as_integer()->get();
  ATOLL_CHECK(v >= lo && v <= hi, "config {}: key '{}' = {} is out of range [{}, {}]", where(key), key,
              v, lo, hi);
  return v;
}

double Config::get_float(const std::string& key, double def, double lo, double hi) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  double v;
  if (n->is_floating_point()) v = n->as_floating_point()->get();
  else if (n->is_integer()) v = double(n->as_integer()->get());
  else impl_->type_error(key, "a number", n);
  ATOLL_CHECK(v >= lo && v <= hi, "config {}: key '{}' = {} is out of range [{}, {}]", where(key), key,
              v, lo, hi);
  return v;
}

bool Config::get_bool(const std::string& key, bool def) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  if (!n->is_boolean()) impl_->type_error(key, "a boolean (true/false)", n);
  return n->as_boolean()->get();
}

std::string Config::get_string(const std::string& key, const std::string& def,
                               const std::vector<std::string>& allowed) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  if (!n->is_string()) impl_->type_error(key, "a string", n);
  std::string v = n->as_string()->get();
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string list;
    for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail("config {}: key '{}' = '{}' is not one of [{}]; did you mean '{}'?", where(key), key, v, list,
         nearest(v, allowed));
  }
  return v;
}

std::vector<double> Config::get_float_list(const std::string& key, const std::vector<double>& def) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  if (!n->is_array()) impl_->type_error(key, "an array of numbers", n);
  std::vector<double> out;
  for (auto& e : *n->as_array()) {
    if (e.is_floating_point()) out.push_back(e.as_floating_point()->get());
    else if (e.is_integer()) out.push_back(double(e.as_integer()->get()));
    else impl_->type_error(key, "an array of numbers", n);
  }
  return out;
}

std::vector<int64_t> Config::get_int_list(const std::string& key, const std::vector<int64_t>& def) {
  impl_->known.insert(key);
  const toml::node* n = impl_->find(key);
  if (!n) return def;
  if (!n->is_array()) impl_->type_error(key, "an array of integers", n);
  std::vector<int64_t> out;
  for (auto& e : *n->as_array()) {
    if (!e.is_integer()) impl_->type_error(key, "an array of integers", n);
    out.push_back(e.as_integer()->get());
  }
  return out;
}

std::vector<std::string> Config::keys_under(const std::string& prefix) const {
  std::vector<std::string> all, out;
  impl_->leaves(impl_->table, "", all);
  for (auto& k : all)
    if (k.rfind(prefix + ".", 0) == 0) out.push_back(k);
  return out;
}

void Config::finish() const {
  std::vector<std::string> all;
  impl_->leaves(impl_->table, "", all);
  std::vector<std::string> known(impl_->known.begin(), impl_->known.end());
  for (const auto& k : all) {
    if (impl_->known.count(k)) continue;
    fail("config {}: unknown key '{}'; did you mean '{}'?", where(k), k, nearest(k, known));
  }
}

}  // namespace atl
