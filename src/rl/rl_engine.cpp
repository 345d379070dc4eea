#include "rl/rl_engine.h"

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "optim/adamw.h"
#include "tensor/safetensors.h"
#include "rl/multi_turn.h"
#include "rl/policy_loss.h"

namespace atl::rl {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const nn::PolicyModel& policy_of(const nn::Model& m) {
  auto* p = dynamic_cast<const nn::PolicyModel*>(&m);
  ATOLL_CHECK(p, "[train] task = 'rl' needs a model that can act as a policy (nn::PolicyModel); model family '{}' "
                 "is not one",
              m.family());
  return *p;
}

uint64_t mix(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

std::vector<Tensor> param_values(nn::Model& m) {
  std::vector<Tensor> v;
  for (nn::Parameter* p : m.parameters()) v.push_back(p->value);
  return v;
}

void copy_weights(nn::Model& dst, const nn::Model& src) {
  Tensor d = dst.flat_values();
  d.copy_from(src.flat_values());
}

}  // namespace

RlEngine::RlEngine(RlConfig c) : c_(std::move(c)) {
  journal_die_after = c_.kill_after_tokens;
  task_ = make_verifiable_task(c_.task);
  task_->heldout_percent = c_.heldout_percent;
  max_new_ = c_.max_new_tokens > 0 ? c_.max_new_tokens : task_->max_answer_len() + 1;
  c_.alg.max_new_tokens = max_new_;
  // A fixed seed: the held-out set does not change with [train] seed.
  eval_ = task_->eval_set(c_.eval_size, 20240601);
}

RlEngine::~RlEngine() {
  if (worker_.joinable()) worker_.join();
  // The trainers' end releases the rollout ranks (they wait in the next push). Not while an error
  // unwinds: the push could wait on a broken job, which `atoll launch` ends anyway.
  if (channel_ && !rollout_rank_ && !stopped_ && std::uncaught_exceptions() == 0) {
    try {
      PushHeader h{calls_, rl_steps_, true, {}};
      channel_->push(h);
    } catch (const std::exception& e) {
      log::warn("rl: could not tell the rollout ranks to stop: {}", e.what());
    }
  }
}

int RlEngine::reserved_ranks(int world) const {
  if (c_.placement != "disaggregated") return 0;
  ATOLL_CHECK(c_.rollout_ranks + c_.shadow_ranks < world,
              "rl.rollout_ranks = {} and rl.shadow_ranks = {} leave none of the job's {} ranks to train", c_.rollout_ranks,
              c_.shadow_ranks, world);
  return int(c_.rollout_ranks + c_.shadow_ranks);
}

void RlEngine::attach_job(std::unique_ptr<comm::Communicator> job, bool rollout_rank) {
  job_ = std::move(job);
  rollout_rank_ = rollout_rank;
}

void RlEngine::setup(nn::Model& model, comm::Communicator* comm, int rank, int world) {
  policy_ = &model;
  comm_ = comm;
  rank_ = rank;
  world_ = world;
  const nn::PolicyModel& p = policy_of(model);
  auto* tm = dynamic_cast<const nn::TokenModel*>(&model);
  ATOLL_CHECK(tm && tm->vocab_size() >= kVocab, "[train] task = 'rl': the model's vocabulary must hold the {} ids of "
                                                "the RL tasks' characters (model.vocab_size = {})",
              kVocab, tm ? tm->vocab_size() : 0);
  const int64_t need = episode_positions(*task_, max_new_, c_.turns) + 1;
  ATOLL_CHECK(tm->max_sequence_length() == 0 || tm->max_sequence_length() >= need,
              "[train] task = 'rl' ({}): prompts and completions need {} positions; model.block_size is {}",
              task_->name(), need, tm->max_sequence_length());
  if (c_.placement == "disaggregated") {
    ATOLL_CHECK(job_, "rl.placement = 'disaggregated' needs a job of rl.rollout_ranks ({}) + at least one trainer rank "
                "(atoll launch --nproc-per-node N)", c_.rollout_ranks);
    channel_ = std::make_unique<RolloutChannel>(std::move(job_), int(c_.rollout_ranks), param_values(model),
                                                c_.sync_bucket_mb, int(c_.shadow_ranks));  // collective over the job
    // The fault injection kills a rollout rank, not its shadow nor a trainer generating for itself.
    if (channel_->is_shadow() || !rollout_rank_) journal_die_after = 0;
    else if (rollout_rank_ && journal_die_after > 0) journal_die_after += channel_->served().front() * c_.kill_stagger;
    if (rollout_rank_) return;  // generates only: no reference, no value head
    if (c_.shadow_ranks > 0) channel_->set_self_generate([this](int64_t step) { return self_generate(step); });
  }
  ref_ = nn::model_from_metadata(model.config_metadata());
  if (c_.placement == "async") {
    rollout_ = nn::model_from_metadata(model.config_metadata());
    sync_ = std::make_unique<WeightSync>(param_values(model), c_.sync_bucket_mb);
  }
  if (algorithm_registry().get(c_.algorithm).value_head) {
    const int64_t C = p.feature_dim();
    vw_ = Tensor::zeros({C, 1});
    vb_ = Tensor::zeros({1});
    Tensor gw = Tensor::zeros({C, 1}), gb = Tensor::zeros({1});
    set_requires_grad(vw_, true, "value_head.weight", gw);
    set_requires_grad(vb_, true, "value_head.bias", gb);
    vrefs_ = {{"value_head.weight", vw_, gw, ParamRole::vector}, {"value_head.bias", vb_, gb, ParamRole::vector}};
    vopt_ = make_adamw(vrefs_, c_.value_lr, 0.9f, 0.999f, 1e-8f, 0.0f);
  }
}

Tensor RlEngine::score_logprobs(const nn::Model& m, const RolloutBatch& b) {
  NoGradGuard ng;
  const nn::PolicyModel& p = policy_of(m);
  return token_logprobs(p.head(p.features(b.input)), b.target);
}

Tensor RlEngine::values(const nn::Model& m, const RolloutBatch& b) const {
  NoGradGuard ng;
  const nn::PolicyModel& p = policy_of(m);
  return ops::linear(p.features(b.input), vw_, vb_).contiguous().reshape({b.B * b.T});
}

RolloutBatch RlEngine::rollouts(const nn::Model& gen, int64_t step, int seed_rank, bool with_ref, int64_t version) {
  NoGradGuard ng;  // also on the async worker thread, whose grad mode starts on
  if (seed_rank < 0) seed_rank = rank_;
  const uint64_t seed = mix(c_.seed, uint64_t(step), uint64_t(seed_rank));
  Rng rng(seed, 5);
  if (c_.partial_tokens > 0) {
    PartialRollouts& pool = pool_for(seed_rank);
    RolloutBatch b = c_.journal_dir.empty() ? pool.step(gen, version, rng, seed ^ 0x5eed)
                                            : journaled_partial(gen, pool, step, seed_rank, version, rng, seed ^ 0x5eed);
    if (channel_ && rollout_rank_) b.carried = pool.save();  // for the trainers' checkpoints
    if (with_ref) b.ref_logp = score_logprobs(*ref_, b);
    return b;
  }
  std::vector<Problem> probs;
  std::vector<std::vector<int32_t>> rows;
  nn::SamplingConfig s;
  draw_batch(rng, seed, probs, rows, s);
  double t0 = now_s();
  std::vector<nn::PolicyModel::Completion> comps;
  std::vector<Episode> eps;  // rl.turns > 1
  if (c_.turns > 1) {
    std::vector<const Problem*> of;
    for (size_t r = 0; r < rows.size(); ++r) of.push_back(&probs[r / size_t(c_.group_size)]);
    eps = run_episodes(policy_of(gen), *task_, of, rows, s, max_new_, c_.turns);
  } else {
    comps = c_.journal_dir.empty() ? policy_of(gen).generate_batch(rows, max_new_, s)
                                   : journaled_generate(gen, rows, s, step, seed_rank, version);
  }
  const double gen_s = now_s() - t0;
  t0 = now_s();
  std::vector<Sample> samples;
  int64_t gen_tokens = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    Sample sm;
    sm.problem = probs[r / size_t(c_.group_size)];
    sm.prompt = rows[r];
    if (c_.turns > 1) {  // the reward is the final answer's
      sm.completion = eps[r].completion;
      sm.env = eps[r].env;
      sm.stopped = eps[r].stopped;
      sm.turns = eps[r].turns;
      sm.reward = task_->score(sm.problem, eps[r].final_answer, sm.stopped, c_.format_reward);
      for (uint8_t e : sm.env) gen_tokens += e ? 0 : 1;
      gen_tokens += sm.stopped ? 1 : 0;
    } else {
      sm.completion = comps[r].tokens;
      sm.stopped = comps[r].stopped;
      sm.reward = task_->score(sm.problem, decode(sm.completion), sm.stopped, c_.format_reward);
      gen_tokens += int64_t(sm.completion.size()) + (sm.stopped ? 1 : 0);
    }
    sm.group = int64_t(r) / c_.group_size;
    samples.push_back(std::move(sm));
  }
  RolloutBatch b = pack_rollouts(std::move(samples));
  b.old_logp = score_logprobs(gen, b);
  if (with_ref) b.ref_logp = score_logprobs(*ref_, b);
  b.policy_version = version;
  b.gen_s = gen_s;
  b.score_s = now_s() - t0;
  b.gen_tokens = gen_tokens;
  return b;
}

