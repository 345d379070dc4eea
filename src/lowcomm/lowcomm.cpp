// The islands' common machinery: config, sub-communicators, sharded averaging across islands,
// metrics, checkpoint state; see lowcomm.h.
#include "lowcomm/lowcomm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/compressed_allreduce.h"
#include "core/log.h"
#include "lowcomm/codec_checkpoint.h"
#include "lowcomm/diloco.h"

namespace atl::lowcomm {

using Clock = std::chrono::steady_clock;

std::unique_ptr<LowCommConfig> LowCommConfig::from_config(Config& cfg, int64_t islands) {
  auto c = std::make_unique<LowCommConfig>();
  bool named = cfg.has("lowcomm.method");
  c->method = cfg.get_string("lowcomm.method", c->method, method_registry().names());
  c->inner_steps = cfg.get_int("lowcomm.inner_steps", c->inner_steps, 1, 1 << 30);
  c->outer_lr = cfg.get_float("lowcomm.outer_lr", c->outer_lr, 0.0, 100.0);
  c->outer_momentum = cfg.get_float("lowcomm.outer_momentum", c->outer_momentum, 0.0, 0.999999);
  c->nesterov = cfg.get_bool("lowcomm.nesterov", c->nesterov);
  c->codec = exchange_spec(cfg);
  c->exchange = c->codec.none() ? "fp32" : c->codec.codec;
  if (c->method == "streaming") {
    c->fragments = cfg.get_int("lowcomm.fragments", c->fragments, 1, 1 << 20);
    c->overlap_steps = cfg.get_int("lowcomm.overlap_steps", c->overlap_steps, 0, 1 << 30);
    c->mixing = cfg.get_float("lowcomm.mixing", c->mixing, 0.0, 1.0);
    ATOLL_CHECK(c->overlap_steps < c->inner_steps,
                "lowcomm.overlap_steps = {} ({}) must be below lowcomm.inner_steps = {}: a fragment's exchange "
                "is applied before its next one starts",
                c->overlap_steps, cfg.where("lowcomm.overlap_steps"), c->inner_steps);
    ATOLL_CHECK(c->fragments <= c->inner_steps,
                "lowcomm.fragments = {} ({}) must not exceed lowcomm.inner_steps = {} (one fragment starts per "
                "H / P steps)", c->fragments, cfg.where("lowcomm.fragments"), c->inner_steps);
  }
  if (c->method == "isoloco") {
    c->merge = cfg.get_string("lowcomm.merge", c->merge, {"iso_c", "average"});
    c->merge_scope = cfg.get_string("lowcomm.merge_scope", c->merge_scope, {"hidden", "all"});
  }
  c->drop_at_sync = cfg.get_int("fault.island_drop_at_sync", 0, 0);
  c->sync = SyncPolicyConfig::from_config(cfg, c->inner_steps);
  ATOLL_CHECK(c->sync.policy == "fixed" || c->method != "streaming",
              "lowcomm.sync_policy = '{}' ({}): streaming syncs its fragments on its own staggered schedule; use "
              "'fixed' with it", c->sync.policy, cfg.where("lowcomm.sync_policy"));
  if (islands == 1 && !named) return nullptr;
  return c;
}

void outer_sgd(float* x, float* b, const float* d, int64_t n, const LowCommConfig& c) {
  const float lr = float(c.outer_lr), mu = float(c.outer_momentum);
  if (mu == 0.f) {
    for (int64_t i = 0; i < n; ++i) x[i] -= lr * d[i];
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    b[i] = mu * b[i] + d[i];
    float u = c.nesterov ? d[i] + mu * b[i] : b[i];
    x[i] -= lr * u;
  }
}

LowComm::LowComm(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world, Config& cfg)
    : c_(c), world_(world) {
  islands_ = int(mesh.shape().island);
  island_ = int(mesh.coord("island"));
  if (world_) {
    // Island-major rank order (mesh.h): the island's ranks are contiguous.
    island_comm_ = world_->split(island_, world_->rank());
    across_ = mesh.axis("island");
  }
  // Every rank's exchange settings compared first, so a codec one island lacks (or sets
  // differently) is refused on every rank before step 1, each rank's setting named.
  if (world_ && world_->size() > 1) comm::exchange_codec_spec(*world_, c_.codec, "lowcomm.exchange");
  std::string w = c_.codec.where.empty() ? "lowcomm.exchange" : "lowcomm.exchange (" + c_.codec.where + ")";
  setup_tensor_parallel(mesh);
  setup_pipeline(mesh);  // pp inside the islands: the stage's dp ranks share the exchange
  if (world_) {  // for HSDP inside the islands (sharded_islands.cpp); split here, on every rank alike
    // cp x HSDP: a shard group is dp_shard x cp (the cp ranks of a replica cut its chunks too, zero.cpp).
    shard_axis_ = mesh.shape().cp > 1 ? mesh.group({"dp_shard", "cp"}) : mesh.axis("dp_shard");
    replica_axis_ = mesh.axis("dp_replicate");
  }
  exchange_ = exchange_registry().get(c_.exchange, w)(c_.codec);
  exchange_->setup(across_);
  sched_ = make_sync_controller(c_.sync);
}

LowComm::~LowComm() = default;

void LowComm::attach(nn::Model& model, const std::string& strategy, const parallel::TensorParallel* tp,
                     std::vector<std::pair<int64_t, int64_t>> owned) {
  ATOLL_CHECK(strategy == "ddp" || strategy == "zero1" || strategy == "zero2" || strategy == "zero3" ||
                  strategy == "hsdp",
              "lowcomm.method = '{}' has no exchange for parallel.strategy = '{}' inside the islands: use ddp, zero1, "
              "zero2, zero3 or hsdp", c_.method, strategy);
  model_ = &model;
  tp_ctx_ = tp;
  flat_ = model.flat_values();
  attach_shards(std::move(owned), strategy);
  attach_pipeline(strategy);
  // Islands initialise alike from the seed; island 0's parameters make sure of it.
  Tensor x = local_values();
  if (across_ && across_->size() > 1) {
    across_->broadcast(x, 0);
    set_local_values(x);
  }
  global_ = x.clone();
  mom_ = Tensor::zeros({x.numel()});
  if (tp)
    for (nn::Parameter* p : model.parameters())
      if (!tp->sharded(p) && in_flat(p)) {  // under pp: the stage's own
        const int64_t at = p->value.f32() - flat_.f32();
        replicated_.emplace_back(at, at + p->value.numel());
      }
  on_attach();
  window_start_ = Clock::now();
  window_open_ = true;
}

nlohmann::json LowComm::after_step(int64_t step) {
  ATOLL_CHECK(model_, "lowcomm: after_step before attach");
  if (!window_open_) {
    window_start_ = Clock::now();
    window_open_ = true;
  }
  due_step_ = sched_->should_sync(step) ? step : -1;
  nlohmann::json j = sync(step);
  if (!j.is_null() && c_.sync.policy != "fixed") j["policy"] = sched_->last();
  return j;
}

comm::Communicator* LowComm::guard_comm(int64_t step) {
  if (!guarded_once_ || round_end(step - 1) || !island_comm_) {
    guarded_once_ = true;
    return world_;
  }
  return island_comm_.get();
}

double LowComm::world_average(double x) {
  if (!world_ || world_->size() == 1) return x;
  Tensor t = Tensor::empty({2});
  t.f32()[0] = float(x);
  t.f32()[1] = float(x - double(t.f32()[0]));
  world_->all_reduce(t, comm::ReduceOp::sum);
  return (double(t.f32()[0]) + double(t.f32()[1])) / double(world_->size());
}

std::vector<comm::MatrixSpan> LowComm::matrices_within(const std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  std::vector<comm::MatrixSpan> out;
  const float* base = flat_.f32();
  for (nn::Parameter* p : model_->parameters()) {
    if (p->shape.size() != 2) continue;
    if (!in_flat(p)) continue;  // another stage's (pp)
    const int64_t o = p->value.f32() - base, n = p->shape[0] * p->shape[1];
    int64_t at = 0;
    for (const auto& [lo, hi] : ranges) {
      if (o >= lo && o + n <= hi) out.push_back({at + o - lo, p->shape[0], p->shape[1]});
      at += hi - lo;
    }
  }
  return out;
}

std::function<void()> LowComm::start_average(const Tensor& buf, const std::string& key,
                                             const std::vector<comm::MatrixSpan>& mats) {
  const int64_t n = buf.numel();
  const int k = share_ ? share_->size() : 1;
  // n = 0: this rank holds none of buf's ranges (ZeRO-3 chunks), nor do the ranks of its place
  // in the other islands (the same layout), nor its share group (HSDP replicas).
  if (!across_ || across_->size() == 1 || n == 0) return [] {};
  if (++exchanges_ == c_.drop_at_sync && island_ == islands_ - 1) {
    // A dropped link: this island goes silent (no error, no closed socket) for longer than the
    // others' communicator timeout, then leaves.
    log::warn("fault: island {} drops its link at exchange {}", island_, exchanges_);
    std::this_thread::sleep_for(across_->timeout() * 2);
    std::_Exit(3);
  }
  if (k == 1) return exchange_->start(buf, across_, key, mats);
  // This rank's share: chunk l of the buffer padded to k equal chunks.
  const int64_t chunk = (n + k - 1) / k, l = share_->rank();
  const int64_t lo = std::min(n, l * chunk), hi = std::min(n, lo + chunk);
  Tensor mine = Tensor::zeros({chunk});
  if (hi > lo) std::memcpy(mine.f32(), buf.f32() + lo, size_t(hi - lo) * sizeof(float));
  std::vector<comm::MatrixSpan> in_share;  // the matrices wholly inside this rank's share
  for (const comm::MatrixSpan& m : mats)
    if (m.offset >= lo && m.offset + m.rows * m.cols <= hi) in_share.push_back({m.offset - lo, m.rows, m.cols});
  auto fin = exchange_->start(mine, across_, key, in_share);
  comm::Communicator* ic = share_;
  return [fin, mine, buf, ic, chunk, n, k] {
    fin();
    Tensor all = Tensor::empty({chunk * k});
    ic->all_gather(mine, all);
    std::memcpy(buf.f32(), all.f32(), size_t(n) * sizeof(float));
  };
}

int64_t LowComm::wan_bytes(int64_t numel) const {
  const int k = share_ ? share_->size() : 1;
  return exchange_->wire_bytes((numel + k - 1) / k, islands_);
}

nlohmann::json LowComm::record(const std::string& what, int64_t numel, double blocked_s, double sync_s,
                               const std::vector<int64_t>* stage_numels) {
  auto now = Clock::now();
  window_blocked_s_ += blocked_s;
  double wall = std::chrono::duration<double>(now - window_start_).count();
  int64_t mine = wan_bytes(numel);
  if (stage_numel_.empty()) {
    job_wan_bytes_ += mine * (world_ ? world_->size() : 1);  // every rank sends its equal share
  } else {  // pp inside the islands: each stage its own size (DiLoCo: the whole stage each sync)
    int64_t per_pipeline = 0;
    for (int64_t n : stage_numels ? *stage_numels : stage_numel_) per_pipeline += wan_bytes(n);
    job_wan_bytes_ += per_pipeline * (world_->size() / (pp_ * tp_));
  }
  nlohmann::json j = {{"what", what},
                      {"outer_step", outer_steps_},
                      {"wan_bytes", mine},
                      {"wan_bytes_job", job_wan_bytes_},
                      {"sync_ms", sync_s * 1e3},
                      {"blocked_ms", blocked_s * 1e3},
                      {"compute_util", wall > 0 ? std::max(0.0, 1.0 - window_blocked_s_ / wall) : 1.0}};
  window_start_ = now;
  window_blocked_s_ = 0;
  return j;
}

namespace {
const char* kPrefix = "lowcomm.";
bool is_ours(const std::string& n) { return n.rfind(kPrefix, 0) == 0; }
}  // namespace

void LowComm::save_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                         std::vector<std::pair<std::string, Tensor>>& opt_sd, nlohmann::json& state) {
  std::vector<std::pair<std::string, Tensor>> extra;
  // The other islands' parameters and inner optimizer state, gathered for world rank 0 (it
  // writes the checkpoint; it is island 0's first rank) from each island's first rank, over the
  // island axis. Every island holds the same names and shapes (one model, one optimizer). An
  // all_gather, not sends to island 0: a communicator's collectives are tagged by its operation
  // count, which uneven point-to-point traffic (M - 1 receives against one send) would set apart
  // for M > 2 islands, hanging the next exchange after a mid-run checkpoint.
  if (islands_ > 1 && island_comm_ && island_comm_->rank() == 0) {
    auto move = [&](const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& kind) {
      for (const auto& [name, t0] : sd) {
        Tensor t = t0.contiguous(), all = Tensor::empty({int64_t(islands_) * t.numel()}, t.dtype());
        across_->all_gather(t.reshape({t.numel()}), all);
        if (island_ > 0) continue;
        for (int i = 1; i < islands_; ++i)
          extra.emplace_back(fmt::format("{}island{}.{}.{}", kPrefix, i, kind, name),
                             all.slice(0, i * t.numel(), (i + 1) * t.numel()).reshape(t.shape()).clone());
      }
    };
    move(model_sd, "model");
    move(opt_sd, "optim");
  }
  nlohmann::json st = {{"method", c_.method},           {"islands", islands_}, {"inner_steps", c_.inner_steps},
                       {"outer_steps", outer_steps_}, {"job_wan_bytes", job_wan_bytes_},
                       {"exchange", c_.codec.describe()}, {"ranks", world_ ? world_->size() : 1}};
  save_outer(extra, st);
  save_method(extra, st);  // completes the exchanges in flight
  save_exchange(extra);
  for (auto& e : extra) opt_sd.push_back(std::move(e));
  state["lowcomm"] = st;
}

