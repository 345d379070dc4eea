#include "rl/disaggregated.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace atl::rl {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Rollout ranks wait in the push for as long as the trainers take between updates (the whole SFT
// warm start before the first one); a trainer that dies ends the job through `atoll launch`.
constexpr comm::Millis kPushTimeout{24ll * 3600 * 1000};

struct Writer {
  std::vector<int32_t> w;
  void i32(int32_t v) { w.push_back(v); }
  void i64(int64_t v) {
    w.push_back(int32_t(uint32_t(uint64_t(v))));
    w.push_back(int32_t(uint32_t(uint64_t(v) >> 32)));
  }
  void f64(double v) {
    int64_t b;
    std::memcpy(&b, &v, 8);
    i64(b);
  }
  void ids(const std::vector<int32_t>& v) {
    i64(int64_t(v.size()));
    w.insert(w.end(), v.begin(), v.end());
  }
  void str(const std::string& s) { ids(std::vector<int32_t>(s.begin(), s.end())); }
};

struct Reader {
  const std::vector<int32_t>& w;
  size_t at = 0;
  int32_t i32() {
    ATOLL_CHECK(at < w.size(), "rl: a rollout payload ended early (word {} of {})", at, w.size());
    return w[at++];
  }
  int64_t i64() {
    const uint64_t lo = uint32_t(i32()), hi = uint32_t(i32());
    return int64_t(lo | hi << 32);
  }
  double f64() {
    int64_t b = i64();
    double v;
    std::memcpy(&v, &b, 8);
    return v;
  }
  std::vector<int32_t> ids() {
    const int64_t n = i64();
    ATOLL_CHECK(n >= 0 && at + size_t(n) <= w.size(), "rl: a rollout payload holds a bad length {}", n);
    std::vector<int32_t> v(w.begin() + std::ptrdiff_t(at), w.begin() + std::ptrdiff_t(at + size_t(n)));
    at += size_t(n);
    return v;
  }
  std::string str() {
    std::vector<int32_t> v = ids();
    return std::string(v.begin(), v.end());
  }
};

constexpr int32_t kMagic = 0x524c4231;  // "RLB1"

}  // namespace

void push_header(comm::Communicator& g, PushHeader& h, bool root) {
  Tensor hdr = Tensor::zeros({4}, DType::i64);
  auto* v = hdr.data<int64_t>();
  if (root) {
    v[0] = h.version;
    v[1] = h.rl_step;
    v[2] = (h.stop ? 1 : 0) | (h.ahead ? 2 : 0);
    v[3] = int64_t(h.pools.size());
  }
  g.broadcast(hdr, 0);
  if (v[3] > 0) {  // a resumed run's carried pools, once
    Tensor w = Tensor::zeros({v[3]}, DType::i32);
    if (root) std::memcpy(w.i32(), h.pools.data(), h.pools.size() * 4);
    g.broadcast(w, 0);
    if (!root) h.pools.assign(w.i32(), w.i32() + v[3]);
  } else if (!root) {
    h.pools.clear();
  }
  if (!root) {
    h.version = v[0];
    h.rl_step = v[1];
    h.stop = (v[2] & 1) != 0;
    h.ahead = (v[2] & 2) != 0;
  }
}

std::vector<int32_t> encode_pools(const std::map<int, std::vector<int32_t>>& pools) {
  std::vector<int32_t> w = {int32_t(pools.size())};
  for (const auto& [t, words] : pools) {
    w.push_back(t);
    w.push_back(int32_t(words.size()));
    w.insert(w.end(), words.begin(), words.end());
  }
  return w;
}

