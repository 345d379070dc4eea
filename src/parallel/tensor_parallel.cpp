#include "parallel/tensor_parallel.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <map>

#include "autograd/graph.h"
#include "core/log.h"
#include "kernels/cpu/kernels.h"
#include "optim/param_groups.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/optim/placement.h"
#include "parallel/optim/tp_whole_matrix.h"
#include "parallel/pipeline.h"
#include "parallel/zero.h"

namespace atl::parallel {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A double through an f32 all-reduce as two floats (high part and remainder): ~1e-14 relative.
double sum_double(comm::Communicator* c, double x) {
  Tensor t = Tensor::empty({2});
  t.f32()[0] = float(x);
  t.f32()[1] = float(x - double(t.f32()[0]));
  c->all_reduce(t);
  return double(t.f32()[0]) + double(t.f32()[1]);
}
}  // namespace

TensorParallel::TensorParallel(comm::Communicator* comm, bool sequence_parallel)
    : comm_(comm && comm->size() > 1 ? comm : nullptr), sp_(sequence_parallel) {
  if (comm_) {
    rank_ = comm_->rank();
    size_ = comm_->size();
  }
}

TensorParallel::~TensorParallel() = default;

std::unique_ptr<TensorParallel> TensorParallel::apply(std::unique_ptr<nn::Model>& model, Mesh& mesh,
                                                      bool sequence_parallel) {
  const int64_t tp = mesh.shape().tp;
  nn::ParallelPlan plan = model->parallelize();
  ATOLL_CHECK(plan.make_tp_shard, "parallel.tp = {}: model family '{}' cannot build a tensor-parallel shard (its "
              "parallelize() gives no make_tp_shard)", tp, model->family());
  std::map<std::string, Shape> full;
  for (nn::Parameter* p : model->parameters()) full[p->name] = p->shape;
  auto ctx = std::make_unique<TensorParallel>(mesh.axis("tp"), sequence_parallel);
  ATOLL_CHECK(ctx->size() == tp, "tensor parallel: the tp group has {} ranks, the mesh says {}", ctx->size(), tp);
  std::unique_ptr<nn::Model> shard = plan.make_tp_shard(*ctx);  // throws, naming parallel.tp, on a bad layout
  for (nn::Parameter* p : shard->parameters()) {
    auto it = full.find(p->name);
    ATOLL_CHECK(it != full.end(), "tensor parallel: the shard has parameter {} the model has not", p->name);
    nn::ShardRule rule = nn::shard_rule(plan, p->name, it->second);
    Shape want = nn::shard_shape(rule, it->second, ctx->rank(), ctx->size());
    ATOLL_CHECK(want == p->shape, "tensor parallel: {} is {} on rank {}, the plan says {}", p->name,
                shape_str(p->shape), ctx->rank(), shape_str(want));
    // Under sequence parallelism every replicated parameter (norms, biases after the row-parallel
    // sum, positions) sees only this rank's tokens: its gradient is a part of the whole.
    ctx->params_.push_back({p, rule, it->second, !rule.sharded() && sequence_parallel && ctx->size() > 1});
  }
  ctx->model_ = shard.get();
  model = std::move(shard);
  return ctx;
}

