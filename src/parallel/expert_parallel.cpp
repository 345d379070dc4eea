#include "parallel/expert_parallel.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "autograd/graph.h"
#include "kernels/dispatch.h"
#include "tensor/allocator.h"
#include "core/log.h"

namespace atl::parallel {

void check_expert_layout(const MeshShape& mesh, const nn::Model& model) {
  if (mesh.ep == 1) return;
  const auto* em = dynamic_cast<const nn::ExpertModel*>(&model);
  ATOLL_CHECK(em, "parallel.ep = {}: model family '{}' has no experts", mesh.ep, model.family());
  ATOLL_CHECK(em->num_experts() % mesh.ep == 0,
              "parallel.ep = {}: model.n_experts = {} is not divisible by it (each ep rank holds n_experts / ep)",
              mesh.ep, em->num_experts());
}

namespace {

// Per-(source rank, global expert) row counts, the same matrix on every rank of the group.
struct CountMatrix {
  int64_t P = 1, E = 0, me = 0;
  std::vector<int64_t> c;  // [P, E]
  int64_t at(int64_t s, int64_t g) const { return c[size_t(s * E + g)]; }
  int64_t local() const { return E / P; }
  int64_t rows_of(int64_t s) const {
    int64_t n = 0;
    for (int64_t g = 0; g < E; ++g) n += at(s, g);
    return n;
  }
  // Rows of source s before global expert g in s's sorted order.
  int64_t before(int64_t s, int64_t g) const {
    int64_t n = 0;
    for (int64_t h = 0; h < g; ++h) n += at(s, h);
    return n;
  }
};

CountMatrix exchange_counts(comm::Communicator* ep, const std::vector<int64_t>& counts) {
  CountMatrix m;
  m.P = ep ? ep->size() : 1;
  m.me = ep ? ep->rank() : 0;
  m.E = int64_t(counts.size());
  ATOLL_CHECK(m.E % m.P == 0, "expert parallel: {} experts over {} ranks", m.E, m.P);
  Tensor mine = Tensor::empty({m.E}, DType::i32);
  for (int64_t g = 0; g < m.E; ++g) mine.i32()[g] = int32_t(counts[size_t(g)]);
  Tensor all = Tensor::empty({m.P * m.E}, DType::i32);
  if (m.P > 1) ep->all_gather(mine, all);
  else all.copy_from(mine.view({m.E}));
  m.c.resize(size_t(m.P * m.E));
  for (int64_t i = 0; i < m.P * m.E; ++i) m.c[size_t(i)] = all.i32()[i];
  return m;
}

// Row positions of the experts' side, in local-expert order then source order: for each output
// row, where it sits in the source's sorted rows (source, index).
struct ExpertSide {
  std::vector<int64_t> offsets;          // [local + 1]
  std::vector<std::pair<int64_t, int64_t>> src;  // per output row: (source rank, index in its rows)
};

ExpertSide expert_side(const CountMatrix& m) {
  ExpertSide s;
  const int64_t L = m.local();
  s.offsets.assign(size_t(L + 1), 0);
  for (int64_t e = 0; e < L; ++e) {
    const int64_t g = m.me * L + e;
    for (int64_t r = 0; r < m.P; ++r) {
      const int64_t b = m.before(r, g);
      for (int64_t t = 0; t < m.at(r, g); ++t) s.src.emplace_back(r, b + t);
    }
    s.offsets[size_t(e + 1)] = int64_t(s.src.size());
  }
  return s;
}

// rows of x at `from` -> buf, all_to_all, buf rows at `to` -> out (accumulate or overwrite).
struct Exchange {
  comm::Communicator* ep;
  int64_t P, chunk_rows;        // rows per (pair) chunk
  std::vector<int64_t> pack;    // x row i -> send slot
  std::vector<int64_t> unpack;  // out row o <- recv slot
};

class AllToAllDispatcher;

void run_exchange(const Exchange& ex, const float* x, int64_t width, float* out, bool accumulate, Tensor& send,
                  Tensor& recv) {
  const int64_t n = ex.P * ex.chunk_rows * width;
  if (send.numel() < n) send = Tensor::empty({n});
  if (recv.numel() < n) recv = Tensor::empty({n});
  float* sb = send.f32();
  for (size_t i = 0; i < ex.pack.size(); ++i)
    std::memcpy(sb + ex.pack[i] * width, x + int64_t(i) * width, size_t(width) * sizeof(float));
  Tensor s = send.slice(0, 0, n), r = recv.slice(0, 0, n);
  if (ex.P > 1) ex.ep->all_to_all(s, r);
  else std::memcpy(r.f32(), s.f32(), size_t(n) * sizeof(float));
  const float* rb = recv.f32();
  for (size_t o = 0; o < ex.unpack.size(); ++o) {
    float* d = out + int64_t(o) * width;
    const float* src = rb + ex.unpack[o] * width;
    if (accumulate)
      for (int64_t c = 0; c < width; ++c) d[c] += src[c];
    else
      std::memcpy(d, src, size_t(width) * sizeof(float));
  }
}

struct A2AState {
  Exchange to_experts, to_sources;  // dispatch direction and combine direction
  int64_t M = 0;                    // rows on the source side
  Tensor src;                       // the source side's rows (dispatch's input): the tiled backward's input
  CountMatrix m;
  std::vector<int64_t> offsets;     // expert side, per local expert
};

// A tile of the expert side: rows [o0, o0 + n) of local expert e, all from source s (or, on the
// source side, the same rows' place in its sorted order, from `start`).
struct Tile {
  int64_t s, e, o0, n, start;
};

// The tiles of one (expert rank d, source s) pair and their messages, as the forward's
// experts_and_combine walks them (by local expert, then row chunks of grain.tile_rows; a message
// closes once it holds ceil(rows / grain.messages) rows, every tile its own with messages = 0).
struct PairPlan {
  struct Message {
    size_t first_tile, tiles;
    int64_t start, rows;  // on the source side: rows [start, start + rows) of s's sorted rows
    int tag;
  };
  std::vector<Tile> tiles;
  std::vector<Message> messages;
  int64_t rows = 0, base = 0;  // base: where d's experts' rows start in s's order
};

PairPlan plan_pair(const CountMatrix& m, int64_t d, int64_t s, const OverlapGrain& grain) {
  PairPlan p;
  const int64_t L = m.local();
  p.base = m.before(s, d * L);
  for (int64_t e = 0; e < L; ++e) {
    const int64_t g = d * L + e, n = m.at(s, g);
    int64_t o0 = 0;
    for (int64_t r = 0; r < s; ++r) o0 += m.at(r, g);
    for (int64_t c = 0; c < n; c += grain.tile_rows)
      p.tiles.push_back(Tile{s, e, o0 + c, std::min(grain.tile_rows, n - c), m.before(s, g) + c});
    p.rows += n;
  }
  const int64_t close_at = grain.messages > 0 ? (p.rows + grain.messages - 1) / grain.messages : 0;
  int64_t rows = 0, seen = 0;
  size_t first = 0;
  for (size_t i = 0; i < p.tiles.size(); ++i) {
    rows += p.tiles[i].n, seen += p.tiles[i].n;
    if (rows >= close_at || seen == p.rows) {
      p.messages.push_back({first, i + 1 - first, p.tiles[first].start, rows, int(p.messages.size() & 0x7ffff)});
      first = i + 1, rows = 0;
    }
  }
  return p;
}

// Tags of the tiled backward's two directions between one pair of ranks: output gradients to the
// experts carry the message index, input gradients back to the sources this bit besides.
constexpr int kInputGradTag = 1 << 19;

class AllToAllDispatcher final : public nn::ExpertDispatcher {
 public:
  AllToAllDispatcher(comm::Communicator* ep, bool overlap, OverlapGrain grain)
      : ep_(ep), overlap_(overlap && ep && ep->size() > 1), grain_(grain) {
    ATOLL_CHECK(grain_.tile_rows >= 1 && grain_.messages >= 0, "expert parallel: tiles of {} rows in {} messages "
                "per destination (parallel.ep_overlap_messages must not be negative)", grain_.tile_rows, grain_.messages);
  }
  std::string name() const override { return "all_to_all"; }
  int64_t growths() const { return growths_; }

