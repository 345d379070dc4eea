// Pipeline parallelism (pipeline.h): the layout of stages over blocks, and the one runner that
// executes any schedule's action lists.
#include "parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <cstring>
#include <set>

#include "autograd/graph.h"
#include "core/log.h"
#include "kernels/cpu/kernels.h"
#include "optim/adamw.h"
#include "parallel/tensor_parallel.h"

namespace atl::parallel {

PipelineConfig PipelineConfig::from_config(Config& cfg, int64_t pp) {
  PipelineConfig c;
  c.pp = pp;
  c.schedule = cfg.get_string("parallel.pp_schedule", c.schedule, pipeline_schedule_registry().names());
  c.virtual_stages = cfg.get_int("parallel.pp_virtual", c.virtual_stages, 1, 1024);
  c.layers = cfg.get_int_list("parallel.pp_layers", {});
  if (pp == 1) {
    ATOLL_CHECK(c.virtual_stages == 1 || !cfg.has("parallel.pp_virtual"),
                "parallel.pp_virtual = {} ({}) needs a pipeline: parallel.pp > 1", c.virtual_stages,
                cfg.where("parallel.pp_virtual"));
  }
  return c;
}

std::vector<std::pair<int64_t, int64_t>> pipeline_stage_blocks(int64_t blocks, int64_t stages,
                                                               const std::vector<int64_t>& layers) {
  ATOLL_CHECK(stages >= 1, "pipeline with {} stages", stages);
  std::vector<int64_t> n = layers;
  if (n.empty()) {
    ATOLL_CHECK(blocks >= stages,
                "parallel.pp: the model has {} blocks (layers), fewer than the {} pipeline stages (parallel.pp x "
                "parallel.pp_virtual); every stage needs at least one block",
                blocks, stages);
    for (int64_t s = 0; s < stages; ++s) n.push_back(blocks / stages + (s < blocks % stages ? 1 : 0));
  }
  ATOLL_CHECK(int64_t(n.size()) == stages,
              "parallel.pp_layers lists {} stages, but the pipeline has {} (parallel.pp x parallel.pp_virtual)",
              n.size(), stages);
  int64_t sum = 0;
  for (size_t s = 0; s < n.size(); ++s) {
    ATOLL_CHECK(n[s] >= 1, "parallel.pp_layers: stage {} has {} blocks; every stage needs at least one", s, n[s]);
    sum += n[s];
  }
  ATOLL_CHECK(sum == blocks, "parallel.pp_layers adds up to {} blocks, the model has {}", sum, blocks);
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t a = 0;
  for (int64_t k : n) {
    out.push_back({a, a + k});
    a += k;
  }
  return out;
}

void check_pipeline_layout(const nn::Model& model, const PipelineConfig& pc, int64_t m) {
  if (pc.pp == 1) return;
  ATOLL_CHECK(dynamic_cast<const nn::PipelineStages*>(&model) != nullptr,
              "parallel.pp = {}: model family '{}' cannot be cut into pipeline stages (it does not implement "
              "nn::PipelineStages)",
              pc.pp, model.family());
  int64_t blocks = int64_t(const_cast<nn::Model&>(model).blocks().size());
  pipeline_stage_blocks(blocks, pc.pp * pc.virtual_stages, pc.layers);
  make_pipe_schedule(pc.schedule, int(pc.pp), int(m), int(pc.virtual_stages));
}

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// A double through f32 collectives: high part and remainder, summed in double by the receiver.
Tensor split_double(double x) {
  Tensor t = Tensor::empty({2});
  t.f32()[0] = float(x);
  t.f32()[1] = float(x - double(t.f32()[0]));
  return t;
}

// Named tensors from `src` to `dst` over comm (header, names, data), for gathering state.
void send_named(comm::Communicator& c, const std::vector<std::pair<std::string, Tensor>>& ts, int dst) {
  std::vector<int64_t> meta = {int64_t(ts.size())};
  std::string names;
  for (auto& [n, t] : ts) {
    meta.push_back(int64_t(n.size()));
    meta.push_back(int64_t(t.dtype()));
    meta.push_back(int64_t(t.dim()));
    for (int64_t d : t.shape()) meta.push_back(d);
    names += n;
  }
  Tensor len = Tensor::empty({2}, DType::i64);
  len.data<int64_t>()[0] = int64_t(meta.size());
  len.data<int64_t>()[1] = int64_t(names.size());
  c.send(len, dst, 1);
  Tensor mt = Tensor::empty({int64_t(meta.size())}, DType::i64);
  std::copy(meta.begin(), meta.end(), mt.data<int64_t>());
  c.send(mt, dst, 2);
  Tensor nt = Tensor::empty({std::max<int64_t>(1, int64_t(names.size()))}, DType::i32);
  for (size_t i = 0; i < names.size(); ++i) nt.i32()[i] = int32_t(static_cast<unsigned char>(names[i]));
  c.send(nt, dst, 3);
  for (auto& [n, t] : ts) c.send(t.contiguous(), dst, 4);
}

std::vector<std::pair<std::string, Tensor>> recv_named(comm::Communicator& c, int src) {
  Tensor len = Tensor::empty({2}, DType::i64);
  c.recv(len, src, 1);
  Tensor mt = Tensor::empty({len.data<int64_t>()[0]}, DType::i64);
  c.recv(mt, src, 2);
  Tensor nt = Tensor::empty({std::max<int64_t>(1, len.data<int64_t>()[1])}, DType::i32);
  c.recv(nt, src, 3);
  const int64_t* m = mt.data<int64_t>();
  int64_t count = *m++, pos = 0;
  std::vector<std::pair<std::string, Tensor>> out;
  for (int64_t i = 0; i < count; ++i) {
    int64_t nl = *m++;
    DType dt = DType(*m++);
    int64_t nd = *m++;
    Shape shape(m, m + nd);
    m += nd;
    std::string name;
    for (int64_t k = 0; k < nl; ++k) name += char(nt.i32()[pos + k]);
    pos += nl;
    Tensor t = Tensor::empty(shape, dt);
    c.recv(t, src, 4);
    out.emplace_back(name, t);
  }
  return out;
}

}  // namespace

