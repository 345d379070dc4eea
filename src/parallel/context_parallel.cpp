#include "parallel/context_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "autograd/graph.h"
#include "kernels/dispatch.h"

namespace atl::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const kernels::KernelTable& K(const Tensor& t) { return kernels::table(t.device(), t.dtype()); }

// Where each position's document starts and ends, per row ([B*T] each); one document per row without ids.
struct Docs {
  std::vector<int32_t> start, end;
};
Docs documents(const Tensor& doc_ids, int64_t B, int64_t T) {
  Docs d;
  d.start.resize(size_t(B * T));
  d.end.resize(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* id = doc_ids.defined() ? doc_ids.i32() + b * T : nullptr;
    for (int64_t s = 0; s < T;) {
      int64_t e = s + 1;
      while (id && e < T && id[e] == id[s]) ++e;
      if (!id) e = T;
      for (int64_t t = s; t < e; ++t) d.start[size_t(b * T + t)] = int32_t(s), d.end[size_t(b * T + t)] = int32_t(e);
      s = e;
    }
  }
  return d;
}

// The visible ranges between this rank's queries (global positions pq) and a key block (pk), both
// increasing, so that every range is contiguous in local indices. Returns [4, B*Tq or B*Tk].
struct Ranges {
  std::vector<int32_t> k_lo, k_hi, q_lo, q_hi;
  bool any = false;
  kernels::AttentionRanges view() const { return {k_lo.data(), k_hi.data(), q_lo.data(), q_hi.data()}; }
};
Ranges block_ranges(const std::vector<int32_t>& pq, const std::vector<int32_t>& pk, const Docs& d, int64_t B,
                    int64_t T, bool causal) {
  const int64_t Tq = int64_t(pq.size()), Tk = int64_t(pk.size());
  Ranges r;
  r.k_lo.resize(size_t(B * Tq));
  r.k_hi.resize(size_t(B * Tq));
  r.q_lo.resize(size_t(B * Tk));
  r.q_hi.resize(size_t(B * Tk));
  auto lb = [](const std::vector<int32_t>& v, int32_t x) { return int32_t(std::lower_bound(v.begin(), v.end(), x) - v.begin()); };
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tq; ++t) {
      const int32_t p = pq[size_t(t)], ds = d.start[size_t(b * T + p)], de = d.end[size_t(b * T + p)];
      const size_t i = size_t(b * Tq + t);
      r.k_lo[i] = lb(pk, ds);
      r.k_hi[i] = lb(pk, causal ? p + 1 : de);
      r.any = r.any || r.k_hi[i] > r.k_lo[i];
    }
    for (int64_t j = 0; j < Tk; ++j) {
      const int32_t p = pk[size_t(j)], ds = d.start[size_t(b * T + p)], de = d.end[size_t(b * T + p)];
      const size_t i = size_t(b * Tk + j);
      r.q_lo[i] = lb(pq, causal ? p : ds);
      r.q_hi[i] = lb(pq, de);
    }
  }
  return r;
}

// out/lse += one block's (out_b, lse_b) by the online-softmax rule: the merged lse is the
// log-sum-exp of the two, and each output is weighted by exp(its lse − the merged one).
void merge(float* out, float* lse, const float* out_b, const float* lse_b, int64_t B, int64_t Tq, int64_t H,
           int64_t hd) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tq; ++t) {
        const int64_t li = (b * H + h) * Tq + t;
        const float l2 = lse_b[li];
        if (l2 == -INFINITY) continue;
        float* o = out + (b * Tq + t) * H * hd + h * hd;
        const float* o2 = out_b + (b * Tq + t) * H * hd + h * hd;
        const float l1 = lse[li];
        if (l1 == -INFINITY) {
          std::copy(o2, o2 + hd, o);
          lse[li] = l2;
          continue;
        }
        const float m = std::max(l1, l2), l = m + std::log1p(std::exp(-std::fabs(l1 - l2)));
        const float w1 = std::exp(l1 - l), w2 = std::exp(l2 - l);
        for (int64_t e = 0; e < hd; ++e) o[e] = w1 * o[e] + w2 * o2[e];
        lse[li] = l;
      }
}

