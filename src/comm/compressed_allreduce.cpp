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

CompressedAllReducer::~CompressedAllReducer() = default;

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

int64_t CompressedAllReducer::scatter_sum(State& st, uint64_t call, std::vector<float>& x, int64_t n, int64_t c,
                                          ReduceOp op, std::vector<float>& acc) {
  const int W = comm_ ? comm_->size() : 1;
  if (spec_.error_feedback) {
    if (st.residual.empty()) st.residual.assign(size_t(n), 0.f);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] += st.residual[size_t(i)];
  }
  const int64_t B = codec_->encoded_bytes(c), words = (B + 3) / 4;
  Tensor send = Tensor::zeros({int64_t(W) * words}, DType::i32), recv = Tensor::zeros({int64_t(W) * words}, DType::i32);
  auto bytes_of = [&](const Tensor& buf, int j) { return reinterpret_cast<uint8_t*>(buf.i32() + int64_t(j) * words); };
  std::vector<float> tmp(static_cast<size_t>(c));
  for (int j = 0; j < W; ++j) {
    RoundingRng r = rng(call, 0, j);
    codec_->encode(x.data() + int64_t(j) * c, c, bytes_of(send, j), spec_.stochastic ? &r : nullptr);
    if (spec_.error_feedback) {
      codec_->decode(bytes_of(send, j), c, tmp.data());
      for (int64_t i = 0; i < c && j * c + i < n; ++i)
        st.residual[size_t(j * c + i)] = x[size_t(j * c + i)] - tmp[size_t(i)];
    }
  }
  if (W > 1) comm_->all_to_all(send, recv);
  else recv = send;

  // Owner: decode the W encodings of chunk `me` and sum them in f32.
  acc.assign(static_cast<size_t>(c), 0.f);
  for (int i = 0; i < W; ++i) {
    codec_->decode(bytes_of(recv, i), c, tmp.data());
    for (int64_t e = 0; e < c; ++e) acc[size_t(e)] += tmp[size_t(e)];
  }
  if (op == ReduceOp::avg)
    for (float& v : acc) v /= float(W);
  return words;
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
  State& st = state(key, n, {});
  const uint64_t call = st.calls++;
  std::vector<float> x(in.f32(), in.f32() + n), acc;
  const int64_t words = scatter_sum(st, call, x, n, c, op, acc);
  std::memcpy(out.f32(), acc.data(), size_t(c) * 4);
  ++stats_.calls;
  stats_.bytes_sent += int64_t(W - 1) * words * 4;
  stats_.f32_bytes += int64_t(W - 1) * c * 4;
}

void CompressedAllReducer::all_reduce(const Tensor& t, ReduceOp op, const std::string& key,
                                      const std::vector<MatrixSpan>& mats) {
  ATOLL_CHECK(t.dtype() == DType::f32 && t.is_contiguous(), "compressed all-reduce '{}' takes a contiguous f32 tensor",
              key);
  ATOLL_CHECK(op != ReduceOp::max, "compressed all-reduce '{}': max is not a codec reduction", key);
  const int W = comm_ ? comm_->size() : 1, me = comm_ ? comm_->rank() : 0;
  const int64_t n = t.numel(), c = (n + W - 1) / W;
  State& st = state(key, n, mats);
  const uint64_t call = st.calls++;
  float* data = t.f32();

  // Local: transform, add the residual, encode W chunks.
  std::vector<float> x(size_t(c) * size_t(W), 0.f);
  std::memcpy(x.data(), data, size_t(n) * 4);
  int active = 0;
  for (auto& [m, g] : st.gift)
    if (g.active()) {
      g.forward(x.data() + m.offset);
      ++active;
    }
  std::vector<float> acc;
  const int64_t words = scatter_sum(st, call, x, n, c, op, acc);
  auto bytes_of = [&](const Tensor& buf, int j) { return reinterpret_cast<uint8_t*>(buf.i32() + int64_t(j) * words); };
  auto rng_for = [&](int phase, int chunk) { return rng(call, phase, chunk); };

  // All-gather the reduced chunks, re-encoded or in f32.
  std::vector<float> out(size_t(c) * size_t(W));
  int64_t gather_bytes;
  if (spec_.gather_encoded) {
    if (spec_.error_feedback) {
      if (st.residual2.empty()) st.residual2.assign(size_t(c), 0.f);
      for (int64_t e = 0; e < c; ++e) acc[size_t(e)] += st.residual2[size_t(e)];
    }
    Tensor mine = Tensor::zeros({words}, DType::i32), all = Tensor::zeros({int64_t(W) * words}, DType::i32);
    RoundingRng r = rng_for(1, me);
    codec_->encode(acc.data(), c, reinterpret_cast<uint8_t*>(mine.i32()), spec_.stochastic ? &r : nullptr);
    if (W > 1) comm_->all_gather(mine, all);
    else all = mine;
    for (int j = 0; j < W; ++j) codec_->decode(bytes_of(all, j), c, out.data() + int64_t(j) * c);
    if (spec_.error_feedback)
      for (int64_t e = 0; e < c; ++e) st.residual2[size_t(e)] = acc[size_t(e)] - out[size_t(me * c + e)];
    gather_bytes = words * 4;
  } else {
    Tensor mine = Tensor::empty({c}), all = Tensor::empty({int64_t(W) * c});
    std::memcpy(mine.f32(), acc.data(), size_t(c) * 4);
    if (W > 1) comm_->all_gather(mine, all);
    else all = mine;
    std::memcpy(out.data(), all.f32(), size_t(W * c) * 4);
    gather_bytes = c * 4;
  }

  // Back to the original coordinates; every rank then learns the geometry from the same tensor.
  for (auto& [m, g] : st.gift) {
    g.inverse(out.data() + m.offset);
    g.observe(out.data() + m.offset);
  }
  std::memcpy(data, out.data(), size_t(n) * 4);

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
  (void)active;
}

std::vector<std::pair<std::string, Tensor>> CompressedAllReducer::state_tensors() const {
  ATOLL_CHECK(!gift_, "compressed all-reduce: codec '{}' keeps GIFT's geometry, which checkpoints do not hold",
              spec_.codec);
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
  }
  return out;
}

void CompressedAllReducer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& sd,
                                              const std::string& what) {
  ATOLL_CHECK(!gift_, "{}: codec '{}' keeps GIFT's geometry, which checkpoints do not hold", what, spec_.codec);
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