// One micro-batch's state on one chunk between its forward and its last backward pass.
struct InFlight {
  Tape tape;
  Tensor in, out, loss;  // in: the received activation (a leaf); out: what was sent on
  Tensor aux;            // the stage's auxiliary losses (PipelineStages::stage_take_aux_loss), if any
  std::vector<std::function<void()>> weight_work;  // ZB: the deferred W pass
};

struct PipelineParallel::Impl {
  std::map<std::pair<int, int>, InFlight> inflight;  // (micro-batch, chunk)
};

PipelineParallel::PipelineParallel(nn::Model& model, comm::Communicator* world, Mesh& mesh, const PipelineConfig& pc,
                                   int64_t micro_batches, const std::string& dp_strategy, const AdamWConfig& ac,
                                   StageOptimizerFactory make_opt)
    : DataParallel(model, world), impl_(std::make_unique<Impl>()), make_opt_(std::move(make_opt)) {
  stages_ = dynamic_cast<const nn::PipelineStages*>(&model);
  check_pipeline_layout(model, pc, micro_batches);
  const MeshShape& ms = mesh.shape();
  ATOLL_CHECK(ms.pp == pc.pp && pc.pp > 1, "pipeline of {} stages on a mesh with pp = {}", pc.pp, ms.pp);
  // Across islands (ms.island > 1) `world` is the island's communicator: every axis below lies
  // inside the island, and the checkpoint gathers the island's model on its rank 0
  // (lowcomm/pipeline_islands.cpp).
  ATOLL_CHECK(world && int64_t(world->size()) * ms.island == ms.world(),
              "pipeline over islands: built over {} ranks, the island has {} (mesh {})", world ? world->size() : 1,
              ms.world() / ms.island, ms.describe());
  const bool hsdp = dp_strategy == "hsdp";
  ATOLL_CHECK(ms.dp_replicate == 1 || ms.dp_shard == 1 || hsdp,
              "parallel.pp = {} with both dp_replicate = {} and dp_shard = {}: one data-parallel axis at a time, "
              "except under parallel.strategy = 'hsdp'", pc.pp, ms.dp_replicate, ms.dp_shard);
  ATOLL_CHECK(ms.dp() == 1 || dp_strategy == "ddp" || dp_strategy == "zero1" || dp_strategy == "zero2" ||
                  dp_strategy == "zero3" || hsdp,
              "parallel.strategy = '{}' with parallel.pp = {}: a pipeline's stages replicate (ddp) or shard their "
              "optimizer state (zero1), reduced gradients (zero2) and parameters (zero3, hsdp) over dp", dp_strategy,
              pc.pp);
  p_ = int(pc.pp);
  v_ = int(pc.virtual_stages);
  m_ = int(micro_batches);
  pp_comm_ = mesh.axis("pp");
  r_ = int(mesh.coord("pp"));
  ATOLL_CHECK(pp_comm_ && pp_comm_->size() == p_ && pp_comm_->rank() == r_, "pipeline axis communicator");
  // pp x cp: a stage's cp ranks run its blocks on their shares of every row (ring attention over
  // the stage's cp group, injected into the model before), so their gradients average with dp's.
  // HSDP: the stage's parameters shard over dp_shard (x cp) as under ZeRO-3, and the shards'
  // averaged gradients average again over dp_replicate (shards of 1: plain replication).
  // Under tp all of this runs per tp coordinate (the groups below are the ranks of this one).
  cp_ = int(ms.cp);
  const bool shard3 = dp_strategy == "zero3" || (hsdp && ms.dp_shard * ms.cp > 1);
  if (hsdp && ms.dp_shard * ms.cp > 1) {
    dp_comm_ = ms.cp > 1 ? mesh.group({"dp_shard", "cp"}) : mesh.axis("dp_shard");
    if (ms.dp_replicate > 1) rep_comm_ = mesh.axis("dp_replicate");
  } else if (ms.dp() * ms.cp > 1) {
    dp_comm_ = data_parallel_comm(mesh);
  }
  pp_p2p_ = pp_comm_->split(0, r_);
  world_p2p_ = world->split(0, world->rank());
  zero1_ = dp_comm_ && (dp_strategy == "zero1" || dp_strategy == "zero2" || shard3);
  zero2_ = dp_comm_ && (dp_strategy == "zero2" || shard3);
  zero3_ = dp_comm_ && shard3;
  sched_ = make_pipe_schedule(pc.schedule, p_, m_, v_);
  const int S = p_ * v_;
  // Point-to-point tags are below 2^20: two steps' windows of activation and gradient tags, then
  // the tied gradients'.
  ATOLL_CHECK(int64_t(4) * S * m_ < (int64_t(1) << 19),
              "parallel.pp x parallel.pp_virtual x train.grad_accum = {} x {} x {} is too many micro-batch transfers "
              "for one step",
              p_, v_, m_);
  auto blocks = model.blocks();
  blocks_ = pipeline_stage_blocks(int64_t(blocks.size()), S, pc.layers);

  // Which stage owns each parameter: its block's, or stage 0 (below the blocks), or the last.
  std::map<nn::Parameter*, int> block_of;
  for (size_t b = 0; b < blocks.size(); ++b)
    for (nn::Parameter* q : blocks[b]->parameters()) block_of[q] = int(b);
  auto stage_of_block = [&](int b) {
    for (int s = 0; s < S; ++s)
      if (b >= blocks_[size_t(s)].first && b < blocks_[size_t(s)].second) return s;
    return S - 1;
  };
  bool seen_block = false;
  std::vector<nn::Parameter*> lower;
  for (nn::Parameter* q : model.parameters()) {
    int stage;
    auto it = block_of.find(q);
    if (it != block_of.end()) {
      seen_block = true;
      stage = stage_of_block(it->second);
    } else if (!seen_block) {
      stage = 0;
      lower.push_back(q);
    } else {
      stage = S - 1;
    }
    int owner = stage % p_;
    owner_pp_.push_back(owner);
    if (owner == r_) {
      owned_.push_back(q);
      norm_params_.push_back(q);
    }
  }
  // The tied head's copy of the lower root on the last stage (rank p-1; the first is rank 0).
  if (model.head_reads_lower_root()) {
    tied_ = lower;
    if (r_ == p_ - 1) owned_.insert(owned_.end(), lower.begin(), lower.end());
  }

  // The model's flat buffers shrink to this rank's parameters before the optimizer takes views of
  // them: the other stages' parameters, gradients and optimizer state are never held here. Under
  // ZeRO-3 they shrink further, to the stage's parameters this dp rank steps (placed first): the
  // stage's others are gathered for the micro-batches of a step only (gather_stage).
  ac_ = ac;
  std::vector<int64_t> sizes;
  for (nn::Parameter* q : owned_) sizes.push_back(shape_numel(q->shape));
  // Under tp (the model being this rank's shard) the dp placement must agree between the tp ranks:
  // ZeRO-1/2/3 place whole parameters on dp ranks by size, and an uneven tp split (the vocabulary,
  // the MLP) makes a shard's local sizes differ between the tp ranks. A tp-replicated parameter is
  // stepped alike on both, a checkpoint's gathers over tp pair up by name, the partial gradients
  // TensorParallel::finish_backward sums are those each rank holds (under ZeRO-3 the ones it
  // keeps), and under ZeRO-3 the flat buffers below keep them: every tp rank places by the
  // group's largest local size (as f32: exact below 2^24 elements, and the same bits on every
  // rank whatever the size).
  if (zero1_ && ms.tp > 1) {
    std::vector<float> most;
    for (int64_t n : sizes) most.push_back(float(n));
    Tensor t = Tensor::from_vector(most, {int64_t(most.size())});
    mesh.axis("tp")->all_reduce(t, comm::ReduceOp::max);
    for (size_t i = 0; i < sizes.size(); ++i) sizes[i] = int64_t(t.f32()[i]);
  }
  if (zero3_) dp_owner_ = place_on_dp(sizes);
  std::set<nn::Parameter*> mine;
  for (size_t i = 0; i < owned_.size(); ++i)
    if (!zero3_ || dp_owner_[i] == dp_comm_->rank()) mine.insert(owned_[i]);
  model_.retain_parameters([&](const nn::Parameter& q) { return mine.count(const_cast<nn::Parameter*>(&q)) > 0; });
  place_optimizer(sizes);
  stale_ = true;
}

