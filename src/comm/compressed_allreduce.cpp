// The compressed all-reduce; see compressed_allreduce.h.
#include "comm/compressed_allreduce.h"

#include <fmt/format.h>

#include <cstring>

namespace atl::comm {

namespace {
uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
constexpr int kSpecWords = 64;  // 8 bytes of hash, 248 of text
}  // namespace

void exchange_codec_spec(Communicator& comm, const CodecSpec& spec, const std::string& what) {
  const std::string line = spec.describe();
  const int W = comm.size();
  Tensor mine = Tensor::zeros({kSpecWords}, DType::i32), all = Tensor::zeros({int64_t(W) * kSpecWords}, DType::i32);
  uint64_t h = fnv(line);
  std::memcpy(mine.i32(), &h, 8);
  std::memcpy(reinterpret_cast<char*>(mine.i32()) + 8, line.data(), std::min<size_t>(line.size(), 4 * kSpecWords - 9));
  comm.all_gather(mine, all);
  std::string lines;
  bool differ = false;
  for (int r = 0; r < W; ++r) {
    const char* p = reinterpret_cast<const char*>(all.i32() + r * kSpecWords);
    uint64_t hr;
    std::memcpy(&hr, p, 8);
    differ |= hr != h;
    lines += fmt::format("\n  rank {}: {}", r, std::string(p + 8, strnlen(p + 8, 4 * kSpecWords - 8)));
  }
  std::string where = spec.where.empty() ? "" : " (" + spec.where + ")";
  std::string unknown = spec.none() || codec_registry().has(spec.codec)
                            ? ""
                            : fmt::format("; this rank's {} = '{}'{} is not a known codec", what, spec.codec, where);
  ATOLL_CHECK(!differ, "ranks disagree on the gradient codec ({}, error_feedback, codec_rounding, codec_seed, "
              "codec_gather), refused before the first step{}:{}", what, unknown, lines);
  if (!spec.none()) {
    std::string valid;
    for (auto& n : codec_registry().names()) valid += n + ", ";
    ATOLL_CHECK(codec_registry().has(spec.codec), "{}{}: unknown codec '{}'; valid: none, {}", what, where, spec.codec,
                valid.substr(0, valid.size() - 2));
  }
}

struct CompressedAllReducer::State {
  int64_t n = 0;
  std::vector<float> residual, residual2;  // error feedback: the local encode, the owner's re-encode
  std::vector<std::pair<MatrixSpan, GiftTransform>> gift;
  uint64_t calls = 0;
};

CompressedAllReducer::CompressedAllReducer(Communicator* comm, CodecSpec spec, bool exchange)
    : comm_(comm), spec_(std::move(spec)) {
  if (comm_ && comm_->size() > 1 && exchange) exchange_codec_spec(*comm_, spec_, "codec");
  ATOLL_CHECK(!spec_.none(), "CompressedAllReducer: codec 'none' has nothing to compress (use the communicator)");
  std::string w = spec_.where.empty() ? "codec" : "codec (" + spec_.where + ")";
  const CodecEntry& e = codec_registry().get(spec_.codec, w);
  gift_ = e.transform == "gift";
  codec_ = make_codec(spec_.codec, w);
}

CompressedAllReducer::~CompressedAllReducer() {
  // Steps still queued on the communicator hold `this`: the last one done, all are (issue order).
  WorkPtr last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = last_;
  }
  if (last) try {
      last->wait();
    } catch (const std::exception&) {  // its caller reports failures; here only the lifetime matters
    }
}

CompressedAllReducer::State& CompressedAllReducer::state(const std::string& key, int64_t n,
                                                         const std::vector<MatrixSpan>& mats) {
  auto& s = states_[key];
  if (!s) {
    s = std::make_unique<State>();
    s->n = n;
    if (gift_)
      for (const MatrixSpan& m : mats) {
        ATOLL_CHECK(m.offset >= 0 && m.rows > 0 && m.cols > 0 && m.offset + m.rows * m.cols <= n,
                    "compressed all-reduce '{}': matrix at {} ({} x {}) lies outside the tensor of {}", key, m.offset,
                    m.rows, m.cols, n);
        s->gift.emplace_back(m, GiftTransform(m.rows, m.cols, spec_.gift));
      }
  }
  ATOLL_CHECK(s->n == n, "compressed all-reduce '{}': the tensor had {} elements, now {}", key, s->n, n);
  return *s;
}