void RlEngine::draw_batch(Rng& rng, uint64_t seed, std::vector<Problem>& probs,
                          std::vector<std::vector<int32_t>>& rows, nn::SamplingConfig& s) const {
  for (int64_t i = 0; i < c_.prompts; ++i) {
    probs.push_back(task_->draw_train(rng));
    for (int64_t g = 0; g < c_.group_size; ++g) rows.push_back(encode(probs.back().prompt));
  }
  s.temperature = c_.temperature;
  s.top_k = c_.top_k;
  s.stop_tokens = {kEndMarker};
  s.seed = seed ^ 0x5eed;
}

RlEngine::JournalBatch RlEngine::journal_batch(const nn::Model& gen, int64_t step, int seed_rank, int64_t version) const {
  JournalBatch jb;
  const uint64_t seed = mix(c_.seed, uint64_t(step), uint64_t(seed_rank));
  Rng rng(seed, 5);
  std::vector<Problem> probs;
  std::vector<std::vector<int32_t>> rows;
  draw_batch(rng, seed, probs, rows, jb.sampling);
  for (size_t r = 0; r < rows.size(); ++r) jb.reqs.push_back({int64_t(r), rows[r]});
  // Named by the stream, the step, the version and a hash of the weights and the sampling seed: a
  // journal left by another run (other weights or seeds) is never continued, only its own.
  const uint64_t key = weights_hash(param_values(const_cast<nn::Model&>(gen))) ^ mix(jb.sampling.seed, uint64_t(version), 7);
  jb.path = (std::filesystem::path(c_.journal_dir) /
             fmt::format("rollouts_r{}_s{}_v{}_{:016x}{}.journal", seed_rank, step, version, key,
                         c_.journal_batched ? "_batched" : ""))
                .string();
  return jb;
}

