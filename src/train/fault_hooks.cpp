#include "train/fault_hooks.h"

#include <cmath>
#include <exception>
#include <filesystem>

#include "core/log.h"
#include "resilience/deadpool.h"
#include "resilience/invariant_gate.h"
#include "resilience/progress_record.h"
#include "resilience/step_signature.h"
#include "tensor/safetensors.h"

namespace atl {

void read_fault_options(Config& c, TrainOptions& o) {
  o.fault_tolerance = c.get_string("fault.tolerance", o.fault_tolerance, {"none", "quorum"});
  o.fault_lighthouse = c.get_string("fault.lighthouse", o.fault_lighthouse);
  o.fault_heartbeat_ms = c.get_int("fault.heartbeat_ms", o.fault_heartbeat_ms, 10, 10000);
  o.fault_gate = c.get_bool("fault.gate", o.fault_gate);
  o.fault_phase_guard = c.get_bool("fault.phase_guard", o.fault_phase_guard);
  o.fault_signatures = c.get_bool("fault.signatures", o.fault_signatures);
  o.fault_snapshot_every = c.get_int("fault.snapshot_every", o.fault_snapshot_every, 0, 1000000);
  o.fault_snapshot_copies = c.get_int("fault.snapshot_copies", o.fault_snapshot_copies, 1, 2);
  ATOLL_CHECK(o.fault_snapshot_copies == 1 || o.fault_snapshot_every > 0,
              "fault.snapshot_copies ({}) = {} needs fault.snapshot_every > 0 (the snapshots it copies)",
              c.where("fault.snapshot_copies"), o.fault_snapshot_copies);
  o.fault_spare = c.get_bool("fault.spare", o.fault_spare);
  o.fault_commit_hashes = c.get_bool("fault.commit_hashes", o.fault_commit_hashes);
  ATOLL_CHECK(!o.fault_commit_hashes || o.fault_tolerance == "quorum",
              "fault.commit_hashes ({}) records quorum commits and needs fault.tolerance = \"quorum\"",
              c.where("fault.commit_hashes"));
  o.fault_progress = c.get_bool("fault.progress", o.fault_progress);
  o.fault_replay_every = c.get_int("fault.replay_every", o.fault_replay_every, 0, 1 << 30);
  o.fault_replay_where = c.where("fault.replay_every");
  o.fault_replay_witnesses = c.get_int("fault.replay_witnesses", o.fault_replay_witnesses, 1, 64);
  o.fault_replay_repair = c.get_bool("fault.replay_repair", o.fault_replay_repair);
  o.fault_resume_certified = c.get_bool("fault.resume_certified", o.fault_resume_certified);
  ATOLL_CHECK(!o.fault_resume_certified || o.fault_replay_every == 1,
              "fault.resume_certified ({}) needs fault.replay_every = 1 (it is {}): a replay certificate is clean "
              "only when every step since the last clean one was replayed",
              c.where("fault.resume_certified"), o.fault_replay_every);
  o.fault_flip_grad_at_step = c.get_int("fault.flip_grad_at_step", 0, 0);
  o.fault_flip_grad_rank = c.get_int("fault.flip_grad_rank", 0, 0, 1 << 20);
  o.fault_flip_grad_every_attempt = c.get_bool("fault.flip_grad_every_attempt", false);
  ATOLL_CHECK(o.fault_flip_grad_at_step == 0 ||
                  (o.fault_replay_every > 0 && o.fault_flip_grad_at_step % o.fault_replay_every == 0),
              "fault.flip_grad_at_step ({}) = {} injects a corruption for the replay to find: it must be a replayed "
              "step (a multiple of fault.replay_every = {})",
              c.where("fault.flip_grad_at_step"), o.fault_flip_grad_at_step, o.fault_replay_every);
  o.fault_campaign = c.get_string("fault.campaign", o.fault_campaign);  // train/fault_campaign_hook.h
  ATOLL_CHECK(o.fault_campaign.empty() || std::filesystem::is_regular_file(o.fault_campaign),
              "fault.campaign ({}) = '{}': no such file", c.where("fault.campaign"), o.fault_campaign);
  ATOLL_CHECK(o.fault_tolerance == "quorum" || (o.fault_snapshot_every == 0 && !o.fault_spare),
              "fault.{} ({}) is DeadPool's and needs fault.tolerance = \"quorum\"",
              o.fault_spare ? "spare" : "snapshot_every",
              c.where(o.fault_spare ? "fault.spare" : "fault.snapshot_every"));
  if (!o.fault_lighthouse.empty()) {
    auto colon = o.fault_lighthouse.rfind(':');
    int port = colon == std::string::npos ? 0 : std::atoi(o.fault_lighthouse.c_str() + colon + 1);
    ATOLL_CHECK(colon != std::string::npos && colon > 0 && port > 0 && port < 65536,
                "fault.lighthouse ({}) = '{}' is not HOST:PORT", c.where("fault.lighthouse"), o.fault_lighthouse);
  }
}

std::string parameter_hash(const nn::Model& model) {
  const Tensor& v = model.flat_values();
  return resilience::hash_hex(v.raw(), size_t(v.nbytes()));
}

void run_pre_run_gate(comm::Communicator& comm, const TrainOptions& o, const std::string& config_text,
                      const std::string& param_hash, const nn::Model& model, const Task& task,
                      const std::string& layout, int world) {
  resilience::RunFacts f;
  f.config_hash = resilience::hash_hex(config_text);
  f.param_hash = param_hash;
  f.param_count = model.flat_values().numel();
  f.dtype = o.matmul_dtype;
  comm::DistEnv env = comm::DistEnv::from_environment();
  f.layout = fmt::format("world={} local={} mesh={}", world, env.local_world_size, layout);
  nlohmann::json d = task.data_facts();
  if (d.is_object()) {
    f.data_space = d.value("space", "");
    f.shards = d.value("shards", std::vector<std::pair<int64_t, int64_t>>{});
    f.batches_per_epoch = d.value("batches_per_epoch", int64_t(0));
  }
  resilience::check_run_invariants(comm, f);
}

void SignatureHook::step_start(const nn::Model& model) {
  t0_ = std::chrono::steady_clock::now();
  const Tensor& v = model.flat_values();
  param_hash_ = resilience::buffer_hash(v.raw(), size_t(v.nbytes()));
}

void SignatureHook::backward_done() { t1_ = std::chrono::steady_clock::now(); }

void SignatureHook::check(comm::Communicator& comm, int64_t step, double loss, const nn::Model& model) {
  resilience::StepSignature s;
  s.step = step;
  s.compute_ms = std::chrono::duration<double, std::milli>(t1_ - t0_).count();
  s.loss = loss;
  const Tensor& g = model.flat_grads();
  s.grad_hash = resilience::buffer_hash(g.raw(), size_t(g.nbytes()));
  double sq = 0;
  const float* p = g.f32();
  for (int64_t i = 0, n = g.numel(); i < n; ++i) sq += double(p[i]) * p[i];
  s.grad_norm = std::sqrt(sq);
  s.param_hash = param_hash_;
  s.fingerprint = ++exchanges_ * 1000003u + uint64_t(g.numel());
  auto all = resilience::exchange_signatures(comm, s);
  auto c = resilience::find_outliers(all);
  if (c.verdict != resilience::Consensus::clean) {
    ++detections_;
    if (comm.rank() == 0) log::warn("signatures: {}", c.message);
  }
}

QuorumHook::QuorumHook(TrainOptions& o, const comm::DistEnv& env) : id_(env.rank), replicas_(env.world_size) {
  qo_ = resilience::QuorumOptions::from_environment();
  if (!o.fault_lighthouse.empty()) {
    auto colon = o.fault_lighthouse.rfind(':');
    qo_.lighthouse_host = o.fault_lighthouse.substr(0, colon);
    qo_.lighthouse_port = std::atoi(o.fault_lighthouse.c_str() + colon + 1);
  }
  ATOLL_CHECK(qo_.lighthouse_port > 0,
              "[fault] tolerance = \"quorum\" needs a lighthouse: set fault.lighthouse = \"HOST:PORT\" or "
              "ATOLL_LIGHTHOUSE (start one with `atoll lighthouse`)");
  qo_.heartbeat = std::chrono::milliseconds(o.fault_heartbeat_ms);
  every_ = o.fault_snapshot_every;
  copies_ = o.fault_snapshot_copies;
  spare_ = o.fault_spare;
  std::string dir = "replica" + std::to_string(id_);
  if (spare_) {
    // ATOLL_SPARE_ID names the spare (RANK must be a valid rank of the job, so it cannot).
    if (const char* sid = std::getenv("ATOLL_SPARE_ID")) id_ = std::atoi(sid);
    else id_ = 1000 + env.rank;
    // DeadPool: wait in the pool; the slot given is the replica this process becomes (its data
    // shard, its place in the quorum). Nothing is built or written before that.
    int slot = resilience::wait_for_slot(qo_.lighthouse_host, qo_.lighthouse_port, id_, std::chrono::milliseconds(-1));
    if (slot < 0) {
      log::info("spare {}: not needed (every replica finished, or the lighthouse is gone)", id_);
      std::exit(0);
    }
    ATOLL_CHECK(slot < replicas_, "spare {}: given slot {} of a job of WORLD_SIZE={}", id_, slot, replicas_);
    dir = fmt::format("replica{}.spare{}", slot, id_);  // not the dead replica's directory: its run
    id_ = slot;
  }
  if (every_ > 0 || spare_) {
    ATOLL_CHECK(replicas_ >= 2, "DeadPool needs WORLD_SIZE >= 2 slots (got {})", replicas_);
    qo_.slots = replicas_;
  }
  qo_.replica_id = id_;
  o.run_dir = (std::filesystem::path(o.run_dir) / dir).string();
}

QuorumHook::~QuorumHook() {
  if (!replica_ || std::uncaught_exceptions() > 0) return;
  try {
    replica_->finish(state_);
  } catch (const std::exception& e) {
    log::warn("replica {}: {}", id_, e.what());
  }
}

void QuorumHook::begin(int64_t start, nn::Model& model, parallel::DataParallel& dp, Task& task, Rng& sample_rng) {
  model_ = &model;
  dp_ = &dp;
  task_ = &task;
  rng_ = &sample_rng;
  state_.step = start;
  state_.save_extra = [this] { return save(); };
  state_.load_extra = [this](const std::string& b) { load(b); };
  state_.before_write = [this] {
    if (pc_) pc_->fence();
  };
  if (every_ > 0) {
    const char* adv = std::getenv("ATOLL_ADVERTISE_HOST");  // where the other hosts reach this one
    pc_ = std::make_unique<resilience::PeerCheckpointer>(qo_.lighthouse_host, qo_.lighthouse_port, id_, replicas_,
                                                         int(every_), adv ? adv : "127.0.0.1", int(copies_));
    if (spare_) {
      auto snap = pc_->fetch_own(std::chrono::seconds(30));
      if (snap) {
        load(snap->blob);
        state_.step = snap->step;
        log::info("spare: slot {} restored from its peer's in-memory snapshot of step {}", id_, snap->step);
      } else {
        log::warn("spare: no peer snapshot of slot {}: its whole state heals from a live replica", id_);
      }
    }
  }
  replica_ = std::make_unique<resilience::QuorumReplica>(qo_);
  log::info("fault tolerance: replica {} of {} against the lighthouse {}:{}", id_, replicas_, qo_.lighthouse_host,
            qo_.lighthouse_port);
}

// Everything a replica is, in one blob: weights and optimizer state (safetensors) and the rest.
static std::string encode_state(const std::vector<std::pair<std::string, Tensor>>& m,
                                const std::vector<std::pair<std::string, Tensor>>& opt, const std::string& rest) {
  std::string a = safetensors_encode(m, {}), b = safetensors_encode(opt, {});
  auto len = [](const std::string& s) { return fmt::format("{:020}", s.size()); };
  return len(a) + len(b) + a + b + rest;
}

std::string QuorumHook::rest() const {
  auto rs = rng_->state();
  nlohmann::json j = {{"rng", std::vector<uint64_t>(rs.begin(), rs.end())}, {"data", task_->data_state()}};
  return j.dump();
}

std::string QuorumHook::save() const {
  std::vector<std::pair<std::string, Tensor>> m, opt;
  dp_->full_state(m, opt);
  return encode_state(m, opt, rest());
}

// DeadPool: the tensors are encoded on the snapshot's copy thread, overlapping the next step's
// forward and backward (they only read them); the RNG and data position are taken here, now.
void QuorumHook::peer_snapshot() {
  if (!pc_ || state_.step % every_ != 0) return;
  std::vector<std::pair<std::string, Tensor>> m, opt;
  dp_->full_state(m, opt);  // handles on the live tensors
  pc_->after_commit(state_.step, [m = std::move(m), opt = std::move(opt), r = rest()](std::string& out) {
    out = encode_state(m, opt, r);
  });
}

void QuorumHook::load(const std::string& blob) {
  size_t na = std::stoull(blob.substr(0, 20)), nb = std::stoull(blob.substr(20, 20));
  TensorFile m = safetensors_decode(blob.substr(40, na), "the peer's weights");
  TensorFile opt = safetensors_decode(blob.substr(40 + na, nb), "the peer's optimizer state");
  nlohmann::json j = nlohmann::json::parse(blob.substr(40 + na + nb));
  dp_->load_full_state(m.tensors, opt, "a live peer");
  auto rs = j.at("rng").get<std::vector<uint64_t>>();
  Rng::State st;
  std::copy(rs.begin(), rs.end(), st.begin());
  rng_->set_state(st);
  task_->set_data_state(j.at("data"), task_env());
}

bool QuorumHook::step(int64_t& step, const std::function<double()>& compute, double& loss,
                      const std::function<void()>& apply) {
  nlohmann::json data_before;  // where this attempt's data starts (after any heal)
  bool ok = replica_->step(
      state_,
      [&](comm::Communicator& c) {
        step = state_.step;  // after a heal
        data_before = task_->data_state();
        double l = compute();
        c.all_reduce(model_->flat_grads(), comm::ReduceOp::avg);
        Tensor lt = Tensor::empty({1}, DType::f32);
        lt.f32()[0] = float(l);
        c.all_reduce(lt, comm::ReduceOp::avg);
        loss = lt.f32()[0];
      },
      [&] {
        if (pc_) pc_->fence();  // the last snapshot's copy is done reading the state
        step = state_.step;
        apply();
      });
  if (ok) peer_snapshot();
  if (!ok && !data_before.is_null()) task_->set_data_state(data_before, task_env());  // redo the step on the same data
  step = state_.step - 1;
  return ok;
}

ProgressRecordGuard::ProgressRecordGuard(const TrainOptions& o, int rank, int world) {
  if (!o.fault_progress) return;
  const char* env = std::getenv("ATOLL_PROGRESS_DIR");
  std::string dir = env && *env ? env : (std::filesystem::path(o.run_dir) / "progress").string();
  try {
    resilience::ProgressPublisher::instance().open(
        (std::filesystem::path(dir) / ("rank" + std::to_string(rank) + ".progress")).string(), rank, world);
    on_ = true;
  } catch (const Error& e) {  // telemetry only: training goes on without it
    log::warn("fault.progress: {}; no progress record for `atoll watch`", e.what());
  }
}

ProgressRecordGuard::~ProgressRecordGuard() {
  if (on_) resilience::ProgressPublisher::instance().close(finished_);
}

}  // namespace atl
