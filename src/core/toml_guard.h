// Protection of toml++ from its own undefined behaviour. Debian's toml++ 3.3.0 reaches
// __builtin_unreachable() in is_non_ascii_horizontal_whitespace() for about 2900 non-ASCII code
// points (in U+00A1-U+0499, U+2C6E-U+3067, U+FB86-U+FEFE) wherever it tests a character for
// whitespace: outside strings, after a line-ending backslash, and while scanning ahead to report
// an error (toml++ issues #190 and #295; fixed upstream after 3.3.0). Found by
// fuzz/fuzz_config.cpp. So before toml++ sees a text:
//  - toml_guard refuses a non-ASCII character outside strings and comments, where TOML allows none,
//    with its line and column (the message toml++ would give is garbled by the next step);
//  - toml_mask swaps every affected code point for one of the Private Use Area, which toml++
//    classifies safely, and toml_unmask swaps them back in the parsed strings and keys.
#pragma once
#include <toml++/toml.h>

#include <string>
#include <string_view>

namespace atl {

// Empty when text has no non-ASCII character outside strings and comments; else "LINE:COL: why".
std::string toml_guard(std::string_view text);

// Replaces the affected code points of text; fails (returning the reason) if text already holds
// one of the private-use code points the masking uses.
std::string toml_mask(std::string& text);
// The inverse, on a string and on every string and key of a parsed table.
std::string toml_unmask(std::string_view s);
void toml_unmask(toml::table& t);

}  // namespace atl