PartialRollouts& RlEngine::pool_for(int seed_rank) {
  std::unique_ptr<PartialRollouts>& pr = partial_[seed_rank];
  if (!pr)
    pr = std::make_unique<PartialRollouts>(PartialRolloutConfig{c_.prompts, c_.group_size, max_new_, c_.partial_tokens,
                                                                c_.temperature, c_.format_reward, c_.top_k},
                                           *task_);
  return *pr;
}

// Belayer's worker generates every request alone (B = 1, its own stream Rng(seed, row)), each
// token journaled as it is sampled; the batch is then read back from the journal, so a process
// that continues a dead one's journal (a shadow with the weights loaded, or the rollout rank
// restarted with them) returns the same batch token for token, no request lost or doubled. The
// previous step's journal of this stream is removed: its batch was sent before this one started
// (disaggregated: serve() exchanges step k's batch before it generates step k + 1's).
std::vector<nn::PolicyModel::Completion> RlEngine::journaled_generate(const nn::Model& gen,
                                                                      const std::vector<std::vector<int32_t>>& rows,
                                                                      const nn::SamplingConfig& s, int64_t step,
                                                                      int seed_rank, int64_t version) {
  std::filesystem::create_directories(c_.journal_dir);
  const JournalBatch jb = journal_batch(gen, step, seed_rank, version);
  const std::string& path = jb.path;
  if (step > 0) {
    const std::string prev = "rollouts_r" + std::to_string(seed_rank) + "_s" + std::to_string(step - 1) + "_v";
    for (const auto& e : std::filesystem::directory_iterator(c_.journal_dir))
      if (e.path().filename().string().rfind(prev, 0) == 0) std::filesystem::remove(e.path());
  }
  std::vector<RolloutRequest> reqs;
  for (size_t r = 0; r < rows.size(); ++r) reqs.push_back({int64_t(r), rows[r]});
  RolloutWorker w(gen, s, max_new_);
  auto fo = followers_.find(path);  // the shadow rank's, when it followed this journal (shadow_rank.cpp)
  const int64_t die = journal_die_after > 0 ? journal_die_after - journal_sampled_ : 0;
  journal_stats_ = c_.journal_batched ? w.run_batched(reqs, path, die)
                                      : w.run(reqs, path, die, fo != followers_.end() ? fo->second.follower.get() : nullptr);
  journal_sampled_ += journal_stats_.sampled_tokens;
  if (journal_stats_.resumed + journal_stats_.skipped > 0)  // a recovery: every rank logs it (warn)
    log::warn("rl: rollout journal {}: {} requests already done, {} continued from their prefix ({} tokens replayed)",
              path, journal_stats_.skipped, journal_stats_.resumed, journal_stats_.replayed_tokens);
  const JournalState js = JournalState::read(path);
  std::vector<nn::PolicyModel::Completion> comps(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    auto it = js.requests.find(int64_t(r));
    ATOLL_CHECK(it != js.requests.end() && it->second.done, "rl: rollout journal {}: request {} did not finish", path, r);
    comps[r].tokens = it->second.tokens;
    comps[r].stopped = it->second.stopped;
  }
  return comps;
}

RolloutBatch RlEngine::sft_batch() {
  Rng rng(mix(c_.seed ^ 0x5f7, uint64_t(calls_), uint64_t(rank_)), 9);
  std::vector<Sample> samples;
  for (int64_t i = 0; i < c_.sft_batch; ++i) {
    Sample s;
    s.problem = task_->draw_train(rng);
    s.prompt = encode(s.problem.prompt);
    s.completion = encode(s.problem.answer);
    s.stopped = true;
    samples.push_back(std::move(s));
  }
  return pack_rollouts(std::move(samples));
}

void RlEngine::step_value_head() {
  if (!vopt_) return;
  if (comm_ && world_ > 1)
    for (ParamRef& r : vrefs_) comm_->all_reduce(r.grad, comm::ReduceOp::avg);
  vopt_->step({1.0f, 1.0f});
  for (ParamRef& r : vrefs_) r.grad.zero();
}

void RlEngine::sync_rollout_model() {
  SyncStats st = sync_->copy_to(param_values(*rollout_));
  m_["sync_ms"] = st.seconds * 1e3;
  m_["sync_buckets"] = st.buckets;
  m_["sync_mb"] = double(st.bytes) / 1e6;
}

