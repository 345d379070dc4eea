// Serving-load traces for workload-aware sync; see load_trace.h.
#include "lowcomm/load_trace.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace atl::lowcomm {

uint64_t SplitMix::next() {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double SplitMix::uniform() { return double(next() >> 11) * 0x1.0p-53; }

LoadTrace LoadTrace::bursty(int64_t steps, const BurstyTraceParams& p) {
  ATOLL_CHECK(steps > 0, "load trace: {} steps", steps);
  SplitMix r{p.seed};
  std::vector<double> v(static_cast<size_t>(steps));
  bool on = false;
  double height = 0;
  for (auto& x : v) {
    if (!on && r.uniform() < p.p_start) {
      on = true;
      // Pareto(alpha) with minimum 1: (1 - u)^(-1/alpha); heavy-tailed for small alpha.
      height = p.burst_scale * std::pow(1.0 - r.uniform(), -1.0 / p.pareto_alpha);
    } else if (on && r.uniform() < p.p_end) {
      on = false;
    }
    double jitter = p.noise * (2 * r.uniform() - 1);
    x = std::clamp(p.base + (on ? height : 0.0) + jitter, 0.0, 1.0);
  }
  return LoadTrace(std::move(v));
}

LoadTrace LoadTrace::read(const std::string& path) {
  std::ifstream f(path);
  ATOLL_CHECK(f, "load trace {}: cannot open it", path);
  std::vector<double> v;
  std::string line;
  int64_t no = 0;
  bool header_ok = true;  // only the first non-comment line may be a header
  while (std::getline(f, line)) {
    ++no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    std::string cell = line.substr(line.rfind(',') == std::string::npos ? 0 : line.rfind(',') + 1);
    cell.erase(0, cell.find_first_not_of(" \t"));
    cell.erase(cell.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    errno = 0;
    double x = std::strtod(cell.c_str(), &end);
    bool numeric = !cell.empty() && end && *end == 0 && errno == 0;
    if (!numeric && header_ok && v.empty() && cell.find_first_of("0123456789") == std::string::npos) {
      header_ok = false;
      continue;
    }
    header_ok = false;
    ATOLL_CHECK(numeric, "load trace {}:{}: '{}' is not a number", path, no, cell);
    ATOLL_CHECK(std::isfinite(x) && x >= 0, "load trace {}:{}: load {} must be finite and >= 0", path, no, x);
    v.push_back(x);
  }
  ATOLL_CHECK(!v.empty(), "load trace {}: no values", path);
  return LoadTrace(std::move(v));
}

double LoadTrace::at(int64_t t) const {
  ATOLL_CHECK(!v_.empty(), "load trace: empty");
  return v_[size_t(((t % size()) + size()) % size())];
}

void LoadTrace::write(const std::string& path) const {
  std::ofstream f(path);
  ATOLL_CHECK(f, "load trace {}: cannot write it", path);
  f.precision(17);
  for (double x : v_) f << x << "\n";
}

}  // namespace atl::lowcomm