std::map<int, std::vector<int32_t>> decode_pools(const std::vector<int32_t>& w) {
  std::map<int, std::vector<int32_t>> out;
  size_t at = 0;
  ATOLL_CHECK(!w.empty() && w[0] >= 0, "rl: a push's carried pools are malformed");
  for (int32_t n = w[at++]; n > 0; --n) {
    ATOLL_CHECK(at + 2 <= w.size() && w[at + 1] >= 0 && at + 2 + size_t(w[at + 1]) <= w.size(),
                "rl: a push's carried pools end early (word {} of {})", at, w.size());
    const int t = w[at];
    const size_t len = size_t(w[at + 1]);
    out[t].assign(w.begin() + std::ptrdiff_t(at + 2), w.begin() + std::ptrdiff_t(at + 2 + len));
    at += 2 + len;
  }
  ATOLL_CHECK(at == w.size(), "rl: a push's carried pools have {} words past their end", w.size() - at);
  return out;
}

uint64_t weights_hash(const std::vector<Tensor>& tensors) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const Tensor& t : tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    const size_t n = size_t(t.numel()) * dtype_size(t.dtype());
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {  // 8 bytes a round: the hash costs less than the push
      uint64_t x;
      std::memcpy(&x, p + i, 8);
      h = (h ^ x) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  }
  return h;
}

RolloutChannel::RolloutChannel(std::unique_ptr<comm::Communicator> job, int rollout_ranks, std::vector<Tensor> params,
                               double bucket_mb, int shadow_ranks)
    : job_(std::move(job)), R_(rollout_ranks), S_(shadow_ranks) {
  ATOLL_CHECK(job_, "rl.placement = 'disaggregated' needs a job of several ranks (atoll launch)");
  T_ = job_->size() - R_ - S_;
  ATOLL_CHECK(R_ >= 1 && T_ >= 1, "rl.rollout_ranks ({}) and rl.shadow_ranks ({}) must leave at least one of the job's "
              "{} ranks to train", R_, S_, job_->size());
  if (S_ > 0) {
    split_pairs(std::move(params), bucket_mb);  // rl/shadow_channel.cpp
    return;
  }
  const bool member = job_->rank() == 0 || is_rollout();
  push_ = job_->split(member ? 0 : -1, job_->rank());  // trainer 0 is the push group's rank 0
  if (push_) {
    push_->set_timeout(kPushTimeout);
    sync_ = std::make_unique<WeightSync>(std::move(params), bucket_mb);
  }
}

RolloutChannel::~RolloutChannel() = default;

std::vector<int> RolloutChannel::served() const {
  std::vector<int> t;
  for (int i = job_->rank() - T_; is_rollout() && i < T_; i += R_) t.push_back(i);
  return t;
}

SyncStats RolloutChannel::push(PushHeader& h, double* header_wait_s) {
  if (S_ > 0 && job_->rank() == 0) return push_pairs(h, header_wait_s);
  SyncStats st;
  if (!push_) return st;
  const double t0 = now_s();
  push_header(*push_, h, push_->rank() == 0);
  if (header_wait_s) *header_wait_s = now_s() - t0;
  if (h.stop) return st;
  return sync_->broadcast(*push_, 0);
}

std::vector<int32_t> RolloutChannel::exchange(const std::map<int, std::vector<int32_t>>& mine, int64_t rl_step) {
  if (S_ > 0) return exchange_pairs(mine, rl_step);
  std::vector<int32_t> out;
  for (int t = 0; t < T_; ++t) {
    const int root = T_ + t % R_;
    const bool src = job_->rank() == root;
    const std::vector<int32_t>* p = nullptr;
    if (src) {
      auto it = mine.find(t);
      ATOLL_CHECK(it != mine.end(), "rl: rollout rank {} has no batch for trainer {}", root, t);
      p = &it->second;
    }
    Tensor n = Tensor::zeros({1}, DType::i64);
    auto* nv = n.data<int64_t>();
    if (src) nv[0] = int64_t(p->size());
    job_->broadcast(n, root);
    Tensor words = Tensor::zeros({std::max<int64_t>(1, nv[0])}, DType::i32);
    if (src) std::memcpy(words.i32(), p->data(), p->size() * 4);
    job_->broadcast(words, root);
    if (t == job_->rank()) out.assign(words.i32(), words.i32() + nv[0]);
  }
  return out;
}