RoundingRng CompressedAllReducer::rng(uint64_t call, int phase, int chunk) const {
  const int me = comm_ ? comm_->rank() : 0;
  RoundingRng r;
  r.seed = mix(spec_.seed ^ mix(uint64_t(me) * 0x100000001b3ull ^ mix(call * 4 + uint64_t(phase)) ^ uint64_t(chunk) * 7919));
  return r;
}

void CompressedAllReducer::encode_chunks(State& st, uint64_t call, std::vector<float>& x, int64_t n, int64_t c,
                                         int64_t words, const Tensor& send) const {
  const int W = comm_ ? comm_->size() : 1;
  if (spec_.error_feedback) {
    if (st.residual.empty()) st.residual.assign(size_t(n), 0.f);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] += st.residual[size_t(i)];
  }
  std::vector<float> tmp(static_cast<size_t>(c));
  for (int j = 0; j < W; ++j) {
    RoundingRng r = rng(call, 0, j);
    uint8_t* b = reinterpret_cast<uint8_t*>(send.i32() + int64_t(j) * words);
    codec_->encode(x.data() + int64_t(j) * c, c, b, spec_.stochastic ? &r : nullptr);
    if (spec_.error_feedback) {
      codec_->decode(b, c, tmp.data());
      for (int64_t i = 0; i < c && j * c + i < n; ++i)
        st.residual[size_t(j * c + i)] = x[size_t(j * c + i)] - tmp[size_t(i)];
    }
  }
}

void CompressedAllReducer::sum_chunks(const Tensor& recv, int64_t c, int64_t words, ReduceOp op,
                                      std::vector<float>& acc) const {
  // Owner: decode the W encodings of chunk `me` and sum them in f32, in rank order.
  const int W = comm_ ? comm_->size() : 1;
  std::vector<float> tmp(static_cast<size_t>(c));
  acc.assign(static_cast<size_t>(c), 0.f);
  for (int i = 0; i < W; ++i) {
    codec_->decode(reinterpret_cast<const uint8_t*>(recv.i32() + int64_t(i) * words), c, tmp.data());
    for (int64_t e = 0; e < c; ++e) acc[size_t(e)] += tmp[size_t(e)];
  }
  if (op == ReduceOp::avg)
    for (float& v : acc) v /= float(W);
}

void CompressedAllReducer::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const std::string& key) {
  ATOLL_CHECK(in.dtype() == DType::f32 && in.is_contiguous() && out.dtype() == DType::f32 && out.is_contiguous(),
              "compressed reduce-scatter '{}' takes contiguous f32 tensors", key);
  ATOLL_CHECK(op != ReduceOp::max, "compressed reduce-scatter '{}': max is not a codec reduction", key);
  ATOLL_CHECK(!gift_, "compressed reduce-scatter '{}': GIFT's codecs need the whole reduced tensor (use an all-reduce)",
              key);
  const int W = comm_ ? comm_->size() : 1;
  const int64_t c = out.numel(), n = in.numel();
  ATOLL_CHECK(n == c * W, "compressed reduce-scatter '{}': input of {} is not {} chunks of {}", key, n, W, c);
  State* stp;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stp = &state(key, n, {});
  }
  State& st = *stp;
  const uint64_t call = st.calls++;
  std::vector<float> x(in.f32(), in.f32() + n), acc;
  const int64_t words = (codec_->encoded_bytes(c) + 3) / 4;
  Tensor send = Tensor::zeros({int64_t(W) * words}, DType::i32), recv = Tensor::zeros({int64_t(W) * words}, DType::i32);
  encode_chunks(st, call, x, n, c, words, send);
  if (W > 1) comm_->all_to_all(send, recv);
  else recv = send;
  sum_chunks(recv, c, words, op, acc);
  std::memcpy(out.f32(), acc.data(), size_t(c) * 4);
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.calls;
  stats_.bytes_sent += int64_t(W - 1) * words * 4;
  stats_.f32_bytes += int64_t(W - 1) * c * 4;
}