std::vector<int> PipelineParallel::place_on_dp(const std::vector<int64_t>& sizes) const {
  // Largest first onto the least loaded dp rank (ties: the lowest), the same on every rank.
  const int D = dp_comm_->size();
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> load(size_t(D), 0);
  std::vector<int> owner(sizes.size(), 0);
  for (size_t i : order) {
    int best = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = best;
    load[size_t(best)] += sizes[i];
  }
  return owner;
}

void PipelineParallel::place_optimizer(const std::vector<int64_t>& sizes) {
  // ZeRO-1 over dp: each owned parameter's optimizer state on one dp rank (largest first onto the
  // least loaded), the updated values broadcast from there after each step. ZeRO-2 places them
  // alike, and its reduce-scatter leaves each parameter's averaged gradient on that rank only.
  std::vector<nn::Parameter*> stepped = owned_;
  if (zero1_) {
    dp_owner_ = place_on_dp(sizes);
    stepped.clear();
    for (size_t i = 0; i < owned_.size(); ++i)
      if (dp_owner_[i] == dp_comm_->rank()) stepped.push_back(owned_[i]);
  }
  // Any optimizer composes: a rank steps whole parameters, each with the state one rank would give
  // it (a matrix optimizer's whole-matrix update included), under the one-rank state names.
  std::vector<ParamRef> refs;
  for (nn::Parameter* q : stepped) refs.push_back({q->name, q->value, q->grad, q->role});
  if (make_opt_) opt_ = make_opt_(std::move(refs));
  else opt_ = std::make_unique<AdamW>(std::move(refs), ac_);
}