  nn::ExpertBatch dispatch(const Tensor& rows, const std::vector<int64_t>& counts, int64_t E) override {
    const CountMatrix m = exchange_counts(ep_, counts);
    const ExpertSide side = expert_side(m);
    const int64_t L = m.local();
    // Largest pair count: every rank computes the same from the same matrix, so chunk sizes agree.
    int64_t need = 0, most = 0;
    for (int64_t s = 0; s < m.P; ++s) {
      most = std::max(most, m.rows_of(s));
      for (int64_t d = 0; d < m.P; ++d) {
        int64_t n = 0;
        for (int64_t e = 0; e < L; ++e) n += m.at(s, d * L + e);
        need = std::max(need, n);
      }
    }
    if (cap_ == 0) cap_ = std::max<int64_t>(1, (most + m.P - 1) / m.P);  // an even share
    if (need > cap_) {
      // No-drop routing sent some pair more rows than the buffers hold: grow (every rank alike).
      log::debug("expert parallel: {} rows for one rank pair exceed the buffers' {}; growing", need, cap_);
      cap_ = std::max(need, cap_ + cap_ / 2);
      ++growths_;
    }
    auto st = std::make_shared<A2AState>();
    st->M = rows.size(0);
    Exchange ex{ep_, m.P, cap_, {}, {}};
    // Source side: my row i (sorted by global expert) goes to rank g / L, after that rank's earlier rows.
    ex.pack.resize(size_t(st->M));
    for (int64_t d = 0, i = 0; d < m.P; ++d)
      for (int64_t e = 0, k = 0; e < L; ++e)
        for (int64_t t = 0; t < m.at(m.me, d * L + e); ++t, ++i, ++k) ex.pack[size_t(i)] = d * cap_ + k;
    // Expert side: output row o comes from (source, index); its slot in that source's chunk.
    ex.unpack.resize(side.src.size());
    for (size_t o = 0; o < side.src.size(); ++o) {
      auto [s, idx] = side.src[o];
      ex.unpack[o] = s * cap_ + (idx - m.before(s, m.me * L));
    }
    st->to_experts = ex;
    st->to_sources = Exchange{ep_, m.P, cap_, ex.unpack, ex.pack};
    st->m = m;
    st->offsets = side.offsets;
    nn::ExpertBatch b;
    b.offsets = side.offsets;
    b.first_expert = m.me * L;
    b.rows = move(rows, st->to_experts, st->to_sources, int64_t(side.src.size()), "ep_dispatch");
    if (overlap_ && grain_.backward) st->src = rows;
    b.state = st;
    return b;
  }