std::vector<int32_t> encode_rollouts(const RolloutBatch& b, uint64_t weights_hash) {
  Writer w;
  w.i32(kMagic);
  w.i64(b.policy_version);
  w.i64(b.gen_version);
  w.i64(int64_t(weights_hash));
  w.f64(b.gen_s);
  w.f64(b.score_s);
  w.i64(b.gen_tokens);
  w.i64(int64_t(b.samples.size()));
  for (const Sample& s : b.samples) {
    w.str(s.problem.prompt);
    w.str(s.problem.answer);
    w.ids(s.prompt);
    w.ids(s.completion);
    w.i32(s.stopped ? 1 : 0);
    w.i64(s.group);
    w.f64(s.reward.exact);
    w.f64(s.reward.format);
    w.f64(s.reward.total);
    w.i64(s.uid);
    w.i64(int64_t(s.token_version.size()));
    for (int64_t v : s.token_version) w.i64(v);
    // Multi-turn episodes: which completion tokens are the task's replies (pack_rollouts masks
    // their targets out again on the trainer) and the model's turns.
    w.ids(std::vector<int32_t>(s.env.begin(), s.env.end()));
    w.i64(s.turns);
  }
  std::vector<int32_t> lp(size_t(b.old_logp.numel()));
  std::memcpy(lp.data(), b.old_logp.f32(), lp.size() * 4);  // the behaviour log-probs' bits
  w.ids(lp);
  w.ids(b.carried);
  return std::move(w.w);
}

RolloutBatch decode_rollouts(const std::vector<int32_t>& words, uint64_t* weights_hash) {
  Reader r{words};
  ATOLL_CHECK(r.i32() == kMagic, "rl: a rollout payload does not start with its marker");
  const int64_t version = r.i64(), gen_version = r.i64();
  const uint64_t hash = uint64_t(r.i64());
  const double gen_s = r.f64(), score_s = r.f64();
  const int64_t gen_tokens = r.i64(), n = r.i64();
  ATOLL_CHECK(n > 0 && n < (int64_t(1) << 24), "rl: a rollout payload holds {} samples", n);
  std::vector<Sample> samples(static_cast<size_t>(n));
  for (Sample& s : samples) {
    s.problem.prompt = r.str();
    s.problem.answer = r.str();
    s.prompt = r.ids();
    s.completion = r.ids();
    s.stopped = r.i32() != 0;
    s.group = r.i64();
    s.reward.exact = r.f64();
    s.reward.format = r.f64();
    s.reward.total = r.f64();
    s.uid = r.i64();
    const int64_t nv = r.i64();
    ATOLL_CHECK(nv >= 0 && nv <= int64_t(s.completion.size()) + 1, "rl: a rollout payload holds {} token versions", nv);
    for (int64_t k = 0; k < nv; ++k) s.token_version.push_back(r.i64());
    const std::vector<int32_t> env = r.ids();
    ATOLL_CHECK(env.empty() || env.size() == s.completion.size(), "rl: a rollout payload's reply mask has {} entries "
                "for {} completion tokens", env.size(), s.completion.size());
    for (int32_t e : env) {
      ATOLL_CHECK(e == 0 || e == 1, "rl: a rollout payload's reply mask holds {}", e);
      s.env.push_back(uint8_t(e));
    }
    s.turns = r.i64();
  }
  RolloutBatch b = pack_rollouts(std::move(samples));
  const std::vector<int32_t> lp = r.ids();
  ATOLL_CHECK(int64_t(lp.size()) == b.B * b.T, "rl: a rollout payload's log-probs ({}) do not fit its batch [{},{}]",
              lp.size(), b.B, b.T);
  std::memcpy(b.old_logp.f32(), lp.data(), lp.size() * 4);
  b.carried = r.ids();
  ATOLL_CHECK(r.at == words.size(), "rl: a rollout payload has {} words past its end", words.size() - r.at);
  b.policy_version = version;
  b.gen_version = gen_version;
  b.gen_s = gen_s;
  b.score_s = score_s;
  b.gen_tokens = gen_tokens;
  if (weights_hash) *weights_hash = hash;
  return b;
}

}  // namespace atl::rl