void PipelineParallel::release_unowned() {
  // The other stages' values, bound by bind_unowned for an evaluation, a sample or a load, go.
  for (nn::Parameter* q : unowned()) q->value = Tensor();
  full_resident_ = false;
  stale_ = true;
}

std::vector<nn::Parameter*> PipelineParallel::unowned() {
  std::set<nn::Parameter*> mine(owned_.begin(), owned_.end());
  std::vector<nn::Parameter*> out;
  for (nn::Parameter* q : model_.parameters())
    if (!mine.count(q)) out.push_back(q);
  return out;
}

void PipelineParallel::bind_unowned() {
  // Values only, outside the flat buffers and without gradients: what evaluation and sampling read.
  for (nn::Parameter* q : unowned())
    if (!q->value.defined()) q->value = Tensor::zeros(q->shape);
}

PipelineParallel::~PipelineParallel() = default;

std::string PipelineParallel::name() const {
  const char* dp = rep_comm_ ? "hsdp" : zero3_ ? "zero3" : zero2_ ? "zero2" : zero1_ ? "zero1" : "ddp";
  return fmt::format("pipeline {} (pp = {}{}{}){}", sched_.name, p_, v_ > 1 ? fmt::format(", {} chunks", v_) : "",
                     tp_ ? fmt::format(", tp = {}", tp_->size()) : "",
                     dp_comm_ ? fmt::format(" x {} over dp{} = {}", dp, cp_ > 1 ? " x cp" : "", dp_comm_->size()) +
                                    (rep_comm_ ? fmt::format(", {} replicas", rep_comm_->size()) : "")
                              : "");
}

void PipelineParallel::zero_grad() {
  for (nn::Parameter* q : owned_)  // the others' gradient pages stay released (ZeRO-3: gather_stage zeroes its own)
    if (q->grad.defined()) q->grad.zero();
}