void LowComm::load_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                         std::vector<std::pair<std::string, Tensor>>& opt_sd, const nlohmann::json& state,
                         const std::string& what) {
  TensorFile ours;
  std::vector<std::pair<std::string, Tensor>> rest;
  for (auto& e : opt_sd) (is_ours(e.first) ? ours.tensors : rest).push_back(std::move(e));
  opt_sd = std::move(rest);
  if (!state.contains("lowcomm")) {  // a checkpoint without islands: the outer state starts here
    ATOLL_CHECK(ours.tensors.empty(), "{}: lowcomm entries but no lowcomm state", what);
    log::info("lowcomm: {} has no outer state; the outer optimizer starts from its parameters", what);
    loaded_plain_ = true;
    return;
  }
  const nlohmann::json& st = state.at("lowcomm");
  ATOLL_CHECK(st.at("islands").get<int>() == islands_ && st.at("method").get<std::string>() == c_.method,
              "{} was saved by lowcomm.method = '{}' over {} islands; this job runs '{}' over {}: resume it as it "
              "was saved", what, st.at("method").get<std::string>(), st.at("islands").get<int>(), c_.method, islands_);
  if (island_ > 0) {
    auto take = [&](std::vector<std::pair<std::string, Tensor>>& sd, const std::string& kind) {
      for (auto& [name, t] : sd) {
        std::string key = fmt::format("{}island{}.{}.{}", kPrefix, island_, kind, name);
        const Tensor* f = ours.find(key);
        ATOLL_CHECK(f, "{}: no {} (island {}'s state)", what, key, island_);
        t = f->clone();
      }
    };
    take(model_sd, "model");
    take(opt_sd, "optim");
  }
  load_outer(ours, st, what);
  load_exchange(ours, st, what);
  outer_steps_ = st.at("outer_steps").get<int64_t>();
  job_wan_bytes_ = st.at("job_wan_bytes").get<int64_t>();
  load_method(ours, st, what);
}