// Trainer side of a disaggregated step: push the current weights (version `updates`), then take
// this trainer's scored rollouts and check they were generated with the weights of their version.
void RlEngine::disaggregated_batch(int64_t updates) {
  const std::vector<Tensor> params = param_values(*policy_);
  std::vector<int32_t> pools = std::move(resume_pools_);  // a resumed run's carried pools, with its first push only
  resume_pools_.clear();
  if (push_behind_) {
    // Resumed one step off: the weights the saving run's rollout ranks generated this step with
    // first (trainer 0 lends them to its policy for the broadcast), then this version's as usual.
    push_behind_ = false;
    pushed_hash_[behind_version_] = behind_hash_;
    PushHeader a{behind_version_, rl_steps_, false, std::move(pools)};
    a.ahead = true;
    pools.clear();
    Tensor now, pv = policy_->flat_values();
    if (rank_ == 0) {
      ATOLL_CHECK(behind_, "rl: resumed one step off without the checkpoint's 'task.rl.behind.*' weights");
      now = pv.clone();
      pv.copy_from(behind_->flat_values());
      ATOLL_CHECK(weights_hash(params) == behind_hash_, "rl: the checkpoint's 'task.rl.behind.*' weights do not hash "
                                                        "to the version {} they were saved as", behind_version_);
    }
    channel_->push(a);
    // The ahead push stands for the saving run's push of the step before (only trainer 0 holds its weights).
    if (c_.shadow_ranks > 0 && rank_ == 0) keep_pushed(behind_version_, rl_steps_ - 1, *policy_);
    if (rank_ == 0) pv.copy_from(now);
  }
  if (c_.shadow_ranks > 0) keep_pushed(updates, rl_steps_, *policy_);
  pushed_hash_[updates] = weights_hash(params);
  while (pushed_hash_.size() > size_t(c_.max_staleness) + 1) pushed_hash_.erase(pushed_hash_.begin());
  PushHeader h{updates, rl_steps_, false, std::move(pools)};
  double wait_s = 0;
  const SyncStats st = channel_->push(h, &wait_s);
  if (c_.max_staleness >= 1) {  // what the rollout ranks pre-generate the next step with
    behind_version_ = updates;
    behind_hash_ = pushed_hash_[updates];
    if (rank_ == 0) {
      if (!behind_) behind_ = nn::model_from_metadata(policy_->config_metadata());
      copy_weights(*behind_, *policy_);
    }
  }
  m_["sync_ms"] = st.seconds * 1e3;  // trainer 0's broadcast of the weights (0 on the other trainers)
  m_["sync_buckets"] = st.buckets;
  m_["sync_mb"] = double(st.bytes) / 1e6;
  m_["push_wait_ms"] = wait_s * 1e3;  // the rollout ranks still generating the previous batch
  const double t0 = now_s();
  uint64_t hash = 0;
  cur_ = decode_rollouts(channel_->exchange({}, rl_steps_), &hash);
  if (c_.partial_tokens > 0) carried_ = cur_.carried;
  m_["exchange_ms"] = (now_s() - t0) * 1e3;
  if (c_.shadow_ranks > 0) {
    m_["from_shadow"] = channel_->from_shadow();        // batches the shadow rank sent so far
    m_["self_generated"] = channel_->self_generated();  // batches this trainer generated itself (both dead)
  }
  const int64_t gen_version = cur_.gen_version >= 0 ? cur_.gen_version : cur_.policy_version;
  auto it = pushed_hash_.find(gen_version);
  ATOLL_CHECK(it != pushed_hash_.end() && it->second == hash,
              "rl: trainer {} got rollouts generated with weights that are not the ones it pushed at version {} (the "
              "trainers are at version {})",
              rank_, gen_version, updates);
  m_["rollout_version"] = gen_version;
  const double t1 = now_s();
  cur_.ref_logp = score_logprobs(*ref_, cur_);
  cur_.score_s += now_s() - t1;
}

void RlEngine::keep_pushed(int64_t version, int64_t rl_step, const nn::Model& weights) {
  std::unique_ptr<nn::Model> m;
  while (pushed_.size() > size_t(c_.max_staleness)) {  // the batches to come need the last max_staleness + 1
    if (!m) m = std::move(pushed_.begin()->second.second);
    pushed_.erase(pushed_.begin());
  }
  if (!m) m = nn::model_from_metadata(policy_->config_metadata());
  copy_weights(*m, weights);
  pushed_[version] = {rl_step, std::move(m)};
}

// The version is serve()'s choice (and the shadow's, version_for in rl/shadow_rank.cpp): one step
// off, the previous push's when it was the step before, else the newest push's. The journal's file
// is named by stream, step, version and weights, so this continues the one the dead rollout rank or
// the shadow was writing, and the batch is theirs token for token.
std::vector<int32_t> RlEngine::self_generate(int64_t step) {
  ATOLL_CHECK(!pushed_.empty(), "rl: trainer {} has pushed no weights to generate RL step {} with", rank_, step);
  auto cur = pushed_.rbegin();
  int64_t version = cur->first;
  if (c_.max_staleness >= 1 && std::next(cur) != pushed_.rend() && std::next(cur)->second.first + 1 == step &&
      cur->second.first == step)
    version = std::next(cur)->first;
  auto it = pushed_.find(version);
  ATOLL_CHECK(it != pushed_.end() && it->second.second,
              "rl: trainer {} cannot generate RL step {} itself (its rollout rank and the shadow rank are dead): it "
              "does not hold the weights of version {} (a resumed run's first step one step off: only trainer 0 "
              "kept them); resume the job from its last checkpoint",
              rank_, step, version);
  const nn::Model& m = *it->second.second;
  if (c_.partial_tokens > 0 && !self_pooled_) {  // as the shadow's first batch of a stream
    self_pooled_ = true;
    adopt_pool(rank_, step);
  }
  const double t0 = now_s();
  RolloutBatch b = rollouts(m, step, rank_, false, version);
  log::info("rl: trainer {} generated its own batch of RL step {} (version {}): {} rollouts already done, {} continued "
            "from their prefix, {} started; {:.1f} ms",
            rank_, step, version, journal_stats_.skipped, journal_stats_.resumed, journal_stats_.fresh,
            (now_s() - t0) * 1e3);
  return encode_rollouts(b, weights_hash(param_values(const_cast<nn::Model&>(m))));
}