  Tensor combine(const Tensor& y, const nn::ExpertBatch& b) override {
    auto st = std::static_pointer_cast<A2AState>(b.state);
    return move(y, st->to_sources, st->to_experts, st->M, "ep_combine");
  }

  bool overlaps_experts() const override { return overlap_; }

  // Tile-level overlap of the experts with the return exchange (the seed paper's signalling, on
  // the communicator's own thread): each rank first posts receives for every tile it will get
  // back, then computes its tiles, those bound for other ranks first, each handed to the
  // communicator thread (send_async) the moment it is done while the next one computes; its own
  // rows are copied in place last. A tile is one (source, expert) block of at most
  // OverlapGrain::tile_rows rows; a destination's tiles go in OverlapGrain::messages sends of
  // consecutive tiles (one per tile with 0: the first version, whose many small messages cost
  // about what they hid across a shaped link, docs/moe.md).
  // The expert math is the grouped GEMM per tile (a row's result does not depend on the rows it
  // is computed with) and the elementwise activation, so outputs equal the plain path's bit for
  // bit; backward is one node running exactly the plain path's backward kernels on the whole
  // tensors, so gradients are identical too.
  Tensor experts_and_combine(const nn::ExpertBatch& b, const Tensor& w1, const Tensor& w2, bool swiglu) override {
    auto st = std::static_pointer_cast<A2AState>(b.state);
    const CountMatrix& m = st->m;
    // Weights of every expert (first: the global index) or of this rank's only (sharded storage).
    const int64_t L = m.local(), R = b.rows.size(0), C = b.rows.size(1), G1 = w1.size(2), F = w2.size(1),
                  first = w1.size(0) == L ? 0 : b.first_expert;
    const kernels::KernelTable& K = kernels::table(b.rows.device(), DType::f32);
    Tensor h = Tensor::empty({R, G1}), act = Tensor::empty({R, F}), y = Tensor::empty({R, C}),
           out = Tensor::empty({st->M, C});
    // Tiles in a fixed order both sides derive from the count matrix: by expert rank d, its local
    // expert e, source s, then row chunks.
    auto tiles_between = [&](int64_t d, int64_t s, auto&& fn) {
      for (int64_t e = 0; e < L; ++e) {
        const int64_t g = d * L + e, n = m.at(s, g);
        int64_t o0 = 0;  // on the expert side: the block's first row within expert e
        for (int64_t r = 0; r < s; ++r) o0 += m.at(r, g);
        for (int64_t c = 0; c < n; c += grain_.tile_rows)
          fn(Tile{s, e, o0 + c, std::min(grain_.tile_rows, n - c), m.before(s, g) + c});
      }
    };
    // Messages: runs of consecutive tiles of one (expert rank, source) pair, closed once they hold
    // ceil(rows / messages) rows (every tile its own with messages = 0). A run's rows are
    // contiguous on the source side (its rows sorted by global expert), so it lands in place in
    // `out`. Both ends walk the same tiles with the same rule; a message's tag is its index in the
    // pair's enumeration (every message of a call is waited for before the next call).
    auto messages_between = [&](int64_t d, int64_t s, auto&& on_tile, auto&& on_message) {
      int64_t total = 0;
      tiles_between(d, s, [&](const Tile& t) { total += t.n; });
      const int64_t close_at = grain_.messages > 0 ? (total + grain_.messages - 1) / grain_.messages : 0;
      int64_t first = -1, rows = 0, seen = 0;
      uint32_t k = 0;
      tiles_between(d, s, [&](const Tile& t) {
        on_tile(t);
        if (first < 0) first = t.start;
        rows += t.n, seen += t.n;
        if (rows >= close_at || seen == total) {
          on_message(first, rows, int(k++ & 0xfffff));
          first = -1, rows = 0;
        }
      });
    };
    // Receives first: every message other ranks send for my rows lands in place in `out`.
    std::vector<comm::WorkPtr> recvs, sends;
    for (int64_t d = 0; d < m.P; ++d) {
      if (d == m.me) continue;
      messages_between(d, m.me, [](const Tile&) {}, [&](int64_t start, int64_t n, int tag) {
        recvs.push_back(ep_->recv_async(out.slice(0, start, start + n), int(d), tag));
      });
    }
    auto compute = [&](const Tile& t) {
      const int64_t o = st->offsets[size_t(t.e)] + t.o0, one[2] = {0, t.n};
      K.moe.grouped_forward(h.f32() + o * G1, b.rows.f32() + o * C, w1.f32() + (first + t.e) * C * G1, one, 1, C, G1);
      if (swiglu) K.act.swiglu_forward(act.f32() + o * F, h.f32() + o * G1, t.n, F);
      else K.act.gelu_forward(act.f32() + o * F, h.f32() + o * G1, t.n * F);
      K.moe.grouped_forward(y.f32() + o * C, act.f32() + o * F, w2.f32() + (first + t.e) * F * C, one, 1, F, C);
      return o;
    };
    // A destination's results are staged in its own order (the source's sorted rows), so that a
    // message of several tiles is one contiguous send; the stage lives until the sends are done.
    std::vector<Tensor> stage(size_t(m.P));
    for (int64_t k = 1; k <= m.P; ++k) {  // other ranks' tiles first, mine last
      const int64_t s = (m.me + k) % m.P;
      if (s == m.me) {
        tiles_between(m.me, s, [&](const Tile& t) {
          const int64_t o = compute(t);
          std::memcpy(out.f32() + t.start * C, y.f32() + o * C, size_t(t.n * C) * sizeof(float));
        });
        continue;
      }
      const int64_t base = m.before(s, m.me * L);  // where my experts' rows start in s's order
      int64_t rows_to_s = 0;
      tiles_between(m.me, s, [&](const Tile& t) { rows_to_s += t.n; });
      Tensor& st_s = stage[size_t(s)];
      st_s = Tensor::empty({rows_to_s, C});
      messages_between(m.me, s,
                       [&](const Tile& t) {
                         const int64_t o = compute(t);
                         std::memcpy(st_s.f32() + (t.start - base) * C, y.f32() + o * C, size_t(t.n * C) * sizeof(float));
                       },
                       [&](int64_t start, int64_t n, int tag) {
                         sends.push_back(ep_->send_async(st_s.slice(0, start - base, start - base + n), int(s), tag));
                       });
    }
    for (auto& w : sends) w->wait();
    for (auto& w : recvs) w->wait();
    if (grain_.backward && st->src.defined()) {
      // The tiled backward takes the dispatch's input directly, so that it sends the input
      // gradients to their sources itself: the dispatch's own node then gets no gradient and
      // does not run (its exchange is this node's).
      if (should_record({&st->src, &w1, &w2}))
        record("ep_experts_combine_overlapped", out, {st->src, w1, w2},
               [this, st, h, act, rows = b.rows, swiglu, offsets = b.offsets, first](Node& n) {
                 tiled_backward(n, *st, rows, h, act, offsets, first, swiglu);
               });
      return out;
    }
    if (should_record({&b.rows, &w1, &w2})) {
      record("ep_experts_combine_overlapped", out, {b.rows, w1, w2},
             [this, st, h, act, swiglu, offsets = b.offsets, first, L, C, G1, F](Node& n) {
               const Tensor &rows = n.inputs[0], &w1i = n.inputs[1], &w2i = n.inputs[2];
               const kernels::KernelTable& K = kernels::table(rows.device(), DType::f32);
               const int64_t R = rows.size(0);
               // The plain path's backward, node by node: combine, down projection, activation, gate/up.
               Tensor gy = Tensor::zeros({R, C}), gact = Tensor::zeros({R, F}), gh = Tensor::zeros({R, G1});
               run_exchange(st->to_experts, grad_of(n.output).f32(), C, gy.f32(), true, send_, recv_);
               float* dw2 = requires_grad(w2i) ? grad_buffer(w2i).f32() + first * F * C : nullptr;
               K.moe.grouped_backward(gact.f32(), dw2, gy.f32(), act.f32(), w2i.f32() + first * F * C, offsets.data(),
                                      L, F, C);
               if (swiglu) K.act.swiglu_backward(gh.f32(), gact.f32(), h.f32(), R, F);
               else K.act.gelu_backward(gh.f32(), gact.f32(), h.f32(), R * F);
               float* dw1 = requires_grad(w1i) ? grad_buffer(w1i).f32() + first * C * G1 : nullptr;
               float* dx = requires_grad(rows) ? grad_buffer(rows).f32() : nullptr;
               K.moe.grouped_backward(dx, dw1, gh.f32(), rows.f32(), w1i.f32() + first * C * G1, offsets.data(), L,
                                      C, G1);
             });
    }
    return out;
  }

