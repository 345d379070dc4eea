#include "train/data_centric_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <limits>

#include "autograd/graph.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "nn/document_mask.h"
#include "parallel/context_parallel.h"
#include "plan/cluster.h"
#include "plan/hardware.h"
#include "plan/predict.h"
#include "train/trainer.h"

namespace atl {

namespace {

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

Recompute recompute_of(const std::string& s) {
  return s == "full" ? Recompute::full : s == "selective" ? Recompute::selective : Recompute::none;
}

// The cost model's device when no calibration file exists: this machine's ranks at the GEMM rate
// of hardware.peak_gflops (measured now when unset; then the choices follow the machine's load),
// memory and links at conservative figures for one host (loopback TCP between ranks). Only the
// ratios between candidates matter to the choice.
plan::Device estimated_cpu_device(double peak_gflops) {
  plan::Device d;
  d.name = "cpu (estimated)";
  d.note = "GEMM peak measured at start; memory and loopback figures assumed";
  d.fp32 = d.tf32 = (peak_gflops > 0 ? peak_gflops : measure_gemm_peak_gflops()) * 1e9;
  d.mem_bytes = 16.0 * (1ull << 30);
  d.mem_bw = d.host_bw = 10e9;
  d.intra_bw = d.inter_bw = 1e9;
  d.links_measured = true;
  d.intra_latency = 50e-6;
  d.gemm_overlaps_memory = false;
  d.gemm_curve = {{1e5, 0.3}, {1e7, 0.6}, {1e9, 0.8}};
  d.gemm_eff_max = 0;
  return d;
}

plan::ModelSpec model_spec(const nn::TransformerShape& t) {
  plan::ModelSpec m;
  m.layers = t.layers, m.hidden = t.hidden, m.heads = t.heads, m.kv_heads = t.kv_heads, m.ffn = t.ffn;
  m.ffn_type = t.swiglu ? "swiglu" : "gelu";
  m.vocab = t.vocab;
  m.tied_head = t.tied_head;
  m.bias = t.bias;
  m.norm = t.rms_norm ? "rmsnorm" : "layernorm";
  m.position = t.rope ? "rope" : "learned";
  m.attention = "flash";  // the CPU attention keeps a log-sum-exp per row, not the [T, T] scores
  return m;
}

}  // namespace

std::vector<plan::RowLengths> dcp_row_lengths(const std::vector<PackedRow>& rows) {
  std::vector<plan::RowLengths> out;
  out.reserve(rows.size());
  for (const PackedRow& r : rows) out.push_back(r.doc_lengths);
  return out;
}

std::vector<DcpMicroBatch> dcp_rank_share(const std::vector<PackedRow>& rows, int64_t cp, int64_t accum, int64_t world,
                                          int rank, double quad) {
  ATOLL_CHECK(cp >= 1 && world % cp == 0 && accum >= 1, "data-centric step: cp {} over {} ranks, accum {}", cp, world,
              accum);
  // The cp group of consecutive ranks rank / cp shares its rows; the groups split the batch, as
  // plan's pricing deals them (plan/data_centric.h).
  const std::vector<plan::RowLengths> lens = dcp_row_lengths(rows);
  std::vector<DcpMicroBatch> out;
  for (auto& m : plan::dcp_group_share(lens, cp, accum, world, rank / cp, quad)) {
    DcpMicroBatch b;
    for (int64_t r : m) b.targets += rows[size_t(r)].used();
    b.T = plan::dcp_micro_batch_len(lens, m, cp);
    b.rows = std::move(m);
    out.push_back(std::move(b));
  }
  return out;
}

plan::ModelSpec dcp_micro_batch_model(const plan::ModelSpec& base, const std::vector<PackedRow>& rows,
                                      const DcpMicroBatch& mb) {
  return plan::dcp_micro_batch_spec(base, dcp_row_lengths(rows), mb.rows, mb.T);
}

DcpSettings DcpSettings::from_config(Config& cfg, const TrainOptions& o) {
  DcpSettings s;
  s.data.batch_tokens = cfg.get_int("data.varlen_tokens", 0, 0, int64_t(1) << 30);
  s.data.lengths = cfg.get_string("data.varlen_lengths", "corpus", {"corpus", "pareto"});
  s.data.alpha = cfg.get_float("data.varlen_alpha", 1.2, 0.05, 10.0);
  s.data.min_len = cfg.get_int("data.varlen_min_len", 16, 1, 1 << 20);
  s.data.max_len = o.seq_len;
  s.data.seed = uint64_t(o.seed);
  s.cp = cfg.get_int("parallel.dcp_cp", 0, 0, 4096);
  s.accum = cfg.get_int("parallel.dcp_accum", 0, 0, 1024);
  s.recompute = cfg.get_string("parallel.dcp_recompute", "auto", {"auto", "none", "selective", "full"});
  s.device = cfg.get_string("parallel.dcp_device", "auto");
  s.memory_gb = cfg.get_float("parallel.dcp_memory_gb", 0.0, 0.0, 1e6);
  s.margin = cfg.get_float("parallel.dcp_margin", s.margin, 0.0, 10.0);
  s.link_gbps = cfg.get_float("parallel.dcp_link_gbps", 0.0, 0.0, 1e6);
  s.link_latency_us = cfg.get_float("parallel.dcp_link_latency_us", 0.0, 0.0, 1e7);
  s.calibrate = cfg.get_bool("parallel.dcp_calibrate", true);
  s.calibrate_attention = cfg.get_bool("parallel.dcp_calibrate_attention", true);
  ATOLL_CHECK(s.calibrate || !cfg.has("parallel.dcp_calibrate_attention") || !s.calibrate_attention,
              "parallel.dcp_calibrate_attention = true ({}) needs parallel.dcp_calibrate = true ({})",
              cfg.where("parallel.dcp_calibrate_attention"), cfg.where("parallel.dcp_calibrate"));
  return s;
}

std::unique_ptr<DataCentricStep> DataCentricStep::from_config(Config& cfg, const TrainOptions& o,
                                                              const parallel::MeshShape& m, int world) {
  DcpSettings s = DcpSettings::from_config(cfg, o);
  if (s.data.batch_tokens == 0) {
    for (const char* k : {"parallel.dcp_cp", "parallel.dcp_accum", "parallel.dcp_recompute", "parallel.dcp_device",
                          "parallel.dcp_memory_gb", "parallel.dcp_margin", "parallel.dcp_link_gbps",
                          "parallel.dcp_link_latency_us", "parallel.dcp_calibrate", "parallel.dcp_calibrate_attention", "data.varlen_lengths", "data.varlen_alpha",
                          "data.varlen_min_len"})
      ATOLL_CHECK(!cfg.has(k), "{} ({}) applies to the variable-length corpus only: set data.varlen_tokens > 0", k,
                  cfg.where(k));
    return nullptr;
  }
  const std::string at = " (" + cfg.where("data.varlen_tokens") + ")";
  ATOLL_CHECK(m.cp == 1 && m.tp == 1 && m.pp == 1 && m.ep == 1 && m.island == 1,
              "data.varlen_tokens{}: Data-Centric Parallel chooses context parallelism per batch over data-parallel "
              "ranks; remove parallel.cp, tp, pp, ep and islands (mesh {})", at, m.describe());
  ATOLL_CHECK(o.fault_tolerance != "quorum", "data.varlen_tokens{} with fault.tolerance = \"quorum\" is not supported",
              at);
  // The step chooses these per batch; a static value goes in parallel.dcp_accum / dcp_recompute.
  for (const auto& [k, alt] : {std::pair<const char*, const char*>{"train.grad_accum", "parallel.dcp_accum"},
                               {"train.recompute", "parallel.dcp_recompute"}})
    ATOLL_CHECK(!cfg.has(k), "{} ({}) with data.varlen_tokens{}: the split and recompute are chosen per batch; to fix "
                "one, set {}", k, cfg.where(k), at, alt);
  ATOLL_CHECK(s.cp == 0 || world % s.cp == 0, "parallel.dcp_cp = {} ({}) does not divide the {} ranks", s.cp,
              cfg.where("parallel.dcp_cp"), world);
  return std::make_unique<DataCentricStep>(std::move(s), o, world);
}

DataCentricStep::DataCentricStep(DcpSettings s, const TrainOptions& o, int world)
    : s_(std::move(s)), world_(world), seq_len_(o.seq_len), peak_gflops_(o.peak_gflops), data_dir_(o.data_dir),
      tokenizer_(o.tokenizer) {
  job_.precision = o.matmul_dtype == "bf16" ? "bf16" : "fp32";
  calibration_ = plan::DcpCalibration(5, s_.calibrate_attention);
}

DataCentricStep::~DataCentricStep() = default;

void DataCentricStep::setup(nn::Model& model, comm::Communicator* comm) {
  rank_ = comm ? comm->rank() : 0;
  auto* tok = dynamic_cast<const nn::TokenModel*>(&model);
  std::optional<nn::TransformerShape> shape = model.transformer_shape();
  ATOLL_CHECK(tok && shape && dynamic_cast<nn::SequenceSharded*>(&model) && dynamic_cast<nn::DocumentMasked*>(&model),
              "data.varlen_tokens: model family '{}' does not take packed documents under context parallelism",
              model.family());
  // The largest cp degree a batch may get; its rows are padded to a multiple of 2cp.
  int64_t max_cp = 1;
  for (int64_t c = 1; c <= world_; c *= 2)
    if (world_ % c == 0 && (s_.cp == 0 || c == s_.cp)) max_cp = c;
  if (s_.cp > 0) max_cp = s_.cp;
  const int64_t padded = (seq_len_ + 2 * max_cp - 1) / (2 * max_cp) * (2 * max_cp);
  ATOLL_CHECK(tok->max_sequence_length() == 0 || padded <= tok->max_sequence_length(),
              "train.seq_len = {} (the longest document) pads to {} for cp = {}, past model.block_size {}", seq_len_,
              padded, max_cp, tok->max_sequence_length());
  corpus_ = std::make_unique<VarlenCorpus>(
      VarlenCorpus::from_shards(data_dir_, "train", load_tokenizer(tokenizer_)->eot(), s_.data));
  ATOLL_CHECK(corpus_->max_token() < tok->vocab_size(), "the variable-length corpus in {} holds id {}, past "
              "model.vocab_size {}", data_dir_, corpus_->max_token(), tok->vocab_size());
  // One ring per cp degree over groups of consecutive ranks (collective: every rank splits alike).
  for (int64_t c = 2; c <= world_; c *= 2) {
    if (world_ % c || (s_.cp > 0 && c != s_.cp)) continue;
    groups_.push_back(comm->split(rank_ / int(c), rank_));
    rings_.push_back(std::make_unique<parallel::RingAttention>(groups_.back().get(), true));
    ring_cp_.push_back(c);
  }
  job_.model = model_spec(*shape);
  quad_ = plan::dcp_quad(job_.model);  // attention within documents against the matmuls per token
  std::string dev = s_.device;
  if (dev == "auto") dev = std::filesystem::exists(plan::calibration_path()) ? "cpu-local" : "";
  plan::Device d = dev.empty() ? estimated_cpu_device(peak_gflops_) : plan::find_device(dev);
  if (dev.empty() && comm && world_ > 1) {
    // Every rank must make the same choice (a ring needs all of its group), so the figures each
    // rank measured are agreed on: the slowest rank's. The link is timed here too unless given:
    // small all-reduces for the per-exchange latency (software hand-offs included, which is
    // what a ring block costs beyond its bytes), 1 MiB ones for the bandwidth.
    using Clock = std::chrono::steady_clock;
    auto timed = [&](int64_t n, int reps) {
      Tensor t = Tensor::zeros({n});
      comm->all_reduce(t);  // warm the connection
      const auto t0 = Clock::now();
      for (int i = 0; i < reps; ++i) comm->all_reduce(t);
      return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
    };
    double lat = d.intra_latency, bw = d.intra_bw;
    if (s_.link_gbps == 0 && s_.link_latency_us == 0) {
      lat = timed(1, 20);
      bw = double(1 << 20) / std::max(1e-9, timed(1 << 18, 3) - lat);
      d.note += "; link timed at start";
    }
    Tensor v = Tensor::empty({3});
    v.f32()[0] = float(-d.fp32), v.f32()[1] = float(lat), v.f32()[2] = float(-bw);  // max of each
    comm->all_reduce(v, comm::ReduceOp::max);
    d.fp32 = d.tf32 = -double(v.f32()[0]), d.intra_latency = double(v.f32()[1]);
    d.intra_bw = d.inter_bw = -double(v.f32()[2]);
  }
  if (s_.link_gbps > 0) d.intra_bw = d.inter_bw = s_.link_gbps * 1e9 / 8, d.links_measured = true;
  if (s_.link_latency_us > 0) d.intra_latency = s_.link_latency_us * 1e-6;
  if (s_.memory_gb > 0) d.mem_bytes = s_.memory_gb * double(1ull << 30) * (d.shared_by_node ? double(world_) : 1.0);
  device_ = d;
  job_.cluster = plan::make_cluster(d, world_, 1, 1);
  if (comm && world_ > 1) calib_comm_ = comm->split(0, rank_);
  job_.world = world_;
  job_.zero = 0;
  if (s_.recompute != "auto") job_.recompute = {s_.recompute};
  const auto lens = corpus_->lengths();
  int64_t longest = 0, total = 0;
  for (int64_t l : lens) longest = std::max(longest, l), total += l;
  log::info("data-centric parallel: {} documents of {} targets on average, longest {} (lengths: {}); batches of {} "
            "targets; cost model on {} ({:.3g} GFLOP/s, link {:.3g} GB/s, {:.3g} us){}",
            lens.size(), lens.empty() ? 0 : total / int64_t(lens.size()), longest, s_.data.lengths,
            s_.data.batch_tokens, d.name, d.fp32 / 1e9, d.intra_bw / 1e9, d.intra_latency * 1e6,
            describe().empty() ? "" : "; fixed: " + describe());
  if (s_.calibrate)
    log::info("data-centric parallel: the cost model's kernels are scaled by the run's measured steps (median of the "
              "last 5{}), its link kept as {} (parallel.dcp_calibrate)",
              s_.calibrate_attention ? "; the attention's scale apart once 8 of the last 16 steps determine it, "
              "parallel.dcp_calibrate_attention" : "", s_.link_gbps > 0 || s_.link_latency_us > 0 ? "given" : "timed");
}

std::string DataCentricStep::describe() const {
  std::string s;
  if (s_.cp > 0) s += fmt::format("cp {}", s_.cp);
  if (s_.accum > 0) s += fmt::format("{}accum {}", s.empty() ? "" : ", ", s_.accum);
  if (s_.recompute != "auto") s += fmt::format("{}recompute {}", s.empty() ? "" : ", ", s_.recompute);
  return s;
}

// Each candidate is priced by plan's model of packed rows (plan::price_packed: every dp group's
// micro-batches, each cut to its own longest row with its attention the sum of its documents'
// own, the step taking the slowest group), on the rows' document lengths: the choice here and
// plan::choose_dcp price a batch alike, and dcp_rank_share deals the rows as the price assumed.
plan::DcpChoice DataCentricStep::price(const std::vector<PackedRow>& rows, int64_t cp, int64_t accum,
                                       const std::string& rc) const {
  return plan::price_packed(job_, dcp_row_lengths(rows), cp, accum, rc);
}

plan::DcpChoice DataCentricStep::choose(const std::vector<PackedRow>& rows, std::map<int64_t, double>* by_cp) const {
  // plan::dcp_candidates' enumeration (cp a power of two dividing the ranks, 1, 2, 4, ... micro-
  // batches up to the rows a group gets, each recompute policy) with the fixed keys held; a fixed
  // accum may exceed the rows a rank gets (its extra micro-batches are empty).
  std::vector<plan::DcpChoice> cands;
  for (int64_t cp = 1; cp <= world_; cp *= 2) {
    if (world_ % cp || (s_.cp > 0 && cp != s_.cp)) continue;
    const int64_t per_rank = (int64_t(rows.size()) + world_ / cp - 1) / (world_ / cp);
    for (int64_t a = 1; a <= std::max<int64_t>(1, std::min(job_.max_accum, per_rank)); a *= 2) {
      if (s_.accum > 0 && a != 1) break;
      const int64_t accum = s_.accum > 0 ? s_.accum : a;
      for (const std::string& rc : job_.recompute) cands.push_back(price(rows, cp, accum, rc));
    }
  }
  ATOLL_CHECK(!cands.empty(), "data-centric step: no configuration for {} ranks", world_);
  // Fitting first, then the fastest (ties: fewer micro-steps); when nothing fits, the smallest
  // memory. A larger cp must be predicted faster by more than the margin: the model leaves out
  // the ring's per-exchange software costs (a thread hand-off and a loopback or network message
  // per block and layer), so a near tie is not worth the ring.
  auto better = [](const plan::DcpChoice& c, const plan::DcpChoice& b) {
    if (c.fits != b.fits) return c.fits;
    if (!c.fits) return c.memory_bytes < b.memory_bytes;
    return c.step_s < b.step_s || (c.step_s == b.step_s && c.accum < b.accum);
  };
  const plan::DcpChoice* best = nullptr;
  for (const plan::DcpChoice& c : cands)
    if (!best || better(c, *best)) best = &c;
  if (by_cp) {
    by_cp->clear();
    for (const plan::DcpChoice& c : cands)
      if (c.fits && (!by_cp->count(c.cp) || c.step_s < by_cp->at(c.cp))) (*by_cp)[c.cp] = c.step_s;
  }
  if (best->fits)
    for (int64_t cp = 1; cp < best->cp; cp *= 2) {
      const plan::DcpChoice* at = nullptr;  // the fastest fitting candidate of this cp
      for (const plan::DcpChoice& c : cands)
        if (c.cp == cp && c.fits && (!at || better(c, *at))) at = &c;
      if (at && at->step_s <= best->step_s * (1 + s_.margin)) {
        best = at;
        break;
      }
    }
  return *best;
}

double DataCentricStep::compute(int64_t step, nn::Model& model, parallel::DataParallel& dp) {
  const std::vector<VarlenDocument> docs = corpus_->batch(step);
  const std::vector<PackedRow> rows = pack_documents(docs);
  const auto t0 = std::chrono::steady_clock::now();
  const plan::DcpChoice c = choose(rows, &last_by_cp_);
  const double c_scale = scale_, c_attention = job_.attention_scale;
  choose_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t N = 0, longest = 0;
  for (const VarlenDocument& d : docs) N += d.targets(), longest = std::max(longest, d.targets());
  const std::vector<DcpMicroBatch> share = dcp_rank_share(rows, c.cp, c.accum, world_, rank_, quad_);
  const nn::ContextAttention* ring = nullptr;
  for (size_t i = 0; i < ring_cp_.size(); ++i)
    if (ring_cp_[i] == c.cp) ring = rings_[i].get();
  ATOLL_CHECK(c.cp == 1 || ring, "data-centric step: no ring for cp {}", c.cp);
  auto& sharded = dynamic_cast<nn::SequenceSharded&>(model);
  auto& masked = dynamic_cast<nn::DocumentMasked&>(model);
  sharded.set_context_attention(ring);
  model.set_recompute(std::vector<Recompute>(size_t(model.transformer_shape()->layers), recompute_of(c.recompute)));
  double sum = 0;
  const auto t_run = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_seconds();
  for (size_t m = 0; m < share.size(); ++m) {
    const DcpMicroBatch& mb = share[m];
    const PackedTensors t = rows_to_tensors(rows, mb.rows, mb.T);
    masked.set_document_ids(t.doc_ids);
    masked.set_position_ids(t.positions);
    dp.set_sync(m + 1 == share.size());  // gradients are summed over the ranks once, after the last
    Tensor loss = model.loss(t.input, t.target);
    // loss is the mean over the micro-batch's targets (its cp group's, under cp, with each rank's
    // share); scaled so that its sum over the micro-batches, averaged over all the ranks by data
    // parallelism, is the mean over the batch's N targets.
    const double scale = double(world_) * double(mb.targets) / (double(c.cp) * double(N));
    sum += double(loss.item()) * scale;
    backward(loss, float(scale));
  }
  masked.set_document_ids(Tensor());
  masked.set_position_ids(Tensor());
  sharded.set_context_attention(nullptr);
  // The slowest rank's forward + backward, in wall-clock and in this process's CPU seconds (all
  // its threads: the ring's too). Wall time is what the price's slowest group stands for; on a
  // shared, loaded machine it also counts the time a rank waits for a core, which CPU time does
  // not (busy_s: the step as dedicated cores would run it, what the benchmark compares). Every
  // rank takes the same maxima, so all keep the same scale and make the same next choice.
  measured_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_run).count();
  busy_s_ = process_cpu_seconds() - cpu0;
  if (calib_comm_) {
    Tensor v = Tensor::empty({2});
    v.f32()[0] = float(measured_s_), v.f32()[1] = float(busy_s_);
    calib_comm_->all_reduce(v, comm::ReduceOp::max);
    measured_s_ = double(v.f32()[0]), busy_s_ = double(v.f32()[1]);
  }
  if (s_.calibrate) {
    calibration_.observe(c, measured_s_, scale_, job_.attention_scale);
    if (calibration_.scale() != scale_) {
      scale_ = calibration_.scale();
      job_.cluster = plan::make_cluster(plan::dcp_scaled_device(device_, scale_), world_, 1, 1);
    }
    job_.attention_scale = calibration_.attention_scale();
  }
  last_ = c;
  last_scale_ = c_scale;
  last_attention_scale_ = c_attention;
  last_tokens_ = N;
  total_tokens_ += N;
  last_docs_ = int64_t(docs.size());
  last_longest_ = longest;
  last_rows_ = int64_t(rows.size());
  return sum;
}

nlohmann::json DataCentricStep::record() const {
  nlohmann::json by_cp = nlohmann::json::object();
  for (auto [cp, s] : last_by_cp_) by_cp[std::to_string(cp)] = s * 1e3;
  return {{"dcp",
           {{"cp", last_.cp}, {"dp", last_.dp}, {"accum", last_.accum}, {"micro_batch", last_.micro_batch},
            {"recompute", last_.recompute}, {"seq", last_.seq}, {"docs", last_docs_}, {"longest", last_longest_},
            {"rows", last_rows_}, {"predicted_ms", last_.step_s * 1e3}, {"predicted_link_ms", last_.link_s * 1e3},
            {"predicted_ms_by_cp", by_cp},
            {"measured_ms", measured_s_ * 1e3}, {"busy_ms", busy_s_ * 1e3}, {"compute_scale", last_scale_},
            {"attention_scale", last_attention_scale_}, {"predicted_attention_ms", last_.attention_s * 1e3},
            {"choose_ms", choose_s_ * 1e3}}},
          {"tokens", total_tokens_}};
}

}  // namespace atl
