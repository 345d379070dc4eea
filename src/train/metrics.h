// Training telemetry: the live progress line and metrics as JSON lines (one object per event).
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace atl {

class MetricsLog {
 public:
  // path empty: no file. Appends when resuming so one run keeps one history.
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  void write(const nlohmann::json& record);

 private:
  FILE* f_ = nullptr;
};

struct Progress {
  int64_t step, total_steps;
  double loss, lr, grad_norm, tokens_per_s, mfu, step_ms, eta_s;
};
std::string format_progress(const Progress& p);
std::string format_duration(double seconds);

}  // namespace atl
