// The operations and their order follow attention_forward.cpp (FlashAttention's online softmax,
// Dao et al. 2022): scores q·k summed over the head dim in order, then scaled; keys in blocks of
// 64 with the running maximum's rescaling; the output accumulated in key order and divided by the
// sum at the end. A cached query's result thus matches the training kernel's on the same inputs
// up to the rounding of those inputs, which keeps cached and recomputed generation in step.
#include "kernels/cpu/attention_cached.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

void attention_cached_forward(float* out, const float* qkv, const CachedAttentionSpan* spans, int64_t nspans,
                              int64_t H, int64_t KV, int64_t hd) {
  using detail::exp_approx;
  ATOLL_CHECK(KV > 0 && H % KV == 0, "cached attention: {} query heads are not a multiple of {} kv heads", H, KV);
  constexpr int64_t BL = 64;
  const int64_t W = KV * hd, S = H * hd + 2 * W, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));

  // One task per (query, head): decoding has few queries, a prefill many; either way enough tasks.
  std::vector<std::pair<int64_t, int64_t>> q;  // (span, t)
  int64_t work = 0;
  for (int64_t i = 0; i < nspans; ++i) {
    for (int64_t t = 0; t < spans[i].count; ++t) q.emplace_back(i, t);
    work += spans[i].count * (spans[i].start + spans[i].count) * H * hd;
  }
  const int64_t ntask = int64_t(q.size()) * H;

#pragma omp parallel if(parallel : work >= detail::kMinParallelWork)
  {
    float* sc = detail::scratch<float, 0>(size_t(BL + hd));
    float* o = sc + BL;
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < ntask; ++task) {
      const CachedAttentionSpan& s = spans[q[size_t(task / H)].first];
      const int64_t t = q[size_t(task / H)].second, h = task % H, g = h / rep;
      const int64_t p = s.start + t;  // this query's position: it sees keys 0..p
      const float* qv = qkv + (s.first + t) * S + h * hd;
      const float* K = s.k + g * hd;
      const float* V = s.v + g * hd;
      float m = -INFINITY, l = 0.0f;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j0 = 0; j0 <= p; j0 += BL) {
        const int64_t nk = std::min(BL, p + 1 - j0);
        float mblk = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) {
          const float* k = K + (j0 + j) * W;
          float acc = 0.0f;
          for (int64_t d = 0; d < hd; ++d) acc += qv[d] * k[d];
          sc[j] = acc * scale;
          mblk = std::max(mblk, sc[j]);
        }
        const float mnew = std::max(m, mblk);
        const float alpha = exp_approx(m - mnew);
        m = mnew;
        l *= alpha;
        for (int64_t j = 0; j < nk; ++j) {
          sc[j] = exp_approx(sc[j] - m);
          l += sc[j];
        }
        for (int64_t e = 0; e < hd; ++e) o[e] *= alpha;
        for (int64_t j = 0; j < nk; ++j) {
          const float pj = sc[j];
          const float* v = V + (j0 + j) * W;
#pragma omp simd
          for (int64_t e = 0; e < hd; ++e) o[e] += pj * v[e];
        }
      }
      const float inv = 1.0f / l;
      float* dst = out + (s.first + t) * H * hd + h * hd;
      for (int64_t e = 0; e < hd; ++e) dst[e] = o[e] * inv;
    }
  }
}

}  // namespace atl::cpu
