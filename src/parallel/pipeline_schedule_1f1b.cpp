// GPipe and 1F1B (pipeline_schedule.h): one chunk per rank.
#include "parallel/pipeline_schedule.h"

#include <algorithm>

namespace atl::parallel {

PipeSchedule make_gpipe(int p, int m, int) {
  PipeSchedule s{"gpipe", p, m, 1, false, {}};
  s.ranks.resize(size_t(p));
  for (auto& l : s.ranks) {
    for (int i = 0; i < m; ++i) l.push_back({PipeOp::forward, i, 0});
    for (int i = 0; i < m; ++i) l.push_back({PipeOp::backward, i, 0});
  }
  return s;
}

PipeSchedule make_1f1b(int p, int m, int) {
  PipeSchedule s{"1f1b", p, m, 1, false, {}};
  s.ranks.resize(size_t(p));
  for (int r = 0; r < p; ++r) {
    auto& l = s.ranks[size_t(r)];
    // Rank r keeps p - r forwards in flight: its warm-up fills the pipeline below it.
    const int warmup = std::min(p - 1 - r, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) l.push_back({PipeOp::forward, f, 0});
    for (; f < m; ++f, ++b) {
      l.push_back({PipeOp::forward, f, 0});
      l.push_back({PipeOp::backward, b, 0});
    }
    for (; b < m; ++b) l.push_back({PipeOp::backward, b, 0});
  }
  return s;
}

}  // namespace atl::parallel