// The K and V columns of qkv [B,T,(H+2KV)*hd] -> [B,T,2KV*hd] (what travels around the ring).
Tensor key_values(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd) {
  const int64_t B = qkv.size(0), T = qkv.size(1), S = (H + 2 * KV) * hd, KS = 2 * KV * hd;
  Tensor kv = Tensor::empty({B, T, KS}, DType::f32, qkv.device());
  K(qkv).elem.copy_rows(kv.f32(), KS, qkv.f32() + H * hd, S, B * T, KS, false);
  return kv;
}

struct Ring {
  comm::Communicator* comm;
  int cp, rank;
  int next() const { return (rank + 1) % cp; }
  int prev() const { return (rank + cp - 1) % cp; }
};

// Sends `mine` on to the next rank and receives the previous rank's into `theirs` (started now).
std::pair<comm::WorkPtr, comm::WorkPtr> pass(const Ring& ring, const Tensor& mine, const Tensor& theirs, int tag) {
  auto s = ring.comm->send_async(mine, ring.next(), tag);
  auto r = ring.comm->recv_async(theirs, ring.prev(), tag);
  return {s, r};
}
void finish(std::pair<comm::WorkPtr, comm::WorkPtr>& w) {
  auto t0 = Clock::now();
  w.first->wait();
  w.second->wait();
  ring_times().wait_s += since(t0);
  ring_times().exchanges++;
}

}  // namespace

std::vector<nn::Span> context_spans(int64_t T, int cp, int rank, bool balanced) {
  ATOLL_CHECK(cp >= 1 && rank >= 0 && rank < cp, "context_spans: rank {} of {}", rank, cp);
  if (!balanced) {
    ATOLL_CHECK(T % cp == 0, "a row of {} tokens does not split into {} equal chunks", T, cp);
    return {{rank * (T / cp), T / cp}};
  }
  ATOLL_CHECK(T % (2 * cp) == 0, "a row of {} tokens does not split into 2 x {} equal chunks", T, cp);
  const int64_t c = T / (2 * cp);
  return {{rank * c, c}, {(2 * cp - 1 - rank) * c, c}};
}

RingTimes& ring_times() {
  thread_local RingTimes t;
  return t;
}