void RlEngine::serve() {
  ATOLL_CHECK(channel_ && rollout_rank_, "rl: serve() on a rank that is not a rollout rank");
  if (channel_->is_shadow()) return serve_shadow();
  const std::vector<Tensor> params = param_values(*policy_);
  const std::vector<int> served = channel_->served();
  auto generate = [&](int64_t step, int64_t version) {
    std::map<int, std::vector<int32_t>> out;
    const uint64_t hash = weights_hash(params);
    for (int t : served) {
      RolloutBatch b = rollouts(*policy_, step, t, false, version);
      out[t] = encode_rollouts(b, hash);
    }
    return out;
  };
  std::map<int, std::vector<int32_t>> ready;
  int64_t ready_step = -1;
  for (;;) {
    PushHeader h;
    try {
      channel_->push(h);
    } catch (const std::exception& e) {
      // Trainer 0 gone, or the job stopping after another trainer's death: name the trainer.
      const int t = channel_->dead_trainer();
      if (t < 0) throw;
      fail("rl: rollout rank {} stops: trainer rank {} died ({}); the trainers are one data-parallel group, so the "
           "job resumes from its last checkpoint",
           rank_, t, e.what());
    }
    if (h.stop) break;
    if (!h.pools.empty()) take_resume_pools(h);
    if (h.ahead) {  // a resumed run: the batch the saving run had pre-generated, with the same weights
      ready = generate(h.rl_step, h.version);
      ready_step = h.rl_step;
      continue;
    }
    if (ready_step != h.rl_step) ready = generate(h.rl_step, h.version);
    channel_->exchange(ready);
    ready_step = -1;
    if (c_.max_staleness >= 1) {  // the next step's rollouts while the trainers train this one
      ready = generate(h.rl_step + 1, h.version);
      ready_step = h.rl_step + 1;
    }
  }
  stopped_ = true;
}

const RolloutBatch& RlEngine::next_batch() {
  ATOLL_CHECK(policy_, "rl: next_batch before setup");
  const double t_enter = now_s();
  const int64_t updates = calls_;  // optimizer steps the policy has taken (one per batch)
  // Fault injection (tests): this trainer dies as it asks for its batch of step kill_trainer_step.
  if (c_.kill_trainer_step > 0 && c_.kill_trainer_step == calls_ + 1 && c_.kill_trainer == rank_ && !rollout_rank_)
    std::raise(SIGKILL);
  if (calls_ > 0 && !sft_phase_) step_value_head();
  ++calls_;
  m_ = nlohmann::json::object();
  t_loss_start_ = -1;
  eval_acc_ = -1;
  if (calls_ <= c_.sft_steps) {
    sft_phase_ = true;
    cur_ = sft_batch();
    m_["phase"] = "sft";
    return cur_;
  }
  sft_phase_ = false;
  m_["phase"] = "rl";
  if (!ref_ready_) {
    // The frozen reference (and the rollout copy) start from the policy as RL starts: after the
    // SFT steps, after init or a loaded checkpoint.
    ATOLL_CHECK(!policy_->block_hooks(), "[train] task = 'rl' needs every rank to hold the whole model between steps "
                                         "(parallel.strategy ddp, zero1 or zero2), not a sharded one");
    copy_weights(*ref_, *policy_);
    ref_ready_ = true;
  }
  if (rollout_ && !rollout_ready_) {  // unless a checkpoint restored both
    copy_weights(*rollout_, *policy_);
    rollout_ready_ = true;
  }
  if (epoch_ != 0 && cur_.samples.empty()) epoch_ = 0;  // resumed inside a reused batch: a fresh one
  if (epoch_ == 0) {
    if (c_.placement == "colocated") {
      cur_ = rollouts(*policy_, rl_steps_, -1, true, updates);
      m_["sync_ms"] = 0.0;
    } else if (channel_) {
      disaggregated_batch(updates);
    } else {
      double wait_s = 0;
      if (!worker_.joinable()) {
        pending_ = rollouts(*rollout_, rl_steps_);
        pending_.policy_version = updates;
      } else {
        const double t = now_s();
        worker_.join();
        wait_s = now_s() - t;
      }
      ATOLL_CHECK(worker_error_.empty(), "rl: the rollout thread failed: {}", worker_error_);
      cur_ = std::move(pending_);
      m_["wait_ms"] = wait_s * 1e3;
      // The rollout copy takes the current weights, then generates the next batch while this one trains.
      sync_rollout_model();
      const int64_t next = rl_steps_ + 1, version = updates;
      const int threads = num_threads();
      worker_ = std::thread([this, next, version, threads] {
        // OpenMP's thread count is per thread: a new thread would start with every core and its
        // spinning team would fight the trainer's.
        set_num_threads(threads);
        try {
          pending_ = rollouts(*rollout_, next);
          pending_.policy_version = version;
        } catch (const std::exception& e) {
          worker_error_ = e.what();
        }
      });
    }
    // The bound: the placement's lag, the epochs' reuse and, with partial rollouts, the rounds a
    // carried group may span (rl/partial_rollouts.h).
    const int64_t staleness = updates - cur_.policy_version;
    const int64_t carried = c_.partial_tokens > 0 ? (max_new_ + c_.partial_tokens - 1) / c_.partial_tokens - 1 : 0;
    const int64_t bound = (c_.placement == "colocated" ? 0 : c_.max_staleness) + c_.epochs - 1 + carried;
    ATOLL_CHECK(staleness <= bound, "rl: rollouts {} updates old exceed the staleness bound {}", staleness, bound);
    m_["staleness"] = staleness;
    if (c_.partial_tokens > 0) {
      int64_t mixed = 0;
      for (const Sample& s : cur_.samples)
        if (!s.token_version.empty() && s.token_version.front() != s.token_version.back()) ++mixed;
      m_["partial_samples"] = mixed;  // carried across at least one update
      m_["rollout_groups"] = cur_.B / c_.group_size;
    }
    const double t0 = now_s();
    const Algorithm& alg = algorithm_registry().get(c_.algorithm);
    if (alg.value_head) cur_.old_values = values(*policy_, cur_);
    alg.prepare(cur_, c_.alg);
    cur_.score_s += now_s() - t0;
    ++rl_steps_;
    // Rewards over the whole job (one small all-reduce).
    double sums[5] = {0, 0, 0, 0, 0};
    for (const Sample& s : cur_.samples) {
      sums[0] += s.reward.total;
      sums[1] += s.reward.exact;
      sums[2] += s.reward.format;
      sums[3] += double(s.completion.size());
      sums[4] += 1;
    }
    if (comm_ && world_ > 1) {
      Tensor t = Tensor::from_vector({float(sums[0]), float(sums[1]), float(sums[2]), float(sums[3]), float(sums[4])}, {5});
      comm_->all_reduce(t);
      for (int i = 0; i < 5; ++i) sums[i] = t.f32()[i];
    }
    m_["reward"] = sums[0] / sums[4];
    m_["exact"] = sums[1] / sums[4];
    m_["format"] = sums[2] / sums[4];
    m_["completion_len"] = sums[3] / sums[4];
    if (c_.turns > 1) {  // the model's turns per episode (this rank's)
      double turns = 0;
      for (const Sample& s : cur_.samples) turns += double(s.turns);
      m_["turns"] = turns / double(std::max<size_t>(1, cur_.samples.size()));
    }
    m_["gen_ms"] = cur_.gen_s * 1e3;
    m_["score_ms"] = cur_.score_s * 1e3;
    // Disaggregated: each rollout rank generates its trainers' batches one after another.
    const double gen_ranks = channel_ ? double(channel_->rollout_ranks()) : double(world_);
    m_["gen_tokens_per_s"] = cur_.gen_s > 0 ? double(cur_.gen_tokens) * gen_ranks / cur_.gen_s : 0.0;
  }
  epoch_ = (epoch_ + 1) % c_.epochs;
  m_["rl_step"] = rl_steps_;
  m_["batch_ms"] = (now_s() - t_enter) * 1e3;
  return cur_;
}