std::unique_ptr<TensorParallel> apply_tensor_parallel(Config& cfg, std::unique_ptr<nn::Model>& model, Mesh& mesh,
                                                      const std::string& strategy, int64_t tokens) {
  const bool sp = cfg.get_bool("parallel.sequence_parallel", true);
  const int64_t tp = mesh.shape().tp;
  if (tp == 1) return nullptr;
  ATOLL_CHECK(strategy == "ddp" || strategy == "zero1" || strategy == "zero2" || strategy == "zero3" ||
                  strategy == "hsdp",
              "parallel.tp = {} composes with parallel.strategy = 'ddp', 'zero1', 'zero2', 'zero3' or 'hsdp' over "
              "the data-parallel axis, not '{}'", tp, strategy);
  // Every group's optimizer, not only the hidden matrices': a table optimizer (Ember) takes
  // statistics over the vocabulary's rows, which the vocab-parallel embedding and head split. A
  // whole-matrix type runs in its tp form (parallel/optim/tp_whole_matrix.h), which gathers whole
  // parameters over tp; ZeRO and HSDP over dp would then hand it flat chunks of tp's blocks, so
  // there it is refused (a pipeline's ZeRO places whole parameters: it composes), except for the
  // hidden-matrix types whose ZeRO form also gathers over tp (sharded_muon.h: Muon, PRMuon).
  const OptimizerRoute route = optimizer_route(cfg);
  std::string elementwise;
  for (const std::string& n : optimizer_registry().names())
    if (optimizer_registry().get(n).elementwise) elementwise += (elementwise.empty() ? "" : ", ") + n;
  const bool flat_chunks = strategy != "ddp" && mesh.shape().pp == 1;
  std::string zero_tp;  // the hidden-matrix types ZeRO shards with their split matrices updated whole
  for (const std::string& n : sharded_placements().names())
    if (!optimizer_registry().get(n).elementwise) zero_tp += (zero_tp.empty() ? "'" : ", '") + n + "'";
  for (auto [key, type] : {std::pair<const char*, const std::string*>{"optim.type", &route.hidden},
                           {"optim.embed", &route.embed}, {"optim.head", &route.head}, {"optim.vector", &route.vector}}) {
    if (optimizer_registry().get(*type).elementwise) continue;
    ATOLL_CHECK(tensor_parallel_placements().has(*type),
                "parallel.tp = {}: {} = '{}' works on whole matrices or tables, which tensor parallelism splits over "
                "ranks, and has no tensor-parallel form; use an elementwise optimizer ({})", tp, key, *type, elementwise);
    const bool sharded_over_tp = key == std::string("optim.type") && sharded_placements().has(*type);
    ATOLL_CHECK(!flat_chunks || sharded_over_tp,
                "parallel.tp = {}: {} = '{}' works on whole matrices or tables, which tensor parallelism splits over "
                "ranks and parallel.strategy = '{}' shards in flat chunks of those pieces: its tensor-parallel form "
                "runs under parallel.strategy = 'ddp' (or with parallel.pp > 1), and ZeRO's only for optim.type = {}; "
                "use 'ddp' or an elementwise optimizer ({})", tp, key, *type, strategy, zero_tp, elementwise);
  }
  ATOLL_CHECK(cfg.get_string("train.dtype", "f32") == "f32", "parallel.tp = {}: train.dtype = '{}': the "
              "tensor-parallel linears compute in fp32 only in this build", tp, cfg.get_string("train.dtype", "f32"));
  // Under cp x tp sequence parallelism splits each cp rank's share of the batch (its head and tail
  // chunks of every row) over the tp group (docs/context_parallel.md).
  const int64_t cp = mesh.shape().cp;
  ATOLL_CHECK(!sp || (tokens % cp == 0 && (tokens / cp) % tp == 0), "parallel.sequence_parallel = true: a "
              "micro-batch of train.batch_size x train.seq_len = {} tokens{} does not split over parallel.tp = {} "
              "ranks; make it a multiple of {} or set parallel.sequence_parallel = false", tokens,
              cp > 1 ? fmt::format(" over parallel.cp = {} (each cp rank's share split over tp)", cp) : "", tp, tp * cp);
  auto ctx = TensorParallel::apply(model, mesh, sp);
  log::info("tensor parallel: tp = {}, sequence parallel {}", tp, sp ? "on" : "off");
  return ctx;
}

comm::Communicator* data_parallel_comm(Mesh& mesh) {
  // cp x tp: the ranks with this tp coordinate over dp x cp (cp ranks average their gradients as
  // data-parallel ones do, their losses scaled by loss_share).
  if (mesh.shape().cp > 1) return mesh.group({"dp_replicate", "dp_shard", "cp"});
  if (mesh.shape().dp_shard > 1 && mesh.shape().dp_replicate > 1) return mesh.group({"dp_replicate", "dp_shard"});
  return mesh.axis(mesh.shape().dp_shard > 1 ? "dp_shard" : "dp_replicate");
}

void TensorParallel::begin_forward(int64_t B, int64_t T) const {
  B_ = B;
  T_ = T;
  sharded_ = sp_ && size_ > 1 && (B * T) % size_ == 0;
  if (sp_ && size_ > 1 && !sharded_)
    ATOLL_CHECK(!grad_enabled(), "parallel.sequence_parallel = true: a batch of {} x {} = {} tokens does not split "
                "over parallel.tp = {} ranks; make train.batch_size x train.seq_len a multiple of {} or set "
                "parallel.sequence_parallel = false", B, T, B * T, size_, size_);
  if (grad_enabled()) issued_.clear();
}

void TensorParallel::wait(const comm::WorkPtr& w, bool overlapped) const {
  double t0 = now_s();
  w->wait();
  double dt = now_s() - t0;
  stats_.wait_s += dt;
  if (overlapped) stats_.wait_overlapped_s += dt;
  ++stats_.collectives;
}

void TensorParallel::note(int kind, int64_t numel, bool overlapped) const {
  issued_.push_back({kind, numel, overlapped});
}

