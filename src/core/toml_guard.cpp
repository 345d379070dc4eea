// The screen of toml_guard.h: a small lexer that knows comments and the four kinds of TOML strings.
#include "core/toml_guard.h"

#include <fmt/format.h>

#include <cstdint>

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

}  // namespace

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
        if (c == '\\') i += 2;  // an escape never ends the string
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
          // toml++ tests the character after the backslash for whitespace and, after a
          // line-ending backslash, every character up to the next one that is not.
          size_t j = i + 1;
          if (j < t.size() && uint8_t(t[j]) >= 0x80) {
            size_t len;
            uint32_t cp = code_point(t, j, &len);
            if (hits_toml_bug(cp))
              return fmt::format("{}: U+{:04X} after a backslash is not an escape", where(j), cp);
          }
          bool line_end = false;
          while (j < t.size() && (t[j] == ' ' || t[j] == '\t' || t[j] == '\n' || t[j] == '\r')) {
            if (t[j] == '\n') {
              line_end = true;
              ++line;
              line_start = j + 1;
            }
            ++j;
          }
          if (line_end && j < t.size() && uint8_t(t[j]) >= 0x80) {
            size_t len;
            uint32_t cp = code_point(t, j, &len);
            if (hits_toml_bug(cp))
              return fmt::format(
                  "{}: U+{:04X} right after a line-ending backslash, which this build's toml++ "
                  "(3.3.0) cannot parse safely; write it as \\u{:04X} or move it after another "
                  "character",
                  where(j), cp, cp);
          }
          i = j > i + 1 ? j : i + 2;
        } else {
          ++i;
        }
        break;
    }
  }
  return "";
}

}  // namespace atl
