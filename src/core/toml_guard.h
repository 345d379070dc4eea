// A screen run on TOML text before toml++ parses it. Debian's toml++ 3.3.0 reaches
// __builtin_unreachable() (undefined behaviour) in is_non_ascii_horizontal_whitespace() for some
// non-ASCII code points where it tests for whitespace (toml++ issues #190 and #295; fixed upstream
// after 3.3.0). Found by fuzz/fuzz_config.cpp. It tests there only outside strings and comments,
// where TOML allows no non-ASCII character at all, and in a multi-line basic string right after a
// backslash; this screen refuses those inputs first, with the line and column.
#pragma once
#include <string>
#include <string_view>

namespace atl {

// Empty when toml++ may parse text; otherwise "LINE:COLUMN: why".
std::string toml_guard(std::string_view text);

}  // namespace atl