Tensor RlEngine::loss(const nn::Model& model, const RolloutBatch& b) {
  t_loss_start_ = now_s();
  const nn::PolicyModel& p = policy_of(model);
  Tensor f = p.features(b.input);
  Tensor logits = p.head(f);
  if (sft_phase_) return ops::cross_entropy(logits, b.target, Tensor(), Tensor());
  PolicyLossStats st;
  Tensor l = policy_loss(logits, b.target, b.old_logp, b.ref_logp, b.advantages, b.weights, c_.loss, &st);
  m_["kl"] = st.kl;
  m_["entropy"] = st.entropy;
  m_["clip_frac"] = st.clip_frac;
  m_["ratio"] = st.ratio;
  m_["policy_loss"] = l.item();
  if (vopt_) {
    Tensor v = ops::linear(f, vw_, vb_);
    Tensor w = b.weights.clone();
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] *= c_.vf_coef;
    Tensor vl = value_loss(v, b.old_values, b.returns, w, c_.value_clip);
    m_["value_loss"] = c_.vf_coef > 0 ? vl.item() / c_.vf_coef : 0.0;
    l = ops::add(l, vl);
  }
  return l;
}

double RlEngine::heldout_accuracy(const nn::Model& model) {
  NoGradGuard ng;
  const double t0 = now_s();
  std::vector<std::vector<int32_t>> rows;
  std::vector<const Problem*> probs;
  for (size_t i = size_t(rank_); i < eval_.size(); i += size_t(world_)) {
    rows.push_back(encode(eval_[i].prompt));
    probs.push_back(&eval_[i]);
  }
  float sums[5] = {0, 0, float(rows.size()), 0, 0};
  if (!rows.empty()) {
    nn::SamplingConfig s;
    s.temperature = 0;
    s.stop_tokens = {kEndMarker};
    std::vector<std::pair<std::string, bool>> answers;
    if (c_.turns > 1) {  // the whole episode, greedy: its final answer
      for (const Episode& e : run_episodes(policy_of(model), *task_, probs, rows, s, max_new_, c_.turns)) {
        answers.emplace_back(e.final_answer, e.stopped);
        sums[3] += float(e.first_exact);
        sums[4] += float(e.turns);
      }
    } else {
      for (const auto& c : policy_of(model).generate_batch(rows, max_new_, s)) answers.emplace_back(decode(c.tokens), c.stopped);
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      Reward r = task_->score(*probs[i], answers[i].first, answers[i].second, 0.0);
      sums[0] += float(r.exact);
      sums[1] += float(r.format);
    }
  }
  // rl.eval_samples: the policy as it trains (rl.temperature), eval_samples episodes per held-out
  // problem from a fixed seed: the expected reward, where the greedy answer moves in jumps.
  float sampled[2] = {0, 0};
  if (c_.eval_samples > 0 && !rows.empty()) {
    std::vector<std::vector<int32_t>> srows;
    std::vector<const Problem*> sprobs;
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t k = 0; k < c_.eval_samples; ++k) srows.push_back(rows[i]), sprobs.push_back(probs[i]);
    nn::SamplingConfig s;
    s.temperature = c_.temperature;
    s.top_k = c_.top_k;
    s.stop_tokens = {kEndMarker};
    s.seed = mix(0x5a3b1e, uint64_t(rank_), 11);
    const std::vector<Episode> eps = run_episodes(policy_of(model), *task_, sprobs, srows, s, max_new_, c_.turns);
    for (size_t i = 0; i < eps.size(); ++i)
      sampled[0] += float(task_->score(*sprobs[i], eps[i].final_answer, eps[i].stopped, c_.format_reward).total);
    sampled[1] = float(eps.size());
  }
  if (c_.eval_samples > 0 && comm_ && world_ > 1) {
    Tensor t = Tensor::from_vector({sampled[0], sampled[1]}, {2});
    comm_->all_reduce(t);
    std::memcpy(sampled, t.f32(), sizeof(sampled));
  }
  if (c_.eval_samples > 0) m_["heldout_sampled_reward"] = sampled[0] / std::max(1.0f, sampled[1]);
  if (comm_ && world_ > 1) {
    Tensor t = Tensor::from_vector({sums[0], sums[1], sums[2], sums[3], sums[4]}, {5});
    comm_->all_reduce(t);
    std::memcpy(sums, t.f32(), sizeof(sums));
  }
  const float n = std::max(1.0f, sums[2]);
  eval_acc_ = sums[0] / n;
  m_["heldout_acc"] = eval_acc_;
  m_["heldout_format"] = sums[1] / n;
  // The training reward's form (exact + rl.format_reward x format) on the held-out problems.
  m_["heldout_reward"] = (sums[0] + c_.format_reward * sums[1]) / n;
  if (c_.turns > 1) {
    m_["heldout_first_acc"] = sums[3] / n;  // right at the first answer
    m_["heldout_turns"] = sums[4] / n;
  }
  m_["eval_ms"] = (now_s() - t0) * 1e3;
  if (rank_ == 0) log::info("rl: held-out accuracy {:.3f} on {} {} problems", eval_acc_, int64_t(sums[2]), task_->name());
  return eval_acc_;
}