TpCollectiveTimes TensorParallel::time_collectives() {
  TpCollectiveTimes t;
  if (!comm_) return t;
  comm_->barrier();
  for (const Issued& c : issued_) {
    Tensor a = Tensor::zeros({c.numel}), b = Tensor::zeros({c.numel * size_});
    double t0 = now_s();
    if (c.kind == 0) comm_->all_reduce(a);
    else if (c.kind == 1) comm_->all_gather(a, b);
    else comm_->reduce_scatter(b, a);
    double dt = now_s() - t0;
    t.all_s += dt;
    if (c.overlapped) t.overlappable_s += dt;
  }
  return t;
}

void TensorParallel::finish_backward() {
  if (!comm_ || per_unit_) return;  // per_unit_: summed before each unit's reduce-scatter (attach)
  // (A pipeline stage holds only its own parameters: the others have no gradient here.)
  auto partial = [](const ParamInfo& pi) { return pi.partial && pi.p->grad.defined(); };
  int64_t n = 0;
  for (auto& pi : params_)
    if (partial(pi)) n += pi.p->grad.numel();
  if (n == 0) return;
  Tensor buf = Tensor::empty({n});
  int64_t o = 0;
  for (auto& pi : params_)
    if (partial(pi)) {
      buf.slice(0, o, o + pi.p->grad.numel()).copy_from(pi.p->grad.contiguous().flatten());
      o += pi.p->grad.numel();
    }
  comm_->all_reduce(buf);
  o = 0;
  for (auto& pi : params_)
    if (partial(pi)) {
      pi.p->grad.copy_from(buf.slice(0, o, o + pi.p->grad.numel()).view(pi.p->grad.shape()));
      o += pi.p->grad.numel();
    }
}

double TensorParallel::grad_norm() {
  double sharded = 0, replicated = 0;
  for (auto& pi : params_) {
    Tensor g = pi.p->grad.contiguous();
    double s = 0;
    for (int64_t i = 0; i < g.numel(); ++i) s += double(g.f32()[i]) * double(g.f32()[i]);
    (pi.rule.sharded() ? sharded : replicated) += s;
  }
  if (comm_) sharded = sum_double(comm_, sharded);
  return std::sqrt(sharded + replicated);
}

bool TensorParallel::sharded(const nn::Parameter* p) const {
  for (auto& pi : params_)
    if (pi.p == p) return pi.rule.sharded();
  return false;
}

double TensorParallel::sum(double x) { return comm_ ? sum_double(comm_, x) : x; }

bool TensorParallel::sums_before(const DataParallel& dp) const {
  const Zero* z = dynamic_cast<const Zero*>(&dp);
  return comm_ && z && z->stage() == 2 && dp.world() > 1;
}

double TensorParallel::grad_norm(DataParallel& dp) {
  if (auto* pipe = dynamic_cast<PipelineParallel*>(&dp)) return pipe->grad_norm();
  const Zero* z = dynamic_cast<const Zero*>(&dp);
  if (!z || z->stage() < 2 || dp.world() == 1 || z->shard_size() == 1) return grad_norm();
  const auto ranges = z->reduced_grad_ranges();
  const float* g0 = model_->flat_grads().f32();
  double sharded = 0, replicated = 0;
  for (auto& pi : params_) {
    const int64_t lo = pi.p->grad.f32() - g0, hi = lo + pi.p->grad.numel();
    double s = 0;
    for (auto [a, b] : ranges)
      if (std::max(a, lo) < std::min(b, hi)) s += cpu::sum_squares(g0 + std::max(a, lo), std::min(b, hi) - std::max(a, lo));
    (pi.rule.sharded() ? sharded : replicated) += s;
  }
  // Over dp: the chunks make up each parameter once (over one replica's shard group under HSDP,
  // whose replicas hold the same chunks). Over tp: the sharded parts add up; the replicated ones
  // are the same parameters on every tp rank (their sums equal up to the order of the chunks),
  // counted once as their mean so that every rank gets the same bits.
  comm::Communicator* chunks = z->shard_comm();
  const double total = sum_double(chunks, sharded) + sum_double(chunks, replicated) / double(size_);
  return std::sqrt(comm_ ? sum_double(comm_, total) : total);
}

bool TensorParallel::any(bool mine) {
  if (!comm_) return mine;
  Tensor t = Tensor::full({1}, mine ? 1.f : 0.f);
  comm_->all_reduce(t, comm::ReduceOp::max);
  return t.item() > 0;
}

