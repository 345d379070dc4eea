#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace atl {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return float(step + 1) / float(warmup_steps);
  if (kind == "constant") return 1.f;
  int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
  double progress = std::min(1.0, double(step - warmup_steps) / double(span));
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return float(min_ratio + (1.0 - min_ratio) * cosine);
}

}  // namespace atl