std::string RlEngine::sample(const nn::Model& model) {
  nn::SamplingConfig s;
  s.temperature = 0;
  s.stop_tokens = {kEndMarker};
  auto comps = policy_of(model).generate_batch({encode(eval_[0].prompt)}, max_new_, s);
  return eval_[0].prompt + decode(comps[0].tokens) + (comps[0].stopped ? "" : "...");
}

nlohmann::json RlEngine::step_metrics() {
  if (t_loss_start_ >= 0) {
    double train_s = now_s() - t_loss_start_;
    if (m_.contains("eval_ms")) train_s -= m_["eval_ms"].get<double>() / 1e3;
    m_["train_ms"] = train_s * 1e3;
    if (train_s > 0) m_["train_tokens_per_s"] = double(cur_.B * cur_.T) * world_ / train_s;
  }
  if (rank_ == 0 && !sft_phase_ && m_.contains("reward") && (rl_steps_ % 10 == 0 || rl_steps_ == 1))
    log::info("rl step {:>4} | reward {:.3f} exact {:.3f} | kl {:.2e} | gen {:.0f} ms train {:.0f} ms", rl_steps_,
              m_["reward"].get<double>(), m_["exact"].get<double>(), m_.value("kl", 0.0), m_.value("gen_ms", 0.0),
              m_.value("train_ms", 0.0));
  return m_;
}

int64_t RlEngine::sequence_length() const { return task_->max_prompt_len() + max_new_; }

int64_t RlEngine::tokens_per_batch() const {
  return std::max(c_.prompts * c_.group_size, c_.sft_batch) * sequence_length();
}

nlohmann::json RlEngine::state() const {
  nlohmann::json j = {{"calls", calls_}, {"rl_steps", rl_steps_}, {"epoch", epoch_}};
  if (behind_version_ >= 0) {
    j["behind_version"] = behind_version_;
    j["behind_hash"] = fmt::format("{:016x}", behind_hash_);
  }
  return j;
}

void RlEngine::set_state(const nlohmann::json& j) {
  calls_ = j.at("calls").get<int64_t>();
  rl_steps_ = j.at("rl_steps").get<int64_t>();
  epoch_ = j.at("epoch").get<int64_t>();
  // One step off, disaggregated: the resumed step was pre-generated with the last push's weights.
  // An older checkpoint has none: the step is regenerated with the newest weights, as before.
  if (j.contains("behind_version") && channel_ && !rollout_rank_ && c_.max_staleness >= 1 && epoch_ == 0) {
    behind_version_ = j.at("behind_version").get<int64_t>();
    behind_hash_ = std::stoull(j.at("behind_hash").get<std::string>(), nullptr, 16);
    push_behind_ = true;
  }
  sft_phase_ = calls_ > 0 && calls_ <= c_.sft_steps;  // the phase of the last batch (the value head's step)
}

