// Errors: every failure atoll reports is an atl::Error with a message a user can act on.
// The C++ namespace is `atl`: `atoll` is taken by the C library (atoll(3)).
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace atl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace atl

// Checks that stay on in Release: they guard user input and invariants, not hot loops.
#define ATOLL_CHECK(cond, ...)                      \
  do {                                              \
    if (!(cond)) ::atl::fail(__VA_ARGS__);        \
  } while (0)