 private:
  // The backward of experts_and_combine with both exchanges tiled (OverlapGrain::backward).
  // n.inputs: {source-side rows, w_gate_up, w_down}; rows: the expert side's (the forward's).
  // Every kernel call on a tile is the plain path's on those rows (a row's dx and activation
  // gradient do not depend on the rows computed with it), and the weight gradients are the plain
  // path's whole-tensor calls, made after the tiles while the last input gradients travel: the
  // results equal the plain path's bit for bit.
  void tiled_backward(Node& n, const A2AState& st, const Tensor& rows, const Tensor& h, const Tensor& act,
                      const std::vector<int64_t>& offsets, int64_t first, bool swiglu) {
    const Tensor &src = n.inputs[0], &w1 = n.inputs[1], &w2 = n.inputs[2];
    const CountMatrix& m = st.m;
    const int64_t L = m.local(), R = rows.size(0), C = rows.size(1), G1 = w1.size(2), F = w2.size(1);
    const kernels::KernelTable& K = kernels::table(rows.device(), DType::f32);
    const Tensor gout = grad_of(n.output).contiguous();  // [M, C], the source side
    const bool need_dx = requires_grad(src);
    float* gsrc = need_dx ? grad_buffer(src).f32() : nullptr;
    Tensor gy = Tensor::zeros({R, C}), gact = Tensor::zeros({R, F}), gh = Tensor::zeros({R, G1}),
           dx = Tensor::zeros({R, C});
    std::vector<comm::WorkPtr> sends, dx_recvs;
    std::vector<PairPlan> as_source(size_t(m.P)), as_experts(size_t(m.P));
    std::vector<Tensor> dx_in(size_t(m.P)), gy_in(size_t(m.P)), dx_out(size_t(m.P));
    std::vector<std::vector<comm::WorkPtr>> gy_recvs(size_t(m.P));
    for (int64_t d = 0; d < m.P; ++d) {
      if (d == m.me) continue;
      // As a source: my rows' output gradients to the rank holding their experts, in the
      // forward's messages, and receives for their input gradients coming back.
      PairPlan& ps = as_source[size_t(d)] = plan_pair(m, d, m.me, grain_);
      if (ps.rows > 0 && need_dx) dx_in[size_t(d)] = Tensor::empty({ps.rows, C});
      for (const auto& msg : ps.messages) {
        sends.push_back(ep_->send_async(gout.slice(0, msg.start, msg.start + msg.rows), int(d), msg.tag));
        if (need_dx)
          dx_recvs.push_back(ep_->recv_async(dx_in[size_t(d)].slice(0, msg.start - ps.base, msg.start - ps.base + msg.rows),
                                             int(d), kInputGradTag | msg.tag));
      }
      // As the experts' rank: receives for the output gradients of source d's rows.
      PairPlan& pe = as_experts[size_t(d)] = plan_pair(m, m.me, d, grain_);
      if (pe.rows > 0) gy_in[size_t(d)] = Tensor::empty({pe.rows, C});
      if (pe.rows > 0 && need_dx) dx_out[size_t(d)] = Tensor::empty({pe.rows, C});
      for (const auto& msg : pe.messages)
        gy_recvs[size_t(d)].push_back(ep_->recv_async(
            gy_in[size_t(d)].slice(0, msg.start - pe.base, msg.start - pe.base + msg.rows), int(d), msg.tag));
    }
    // One tile: its output gradient rows (from `g`) through the down projection's and the
    // activation's backward, and, when wanted, the gate/up projection's input gradient.
    auto tile = [&](const Tile& t, const float* g) {
      const int64_t o = offsets[size_t(t.e)] + t.o0, one[2] = {0, t.n};
      float* gyo = gy.f32() + o * C;  // added to zeros, as the plain path's exchange does (-0 stays +0)
      for (int64_t c = 0; c < t.n * C; ++c) gyo[c] += g[c];
      K.moe.grouped_backward(gact.f32() + o * F, nullptr, gy.f32() + o * C, act.f32() + o * F,
                             w2.f32() + (first + t.e) * F * C, one, 1, F, C);
      if (swiglu) K.act.swiglu_backward(gh.f32() + o * G1, gact.f32() + o * F, h.f32() + o * G1, t.n, F);
      else K.act.gelu_backward(gh.f32() + o * G1, gact.f32() + o * F, h.f32() + o * G1, t.n * F);
      if (need_dx)
        K.moe.grouped_backward(dx.f32() + o * C, nullptr, gh.f32() + o * G1, rows.f32() + o * C,
                               w1.f32() + (first + t.e) * C * G1, one, 1, C, G1);
      return o;
    };
    // My own rows first: their gradients are here, while the others' travel.
    for (const Tile& t : plan_pair(m, m.me, m.me, grain_).tiles) {
      const int64_t o = tile(t, gout.f32() + t.start * C);
      if (!need_dx) continue;
      float* d = gsrc + t.start * C;
      const float* x = dx.f32() + o * C;
      for (int64_t c = 0; c < t.n * C; ++c) d[c] += x[c];
    }
    // Then each source's messages as they land, each one's input gradients sent back at once.
    for (int64_t k = 1; k < m.P; ++k) {
      const int64_t s = (m.me + k) % m.P;
      const PairPlan& pe = as_experts[size_t(s)];
      for (size_t i = 0; i < pe.messages.size(); ++i) {
        const auto& msg = pe.messages[i];
        gy_recvs[size_t(s)][i]->wait();
        for (size_t j = msg.first_tile; j < msg.first_tile + msg.tiles; ++j) {
          const Tile& t = pe.tiles[j];
          const int64_t o = tile(t, gy_in[size_t(s)].f32() + (t.start - pe.base) * C);
          if (need_dx)
            std::memcpy(dx_out[size_t(s)].f32() + (t.start - pe.base) * C, dx.f32() + o * C,
                        size_t(t.n * C) * sizeof(float));
        }
        if (need_dx)
          sends.push_back(ep_->send_async(
              dx_out[size_t(s)].slice(0, msg.start - pe.base, msg.start - pe.base + msg.rows), int(s),
              kInputGradTag | msg.tag));
      }
    }
    // The weight gradients over every row, as the plain path computes them, while the last
    // input gradients are on their way.
    if (requires_grad(w2))
      K.moe.grouped_backward(nullptr, grad_buffer(w2).f32() + first * F * C, gy.f32(), act.f32(),
                             w2.f32() + first * F * C, offsets.data(), L, F, C);
    if (requires_grad(w1))
      K.moe.grouped_backward(nullptr, grad_buffer(w1).f32() + first * C * G1, gh.f32(), rows.f32(),
                             w1.f32() + first * C * G1, offsets.data(), L, C, G1);
    for (auto& w : dx_recvs) w->wait();
    for (int64_t d = 0; need_dx && d < m.P; ++d) {
      if (d == m.me || !dx_in[size_t(d)].defined()) continue;
      const PairPlan& ps = as_source[size_t(d)];
      float* g = gsrc + ps.base * C;
      const float* x = dx_in[size_t(d)].f32();
      for (int64_t c = 0; c < ps.rows * C; ++c) g[c] += x[c];
    }
    for (auto& w : sends) w->wait();
  }