void CompressedAllReducer::all_reduce(const Tensor& t, ReduceOp op, const std::string& key,
                                      const std::vector<MatrixSpan>& mats) {
  start_all_reduce(t, op, key, mats)();
}

// One all-reduce in flight: its buffers, shared by the steps queued on the communicator.
struct CompressedAllReducer::Flight {
  Tensor t;
  ReduceOp op;
  State* st;
  uint64_t call;
  int64_t n, c, words;
  std::vector<float> x, acc, out;
  Tensor send, recv, mine, all;
};

std::function<void()> CompressedAllReducer::start_all_reduce(const Tensor& t, ReduceOp op, const std::string& key,
                                                             const std::vector<MatrixSpan>& mats) {
  ATOLL_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "compressed all-reduce '{}' takes a contiguous f32 tensor",
              key);
  ATOLL_CHECK(op != ReduceOp::max, "compressed all-reduce '{}': max is not a codec reduction", key);
  const int W = comm_ ? comm_->size() : 1;
  auto f = std::make_shared<Flight>();
  f->t = t;
  f->op = op;
  f->n = t.numel();
  f->c = (f->n + W - 1) / W;
  f->words = (codec_->encoded_bytes(f->c) + 3) / 4;
  {
    std::lock_guard<std::mutex> lk(mu_);
    f->st = &state(key, f->n, mats);  // map nodes stay put: the pointer outlives later insertions
  }
  f->call = f->st->calls++;  // on the caller's thread, in issue order
  f->send = Tensor::zeros({int64_t(W) * f->words}, DType::i32);
  f->recv = W > 1 ? Tensor::zeros({int64_t(W) * f->words}, DType::i32) : f->send;
  if (spec_.gather_encoded) {
    f->mine = Tensor::zeros({f->words}, DType::i32);
    f->all = W > 1 ? Tensor::zeros({int64_t(W) * f->words}, DType::i32) : f->mine;
  } else {
    f->mine = Tensor::empty({f->c});
    f->all = W > 1 ? Tensor::empty({int64_t(W) * f->c}) : f->mine;
  }
  if (W == 1) {
    encode_step(*f);
    gather_step(*f);
    finish_step(*f);
    return [] {};
  }
  // Everything is queued now, in issue order on the communicator's worker (comm/communicator.h):
  // the local steps run between the collectives, so the caller goes on computing meanwhile and the
  // result is the synchronous path's bit for bit (the same steps in the same order).
  std::vector<WorkPtr> q;
  q.push_back(comm_->run_async("codec encode", [this, f] { encode_step(*f); }));
  q.push_back(comm_->all_to_all_async(f->send, f->recv));
  q.push_back(comm_->run_async("codec sum", [this, f] { gather_step(*f); }));
  q.push_back(comm_->all_gather_async(f->mine, f->all));
  q.push_back(comm_->run_async("codec decode", [this, f] { finish_step(*f); }));
  {
    std::lock_guard<std::mutex> lk(mu_);
    last_ = q.back();
  }
  return [q] {
    for (const WorkPtr& w : q) w->wait();
  };
}

void CompressedAllReducer::encode_step(Flight& f) {
  // Local: transform, add the residual, encode W chunks.
  const int W = comm_ ? comm_->size() : 1;
  f.x.assign(size_t(f.c) * size_t(W), 0.f);
  std::memcpy(f.x.data(), f.t.f32(), size_t(f.n) * 4);
  for (auto& [m, g] : f.st->gift)
    if (g.active()) g.forward(f.x.data() + m.offset);
  encode_chunks(*f.st, f.call, f.x, f.n, f.c, f.words, f.send);
}

