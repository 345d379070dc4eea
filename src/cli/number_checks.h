// Validators for the numeric flags of the commands. CLI11's own are not enough: PositiveNumber
// reports its range as two 300-digit doubles, and Range lets NaN through (every comparison with
// NaN is false). These parse the flag's text whole, so "4x", "nan", "inf" and "-1" are refused
// with the flag named (CLI11 prefixes the message with it) and the accepted range said plainly.
#pragma once
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace atl::cli {

// An integer in [lo, hi].
inline CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi)
          return "must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                 ", got '" + s + "'";
        return "";
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

// A finite number above 0 (positive) or at least 0.
inline CLI::Validator finite_number(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        char* end = nullptr;
        double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
        bool ok = !s.empty() && end == s.c_str() + s.size() && std::isfinite(v) &&
                  (allow_zero ? v >= 0 : v > 0);
        if (!ok)
          return std::string("must be a finite number ") + (allow_zero ? "of 0 or more" : "above 0") +
                 ", got '" + s + "'";
        return "";
      },
      allow_zero ? "NUMBER >= 0" : "NUMBER > 0");
}

}  // namespace atl::cli