void PipelineParallel::gather_stage() {
  // ZeRO-3: the stage's parameters this dp rank does not step are bound (values and zeroed
  // gradients, outside the flat buffers) and every one is all-gathered from its dp owner: one
  // buffer, chunk d packing what dp rank d steps (as reduce_scatter_grads packs the gradients).
  // Kept gathered across the step's micro-batches: the schedule runs a stage's forwards and
  // backwards interleaved over them, and its gradients accumulate over all of them before the
  // one reduce-scatter, so a stage holds its whole gradient during the step anyway; a gather per
  // micro-batch would cost m all-gathers (2m with the backward's) to save the values only.
  const int D = dp_comm_->size(), me = dp_comm_->rank();
  bind_stage();
  std::vector<int64_t> load(size_t(D), 0);
  for (size_t i = 0; i < owned_.size(); ++i) load[size_t(dp_owner_[i])] += shape_numel(owned_[i]->shape);
  const int64_t most = *std::max_element(load.begin(), load.end());
  Tensor mine = Tensor::zeros({most}), all = Tensor::empty({int64_t(D) * most});
  int64_t o = 0;
  for (size_t i = 0; i < owned_.size(); ++i)
    if (dp_owner_[i] == me) {
      std::copy(owned_[i]->value.f32(), owned_[i]->value.f32() + owned_[i]->value.numel(), mine.f32() + o);
      o += owned_[i]->value.numel();
    }
  dp_comm_->all_gather(mine, all);
  std::vector<int64_t> at(size_t(D), 0);
  for (size_t i = 0; i < owned_.size(); ++i) {
    const int d = dp_owner_[i];
    const int64_t n = shape_numel(owned_[i]->shape);
    const float* from = all.f32() + d * most + at[size_t(d)];
    if (d != me) std::copy(from, from + n, owned_[i]->value.f32());
    at[size_t(d)] += n;
  }
  stage_gathered_ = true;
}

void PipelineParallel::bind_stage() {
  const int me = dp_comm_->rank();
  for (size_t i = 0; i < owned_.size(); ++i) {
    nn::Parameter* q = owned_[i];
    if (dp_owner_[i] == me) continue;
    if (!q->value.defined()) q->value = Tensor::empty(q->shape);
    q->grad = Tensor::zeros(q->shape);
    set_requires_grad(q->value, true, q->name, q->grad);
  }
}

void PipelineParallel::release_stage() {
  // ZeRO-3: what gather_stage bound goes; this rank keeps the parameters it steps.
  const int me = dp_comm_->rank();
  for (size_t i = 0; i < owned_.size(); ++i)
    if (dp_owner_[i] != me) owned_[i]->value = Tensor(), owned_[i]->grad = Tensor();
  stage_gathered_ = false;
}

std::vector<nn::Parameter*> PipelineParallel::resident() const {
  std::vector<nn::Parameter*> out;
  for (size_t i = 0; i < owned_.size(); ++i)
    if (!zero3_ || dp_owner_[i] == dp_comm_->rank()) out.push_back(owned_[i]);
  return out;
}

