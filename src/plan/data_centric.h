// Data-Centric Parallel, the chooser (issue 12, item 5; seed: "Training Variable Long Sequences
// with Data-Centric Parallel"): instead of one static configuration for every batch of a
// variable-length corpus, each batch's sequence lengths choose its context-parallel degree (data
// parallelism over the rest of the ranks), its gradient-accumulation split and its recomputation
// policy, by plan's cost model (plan/predict.h: step time and memory of each candidate). Short
// batches of many sequences get pure data parallelism with few micro-batches and no recompute;
// one long sequence gets context parallelism (and recompute where activations would not fit).
//
// A batch is its documents, packed as the trainer packs them (data/varlen_packer.h: first-fit
// decreasing into rows as long as the longest document), the rows dealt out to the dp groups and
// then to each group's micro-batches by the least loaded bin (a row's load: its positions plus
// quad·Σ len², quad = 1/(12·hidden)). A micro-batch is priced as it runs: its rows padded to its
// longest (rounded to 2cp under cp > 1), its attention the sum over rows of Σ len² of their
// documents (the masked kernels visit only each query's own document, none of the padding), by
// plan's model of one micro-batch on one cp group (compute, memory-bound and recompute time,
// gradient buffers, exposed ring traffic); a step takes its slowest group. The gradient reduction
// and the optimizer step are the same for every candidate (data parallelism always reduces over
// all the ranks), so they are left out of step_s. Candidates that exceed a device's memory are
// left out; of the rest the fastest predicted step wins (ties: smaller cp, fewer micro-steps).
// The trainer's per-batch chooser (train/data_centric_step.h) prices with these functions.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/model_spec.h"

