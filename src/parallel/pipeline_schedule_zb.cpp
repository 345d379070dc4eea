// ZB-H1 (Qi, Wan, Huang, Lin, "Zero Bubble Pipeline Parallelism", ICLR 2024, section 3.1): 1F1B
// with each backward split into B (input gradient, which the previous stage waits for) and W
// (weight gradient, which nobody waits for). W passes are postponed into the time 1F1B spends
// idle, so the bubble shrinks from (p-1)(F+B+W) to (p-1)(F+B-W): a third when the three cost
// the same. Built by list scheduling with unit costs: at each step a rank runs the next B if it
// can, else its next F if it has fewer than p-r forwards awaiting their B (1F1B's activation
// bound), else its oldest postponed W; rank r postpones at most r+1 W passes (it runs a W before
// the next B when it holds that many), which keeps the memory of pending W inputs bounded and
// lands the W passes in the cool-down, as the paper's handcrafted schedule does.
#include "parallel/pipeline_schedule.h"

#include <deque>
#include <map>

namespace atl::parallel {

PipeSchedule make_zb_h1(int p, int m, int) {
  PipeSchedule s{"zb-h1", p, m, 1, true, {}};
  s.ranks.resize(size_t(p));
  std::map<std::pair<int, int>, int> f_end, b_end;  // (mb, rank) -> unit step at which it finished
  std::vector<int> next_f(size_t(p), 0), next_b(size_t(p), 0);
  std::vector<std::deque<int>> pending_w(static_cast<size_t>(p));
  auto finished = [](const std::map<std::pair<int, int>, int>& e, int mb, int r, int t) {
    auto it = e.find({mb, r});
    return it != e.end() && it->second <= t;
  };
  size_t left = size_t(3 * m * p);
  for (int t = 0; left > 0; ++t) {
    ATOLL_CHECK(t < 8 * (m + p) * 3, "zb-h1: the list scheduler made no progress (pp = {}, m = {})", p, m);
    for (int r = 0; r < p; ++r) {
      auto& l = s.ranks[size_t(r)];
      const int b = next_b[size_t(r)], f = next_f[size_t(r)];
      bool can_b = int(pending_w[size_t(r)].size()) < r + 1 && b < m && finished(f_end, b, r, t) &&
                   (r == p - 1 || finished(b_end, b, r + 1, t));
      bool can_f = f < m && f - b < p - r && (r == 0 || finished(f_end, f, r - 1, t));
      if (can_b) {
        l.push_back({PipeOp::backward, b, 0});
        b_end[{b, r}] = t + 1;
        pending_w[size_t(r)].push_back(b);
        ++next_b[size_t(r)];
      } else if (can_f) {
        l.push_back({PipeOp::forward, f, 0});
        f_end[{f, r}] = t + 1;
        ++next_f[size_t(r)];
      } else if (!pending_w[size_t(r)].empty()) {
        l.push_back({PipeOp::weight, pending_w[size_t(r)].front(), 0});
        pending_w[size_t(r)].pop_front();
      } else {
        continue;
      }
      --left;
    }
  }
  return s;
}

}  // namespace atl::parallel
