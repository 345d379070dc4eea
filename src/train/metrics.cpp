#include "train/metrics.h"

#include <filesystem>

#include "core/error.h"

namespace atl {

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (path.empty()) return;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  ATOLL_CHECK(f_ != nullptr, "cannot open metrics file '{}'", path);
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!f_) return;
  std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  int64_t t = int64_t(s + 0.5);
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, (t / 60) % 60, t % 60);
}

std::string format_progress(const Progress& p) {
  auto tok = p.tokens_per_s >= 1e6 ? fmt::format("{:.2f}M", p.tokens_per_s / 1e6)
                                   : fmt::format("{:.1f}k", p.tokens_per_s / 1e3);
  return fmt::format("step {:>5}/{} | loss {:.4f} | lr x{:.3f} | norm {:.3f} | {} tok/s | MFU {:.1f}% | {:.0f} ms | ETA {}",
                     p.step, p.total_steps, p.loss, p.lr, p.grad_norm, tok, 100.0 * p.mfu, p.step_ms,
                     format_duration(p.eta_s));
}

}  // namespace atl