  // Differentiable: forward along `fwd`, gradient back along `bwd`.
  Tensor move(const Tensor& x, const Exchange& fwd, const Exchange& bwd, int64_t out_rows, const char* op) {
    ATOLL_CHECK(x.dim() == 2 && x.is_contiguous(), "{}: rows must be a contiguous [rows, width] tensor", op);
    const int64_t w = x.size(1);
    Tensor out = Tensor::empty({out_rows, w});
    run_exchange(fwd, x.f32(), w, out.f32(), false, send_, recv_);
    if (should_record({&x})) {
      record(op, out, {x}, [this, bwd, w](Node& n) {
        const Tensor& xi = n.inputs[0];
        if (!requires_grad(xi)) return;
        run_exchange(bwd, grad_of(n.output).f32(), w, grad_buffer(xi).f32(), true, send_, recv_);
      });
    }
    return out;
  }

  comm::Communicator* ep_;
  bool overlap_;
  OverlapGrain grain_;
  int64_t cap_ = 0, growths_ = 0;
  Tensor send_, recv_;  // persistent, [P * cap * width] at least; used only within one exchange
};

struct AGState {
  std::vector<int64_t> pick;  // expert-side row o <- gathered slot (source * Mmax + index)
  int64_t M = 0, Mmax = 0, P = 1, me = 0;
};

class AllGatherDispatcher final : public nn::ExpertDispatcher {
 public:
  explicit AllGatherDispatcher(comm::Communicator* ep) : ep_(ep) {}
  std::string name() const override { return "all_gather"; }

