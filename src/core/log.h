// Logging: one line per event, prefixed with the rank when running distributed.
#pragma once
#include <fmt/format.h>
#include <string>

namespace atl::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

void set_level(Level l);
Level level();
void set_rank(int rank);  // -1 (default): no prefix
void write(Level l, const std::string& msg);

template <typename... A> void debug(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void info(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void warn(fmt::format_string<A...> f, A&&... a) {
  if (level() <= Level::warn) write(Level::warn, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A> void error(fmt::format_string<A...> f, A&&... a) {
  write(Level::error, fmt::format(f, std::forward<A>(a)...));
}

}  // namespace atl::log
