// Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", SC 2021, section 2.2): rank r holds chunks r, p+r, 2p+r, ... of
// the v·p virtual stages. Forwards go through micro-batches in groups of p, chunk by chunk (the
// k-th forward of a rank is micro-batch (k / vp)·p + k mod p on chunk (k / p) mod v), backwards
// the same with the chunks reversed; the warm-up is long enough, (p-r-1)·2 + (v-1)·p, that the
// steady state never waits on a backward, and each chunk costs 1/v of a stage, which is what
// shrinks the bubble by v.
#include "parallel/pipeline_schedule.h"

#include <algorithm>

namespace atl::parallel {

PipeSchedule make_interleaved_1f1b(int p, int m, int v) {
  ATOLL_CHECK(m % p == 0,
              "parallel.pp_schedule = 'interleaved' takes micro-batches in groups of the {} stages: train.grad_accum "
              "= {} must be a multiple of parallel.pp = {}",
              p, m, p);
  PipeSchedule s{"interleaved", p, m, v, false, {}};
  s.ranks.resize(size_t(p));
  const int total = m * v;
  auto at = [&](int k, bool fwd) {
    int group = k / (p * v), in_group = k % (p * v);
    int chunk = in_group / p;
    return PipeAction{fwd ? PipeOp::forward : PipeOp::backward, group * p + in_group % p, fwd ? chunk : v - 1 - chunk};
  };
  for (int r = 0; r < p; ++r) {
    auto& l = s.ranks[size_t(r)];
    int warmup = m == p ? total : std::min(total, (p - r - 1) * 2 + (v - 1) * p);
    int f = 0, b = 0;
    for (; f < warmup; ++f) l.push_back(at(f, true));
    for (; f < total; ++f, ++b) {
      l.push_back(at(f, true));
      l.push_back(at(b, false));
    }
    for (; b < total; ++b) l.push_back(at(b, false));
  }
  return s;
}

}  // namespace atl::parallel
