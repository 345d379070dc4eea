#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace atl {

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (path.empty()) return;
  auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  (void)append;
  f_ = std::fopen(path.c_str(), "a+");
  ATOLL_CHECK(f_ != nullptr, "cannot open metrics file '{}': {}", path, std::strerror(errno));
  // A kill in the middle of a line leaves it unterminated: end it, so the next record starts clean.
  if (std::fseek(f_, 0, SEEK_END) == 0 && std::ftell(f_) > 0 && std::fseek(f_, -1, SEEK_END) == 0 &&
      std::fgetc(f_) != '\n') {
    std::fseek(f_, 0, SEEK_END);
    std::fputc('\n', f_);
  }
  std::fseek(f_, 0, SEEK_END);
}

void MetricsLog::begin_segment(int64_t start_step, int64_t end_step, const std::string& resumed_from,
                               int restart_count) {
  nlohmann::json seg = {{"start_step", start_step},
                        {"end_step", end_step},
                        {"resumed_from", resumed_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(resumed_from)}};
  if (restart_count > 0) seg["restart_count"] = restart_count;  // issue 14: `atoll launch --max-restarts`
  write({{"segment", seg}});
}

std::vector<nlohmann::json> read_metrics(const std::string& path, int* skipped) {
  std::vector<nlohmann::json> out;
  int skip = 0;
  FILE* f = std::fopen(path.c_str(), "r");
  ATOLL_CHECK(f != nullptr, "cannot open metrics file '{}': {}", path, std::strerror(errno));
  std::string line;
  char buf[8192];
  auto take = [&](const std::string& l) {
    if (l.empty()) return;
    nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      ++skip;
      return;
    }
    if (j.contains("segment")) {
      int64_t s = j["segment"].value("start_step", int64_t(0));
      while (!out.empty() && out.back()["step"].get<int64_t>() > s) {
        out.pop_back();
        ++skip;
      }
      return;
    }
    if (!j.contains("step") || !j["step"].is_number_integer()) {
      ++skip;
      return;
    }
    out.push_back(std::move(j));
  };
  while (std::fgets(buf, sizeof buf, f)) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      take(line);
      line.clear();
    }
  }
  take(line);
  std::fclose(f);
  if (skipped) *skipped = skip;
  return out;
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
