// Learning-rate schedule: linear warmup, then cosine decay to min_ratio of the base rate
// (the GPT-2/3 recipe). Returns the multiplier applied to every optimizer group's base rate.
#pragma once
#include <cstdint>
#include <string_view>

namespace atl {

struct LrSchedule {
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  float min_ratio = 0.1f;
  std::string_view kind = "cosine";  // "cosine" or "constant"
  float at(int64_t step) const;  // step is 0-based
};

}  // namespace atl