double PipelineParallel::forward_backward(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  ATOLL_CHECK(int(inputs.size()) == m_ && int(targets.size()) == m_,
              "the pipeline was laid out for {} micro-batches (train.grad_accum), got {}", m_, inputs.size());
  if (full_resident_) release_unowned();  // after an evaluation, a checkpoint or a load
  if (zero3_) gather_stage();  // released by finish_backward
  const int S = p_ * v_;
  const int next = (r_ + 1) % p_, prev = (r_ + p_ - 1) % p_;
  // Tags: one per (direction, micro-batch, sending stage), in a window that alternates by step.
  const int base = int(steps_run_ % 2) * (2 * S * m_);
  auto tag = [&](bool grad, int mb, int stage) { return base + (stage * m_ + mb) * 2 + (grad ? 1 : 0); };
  std::vector<comm::WorkPtr> sends;
  spans_.clear();
  double loss_sum = 0, aux_sum = 0;
  auto& inflight = impl_->inflight;
  inflight.clear();
  for (const PipeAction& a : sched_.ranks[size_t(r_)]) {
    const int s = a.chunk * p_ + r_;
    InFlight& f = inflight[{a.mb, a.chunk}];
    double t0 = now_s();
    if (a.op == PipeOp::forward) {
      stages_->stage_begin(inputs[size_t(a.mb)].shape());
      Tensor x;
      if (s == 0) {
        TapeScope scope(f.tape);
        t0 = now_s();
        x = stages_->stage_input(inputs[size_t(a.mb)]);
      } else {
        x = Tensor::empty(stages_->stage_hidden_shape(inputs[size_t(a.mb)].shape()));
        pp_p2p_->recv(x, prev, tag(false, a.mb, s - 1));
        t0 = now_s();
        set_requires_grad(x, true, fmt::format("pipeline input of stage {}", s));
        f.in = x;
      }
      TapeScope scope(f.tape);
      const auto& [first, last] = blocks_[size_t(s)];
      Tensor y = stages_->stage_blocks(x, first, last);
      f.aux = stages_->stage_take_aux_loss();
      if (f.aux.defined()) aux_sum += double(f.aux.item());
      if (s == S - 1) {
        f.loss = stages_->stage_loss(y, targets[size_t(a.mb)]);
        loss_sum += double(f.loss.item());
      } else {
        f.out = y;
        sends.push_back(pp_p2p_->send_async(y, next, tag(false, a.mb, s)));
      }
    } else if (a.op == PipeOp::backward) {
      Tensor g;
      if (s < S - 1) {
        g = Tensor::empty(f.out.shape());
        pp_p2p_->recv(g, next, tag(true, a.mb, s + 1));
      }
      t0 = now_s();
      {
        TapeScope scope(f.tape);
        std::unique_ptr<WeightGradDeferral> defer;
        if (sched_.split_backward) defer = std::make_unique<WeightGradDeferral>();
        // The auxiliary losses are a second root of this backward: one process adds them to the
        // loss, whose seed 1/m reaches each of them unchanged through the additions.
        if (f.aux.defined() && requires_grad(f.aux)) grad_buffer(f.aux).fill(1.f / float(m_));
        if (s == S - 1) backward(f.loss, 1.f / float(m_));
        else backward(f.out, g);
        if (defer) f.weight_work = defer->take();
      }
      if (s > 0) {
        Tensor gi = grad_of(f.in);
        if (!gi.defined()) gi = Tensor::zeros(f.in.shape());  // the stage ignored its input
        sends.push_back(pp_p2p_->send_async(gi, prev, tag(true, a.mb, s)));
      }
      f.out = Tensor();
      f.loss = Tensor();
      f.aux = Tensor();
      if (!sched_.split_backward) inflight.erase({a.mb, a.chunk});
    } else {
      for (auto& w : f.weight_work) w();
      inflight.erase({a.mb, a.chunk});
    }
    spans_.push_back({a.op, a.mb, a.chunk, t0, now_s()});
  }
  for (auto& w : sends) w->wait();
  ++steps_run_;
  // The mean loss (the last stage's cross-entropy and every stage's auxiliary losses) on every
  // stage. Without auxiliary losses only the last stage's term is nonzero: the sum is its bits.
  Tensor mine = split_double(((r_ == p_ - 1 ? loss_sum : 0.0) + aux_sum) / double(m_));
  Tensor all = Tensor::empty({2 * int64_t(p_)});
  pp_comm_->all_gather(mine, all);
  double total = 0;
  for (int i = 0; i < p_; ++i) total += double(all.f32()[2 * i]) + double(all.f32()[2 * i + 1]);
  return total;
}

void PipelineParallel::finish_backward() {
  // Tied embedding: the first and the last stage each add the other's gradient (a + b == b + a,
  // so both copies get the same bits and step alike).
  if (!tied_.empty() && (r_ == 0 || r_ == p_ - 1)) {
    const int peer = r_ == 0 ? p_ - 1 : 0;
    std::vector<Tensor> theirs;
    std::vector<comm::WorkPtr> ws;
    for (size_t i = 0; i < tied_.size(); ++i) {
      theirs.push_back(Tensor::empty(tied_[i]->shape));
      const int tag = (1 << 20) - 1 - int(i);  // above the activations' tags (see the constructor)
      ws.push_back(pp_p2p_->send_async(tied_[i]->grad, peer, tag));
      ws.push_back(pp_p2p_->recv_async(theirs.back(), peer, tag));
    }
    for (auto& w : ws) w->wait();
    for (size_t i = 0; i < tied_.size(); ++i) cpu::add_inplace(tied_[i]->grad.f32(), theirs[i].f32(), theirs[i].numel());
  }
  if (zero2_) {
    reduce_scatter_grads();
    if (rep_comm_) {  // HSDP: the shard's averages, averaged over the replicas
      std::vector<comm::WorkPtr> ws;
      for (nn::Parameter* q : resident()) ws.push_back(rep_comm_->all_reduce_async(q->grad, comm::ReduceOp::avg));
      for (auto& w : ws) w->wait();
    }
    if (zero3_) release_stage();  // each dp rank keeps its parameters and their averaged gradients
  } else if (dp_comm_) {
    std::vector<comm::WorkPtr> ws;
    for (nn::Parameter* q : owned_) ws.push_back(dp_comm_->all_reduce_async(q->grad, comm::ReduceOp::avg));
    for (auto& w : ws) w->wait();
  }
}

