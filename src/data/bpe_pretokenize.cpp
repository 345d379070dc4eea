// GPT-2 pre-tokenization by hand (Radford et al. 2019); see bpe_pretokenize.h for the regex it
// follows and the Unicode approximation.
#include "data/bpe_pretokenize.h"

namespace atl {

namespace {
bool in(uint32_t cp, uint32_t lo, uint32_t hi) {
  return cp >= lo && cp <= hi;
}
}  // namespace

CharClass classify_codepoint(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    if (cp == ' ' || in(cp, 0x09, 0x0D) || in(cp, 0x1C, 0x1F)) return CharClass::space;
    return CharClass::other;
  }
  if (cp >= 0x110000) return CharClass::other;  // an invalid UTF-8 byte
  // Whitespace as Python's \s sees it.
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || in(cp, 0x2000, 0x200A) || cp == 0x2028 ||
      cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return CharClass::space;
  // Latin-1 supplement: exact.
  if (cp < 0x100) {
    if (cp < 0xA0) return CharClass::other;  // C1 controls
    if (cp == 0xAA || cp == 0xB5 || cp == 0xBA) return CharClass::letter;
    if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || in(cp, 0xBC, 0xBE)) return CharClass::number;
    if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return CharClass::other;
    return CharClass::letter;
  }
  // Brahmic scripts (Devanagari .. Malayalam) share one layout per 128-code-point block: signs,
  // nukta, vowel signs and virama are marks (not L), and offsets 0x66-0x6F are the digits.
  if (in(cp, 0x0900, 0x0D7F)) {
    uint32_t o = cp & 0x7F;
    if (in(o, 0x66, 0x6F)) return CharClass::number;
    if (in(o, 0x00, 0x03) || o == 0x3C || in(o, 0x3E, 0x4D) || in(o, 0x51, 0x57) ||
        in(o, 0x62, 0x65))
      return CharClass::other;
    return CharClass::letter;
  }
  // Decimal digits of the common scripts, superscripts/subscripts, number forms, enclosed numbers.
  if (in(cp, 0x0660, 0x0669) || in(cp, 0x06F0, 0x06F9) || in(cp, 0x0966, 0x096F) ||
      in(cp, 0x09E6, 0x09EF) || in(cp, 0x0E50, 0x0E59) || in(cp, 0x2070, 0x2070) ||
      in(cp, 0x2074, 0x2079) || in(cp, 0x2080, 0x2089) || in(cp, 0x2150, 0x2182) ||
      in(cp, 0x2460, 0x249B) || in(cp, 0x24EA, 0x24FF) || in(cp, 0x2776, 0x2793) ||
      in(cp, 0xFF10, 0xFF19) || in(cp, 0x3220, 0x3229) || in(cp, 0x3248, 0x324F) ||
      in(cp, 0x3251, 0x325F) || in(cp, 0x3280, 0x3289) || in(cp, 0x32B1, 0x32BF) ||
      in(cp, 0x10107, 0x10133) || in(cp, 0x1D2E0, 0x1D2F3) || in(cp, 0x1D360, 0x1D378) ||
      in(cp, 0x1D7CE, 0x1D7FF) || in(cp, 0x1FBF0, 0x1FBF9))
    return CharClass::number;
  // Combining marks, punctuation and symbol blocks, private use, emoji: neither L nor N.
  if (in(cp, 0x0300, 0x036F) || in(cp, 0x0483, 0x0489) || in(cp, 0x0591, 0x05C7) ||
      in(cp, 0x0600, 0x060F) || in(cp, 0x064B, 0x065F) || in(cp, 0x0670, 0x0670) ||
      in(cp, 0x2000, 0x2BFF) || in(cp, 0x2E00, 0x2FFF) || in(cp, 0x3001, 0x3004) ||
      in(cp, 0x3008, 0x3020) || in(cp, 0x3200, 0x33FF) || in(cp, 0x10100, 0x1013F) ||
      in(cp, 0x1CF00, 0x1CFCF) || in(cp, 0x1D000, 0x1D24F) || in(cp, 0x1D300, 0x1D35F) ||
      in(cp, 0x1D800, 0x1DAAF) || in(cp, 0x1FB00, 0x1FBFF) || in(cp, 0xD800, 0xF8FF) ||
      in(cp, 0xFE00, 0xFE6F) || in(cp, 0xFEFF, 0xFEFF) || in(cp, 0xFF01, 0xFF0F) ||
      in(cp, 0xFF1A, 0xFF20) || in(cp, 0xFF3B, 0xFF40) || in(cp, 0xFF5B, 0xFF65) ||
      in(cp, 0xFFF0, 0xFFFF) || in(cp, 0x1F000, 0x1FAFF) || in(cp, 0xE0000, 0x10FFFF))
    return CharClass::other;
  return CharClass::letter;
}

uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  auto b = [&](size_t k) { return uint8_t(s[k]); };
  uint8_t c = b(i);
  size_t n = s.size();
  auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if ((c & 0xE0) == 0xC0 && c >= 0xC2 && cont(i + 1)) {
    *len = 2;
    return (uint32_t(c & 0x1F) << 6) | (b(i + 1) & 0x3F);
  }
  if ((c & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
    uint32_t cp = (uint32_t(c & 0x0F) << 12) | (uint32_t(b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    if (cp >= 0x800) {
      *len = 3;
      return cp;
    }
  }
  if ((c & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    uint32_t cp = (uint32_t(c & 0x07) << 18) | (uint32_t(b(i + 1) & 0x3F) << 12) |
                  (uint32_t(b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
    if (cp >= 0x10000 && cp < 0x110000) {
      *len = 4;
      return cp;
    }
  }
  *len = 1;
  return 0x110000 + c;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  // Classify every code point once; runs are then found on the class array.
  std::vector<size_t> start;  // byte offset of each code point, plus text.size() at the end
  std::vector<CharClass> cls;
  start.reserve(text.size() + 1);
  cls.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    size_t len;
    uint32_t cp = decode_utf8(text, i, &len);
    start.push_back(i);
    cls.push_back(classify_codepoint(cp));
    i += len;
  }
  const size_t n = cls.size();
  start.push_back(text.size());
  auto ch = [&](size_t k) { return text[start[k]]; };  // first byte of code point k

  std::vector<std::string_view> out;
  auto emit = [&](size_t a, size_t b) {
    out.push_back(text.substr(start[a], start[b] - start[a]));
  };
  size_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, as in GPT-2)
    if (ch(i) == '\'' && i + 1 < n) {
      char c1 = ch(i + 1), c2 = i + 2 < n ? ch(i + 2) : 0;
      size_t len = 0;
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        len = 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        len = 3;
      if (len) {
        emit(i, i + len);
        i += len;
        continue;
      }
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+
    size_t j = (ch(i) == ' ' && cls[i] == CharClass::space && i + 1 < n) ? i + 1 : i;
    if (cls[j] != CharClass::space) {
      CharClass c = cls[j];
      size_t k = j + 1;
      while (k < n && cls[k] == c) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // \s+(?!\S) | \s+ : a whitespace run leaves its last character to prefix the next word.
    size_t k = i;
    while (k < n && cls[k] == CharClass::space) ++k;
    if (k < n && k - i > 1) k -= 1;
    emit(i, k);
    i = k;
  }
  return out;
}

}  // namespace atl