// Every rank's exchange state goes to world rank 0 (the writer) as lowcomm.exchange.rank<r>.*;
// the ranks hold the same names and shapes (one key per exchanged tensor, equal shares), so
// each tensor travels by one all_gather (collectives keep every rank's operation count equal).
void LowComm::save_exchange(std::vector<std::pair<std::string, Tensor>>& extra) {
  gather_rank_tensors(world_, exchange_->state(), std::string(kPrefix) + "exchange.", extra);
}

void LowComm::load_exchange(const TensorFile& ours, const nlohmann::json& st, const std::string& what) {
  const int W = world_ ? world_->size() : 1, me = world_ ? world_->rank() : 0;
  const std::string saved = st.value("exchange", comm::CodecSpec{}.describe());  // older: fp32
  if (saved != c_.codec.describe()) {
    // A different codec (or setting) from here on: its error feedback starts from zero.
    log::warn("lowcomm: {} was saved with exchange '{}', this job runs '{}': the exchange state starts afresh", what,
              saved, c_.codec.describe());
    exchange_->load({}, what);
    return;
  }
  ATOLL_CHECK(c_.codec.none() || st.value("ranks", W) == W,
              "{} holds the exchange state of {} ranks, this job has {}: resume with the same ranks (or another "
              "lowcomm.exchange setting, whose error feedback then starts from zero)", what, st.value("ranks", W), W);
  const std::string prefix = fmt::format("{}exchange.rank{}.", kPrefix, me);
  std::vector<std::pair<std::string, Tensor>> sd;
  for (const auto& [n, t] : ours.tensors)
    if (n.rfind(prefix, 0) == 0) sd.emplace_back(n.substr(prefix.size()), t);
  exchange_->load(sd, what);
}

void LowComm::finish_load() {
  if (!loaded_plain_) return;
  global_.copy_from(local_values());
  mom_.zero();
  loaded_plain_ = false;
}

Registry<MethodMaker>& method_registry() {
  static Registry<MethodMaker> r = [] {
    Registry<MethodMaker> g("lowcomm method");
    g.add("diloco", make_diloco);
    g.add("streaming", make_streaming_diloco);
    g.add("isoloco", make_isoloco);
    return g;
  }();
  return r;
}

std::unique_ptr<LowComm> make_lowcomm(Config& cfg, parallel::Mesh& mesh, comm::Communicator* world) {
  auto c = LowCommConfig::from_config(cfg, mesh.shape().island);
  if (!c) return nullptr;
  return method_registry().get(c->method, "lowcomm.method")(*c, mesh, world, cfg);
}

}  // namespace atl::lowcomm