void PipelineParallel::reduce_scatter_grads() {
  // Chunk d of one buffer packs the gradients of the parameters dp rank d steps (each chunk as
  // long as the most loaded rank's, zero-padded); one reduce-scatter averages chunk d onto rank d,
  // and only its parameters' gradients are overwritten: the others keep this rank's unreduced
  // contribution, which nothing reads (the norm and the step use the reduced ones only). The
  // stage's whole gradient stays allocated: the micro-batches accumulate into it, as Megatron's
  // distributed optimizer keeps its main gradients until the last micro-batch's backward.
  const int D = dp_comm_->size(), me = dp_comm_->rank();
  std::vector<int64_t> load(size_t(D), 0);
  for (size_t i = 0; i < owned_.size(); ++i) load[size_t(dp_owner_[i])] += owned_[i]->grad.numel();
  const int64_t most = *std::max_element(load.begin(), load.end());
  Tensor all = Tensor::zeros({int64_t(D) * most}), mine = Tensor::empty({most});
  std::vector<int64_t> at(size_t(D), 0);
  for (size_t i = 0; i < owned_.size(); ++i) {
    const int d = dp_owner_[i];
    const int64_t n = owned_[i]->grad.numel();
    std::copy(owned_[i]->grad.f32(), owned_[i]->grad.f32() + n, all.f32() + d * most + at[size_t(d)]);
    at[size_t(d)] += n;
  }
  dp_comm_->reduce_scatter(all, mine, comm::ReduceOp::avg);
  int64_t o = 0;
  for (size_t i = 0; i < owned_.size(); ++i)
    if (dp_owner_[i] == me) {
      const int64_t n = owned_[i]->grad.numel();
      std::copy(mine.f32() + o, mine.f32() + o + n, owned_[i]->grad.f32());
      o += n;
    }
}

bool PipelineParallel::holds_reduced_grad(const nn::Parameter* q) const {
  if (!zero2_) return true;
  for (size_t i = 0; i < owned_.size(); ++i)
    if (owned_[i] == q) return dp_owner_[i] == dp_comm_->rank();
  return false;
}

void PipelineParallel::set_tensor_parallel(TensorParallel* tp) {
  tp_ = tp;  // (the constructor placed the parameters on dp ranks as the tp group agrees)
}

double PipelineParallel::grad_norm() {
  // Under tp the stage's sharded parameters add up over its tp group; replicated ones (equal on
  // the group's ranks after TensorParallel::finish_backward) count once.
  double sq = 0, sharded = 0;
  for (nn::Parameter* q : norm_params_)
    if (holds_reduced_grad(q)) (tp_ && tp_->sharded(q) ? sharded : sq) += cpu::sum_squares(q->grad.f32(), q->grad.numel());
  if (tp_) sq += tp_->sum(sharded);
  if (zero2_) {  // each dp rank holds its parameters' reduced gradients: their squares add up over dp
    Tensor part = split_double(sq), parts = Tensor::empty({2 * int64_t(dp_comm_->size())});
    dp_comm_->all_gather(part, parts);
    sq = 0;
    for (int i = 0; i < dp_comm_->size(); ++i) sq += double(parts.f32()[2 * i]) + double(parts.f32()[2 * i + 1]);
  }
  // Every stage's squared norm, summed in double on every rank (so all ranks agree bit for bit).
  Tensor mine = split_double(sq), all = Tensor::empty({2 * int64_t(p_)});
  pp_comm_->all_gather(mine, all);
  double total = 0;
  for (int i = 0; i < p_; ++i) total += double(all.f32()[2 * i]) + double(all.f32()[2 * i + 1]);
  return std::sqrt(total);
}

void PipelineParallel::step(const StepContext& ctx) {
  opt_->step(ctx);
  if (zero1_ && !zero3_) {  // ZeRO-3: the next step's gather_stage fetches the updated values
    std::vector<comm::WorkPtr> ws;
    for (size_t i = 0; i < owned_.size(); ++i) ws.push_back(dp_comm_->broadcast_async(owned_[i]->value, dp_owner_[i]));
    for (auto& w : ws) w->wait();
  }
  stale_ = true;
}

