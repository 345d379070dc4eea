#include "plan/data_centric.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "plan/comm_fit.h"
#include "plan/predict.h"

namespace atl::plan {

std::string DcpChoice::describe() const {
  return fmt::format("cp {} x dp {}, {} micro-batch{} of {} x {} tokens, recompute {} ({:.3g} s predicted)", cp, dp,
                     accum, accum == 1 ? "" : "es", micro_batch, seq, recompute, step_s);
}

std::vector<RowLengths> pack_lengths(const std::vector<int64_t>& docs) {
  std::vector<size_t> order(docs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return docs[a] > docs[b]; });
  int64_t longest = 0;
  for (int64_t d : docs) longest = std::max(longest, d);
  std::vector<RowLengths> rows;
  std::vector<int64_t> used;
  for (size_t i : order) {
    const int64_t n = docs[i];
    if (n <= 0) continue;
    size_t r = 0;
    while (r < rows.size() && used[r] + n > longest) ++r;
    if (r == rows.size()) rows.emplace_back(), used.push_back(0);
    rows[r].push_back(n);
    used[r] += n;
  }
  std::vector<size_t> by(rows.size());
  std::iota(by.begin(), by.end(), size_t(0));
  std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return used[a] > used[b]; });
  std::vector<RowLengths> out;
  for (size_t r : by) out.push_back(std::move(rows[r]));
  return out;
}

double dcp_quad(const ModelSpec& m) { return 1.0 / (12.0 * double(m.hidden)); }

double row_cost(const RowLengths& r, double quad) {
  double c = double(std::accumulate(r.begin(), r.end(), int64_t(0)));
  for (int64_t l : r) c += quad * double(l) * double(l);
  return c;
}

std::vector<std::vector<int64_t>> deal_rows(const std::vector<RowLengths>& rows, const std::vector<int64_t>& which,
                                            int64_t parts, double quad) {
  ATOLL_CHECK(parts >= 1, "data-centric parallel: rows dealt to {} parts", parts);
  std::vector<std::vector<int64_t>> bins(static_cast<size_t>(parts));
  std::vector<double> load(static_cast<size_t>(parts), 0.0);
  for (int64_t i : which) {
    const size_t b = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    bins[b].push_back(i);
    load[b] += row_cost(rows[size_t(i)], quad);
  }
  for (auto& b : bins) std::sort(b.begin(), b.end());
  return bins;
}

std::vector<std::vector<int64_t>> dcp_group_share(const std::vector<RowLengths>& rows, int64_t cp, int64_t accum,
                                                  int64_t world, int64_t group, double quad) {
  ATOLL_CHECK(cp >= 1 && world % cp == 0 && accum >= 1, "data-centric parallel: cp {} over {} ranks, accum {}", cp,
              world, accum);
  std::vector<int64_t> all(rows.size());
  std::iota(all.begin(), all.end(), int64_t(0));
  const auto groups = deal_rows(rows, all, world / cp, quad);
  return deal_rows(rows, groups[size_t(group)], accum, quad);
}

int64_t dcp_micro_batch_len(const std::vector<RowLengths>& rows, const std::vector<int64_t>& which, int64_t cp) {
  int64_t longest = 1;
  for (int64_t r : which)
    longest = std::max(longest, std::accumulate(rows[size_t(r)].begin(), rows[size_t(r)].end(), int64_t(0)));
  const int64_t q = cp > 1 ? 2 * cp : 1;
  return (longest + q - 1) / q * q;
}

ModelSpec dcp_micro_batch_spec(const ModelSpec& base, const std::vector<RowLengths>& rows,
                               const std::vector<int64_t>& which, int64_t T) {
  ModelSpec m = base;
  m.seq = T;
  double sq = 0;
  for (int64_t r : which)
    for (int64_t l : rows[size_t(r)]) sq += double(l) * double(l);
  m.attention_sq_len = which.empty() ? 0 : sq / double(which.size());
  return m;
}

DcpChoice price_packed(const DcpJob& job, const std::vector<RowLengths>& rows, int64_t cp, int64_t accum,
                       const std::string& recompute) {
  ATOLL_CHECK(cp >= 1 && job.world % cp == 0, "data-centric parallel: cp = {} does not divide {} ranks", cp, job.world);
  DcpChoice c;
  c.cp = cp, c.dp = job.world / cp, c.accum = accum, c.recompute = recompute;
  c.fits = true;
  const double quad = dcp_quad(job.model);
  // One cp group's devices, each at its share of the machine (the job's cluster divided them).
  Cluster group = job.cluster;
  group.devices_per_node = cp;
  for (int64_t g = 0; g < c.dp; ++g) {
    double t = 0, link = 0, att_s = 0;
    for (const std::vector<int64_t>& mb : dcp_group_share(rows, cp, accum, job.world, g, quad)) {
      const int64_t T = dcp_micro_batch_len(rows, mb, cp);
      const ModelSpec m = dcp_micro_batch_spec(job.model, rows, mb, T);
      Layout l;
      l.dp = 1, l.cp = cp, l.zero = 0;
      l.micro_batch = l.global_batch = std::max<int64_t>(1, int64_t(mb.size()));
      l.recompute = recompute;
      l.precision = job.precision;
      const Prediction p = predict(m, group, l);
      // The attention cores' part: the same micro-batch priced with (almost) no query-key pairs
      // (0 would mean "the full causal square" to the model). Its ring exposure is taken from
      // the whole price.
      ModelSpec m0 = m;
      m0.attention_sq_len = 1e-300;
      const Prediction p0 = predict(m0, group, l);
      const double work0 = p0.compute + p0.memory_bound + p0.recompute + p0.grad_buffers;
      const double att = std::max(0.0, p.compute + p.memory_bound + p.recompute + p.grad_buffers - work0);
      const double work = work0 + job.attention_scale * att;
      t += work + p.cp.total();
      link += p.cp.total();
      att_s += job.attention_scale * att;
      c.fits = c.fits && !p.memory.oom;
      c.memory_bytes = std::max(c.memory_bytes, p.memory.total);
      c.micro_batch = std::max<int64_t>(c.micro_batch, int64_t(mb.size()));
      c.seq = std::max(c.seq, T);
    }
    if (t > c.step_s || g == 0) c.step_s = t, c.compute_s = t - link, c.link_s = link, c.attention_s = att_s;
  }
  return c;
}