  nn::ExpertBatch dispatch(const Tensor& rows, const std::vector<int64_t>& counts, int64_t E) override {
    const CountMatrix m = exchange_counts(ep_, counts);
    const ExpertSide side = expert_side(m);
    auto st = std::make_shared<AGState>();
    st->M = rows.size(0), st->P = m.P, st->me = m.me;
    for (int64_t s = 0; s < m.P; ++s) st->Mmax = std::max(st->Mmax, m.rows_of(s));
    for (auto [s, idx] : side.src) st->pick.push_back(s * st->Mmax + idx);
    nn::ExpertBatch b;
    b.offsets = side.offsets;
    b.first_expert = m.me * m.local();
    b.state = st;
    const int64_t w = rows.size(1);
    Tensor out = Tensor::empty({int64_t(st->pick.size()), w});
    gather_pick(*st, rows.f32(), w, out.f32(), false);
    if (should_record({&rows})) {
      record("ep_dispatch_allgather", out, {rows}, [this, st, w](Node& n) {
        const Tensor& xi = n.inputs[0];
        if (requires_grad(xi)) scatter_reduce(*st, grad_of(n.output).f32(), w, grad_buffer(xi).f32(), true);
      });
    }
    b.rows = out;
    return b;
  }

  Tensor combine(const Tensor& y, const nn::ExpertBatch& b) override {
    auto st = std::static_pointer_cast<AGState>(b.state);
    const int64_t w = y.size(1);
    Tensor out = Tensor::empty({st->M, w});
    scatter_reduce(*st, y.f32(), w, out.f32(), false);
    if (should_record({&y})) {
      record("ep_combine_allgather", out, {y}, [this, st, w](Node& n) {
        const Tensor& yi = n.inputs[0];
        if (requires_grad(yi)) gather_pick(*st, grad_of(n.output).f32(), w, grad_buffer(yi).f32(), true);
      });
    }
    return out;
  }