void CompressedAllReducer::gather_step(Flight& f) {
  // The reduced chunk, re-encoded (with its own error feedback) or in f32, for the all-gather.
  const int me = comm_ ? comm_->rank() : 0;
  sum_chunks(f.recv, f.c, f.words, f.op, f.acc);
  if (spec_.gather_encoded) {
    State& st = *f.st;
    if (spec_.error_feedback) {
      if (st.residual2.empty()) st.residual2.assign(size_t(f.c), 0.f);
      for (int64_t e = 0; e < f.c; ++e) f.acc[size_t(e)] += st.residual2[size_t(e)];
    }
    RoundingRng r = rng(f.call, 1, me);
    codec_->encode(f.acc.data(), f.c, reinterpret_cast<uint8_t*>(f.mine.i32()), spec_.stochastic ? &r : nullptr);
  } else {
    std::memcpy(f.mine.f32(), f.acc.data(), size_t(f.c) * 4);
  }
}

void CompressedAllReducer::finish_step(Flight& f) {
  const int W = comm_ ? comm_->size() : 1, me = comm_ ? comm_->rank() : 0;
  const int64_t c = f.c, words = f.words;
  State& st = *f.st;
  f.out.assign(size_t(c) * size_t(W), 0.f);
  int64_t gather_bytes;
  if (spec_.gather_encoded) {
    for (int j = 0; j < W; ++j)
      codec_->decode(reinterpret_cast<const uint8_t*>(f.all.i32() + int64_t(j) * words), c, f.out.data() + int64_t(j) * c);
    if (spec_.error_feedback)
      for (int64_t e = 0; e < c; ++e) st.residual2[size_t(e)] = f.acc[size_t(e)] - f.out[size_t(me * c + e)];
    gather_bytes = words * 4;
  } else {
    std::memcpy(f.out.data(), f.all.f32(), size_t(W * c) * 4);
    gather_bytes = c * 4;
  }
  // Back to the original coordinates; every rank then learns the geometry from the same tensor.
  for (auto& [m, g] : st.gift) {
    g.inverse(f.out.data() + m.offset);
    g.observe(f.out.data() + m.offset);
  }
  std::memcpy(f.t.f32(), f.out.data(), size_t(f.n) * 4);

  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.calls;
  stats_.bytes_sent += int64_t(W - 1) * (words * 4 + gather_bytes);
  stats_.f32_bytes += 2 * int64_t(W - 1) * c * 4;
  if (gift_) {
    int64_t total = 0, act = 0;
    for (auto& [k, s] : states_) {
      total += int64_t(s->gift.size());
      for (auto& [m, g] : s->gift) act += g.active();
    }
    stats_.gift_matrices = total;
    stats_.gift_active = act;
  }
}

std::vector<std::pair<std::string, Tensor>> CompressedAllReducer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  auto floats = [](const std::vector<float>& v) {
    return Tensor::from_vector(v, {int64_t(v.size())});
  };
  for (const auto& [key, s] : states_) {
    Tensor meta = Tensor::empty({2}, DType::i64);
    meta.data<int64_t>()[0] = s->n;
    meta.data<int64_t>()[1] = int64_t(s->calls);
    out.emplace_back(key + ".meta", meta);
    if (!s->residual.empty()) out.emplace_back(key + ".residual", floats(s->residual));
    if (!s->residual2.empty()) out.emplace_back(key + ".residual2", floats(s->residual2));
    if (gift_) {
      // GIFT's matrices and learned geometry, the doubles' bits as i64: [matrices, then per
      // matrix offset, rows, cols, values, its GiftTransform::save()].
      std::vector<int64_t> v = {int64_t(s->gift.size())};
      for (const auto& [m, g] : s->gift) {
        std::vector<double> d = g.save();
        v.insert(v.end(), {m.offset, m.rows, m.cols, int64_t(d.size())});
        for (double x : d) {
          int64_t b;
          std::memcpy(&b, &x, 8);
          v.push_back(b);
        }
      }
      Tensor t = Tensor::empty({int64_t(v.size())}, DType::i64);
      std::memcpy(t.data<int64_t>(), v.data(), v.size() * 8);
      out.emplace_back(key + ".gift", t);
    }
  }
  return out;
}