namespace atl::plan {

struct DcpJob {
  ModelSpec model;     // seq is set per batch
  Cluster cluster;
  int64_t world = 1;   // ranks of the job
  int64_t max_accum = 8;
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::string precision = "bf16";
  int zero = 1;
  // The attention kernels' time relative to the rest's, beyond the device's figures
  // (DcpCalibration's two-term fit): each micro-batch's attention part is multiplied by it.
  double attention_scale = 1.0;
};

struct DcpChoice {
  int64_t cp = 1, dp = 1, accum = 1, micro_batch = 1, seq = 0;
  std::string recompute = "none";
  double step_s = 0, memory_bytes = 0;
  // The slowest dp group's step split: its kernels (compute, memory-bound, recompute, gradient
  // buffers) and its ring exchanges not hidden behind them (step_s = compute_s + link_s).
  double compute_s = 0, link_s = 0;
  // The part of compute_s that is the attention cores' (the price less the same micro-batches'
  // with no query-key pairs), at the job's attention_scale.
  double attention_s = 0;
  bool fits = false;
  std::string describe() const;
  bool same_config(const DcpChoice& o) const {
    return cp == o.cp && accum == o.accum && micro_batch == o.micro_batch && recompute == o.recompute;
  }
};

// A packed row as the cost model sees it: the lengths of its documents, in order (PackedRow::
// doc_lengths); its positions are their sum.
using RowLengths = std::vector<int64_t>;
// The packer's rows for documents of these lengths (pack_documents' rule, on lengths; empty
// documents are left out), in order of decreasing use.
std::vector<RowLengths> pack_lengths(const std::vector<int64_t>& docs);
// The weight of a row's attention against its matmuls per position when balancing: 1 / (12 hidden).
double dcp_quad(const ModelSpec& m);
// A row's load: its positions plus quad·Σ len² (PackedRow::cost).
double row_cost(const RowLengths& r, double quad);
// Deals rows `which`, in that order, to `parts` bins: each to the bin with the least load so far
// (ties: the lower bin); a bin's rows in increasing index order. Bins may be empty.
std::vector<std::vector<int64_t>> deal_rows(const std::vector<RowLengths>& rows, const std::vector<int64_t>& which,
                                            int64_t parts, double quad);
// The micro-batches (row indices) of dp group `group` (the cp group of ranks [group cp, (group +
// 1) cp)) under cp and accum.
std::vector<std::vector<int64_t>> dcp_group_share(const std::vector<RowLengths>& rows, int64_t cp, int64_t accum,
                                                  int64_t world, int64_t group, double quad);
// A micro-batch's row length: its longest row, at least 1, rounded up to 2cp under cp > 1 (ring
// attention's balanced chunks; trailing padding changes nothing under a causal mask).
int64_t dcp_micro_batch_len(const std::vector<RowLengths>& rows, const std::vector<int64_t>& which, int64_t cp);
// The spec of a micro-batch cut to T positions: attention_sq_len the mean over its rows of Σ len².
ModelSpec dcp_micro_batch_spec(const ModelSpec& base, const std::vector<RowLengths>& rows,
                               const std::vector<int64_t>& which, int64_t T);
// One configuration's price for a batch of packed rows (step_s: the slowest dp group's
// micro-batches; memory_bytes, micro_batch, seq: the largest micro-batch's).
DcpChoice price_packed(const DcpJob& job, const std::vector<RowLengths>& rows, int64_t cp, int64_t accum,
                       const std::string& recompute);

// The compute scale of a run (DcpCalibration): a device whose kernels run k times slower than its
// figures say — every FLOP/s and memory/element-wise bandwidth (and the attention and optimizer
// rates) divided by k — with its links unchanged. A link timed in wall-clock seconds under the
// machine's load (the trainer's start-up timing) is only comparable with kernels priced in the
// same seconds; a nominal peak (hardware.peak_gflops, or a large GEMM's rate) prices a small,
// loaded model's kernels tens of times too fast and so its ring tens of times too dear.
Device dcp_scaled_device(const Device& d, double k);
// The run's own measure of k: after each step, the slowest rank's measured forward + backward
// against the price of the configuration it ran (priced at the scale then in force): k_step =
// k · (measured − link_s) / compute_s, the link part taken as priced (it was timed, not
// assumed). scale() is the median of the last `window` steps (1 before the first), so one
// step's hiccup of the machine does not move the choices.
//
// Two terms (two_terms = true): one scale cannot correct a model that prices per-position work
// too dear against attention (docs/data_centric.md: a batch of short rows predicted at 2.7x its
// measured time while long-document batches were within 20%). Each step's kernels are then
// measured = α P + β A, P and A its priced non-attention and attention parts at scale 1; over the
// last `fit_window` steps, y = measured / P against x = A / P is a line of intercept α and slope
// β, fitted by Theil–Sen (the median of the pairwise slopes, then the median intercept: a
// stalled step moves neither). The fit is used only when it is determined and physical: at least
// `min_fit` steps, their x spread over at least a fifth of its median (batches of one shape say
// nothing about the ratio), the pairwise slopes' inter-quartile range at most β (noisy steps
// scatter them over both signs), α > 0 and β > 0; then scale() = α and attention_scale() = β / α.
// Otherwise the one-scale rule above, with attention_scale() = 1.
class DcpCalibration {
 public:
  explicit DcpCalibration(int window = 5, bool two_terms = false, int fit_window = 16, int min_fit = 8)
      : window_(window), fit_window_(fit_window), min_fit_(min_fit), two_terms_(two_terms) {}
  // attention_scale_then: the job's attention_scale the choice was priced at.
  void observe(const DcpChoice& ran, double measured_s, double scale_then, double attention_scale_then = 1.0);
  double scale() const;
  double attention_scale() const;
  bool fitted() const { return fit_ok_; }  // the two-term fit is in force
  int64_t steps() const { return observed_; }

 private:
  void fit();
  int window_, fit_window_, min_fit_;
  bool two_terms_;
  int64_t observed_ = 0;
  std::vector<double> k_;
  std::vector<double> x_, y_;  // A/P and measured/P at scale 1, the last fit_window steps
  bool fit_ok_ = false;
  double alpha_ = 1.0, beta_ = 1.0;
};

// The functions below take a batch as its documents' lengths, packed by pack_lengths.
// One configuration's prediction for a batch of these lengths.
DcpChoice predict_config(const DcpJob& job, const std::vector<int64_t>& lengths, int64_t cp, int64_t accum,
                         const std::string& recompute);
// Every candidate for a batch of these lengths, predicted (fits false: over memory).
std::vector<DcpChoice> dcp_candidates(const DcpJob& job, const std::vector<int64_t>& lengths);
// The fastest candidate that fits; throws when none does.
DcpChoice choose_dcp(const DcpJob& job, const std::vector<int64_t>& lengths);
// The best single configuration for all these batches (the static baseline): the (cp, accum,
// recompute) that fits every batch with the smallest summed predicted time (total_s); the
// returned choice is its prediction for the first batch.
DcpChoice best_static(const DcpJob& job, const std::vector<std::vector<int64_t>>& batches, double* total_s = nullptr);

}  // namespace atl::plan
