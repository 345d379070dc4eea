// Data-Centric Parallel in the training loop (issue 12, item 5; seed: "Training Variable Long
// Sequences with Data-Centric Parallel"). With [data] varlen_tokens > 0 the job trains on a
// variable-length corpus (data/varlen_corpus.h): each step is one global batch of whole documents,
// packed into rows with document masks (data/varlen_packer.h). Per batch, plan's chooser
// (plan/data_centric.h) picks from the rows' lengths the context-parallel degree cp (ring attention
// over groups of cp consecutive ranks, data parallelism over the world / cp groups), the
// gradient-accumulation split and the recompute policy; the step then runs that layout: the
// batch's rows dealt to the dp groups and to micro-batches by balanced cost, each micro-batch cut
// to its own longest row. Keys [parallel] dcp_cp, dcp_accum, dcp_recompute fix any of the three
// (all three fixed: a static configuration on the same data, the benchmark's baseline).
//
// Numerics: the rows are a function of the batch only, each rank scales its micro-batches' losses
// so that data parallelism's average over the ranks is the mean over the batch's targets, and a
// row's trailing padding is invisible under causal document masks; so any layout computes the
// same loss and gradients as any other up to the order of fp32 sums (ring attention's block
// merges, the per-rank partial sums).
#pragma once
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "data/varlen_corpus.h"
#include "data/varlen_packer.h"
#include "nn/context_attention.h"
#include "nn/model.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "plan/data_centric.h"

namespace atl {

struct TrainOptions;

// What one rank computes of a batch under a choice: its micro-batches, each a set of row indices
// cut to T positions (T a multiple of 2cp under cp > 1), and the real targets of the whole
// micro-batch (all the cp group's rows, which every rank of the group shares).
struct DcpMicroBatch {
  std::vector<int64_t> rows;
  int64_t T = 1, targets = 0;
};
// The rows' document lengths, as plan prices them.
std::vector<plan::RowLengths> dcp_row_lengths(const std::vector<PackedRow>& rows);
std::vector<DcpMicroBatch> dcp_rank_share(const std::vector<PackedRow>& rows, int64_t cp, int64_t accum, int64_t world,
                                          int rank, double quad);

// The cost model's spec of one micro-batch: rows cut to mb.T, attention priced as the sum of each
// row's per-document causal attention (Σ len², documents masked from one another), not as causal
// attention over the padded row.
plan::ModelSpec dcp_micro_batch_model(const plan::ModelSpec& base, const std::vector<PackedRow>& rows,
                                      const DcpMicroBatch& mb);

struct DcpSettings {
  VarlenOptions data;
  int64_t cp = 0, accum = 0;       // 0: chosen per batch
  std::string recompute = "auto";  // or fixed: none | selective | full
  std::string device = "auto";     // plan device of the cost model
  double memory_gb = 0;            // the cost model's memory per rank (0: the device's)
  double margin = 0.1;             // a larger cp must be predicted this much faster
  double link_gbps = 0, link_latency_us = 0;  // the ranks' link for the cost model (0: the device's)
  // Scale the cost model's kernels by the run's own measured steps (plan::DcpCalibration); on by
  // default: a given or timed link is in real seconds whatever the device's nominal figures say.
  // Off: the choices are a function of the config alone (the tests' fixed figures).
  bool calibrate = true;
  // With calibrate: fit the attention kernels' scale apart from the rest's (DcpCalibration's two
  // terms), once the run's steps determine it; off: one scale for every kernel.
  bool calibrate_attention = true;
  static DcpSettings from_config(Config& cfg, const TrainOptions& o);
};

class DataCentricStep {
 public:
  // Null unless [data] varlen_tokens > 0; refuses (naming the key) what it does not compose with.
  static std::unique_ptr<DataCentricStep> from_config(Config& cfg, const TrainOptions& o, const parallel::MeshShape& m,
                                                      int world);
  DataCentricStep(DcpSettings s, const TrainOptions& o, int world);
  ~DataCentricStep();
  // Before step 1, on every rank (collective: splits comm into the cp groups), once the prepared
  // data exists and threads are set: reads the corpus, checks it against the model, builds the
  // ring attention of each cp degree and the chooser's cost model.
  void setup(nn::Model& model, comm::Communicator* comm);
  // Forward and backward of global batch `step` (this rank's share); returns this rank's part of
  // the loss: the ranks' average is the batch's mean loss, as their averaged gradients are its
  // gradient. The caller zeroes gradients before and finishes the data-parallel backward after.
  double compute(int64_t step, nn::Model& model, parallel::DataParallel& dp);
  int64_t step_tokens() const { return last_tokens_; }  // targets of the last batch (whole job)
  // The last step's choice for its metrics record: "dcp" {cp, dp, accum, micro_batch, recompute,
  // seq, docs, longest, rows, predicted_ms, predicted_link_ms (its ring part), predicted_ms_by_cp,
  // measured_ms, compute_scale, attention_scale, predicted_attention_ms,
  // choose_ms}, and "tokens" (cumulative over this run). predicted_ms_by_cp: the fastest fitting
  // candidate of each cp degree, so that a run's choices can be checked against what it measured;
  // measured_ms / busy_ms: the slowest rank's forward + backward of this batch, wall-clock / its
  // process's CPU time;
  // compute_scale: the kernels' scale the choice was priced at (plan::DcpCalibration);
  // attention_scale: the attention part's further factor then (1 until the two-term fit holds);
  // predicted_attention_ms: the attention part of predicted_ms.
  nlohmann::json record() const;
  std::string describe() const;
  // The choice for a batch's rows (the fixed keys held).
  // by_cp, when given, receives the fastest fitting candidate's predicted seconds per cp degree.
  plan::DcpChoice choose(const std::vector<PackedRow>& rows, std::map<int64_t, double>* by_cp = nullptr) const;
  // One candidate's predicted time for these rows (the slowest dp group's micro-batches).
  plan::DcpChoice price(const std::vector<PackedRow>& rows, int64_t cp, int64_t accum, const std::string& rc) const;

 private:
  DcpSettings s_;
  int world_ = 1, rank_ = 0;
  int64_t seq_len_ = 0;
  double peak_gflops_ = 0;  // hardware.peak_gflops (0: measured at setup)
  double quad_ = 0;
  std::unique_ptr<VarlenCorpus> corpus_;
  plan::DcpJob job_;
  std::vector<std::unique_ptr<comm::Communicator>> groups_;  // cp groups, one per degree > 1
  std::vector<std::unique_ptr<nn::ContextAttention>> rings_;
  std::vector<int64_t> ring_cp_;
  plan::Device device_;  // the cost model's device at its own figures (scale 1)
  plan::DcpCalibration calibration_;
  double scale_ = 1.0;   // the compute scale the job's cluster is priced at
  std::unique_ptr<comm::Communicator> calib_comm_;  // the measured times' max (apart from DDP's traffic)
  double measured_s_ = 0, busy_s_ = 0, last_scale_ = 1.0, last_attention_scale_ = 1.0;
  int64_t last_rows_ = 0;
  plan::DcpChoice last_;
  std::map<int64_t, double> last_by_cp_;  // the last choice's by_cp (see choose)
  double choose_s_ = 0;  // the last choice's time (packing excluded)
  int64_t last_tokens_ = 0, total_tokens_ = 0, last_docs_ = 0, last_longest_ = 0;
  std::string data_dir_, tokenizer_;
};

}  // namespace atl