void PipelineParallel::sync_full_model() {
  if (zero3_ && !stage_gathered_) gather_stage();  // the stage's own first (collective over dp)
  bind_unowned();
  // Every parameter from its owner, in the model's order on every rank (the tied copy on the last
  // stage is overwritten with the same bits).
  std::vector<comm::WorkPtr> ws;
  auto params = model_.parameters();
  for (size_t k = 0; k < params.size(); ++k) ws.push_back(pp_comm_->broadcast_async(params[k]->value, owner_pp_[k]));
  for (auto& w : ws) w->wait();
  stale_ = false;
  full_resident_ = true;
}

void PipelineParallel::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                                  std::vector<std::pair<std::string, Tensor>>& opt_state) {
  // Rank 0 gathers the whole model (each parameter from its stage's first dp rank) and every
  // rank's optimizer state (its stages', its dp shard); the other ranks return nothing and never
  // hold the whole model. The tied copy and the step counter arrive more than once, equal, and
  // are kept once.
  std::vector<std::pair<std::string, Tensor>> mine_model, mine_opt;  // model: under file names
  auto params = model_.parameters();
  const nn::StateDictAdapter& a = model_.state_dict_adapter();
  // Under ZeRO-3 each parameter comes from the dp rank that holds it (and steps it).
  for (size_t k = 0; k < params.size(); ++k)
    if (owner_pp_[k] == r_ && (!rep_comm_ || rep_comm_->rank() == 0) &&
        (zero3_ ? holds_reduced_grad(params[k]) : !dp_comm_ || dp_comm_->rank() == 0))
      mine_model.emplace_back(a.to_file(params[k]->name), params[k]->value);
  // The last stage's tied copy too, to be compared with the first stage's below (not under tp or
  // ZeRO-3, whose gathers pair the stage's own parameters only).
  if (r_ == p_ - 1 && !tp_ && !zero3_ && (!rep_comm_ || rep_comm_->rank() == 0) && (!dp_comm_ || dp_comm_->rank() == 0))
    for (nn::Parameter* q : tied_) mine_model.emplace_back(a.to_file(q->name), q->value);
  opt_->save_state(mine_opt, "");
  // Under tp a stage's tp group gathers its shards into whole tensors first (collective over the
  // group: its ranks own the same parameters), and only its tp rank 0 sends them.
  const bool sender = !tp_ || tp_->rank() == 0;
  if (tp_) tp_->full_state(mine_model, mine_opt);
  model_sd.clear();
  opt_state.clear();
  if (rank() != 0) {
    if (!sender) mine_model.clear(), mine_opt.clear();
    send_named(*world_p2p_, mine_model, 0);
    send_named(*world_p2p_, mine_opt, 0);
    return;
  }
  std::map<std::string, Tensor> weights;
  std::set<std::string> have;
  auto merge = [&](std::vector<std::pair<std::string, Tensor>>&& m, std::vector<std::pair<std::string, Tensor>>&& o) {
    for (auto& [n, t] : m) {
      auto [it, fresh] = weights.emplace(n, t);
      // The tied head's copy on the last stage must hold the first stage's bits (its gradient is
      // summed with theirs, so both step alike; across islands lowcomm agrees their outer step):
      // a copy that parted is said, since only the first stage's is saved.
      if (!fresh && it->second.nbytes() == t.nbytes() &&
          std::memcmp(it->second.contiguous().raw(), t.contiguous().raw(), t.nbytes()) != 0)
        log::warn("pipeline checkpoint: the last stage's tied copy of {} differs from the first stage's", n);
    }
    for (auto& [n, t] : o)
      if (have.insert(n).second) opt_state.emplace_back(n, t);
  };
  merge(std::move(mine_model), std::move(mine_opt));
  for (int src = 1; src < world(); ++src) {
    auto m = recv_named(*world_p2p_, src);
    merge(std::move(m), recv_named(*world_p2p_, src));
  }
  for (nn::Parameter* q : params) {
    auto it = weights.find(a.to_file(q->name));
    ATOLL_CHECK(it != weights.end(), "pipeline checkpoint: no stage sent {}", q->name);
    model_sd.emplace_back(it->first, it->second);
  }
}

void PipelineParallel::load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd,
                                       const TensorFile& opt_state, const std::string& what) {
  bind_unowned();  // the whole file is checked; the others' values go with the next step
  if (zero3_) bind_stage(), stage_gathered_ = true;  // and the stage's own, which the file holds too
  model_.load_state_dict(model_sd, what);
  opt_->load_state(opt_state, "");
  stale_ = false;
  full_resident_ = true;
}

}  // namespace atl::parallel