Tensor ring_attention(comm::Communicator* comm, const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, int64_t T,
                      bool causal, const Tensor& doc_ids, bool balanced) {
  ATOLL_CHECK(qkv.dtype() == DType::f32 && qkv.is_contiguous() && qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * hd,
              "ring attention: qkv {} is not a contiguous f32 [B,T,(H+2KV)*hd]", shape_str(qkv.shape()));
  ATOLL_CHECK(KV > 0 && H % KV == 0, "ring attention: {} query heads not divisible by {} kv heads", H, KV);
  const Ring ring{comm, comm ? comm->size() : 1, comm ? comm->rank() : 0};
  const int64_t B = qkv.size(0), Tq = qkv.size(1), S = (H + 2 * KV) * hd;
  ATOLL_CHECK(Tq * ring.cp == T, "ring attention: {} local tokens on each of {} ranks for a row of {}", Tq, ring.cp, T);
  if (doc_ids.defined())
    ATOLL_CHECK(doc_ids.dtype() == DType::i32 && doc_ids.numel() == B * T, "ring attention: doc_ids {} for rows [{}, {}]",
                shape_str(doc_ids.shape()), B, T);
  const Docs docs = documents(doc_ids, B, T);
  std::vector<std::vector<int32_t>> pos(size_t(ring.cp));
  for (int r = 0; r < ring.cp; ++r) pos[size_t(r)] = nn::span_positions(context_spans(T, ring.cp, r, balanced));
  const std::vector<int32_t>& pq = pos[size_t(ring.rank)];
  // The block a rank holds at ring step s started on rank - s.
  auto src_of = [rank = ring.rank, cp = ring.cp](int s) { return (rank - s + cp) % cp; };

  Tensor out = Tensor::zeros({B, Tq, H * hd}, DType::f32, qkv.device());
  Tensor lse = Tensor::full({B, H, Tq}, -INFINITY);
  {
    Tensor cur = key_values(qkv, H, KV, hd);
    Tensor ob = Tensor::empty({B, Tq, H * hd}), lb = Tensor::empty({B, H, Tq});
    for (int s = 0; s < ring.cp; ++s) {
      Tensor nxt;
      std::pair<comm::WorkPtr, comm::WorkPtr> w;
      if (s + 1 < ring.cp) {
        nxt = Tensor::empty(cur.shape());
        w = pass(ring, cur, nxt, s);
      }
      auto t0 = Clock::now();
      const Ranges rg = block_ranges(pq, pos[size_t(src_of(s))], docs, B, T, causal);
      if (rg.any) {
        K(qkv).attention.block_forward(ob.f32(), lb.f32(), qkv.f32(), S, cur.f32(), rg.view(), B, Tq, Tq, H, KV, hd);
        merge(out.f32(), lse.f32(), ob.f32(), lb.f32(), B, Tq, H, hd);
      }
      ring_times().compute_s += since(t0);
      if (s + 1 < ring.cp) {
        finish(w);
        cur = nxt;
      }
    }
  }
  if (!(grad_enabled() && requires_grad(qkv))) return out;
  record("ring_attention", out, {qkv}, [=, pos = std::move(pos)](Node& n) {
    const Tensor& x = n.inputs[0];
    const Tensor dout = grad_of(n.output);
    const int64_t KS = 2 * KV * hd;
    // D = dO·O per (b, h, t), with the merged output: every block's probabilities are final ones.
    Tensor D = Tensor::empty({B, H, Tq});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < Tq; ++t) {
          const float* a = dout.f32() + (b * Tq + t) * H * hd + h * hd;
          const float* o = out.f32() + (b * Tq + t) * H * hd + h * hd;
          float acc = 0;
          for (int64_t e = 0; e < hd; ++e) acc += a[e] * o[e];
          D.f32()[(b * H + h) * Tq + t] = acc;
        }
    float* dq = grad_buffer(x).f32();  // the q columns of dqkv, row stride S
    // Each block travels with the accumulator of its dK/dV: at step s this rank adds its queries'
    // share to the accumulator that arrives with the block (received while computing) and sends
    // it on; after cp hops it is home. Tags: 3s for K/V, 3s+1 for accumulators.
    Tensor cur = key_values(x, H, KV, hd), home = Tensor::empty({B, Tq, KS});
    comm::WorkPtr sent;  // the accumulator sent last step (waited before its buffer is dropped)
    Tensor sent_buf;
    for (int s = 0; s < ring.cp; ++s) {
      Tensor nxt, acc_in;
      std::pair<comm::WorkPtr, comm::WorkPtr> w;
      comm::WorkPtr got;
      if (s + 1 < ring.cp) {
        nxt = Tensor::empty(cur.shape());
        w = pass(ring, cur, nxt, 3 * s);
      }
      if (s > 0) {
        acc_in = Tensor::empty({B, Tq, KS});
        got = ring.comm->recv_async(acc_in, ring.prev(), 3 * (s - 1) + 1);
      }
      auto t0 = Clock::now();
      Tensor part = Tensor::zeros({B, Tq, KS});
      const Ranges rg = block_ranges(pq, pos[size_t(src_of(s))], docs, B, T, causal);
      if (rg.any)
        K(x).attention.block_backward(dq, part.f32(), dout.f32(), D.f32(), lse.f32(), x.f32(), S, cur.f32(), rg.view(),
                                      B, Tq, Tq, H, KV, hd);
      ring_times().compute_s += since(t0);
      if (got) {
        auto tw = Clock::now();
        got->wait();
        ring_times().wait_s += since(tw);
        K(x).elem.add_inplace(part.f32(), acc_in.f32(), part.numel());
      }
      if (sent) sent->wait();
      if (ring.cp == 1) {
        home = part;
      } else {
        sent_buf = part;
        sent = ring.comm->send_async(part, ring.next(), 3 * s + 1);
      }
      if (s + 1 < ring.cp) {
        finish(w);
        cur = nxt;
      }
    }
    if (ring.cp > 1) {  // our own block's accumulator, back from its last hop
      auto tw = Clock::now();
      ring.comm->recv_async(home, ring.prev(), 3 * (ring.cp - 1) + 1)->wait();
      sent->wait();
      ring_times().wait_s += since(tw);
    }
    // Our own block's dK/dV, summed over every rank's queries, into the k and v columns.
    K(x).elem.copy_rows(dq + H * hd, S, home.f32(), KS, B * Tq, KS, true);
  });
  return out;
}

