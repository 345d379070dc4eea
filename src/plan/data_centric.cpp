#include "plan/data_centric.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "plan/predict.h"

namespace atl::plan {

std::string DcpChoice::describe() const {
  return fmt::format("cp {} x dp {}, {} micro-batch{} of {} x {} tokens, recompute {} ({:.3g} s predicted)", cp, dp,
                     accum, accum == 1 ? "" : "es", micro_batch, seq, recompute, step_s);
}

DcpChoice predict_config(const DcpJob& job, const std::vector<int64_t>& lengths, int64_t cp, int64_t accum,
                         const std::string& recompute) {
  ATOLL_CHECK(!lengths.empty(), "data-centric parallel: an empty batch");
  ATOLL_CHECK(cp >= 1 && job.world % cp == 0, "data-centric parallel: cp = {} does not divide {} ranks", cp, job.world);
  const int64_t n = int64_t(lengths.size()), longest = *std::max_element(lengths.begin(), lengths.end());
  DcpChoice c;
  c.cp = cp, c.dp = job.world / cp, c.accum = accum, c.recompute = recompute;
  const int64_t per_rank = (n + c.dp - 1) / c.dp;  // sequences each dp group takes (padded)
  c.micro_batch = std::max<int64_t>(1, (per_rank + accum - 1) / accum);
  c.seq = (longest + cp - 1) / cp * cp;
  ModelSpec m = job.model;
  m.seq = c.seq;
  Layout l;
  l.dp = c.dp, l.cp = cp, l.zero = job.zero;
  l.micro_batch = c.micro_batch;
  l.global_batch = c.micro_batch * accum * c.dp;
  l.recompute = recompute;
  l.precision = job.precision;
  Prediction p = predict(m, job.cluster, l);
  c.step_s = p.step;
  c.memory_bytes = p.memory.total;
  c.fits = !p.memory.oom;
  return c;
}

std::vector<DcpChoice> dcp_candidates(const DcpJob& job, const std::vector<int64_t>& lengths) {
  std::vector<DcpChoice> out;
  for (int64_t cp = 1; cp <= job.world; cp *= 2) {
    if (job.world % cp) continue;
    const int64_t per_rank = (int64_t(lengths.size()) + job.world / cp - 1) / (job.world / cp);
    for (int64_t accum = 1; accum <= std::min(job.max_accum, per_rank); accum *= 2)
      for (const std::string& rc : job.recompute) out.push_back(predict_config(job, lengths, cp, accum, rc));
  }
  return out;
}

namespace {
bool better(const DcpChoice& a, const DcpChoice& b) {
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  if (a.cp != b.cp) return a.cp < b.cp;
  return a.accum < b.accum;
}
}  // namespace

DcpChoice choose_dcp(const DcpJob& job, const std::vector<int64_t>& lengths) {
  const DcpChoice* best = nullptr;
  auto c = dcp_candidates(job, lengths);
  for (const DcpChoice& x : c)
    if (x.fits && (!best || better(x, *best))) best = &x;
  ATOLL_CHECK(best, "data-centric parallel: no configuration fits a batch of {} sequences (longest {}) on {} ranks",
              lengths.size(), *std::max_element(lengths.begin(), lengths.end()), job.world);
  return *best;
}

DcpChoice best_static(const DcpJob& job, const std::vector<std::vector<int64_t>>& batches, double* total_s) {
  ATOLL_CHECK(!batches.empty(), "data-centric parallel: no batches");
  // A static configuration fixes cp, the accumulation split and recompute for every batch; the
  // best is the one that fits every batch with the least total predicted time.
  DcpChoice best;
  double best_t = std::numeric_limits<double>::infinity();
  for (int64_t cp = 1; cp <= job.world; cp *= 2) {
    if (job.world % cp) continue;
    for (int64_t accum = 1; accum <= job.max_accum; accum *= 2)
      for (const std::string& rc : job.recompute) {
        double t = 0;
        bool fits = true;
        DcpChoice first;
        for (size_t b = 0; b < batches.size() && fits; ++b) {
          DcpChoice c = predict_config(job, batches[b], cp, accum, rc);
          fits = c.fits;
          t += c.step_s;
          if (b == 0) first = c;
        }
        if (fits && t < best_t) best_t = t, best = first;
      }
  }
  ATOLL_CHECK(std::isfinite(best_t), "data-centric parallel: no static configuration fits every batch");
  if (total_s) *total_s = best_t;
  return best;
}

}  // namespace atl::plan