Device dcp_scaled_device(const Device& d, double k) {
  ATOLL_CHECK(k > 0 && std::isfinite(k), "data-centric parallel: compute scale {}", k);
  Device s = d;
  for (double* r : {&s.fp32, &s.tf32, &s.bf16, &s.fp8, &s.mem_bw, &s.elementwise_bw, &s.attention_flops,
                    &s.optimizer_params_per_s})
    *r /= k;
  for (auto* curve : {&s.attention_curve, &s.ring_attention_curve})
    for (auto& [f, r] : *curve) r /= k;  // the rate at each call size; the sizes stay
  return s;
}

void DcpCalibration::observe(const DcpChoice& ran, double measured_s, double scale_then, double attention_scale_then) {
  if (!(ran.compute_s > 0) || !(measured_s > 0) || !(scale_then > 0) || !(attention_scale_then > 0)) return;
  // What the kernels took: the measurement less the ring's exposed part as priced; at least a
  // tenth of the measurement (a ring priced above the whole step says nothing about the kernels).
  const double kernels = std::max(measured_s - ran.link_s, 0.1 * measured_s);
  // The price's two parts at scale 1 (the device's own figures, attention_scale 1).
  const double A = std::max(0.0, ran.attention_s) / (scale_then * attention_scale_then);
  const double P = std::max(0.0, ran.compute_s - ran.attention_s) / scale_then;
  k_.push_back(kernels / (P + A));  // = scale_then · kernels / compute_s when attention_scale_then = 1
  ++observed_;
  if (int64_t(k_.size()) > window_) k_.erase(k_.begin());
  if (two_terms_ && P > 0) {
    x_.push_back(A / P), y_.push_back(kernels / P);
    if (int64_t(x_.size()) > fit_window_) x_.erase(x_.begin()), y_.erase(y_.begin());
    fit();
  }
}

void DcpCalibration::fit() {
  fit_ok_ = false;
  const size_t n = x_.size();
  if (int64_t(n) < min_fit_) return;
  const double xm = median_of(x_);
  const auto [lo, hi] = std::minmax_element(x_.begin(), x_.end());
  if (!(xm > 0) || *hi - *lo < 0.2 * xm) return;
  std::vector<double> slopes;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j)
      if (std::fabs(x_[j] - x_[i]) > 1e-3 * xm) slopes.push_back((y_[j] - y_[i]) / (x_[j] - x_[i]));
  if (slopes.size() < 4) return;
  const double b = median_of(slopes);
  // Determined: the pairwise slopes' middle half within ±b/2 of each other's spread (their
  // inter-quartile range at most b). Wall-clock noise on steps whose attention shares differ
  // little scatters the slopes over both signs; a ratio taken from them would swing the choices.
  std::sort(slopes.begin(), slopes.end());
  const double q1 = slopes[slopes.size() / 4], q3 = slopes[(3 * slopes.size()) / 4];
  if (!(q3 - q1 <= b)) return;
  std::vector<double> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = y_[i] - b * x_[i];
  const double a = median_of(r);
  if (!(a > 0) || !(b > 0) || !std::isfinite(a) || !std::isfinite(b)) return;
  alpha_ = a, beta_ = b, fit_ok_ = true;
}

double DcpCalibration::scale() const {
  if (fit_ok_) return alpha_;
  return k_.empty() ? 1.0 : median_of(k_);
}

double DcpCalibration::attention_scale() const { return fit_ok_ ? beta_ / alpha_ : 1.0; }

DcpChoice predict_config(const DcpJob& job, const std::vector<int64_t>& lengths, int64_t cp, int64_t accum,
                         const std::string& recompute) {
  ATOLL_CHECK(!lengths.empty(), "data-centric parallel: an empty batch");
  return price_packed(job, pack_lengths(lengths), cp, accum, recompute);
}

std::vector<DcpChoice> dcp_candidates(const DcpJob& job, const std::vector<int64_t>& lengths) {
  ATOLL_CHECK(!lengths.empty(), "data-centric parallel: an empty batch");
  const std::vector<RowLengths> rows = pack_lengths(lengths);
  std::vector<DcpChoice> out;
  for (int64_t cp = 1; cp <= job.world; cp *= 2) {
    if (job.world % cp) continue;
    const int64_t per_rank = (int64_t(rows.size()) + job.world / cp - 1) / (job.world / cp);
    for (int64_t accum = 1; accum <= std::max<int64_t>(1, std::min(job.max_accum, per_rank)); accum *= 2)
      for (const std::string& rc : job.recompute) out.push_back(price_packed(job, rows, cp, accum, rc));
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