namespace {
const std::string kRef = "task.rl.reference.", kRollout = "task.rl.rollout.", kValue = "task.rl.value_head.",
                  kPartial = "task.rl.partial.", kBehind = "task.rl.behind.";

void save_model(const nn::Model& m, const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) {
  for (nn::Parameter* p : const_cast<nn::Model&>(m).parameters()) out.emplace_back(prefix + p->name, p->value);
}

// True when every parameter of m is in `by` (copied in); false when none is; an error otherwise.
bool load_model(nn::Model& m, const std::string& prefix, const std::map<std::string, const Tensor*>& by) {
  size_t found = 0;
  const auto params = m.parameters();
  for (nn::Parameter* p : params) {
    auto it = by.find(prefix + p->name);
    if (it == by.end()) continue;
    ATOLL_CHECK(it->second->shape() == p->shape, "checkpoint: '{}' has shape {}, the model expects {}", it->first,
                shape_str(it->second->shape()), shape_str(p->shape));
    p->value.copy_from(*it->second);
    ++found;
  }
  ATOLL_CHECK(found == 0 || found == params.size(), "checkpoint: {} of the {} tensors of '{}*' are missing", params.size() - found,
              params.size(), prefix);
  return found > 0;
}
}  // namespace

void RlEngine::save_tensors(std::vector<std::pair<std::string, Tensor>>& out) const {
  if (ref_ && ref_ready_) save_model(*ref_, kRef, out);
  if (rollout_ && rollout_ready_) save_model(*rollout_, kRollout, out);
  if (behind_ && behind_version_ >= 0) save_model(*behind_, kBehind, out);
  if (vopt_) {
    for (const ParamRef& r : vrefs_) {
      out.emplace_back("task.rl." + r.name, r.value);
      out.emplace_back("task.rl." + r.name + ".grad", r.grad);  // stepped at the next batch request
    }
    vopt_->save_state(out, kValue + "adamw.");
  }
  // Carried partial groups (colocated: each rank's own, by its seed rank). make_checkpoint runs on
  // every rank and rank 0 writes, so each rank's pool goes to all (one broadcast of its length,
  // one of its words); every rank then reads its own back on resume.
  // Disaggregated, a trainer holds its stream's pool as its rollout rank sent it with the last batch.
  if (c_.partial_tokens > 0 && !rollout_rank_) {
    auto* self = const_cast<RlEngine*>(this);
    const std::vector<int32_t> mine = channel_ && !carried_.empty() ? carried_ : self->pool_for(rank_).save();
    for (int r = 0; r < world_; ++r) {
      std::vector<int32_t> words = mine;
      if (comm_ && world_ > 1) {
        Tensor n = Tensor::zeros({1}, DType::i64);
        if (r == rank_) n.data<int64_t>()[0] = int64_t(mine.size());
        comm_->broadcast(n, r);
        Tensor w = Tensor::zeros({n.data<int64_t>()[0]}, DType::i32);
        if (r == rank_) std::memcpy(w.data<int32_t>(), mine.data(), mine.size() * 4);
        comm_->broadcast(w, r);
        words.assign(w.data<int32_t>(), w.data<int32_t>() + w.numel());
      }
      Tensor t = Tensor::zeros({int64_t(words.size())}, DType::i32);
      std::memcpy(t.data<int32_t>(), words.data(), words.size() * 4);
      out.emplace_back(kPartial + std::to_string(r), t);
    }
  }
}

void RlEngine::load_tensors(const std::vector<std::pair<std::string, Tensor>>& in) {
  std::map<std::string, const Tensor*> by;
  for (const auto& [n, t] : in) by[n] = &t;
  // An older checkpoint without the reference: it is re-taken from the resumed policy, as before.
  if (ref_) ref_ready_ = load_model(*ref_, kRef, by);
  if (rollout_) rollout_ready_ = load_model(*rollout_, kRollout, by);
  if (channel_ && !rollout_rank_ && rank_ == 0 && by.count(kBehind + policy_->parameters().front()->name)) {
    behind_ = nn::model_from_metadata(policy_->config_metadata());
    load_model(*behind_, kBehind, by);
  }
  if (vopt_ && by.count("task.rl.value_head.weight")) {
    TensorFile f;
    for (const auto& [n, t] : in) f.tensors.emplace_back(n, t);
    for (ParamRef& r : vrefs_) {
      r.value.copy_from(f.get("task.rl." + r.name));
      r.grad.copy_from(f.get("task.rl." + r.name + ".grad"));
    }
    vopt_->load_state(f, kValue + "adamw.");
  }
  // This rank's carried groups; none in an older checkpoint, or for a rank the saving job lacked
  // (a larger job): that rank starts with an empty pool (its groups are drawn anew, none is lost).
  // Disaggregated: trainer 0 sends every stream's pool to the rollout ranks with its first push.
  if (c_.partial_tokens > 0 && !rollout_rank_) {
    std::map<int, std::vector<int32_t>> all;
    for (int r = 0; r < world_; ++r) {
      auto it = by.find(kPartial + std::to_string(r));
      if (it == by.end() || (r != rank_ && !(channel_ && rank_ == 0))) continue;
      ATOLL_CHECK(it->second->dtype() == DType::i32, "checkpoint: '{}' must be int32", it->first);
      const int32_t* w = it->second->data<int32_t>();
      std::vector<int32_t> words(w, w + it->second->numel());
      PartialRollouts check(PartialRolloutConfig{c_.prompts, c_.group_size, max_new_, c_.partial_tokens}, *task_);
      (r == rank_ ? pool_for(rank_) : check).load(words, it->first);  // malformed words: an error naming it
      if (r == rank_ && channel_) carried_ = words;
      all[r] = std::move(words);
    }
    if (channel_ && rank_ == 0 && !all.empty()) resume_pools_ = encode_pools(all);
  }
}

}  // namespace atl::rl