const TensorParallel::ParamInfo* TensorParallel::info_of(const std::string& name) const {
  for (auto& pi : params_)
    if (pi.p->name == name) return &pi;
  return nullptr;
}

Tensor TensorParallel::gather_full(const ParamInfo& pi, const Tensor& local) const {
  Tensor full = Tensor::empty(pi.full, local.dtype());
  if (!comm_) {
    full.copy_from(local);
    return full;
  }
  int64_t most = 0;
  for (int q = 0; q < size_; ++q) most = std::max(most, shape_numel(nn::shard_shape(pi.rule, pi.full, q, size_)));
  Tensor pad = Tensor::zeros({most}, local.dtype()), all = Tensor::empty({most * size_}, local.dtype());
  pad.slice(0, 0, local.numel()).copy_from(local.contiguous().flatten());
  comm_->all_gather(pad, all);
  for (int q = 0; q < size_; ++q) {
    Shape s = nn::shard_shape(pi.rule, pi.full, q, size_);
    nn::put_shard(full, all.slice(0, most * q, most * q + shape_numel(s)).view(s), pi.rule, q, size_);
  }
  return full;
}

bool TensorParallel::sharded(const std::string& param) const {
  const ParamInfo* pi = info_of(param);
  return pi && pi->rule.sharded();
}

Shape TensorParallel::full_shape(const std::string& param) const {
  const ParamInfo* pi = info_of(param);
  ATOLL_CHECK(pi, "tensor parallel: the shard has no parameter {}", param);
  return pi->full;
}

Tensor TensorParallel::gather(const std::string& param, const Tensor& local) const {
  const ParamInfo* pi = info_of(param);
  ATOLL_CHECK(pi && pi->rule.sharded() && local.shape() == pi->p->shape, "tensor parallel: {} is not split over "
              "the tp group, or {} is not its local shape", param, shape_str(local.shape()));
  return gather_full(*pi, local);
}

Tensor TensorParallel::take(const std::string& param, const Tensor& whole) const {
  const ParamInfo* pi = info_of(param);
  ATOLL_CHECK(pi && pi->rule.sharded() && whole.shape() == pi->full, "tensor parallel: {} is not split over the "
              "tp group, or {} is not its full shape", param, shape_str(whole.shape()));
  return nn::take_shard(whole, pi->rule, rank_, size_);
}

namespace {
// "transformer.h.0.attn.c_attn.weight.exp_avg" -> "transformer.h.0.attn.c_attn.weight"
std::string owner_of(const std::string& key) {
  size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}
}  // namespace

const TensorParallel::ParamInfo* TensorParallel::sharded_owner(const std::string& entry) const {
  std::string owner = owner_of(entry);
  const ParamInfo* pi = info_of(owner);
  // A grouped optimizer prefixes its groups' entries with the group's type ("adamw.", "lion.").
  if (!pi && owner.find('.') != std::string::npos) pi = info_of(owner.substr(owner.find('.') + 1));
  if (!pi || !pi->rule.sharded()) return nullptr;
  for (const std::string& w : whole_state_)
    if (w == pi->p->name) return nullptr;
  return pi;
}

void TensorParallel::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                                std::vector<std::pair<std::string, Tensor>>& opt_state) {
  // Every rank walks the same names in the same order: the gathers pair up.
  const nn::StateDictAdapter& names = model_->state_dict_adapter();
  for (auto& [name, t] : model_sd)
    if (const ParamInfo* pi = info_of(names.from_file(name)); pi && pi->rule.sharded()) t = gather_full(*pi, t);
  for (auto& [name, t] : opt_state)
    if (const ParamInfo* pi = sharded_owner(name); pi && t.shape() == pi->p->shape) t = gather_full(*pi, t);
}

void TensorParallel::local_state(std::vector<std::pair<std::string, Tensor>>& model_sd, TensorFile& opt_state) {
  const nn::StateDictAdapter& names = model_->state_dict_adapter();
  for (auto& [name, t] : model_sd)
    if (const ParamInfo* pi = info_of(names.from_file(name)); pi && pi->rule.sharded()) {
      ATOLL_CHECK(t.shape() == pi->full, "checkpoint: {} is {}, the model's {}", name, shape_str(t.shape()),
                  shape_str(pi->full));
      t = nn::take_shard(t.dtype() == DType::f32 ? t : t.to(DType::f32), pi->rule, rank_, size_);
    }
  for (auto& [name, t] : opt_state.tensors)
    if (const ParamInfo* pi = sharded_owner(name); pi && t.shape() == pi->full) t = nn::take_shard(t, pi->rule, rank_, size_);
}

}  // namespace atl::parallel