void CompressedAllReducer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& sd,
                                              const std::string& what) {
  std::lock_guard<std::mutex> lk(mu_);
  states_.clear();
  auto ends = [](const std::string& a, const std::string& b) {
    return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
  };
  for (const auto& [name, t] : sd)
    if (ends(name, ".meta")) {
      ATOLL_CHECK(t.dtype() == DType::i64 && t.numel() == 2, "{}: {} is not an i64 [2]", what, name);
      auto s = std::make_unique<State>();
      s->n = t.contiguous().data<int64_t>()[0];
      s->calls = uint64_t(t.contiguous().data<int64_t>()[1]);
      states_[name.substr(0, name.size() - 5)] = std::move(s);
    }
  for (const auto& [name, t] : sd) {
    if (!ends(name, ".gift")) continue;
    std::string key = name.substr(0, name.size() - 5);
    auto it = states_.find(key);
    ATOLL_CHECK(it != states_.end(), "{}: {} without {}.meta", what, name, key);
    ATOLL_CHECK(gift_, "{}: {} holds GIFT geometry, but this job's codec is '{}'", what, name, spec_.codec);
    ATOLL_CHECK(t.dtype() == DType::i64, "{}: {} is not i64", what, name);
    Tensor c = t.contiguous();
    const int64_t* p = c.data<int64_t>();
    const int64_t len = c.numel();
    int64_t at = 1;
    ATOLL_CHECK(len >= 1 && p[0] >= 0, "{}: {} is malformed", what, name);
    for (int64_t j = 0; j < p[0]; ++j) {
      ATOLL_CHECK(at + 4 <= len && p[at + 3] >= 0 && at + 4 + p[at + 3] <= len, "{}: {} is malformed", what, name);
      MatrixSpan m{p[at], p[at + 1], p[at + 2]};
      ATOLL_CHECK(m.offset >= 0 && m.rows > 0 && m.cols > 0 && m.offset + m.rows * m.cols <= it->second->n,
                  "{}: {}: matrix {} lies outside the tensor of {}", what, name, j, it->second->n);
      std::vector<double> d(size_t(p[at + 3]));
      std::memcpy(d.data(), p + at + 4, d.size() * 8);
      GiftTransform g(m.rows, m.cols, spec_.gift);
      g.load(d, what + ": " + name);
      it->second->gift.emplace_back(m, std::move(g));
      at += 4 + p[at + 3];
    }
  }
  for (const auto& [name, t] : sd) {
    for (const char* suffix : {".residual2", ".residual"}) {
      if (!ends(name, suffix)) continue;
      std::string key = name.substr(0, name.size() - std::strlen(suffix));
      auto it = states_.find(key);
      ATOLL_CHECK(it != states_.end(), "{}: {} without {}.meta", what, name, key);
      ATOLL_CHECK(t.dtype() == DType::f32, "{}: {} is not f32", what, name);
      std::vector<float> v = t.contiguous().to_vector();
      const bool second = std::strcmp(suffix, ".residual2") == 0;
      if (second) it->second->residual2 = std::move(v);
      else {
        ATOLL_CHECK(int64_t(v.size()) == it->second->n, "{}: {} has {} elements, the tensor {}", what, name, v.size(),
                    it->second->n);
        it->second->residual = std::move(v);
      }
      break;
    }
  }
}

int64_t compressed_all_reduce(Communicator& comm, const Tensor& t, const std::string& codec, ReduceOp op,
                              bool stochastic, uint64_t seed) {
  CodecSpec s;
  s.codec = codec;
  s.stochastic = stochastic;
  s.seed = seed;
  CompressedAllReducer r(&comm, s, false);
  r.all_reduce(t, op, "tensor");
  return r.stats().bytes_sent;
}

}  // namespace atl::comm