 private:
  // Every rank's M rows (padded to Mmax) gathered; expert-side rows picked from them.
  void gather_pick(const AGState& st, const float* x, int64_t w, float* out, bool accumulate) {
    Tensor mine = Tensor::zeros({st.Mmax * w}), all = Tensor::empty({st.P * st.Mmax * w});
    std::memcpy(mine.f32(), x, size_t(st.M * w) * sizeof(float));
    if (st.P > 1) ep_->all_gather(mine, all);
    else all.copy_from(mine);
    for (size_t o = 0; o < st.pick.size(); ++o) {
      const float* s = all.f32() + st.pick[o] * w;
      float* d = out + int64_t(o) * w;
      for (int64_t c = 0; c < w; ++c) d[c] = accumulate ? d[c] + s[c] : s[c];
    }
  }
  // Expert-side rows scattered into a zero [P, Mmax] buffer, reduce-scattered: each source's rows
  // come back summed with zeros only (exact).
  void scatter_reduce(const AGState& st, const float* y, int64_t w, float* out, bool accumulate) {
    Tensor all = Tensor::zeros({st.P * st.Mmax * w}), mine = Tensor::empty({st.Mmax * w});
    for (size_t o = 0; o < st.pick.size(); ++o)
      std::memcpy(all.f32() + st.pick[o] * w, y + int64_t(o) * w, size_t(w) * sizeof(float));
    if (st.P > 1) ep_->reduce_scatter(all, mine);
    else mine.copy_from(all);
    for (int64_t i = 0; i < st.M * w; ++i) out[i] = accumulate ? out[i] + mine.f32()[i] : mine.f32()[i];
  }