RingAttention::RingAttention(comm::Communicator* cp_group, bool balanced)
    : comm_(cp_group), cp_(cp_group ? cp_group->size() : 1), rank_(cp_group ? cp_group->rank() : 0),
      balanced_(balanced) {}

std::vector<nn::Span> RingAttention::spans(int64_t T) const { return context_spans(T, cp_, rank_, balanced_); }
std::vector<nn::Span> RingAttention::spans_of(int64_t rank, int64_t T) const {
  return context_spans(T, cp_, int(rank), balanced_);
}

Tensor RingAttention::attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, int64_t T, bool causal,
                                const Tensor& doc_ids) const {
  return ring_attention(comm_, qkv, H, KV, hd, T, causal, doc_ids, balanced_);
}

double RingAttention::loss_share(int64_t kept_local) const {
  if (!comm_ || cp_ == 1) return 1.0;
  Tensor t = Tensor::empty({1}, DType::i64);
  t.data<int64_t>()[0] = kept_local;
  comm_->all_reduce(t, comm::ReduceOp::sum);
  const int64_t total = t.data<int64_t>()[0];
  return total > 0 ? double(kept_local) * double(cp_) / double(total) : 0.0;
}

void RingAttention::sum_over_ranks(std::vector<int64_t>& v) const {
  if (!comm_ || cp_ == 1 || v.empty()) return;
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i64);
  std::memcpy(t.data<int64_t>(), v.data(), v.size() * sizeof(int64_t));
  comm_->all_reduce(t, comm::ReduceOp::sum);
  std::memcpy(v.data(), t.data<int64_t>(), v.size() * sizeof(int64_t));
}

void check_context_parallel(const MeshShape& mesh, const nn::Model& model, int64_t seq_len, bool balanced,
                            const std::string& where) {
  const int64_t cp = mesh.cp;
  if (cp == 1) return;
  ATOLL_CHECK(dynamic_cast<const nn::SequenceSharded*>(&model) && model.parallelize().covers(nn::ParallelStyle::sequence),
              "parallel.cp = {}: model family '{}' plans no context parallelism (no sequence modules)", cp,
              model.family());
  const int64_t parts = balanced ? 2 * cp : cp;
  ATOLL_CHECK(seq_len % parts == 0,
              "train.seq_len = {}{} does not split over parallel.cp = {}: context parallelism gives each rank two of "
              "2 x cp = {} equal chunks of every row (head and tail, for causal load balance), so train.seq_len "
              "must be a multiple of {}",
              seq_len, where.empty() ? "" : " (" + where + ")", cp, parts, parts);
}

std::unique_ptr<nn::ContextAttention> apply_context_parallel(nn::Model& model, Mesh& mesh, int64_t seq_len,
                                                             bool balanced, const std::string& where) {
  if (mesh.shape().cp == 1) return nullptr;
  check_context_parallel(mesh.shape(), model, seq_len, balanced, where);
  auto ring = std::make_unique<RingAttention>(mesh.axis("cp"), balanced);
  dynamic_cast<nn::SequenceSharded&>(model).set_context_attention(ring.get());
  return ring;
}

}  // namespace atl::parallel
