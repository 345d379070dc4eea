// Training telemetry: the live progress line and metrics as JSON lines (one object per event).
//
// metrics.jsonl is one run's whole history: it is only ever appended to. Each invocation first
// writes a segment line, {"segment": {"start_step": S, "end_step": E, "resumed_from": ...}};
// a segment that starts at step S supersedes every earlier line of a step above S (the steps a
// crashed attempt ran past its last checkpoint), which read_metrics drops.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atl {

class MetricsLog {
 public:
  // path empty: no file. Always appends (a new run starts on a file moved aside or absent);
  // `append` is kept for callers and means nothing more.
  MetricsLog(const std::string& path, bool append = true);
  ~MetricsLog();
  void write(const nlohmann::json& record);
  // Marks the start of this invocation's steps (start_step, end_step].
  // restart_count >= 0: the launcher's TORCHELASTIC_RESTART_COUNT, recorded when above 0.
  void begin_segment(int64_t start_step, int64_t end_step, const std::string& resumed_from, int restart_count = 0);

 private:
  FILE* f_ = nullptr;
};

// The step records of a metrics.jsonl in step order, without segment lines, superseded lines, or a
// line torn by a crash; `skipped` (optional) counts the lines left out.
std::vector<nlohmann::json> read_metrics(const std::string& path, int* skipped = nullptr);

struct Progress {
  int64_t step, total_steps;
  double loss, lr, grad_norm, tokens_per_s, mfu, step_ms, eta_s;
};
std::string format_progress(const Progress& p);
std::string format_duration(double seconds);

}  // namespace atl