  comm::Communicator* ep_;
};

}  // namespace

std::unique_ptr<nn::ExpertDispatcher> make_expert_dispatcher(const std::string& kind, comm::Communicator* ep,
                                                             bool overlap, OverlapGrain grain) {
  if (kind == "all_to_all") return std::make_unique<AllToAllDispatcher>(ep, overlap, grain);
  ATOLL_CHECK(!overlap, "parallel.ep_overlap = true overlaps the all-to-all's return: it needs ep_dispatcher = "
              "'all_to_all', not '{}'", kind);
  if (kind == "all_gather") return std::make_unique<AllGatherDispatcher>(ep);
  fail("parallel.ep_dispatcher = '{}': all_to_all or all_gather", kind);
}

int64_t dispatcher_buffer_growths(const nn::ExpertDispatcher& d) {
  auto* a = dynamic_cast<const AllToAllDispatcher*>(&d);
  return a ? a->growths() : 0;
}

std::unique_ptr<ExpertShards> apply_expert_parallel(Config& cfg, std::unique_ptr<nn::Model>& model, Mesh& mesh,
                                                    comm::Communicator* world) {
  const std::string kind = cfg.get_string("parallel.ep_dispatcher", "all_to_all", {"all_to_all", "all_gather"});
  const bool overlap = cfg.get_bool("parallel.ep_overlap", false);
  OverlapGrain grain;
  grain.messages = cfg.get_int("parallel.ep_overlap_messages", grain.messages, 0, 1 << 20);
  grain.backward = cfg.get_bool("parallel.ep_overlap_backward", grain.backward);
  const MeshShape& m = mesh.shape();
  if (m.ep == 1) return nullptr;
  check_expert_layout(m, *model);
  ATOLL_CHECK(m.island == 1, "parallel.ep = {} with parallel.islands = {}: sharded experts compose with data, "
              "context, tensor and pipeline parallelism (islands must be 1)", m.ep, m.island);
  // ep x tp (Megatron-Core's composition): each tp rank routes its sequence-parallel share of the
  // tokens over the ep group of its tp coordinate, to experts whole on every tp rank. Without
  // sequence parallelism every tp rank would route and compute the same tokens (Megatron-Core
  // refuses it too).
  ATOLL_CHECK(m.tp == 1 || cfg.get_bool("parallel.sequence_parallel", true), "parallel.ep = {} with parallel.tp = {} "
              "needs parallel.sequence_parallel = true ({}): each tp rank dispatches its own share of the tokens",
              m.ep, m.tp, cfg.where("parallel.sequence_parallel"));
  // ep x tp under ZeRO-3 / HSDP: the experts stay outside the flat buffers ZeRO-3 cuts into units
  // (each rank's are whole, summed over their replicas after backward: expert_shards.h), while
  // tp's partial gradients of the dense units are summed per unit before its reduce-scatter
  // (tensor_parallel_fsdp.cpp). Tested: EpTimesTp.UnderZero3AndHsdpFollowsOneProcess.
  const int64_t E = dynamic_cast<nn::ExpertModel&>(*model).num_experts();
  const int64_t coord = mesh.coord("ep");
  comm::Communicator* ep = mesh.axis("ep");
  ATOLL_CHECK(!ep || (ep->size() == m.ep && ep->rank() == coord), "expert parallel: the ep group ({} ranks, rank {}) "
              "does not match the mesh (ep = {}, coordinate {})", ep ? ep->size() : 1, ep ? ep->rank() : 0, m.ep, coord);
  // The ranks holding the same experts: equal ep coordinates within a pipeline stage (equal pp
  // coordinates: a stage's experts are its MoE layers', ExpertShards::set_pipeline), the tp ranks
  // among them (their token shares reach the same experts).
  const int64_t color = mesh.coord("pp") * m.ep + coord;
  std::unique_ptr<comm::Communicator> replicas = world ? world->split(int(color), world->rank()) : nullptr;
  model = dynamic_cast<nn::ExpertModel&>(*model).expert_shard(m.ep, coord);
  allocator_for(Device::cpu()).release_cache();  // the whole model's buffers go back, not to the cache
  auto d = make_expert_dispatcher(kind, ep, overlap, grain);
  dynamic_cast<nn::ExpertModel&>(*model).set_expert_dispatcher(d.get());
  log::info("expert parallel: {} experts per layer over ep = {} ({} stored on each rank, replicated over {} ranks), "
            "{} dispatcher{}", E, m.ep, E / m.ep, replicas ? replicas->size() : 1, kind,
            overlap ? fmt::format(", experts tiled and overlapped with the return exchange ({} messages per "
                                  "destination{})", grain.messages, grain.messages == 0 ? ": one per tile" : "")
                    : std::string());
  return std::make_unique<ExpertShards>(*model, std::move(d), ep, std::move(replicas));
}

}  // namespace atl::parallel
