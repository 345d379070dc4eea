// toml_guard.h: a small lexer that knows comments and the four kinds of TOML strings, and the
// masking of the code points toml++ 3.3.0 cannot classify.
#include "core/toml_guard.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace atl {

namespace {

// The code points for which toml++ 3.3.0's is_non_ascii_horizontal_whitespace() falls to its
// unreachable default: its 0x3FA-wide blocks 0, 11 and 63 over [U+00A0, U+FEFF], less the three
// spaces it tests before the switch.
bool hits_toml_bug(uint32_t c) {
  if (c < 0xA0 || c > 0xFEFF || c == 0xA0 || c == 0x3000 || c == 0xFEFF) return false;
  const uint32_t block = (c - 0xA0) / 0x3FA;
  return block == 0 || block == 11 || block == 63;
}

// The affected code points in order; the k-th is masked as U+E000 + k (the Private Use Area's
// U+E000-U+F8FF lies in blocks the classifier handles).
const std::vector<uint32_t>& affected() {
  static const std::vector<uint32_t> v = [] {
    std::vector<uint32_t> a;
    for (uint32_t c = 0xA0; c <= 0xFEFF; ++c)
      if (hits_toml_bug(c)) a.push_back(c);
    return a;
  }();
  return v;
}
constexpr uint32_t kMaskBase = 0xE000;

void append_utf8(std::string* s, uint32_t cp) {
  if (cp < 0x80) {
    *s += char(cp);
  } else if (cp < 0x800) {
    *s += char(0xC0 | (cp >> 6));
    *s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *s += char(0xE0 | (cp >> 12));
    *s += char(0x80 | ((cp >> 6) & 0x3F));
    *s += char(0x80 | (cp & 0x3F));
  } else {
    *s += char(0xF0 | (cp >> 18));
    *s += char(0x80 | ((cp >> 12) & 0x3F));
    *s += char(0x80 | ((cp >> 6) & 0x3F));
    *s += char(0x80 | (cp & 0x3F));
  }
}

// The code point at text[i] (0 for invalid UTF-8, left to toml++ to refuse); *len its bytes.
uint32_t code_point(std::string_view t, size_t i, size_t* len) {
  const uint8_t c = uint8_t(t[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  *len = 1;
  if (n == 0 || i + n > t.size()) return 0;
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (size_t k = 1; k < n; ++k) {
    if ((uint8_t(t[i + k]) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (uint8_t(t[i + k]) & 0x3F);
  }
  *len = n;
  return cp;
}

// Rewrites s, mapping each code point through f (which returns it unchanged, or its image).
template <class F>
std::string remap(std::string_view s, F f) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = uint8_t(s[i]) < 0x80 ? uint8_t(s[i]) : code_point(s, i, &len);
    if (uint8_t(s[i]) < 0x80) len = 1;
    uint32_t to = cp ? f(cp) : 0;
    if (to && to != cp) append_utf8(&out, to);
    else out.append(s.substr(i, len));
    i += len;
  }
  return out;
}

}  // namespace

std::string toml_mask(std::string& text) {
  static const std::unordered_map<uint32_t, uint32_t> to_mask = [] {
    std::unordered_map<uint32_t, uint32_t> m;
    for (size_t k = 0; k < affected().size(); ++k) m[affected()[k]] = kMaskBase + uint32_t(k);
    return m;
  }();
  const uint32_t end = kMaskBase + uint32_t(affected().size());
  std::string bad;
  std::string out = remap(text, [&](uint32_t c) -> uint32_t {
    if (c >= kMaskBase && c < end && bad.empty()) bad = fmt::format("U+{:04X}", c);
    auto it = to_mask.find(c);
    return it == to_mask.end() ? c : it->second;
  });
  if (!bad.empty())
    return "it holds the private-use character " + bad +
           ", which atoll's TOML reader reserves (see core/toml_guard.h)";
  text.swap(out);
  return "";
}

std::string toml_unmask(std::string_view s) {
  const uint32_t end = kMaskBase + uint32_t(affected().size());
  return remap(s, [&](uint32_t c) { return c >= kMaskBase && c < end ? affected()[c - kMaskBase] : c; });
}

static bool has_mask(std::string_view s) {
  for (size_t i = 0; i + 2 < s.size(); ++i)
    if (uint8_t(s[i]) == 0xEE || uint8_t(s[i]) == 0xEF) return true;  // U+E000-U+FFFF lead bytes
  return false;
}

static void unmask_node(toml::node& n) {
  if (auto* t = n.as_table()) {
    toml_unmask(*t);
  } else if (auto* a = n.as_array()) {
    for (auto& e : *a) unmask_node(e);
  } else if (auto* v = n.as_string()) {
    if (has_mask(v->get())) *v = toml_unmask(v->get());
  }
}

void toml_unmask(toml::table& t) {
  bool keys = false;
  for (auto&& [k, v] : t) {
    unmask_node(v);
    keys = keys || has_mask(k.str());
  }
  if (!keys) return;
  toml::table out;  // keys cannot be renamed in place; the nodes move, keeping their source lines
  for (auto&& [k, v] : t) out.insert(toml_unmask(k.str()), std::move(v));
  t = std::move(out);
}

std::string toml_guard(std::string_view t) {
  enum { normal, comment, basic, literal, ml_basic, ml_literal } state = normal;
  size_t line = 1, line_start = 0;
  auto where = [&](size_t i) { return fmt::format("{}:{}", line, i - line_start + 1); };
  auto starts = [&](size_t i, std::string_view s) { return t.substr(i, s.size()) == s; };
  for (size_t i = 0; i < t.size();) {
    const char c = t[i];
    if (c == '\n') {
      ++line;
      line_start = i + 1;
      if (state == comment || state == basic || state == literal) state = normal;
      ++i;
      continue;
    }
    switch (state) {
      case normal:
        if (uint8_t(c) >= 0x80) {
          size_t len;
          uint32_t cp = code_point(t, i, &len);
          return fmt::format("{}: a non-ASCII character (U+{:04X}) outside a string or comment; TOML "
                             "allows them only in strings and comments",
                             where(i), cp);
        }
        if (c == '#') state = comment, ++i;
        else if (starts(i, "\"\"\"")) state = ml_basic, i += 3;
        else if (starts(i, "'''")) state = ml_literal, i += 3;
        else if (c == '"') state = basic, ++i;
        else if (c == '\'') state = literal, ++i;
        else ++i;
        break;
      case comment:
        ++i;
        break;
      case basic:
        if (c == '\\') i += i + 1 < t.size() && t[i + 1] == '\n' ? 1 : 2;  // an escape never ends the string
        else if (c == '"') state = normal, ++i;
        else ++i;
        break;
      case literal:
        if (c == '\'') state = normal;
        ++i;
        break;
      case ml_literal:
        if (starts(i, "'''")) {
          i += 3;
          while (i < t.size() && t[i] == '\'') ++i;  // up to two quotes may close with it
          state = normal;
        } else {
          ++i;
        }
        break;
      case ml_basic:
        if (starts(i, "\"\"\"")) {
          i += 3;
          while (i < t.size() && t[i] == '"') ++i;
          state = normal;
        } else if (c == '\\') {
          i += i + 1 < t.size() && t[i + 1] == '\n' ? 1 : 2;  // an escape never ends the string
        } else {
          ++i;
        }
        break;
    }
  }
  return "";
}

}  // namespace atl
