#include "nn/moe.h"

#include <algorithm>
#include <cmath>

namespace atl::nn {

void MoEConfig::validate(const std::string& s) const {
  ATOLL_CHECK(dim > 0, "{}: the model width must be positive, got {}", s, dim);
  ATOLL_CHECK(n_experts >= 1, "{}.n_experts = {} must be at least 1", s, n_experts);
  ATOLL_CHECK(top_k >= 1 && top_k <= n_experts, "{}.top_k = {} must be between 1 and n_experts = {}", s, top_k,
              n_experts);
  ATOLL_CHECK(expert_ffn >= 1, "{}.expert_ffn = {} must be positive", s, expert_ffn);
  ATOLL_CHECK(n_shared >= 0, "{}.n_shared_experts = {} must not be negative", s, n_shared);
  ATOLL_CHECK(score == "softmax" || score == "sigmoid", "{}.router_score = '{}': softmax or sigmoid", s, score);
  ATOLL_CHECK(std::isfinite(capacity_factor) && capacity_factor > 0,
              "{}.capacity_factor = {} must be above 0 (set drop_tokens = false for no dropping)", s, capacity_factor);
  ATOLL_CHECK(expert_gemm == "grouped" || expert_gemm == "loop", "{}.expert_gemm = '{}': grouped or loop", s,
              expert_gemm);
  ATOLL_CHECK(aux_loss_coef >= 0 && z_loss_coef >= 0, "{}: aux_loss_coef and z_loss_coef must not be negative", s);
  ATOLL_CHECK(expert_ranks >= 1 && n_experts % expert_ranks == 0 && expert_rank >= 0 && expert_rank < expert_ranks,
              "{}.n_experts = {} cannot be sharded as rank {} of {} expert-parallel ranks (parallel.ep)", s, n_experts,
              expert_rank, expert_ranks);
}

ExpertBatch LocalDispatcher::dispatch(const Tensor& rows, const std::vector<int64_t>& counts, int64_t n_experts) {
  ExpertBatch b;
  b.rows = rows;
  b.offsets.assign(size_t(n_experts + 1), 0);
  for (int64_t e = 0; e < n_experts; ++e) b.offsets[size_t(e + 1)] = b.offsets[size_t(e)] + counts[size_t(e)];
  return b;
}

FeedForward::FeedForward(std::string prefix, int64_t dim, int64_t hidden, bool swiglu, const TensorParallelContext* tp)
    : Module(std::move(prefix)), swiglu_(swiglu), tp_(tp) {
  if (tp_) {
    ATOLL_CHECK(hidden >= tp_->size(), "parallel.tp = {}: {} has {} hidden units, fewer than the ranks", tp_->size(),
                name(), hidden);
    auto [lo, hi] = shard_range(hidden, tp_->rank(), tp_->size());
    hidden = hi - lo;
  }
  gate_up_proj = child<Linear>("gate_up_proj", dim, swiglu ? 2 * hidden : hidden, false);
  down_proj = child<Linear>("down_proj", hidden, dim, false);
}

Tensor FeedForward::operator()(const Tensor& x) const {
  const Tensor none;
  Tensor h = tp_ ? tp_->column_linear(x, gate_up_proj->weight->value, none) : (*gate_up_proj)(x);
  h = swiglu_ ? ops::swiglu(h) : ops::gelu(h);
  return tp_ ? tp_->row_linear(h, down_proj->weight->value, none) : (*down_proj)(h);
}

MoELayer::MoELayer(std::string prefix, const MoEConfig& c, const TensorParallelContext* tp)
    : Module(std::move(prefix)), c_(c), tp_(tp) {
  c_.validate();
  const int64_t E = c_.n_experts, C = c_.dim, F = c_.expert_ffn;
  gate = declare("gate.weight", {E, C}, ParamRole::matrix);
  const Shape up{E, C, c_.swiglu ? 2 * F : F}, down{E, F, C};
  if (c_.expert_ranks == 1) {
    w_gate_up = declare("experts.gate_up_proj", up, ParamRole::expert);
    w_down = declare("experts.down_proj", down, ParamRole::expert);
  } else {  // this rank's experts only, outside the tree (and so outside the flat buffers)
    auto own = [&](const std::string& local, Shape s) {
      auto p = std::make_unique<Parameter>();
      p->name = child_prefix(local);
      s[0] = local_experts();
      p->shape = s;
      p->role = ParamRole::expert;
      p->value = Tensor::zeros(s);
      p->grad = Tensor::zeros(s);
      set_requires_grad(p->value, true, p->name, p->grad);
      return p;
    };
    own_gate_up_ = own("experts.gate_up_proj", up);
    own_down_ = own("experts.down_proj", down);
    w_gate_up = own_gate_up_.get();
    w_down = own_down_.get();
  }
  if (c_.n_shared > 0)
    shared = child<FeedForward>("shared_experts", C, c_.n_shared * (c_.shared_ffn > 0 ? c_.shared_ffn : F), c_.swiglu,
                                tp_);
}

std::vector<Parameter*> MoELayer::sharded_experts() const {
  if (!own_gate_up_) return {};
  return {own_gate_up_.get(), own_down_.get()};
}

namespace {
// Token dropping under context parallelism: how many of each expert's assignments on this rank
// (sorted by expert, then by (token, slot): `sorted`, from `start`) are within the capacity when
// the whole rows' assignments are served first come, first served in the rows' order (row, then
// position, then slot), as one rank holding the rows serves them. A rank's tokens are its spans of
// each row in increasing positions, so its assignments to an expert are in that global order, and
// the kept ones a prefix: each (row, span) block's position in the order is the sum of the counts
// of the blocks before it, over every rank (one sum over the cp group: integers, exact).
std::vector<int64_t> context_kept(const ContextAttention& cx, const std::vector<int32_t>& experts,
                                  const std::vector<int32_t>& sorted, const std::vector<int64_t>& start, int64_t N,
                                  int64_t k, int64_t E, int64_t rows, int64_t cap) {
  const int64_t cp = cx.ranks(), Tl = N / rows, T = Tl * cp;
  ATOLL_CHECK(rows > 0 && N % rows == 0, "moe: {} tokens are not {} rows", N, rows);
  // Every rank's spans, in the row's order: block g of a row is the g-th span by position.
  std::vector<Span> all;
  const std::vector<Span> mine = cx.spans(T);
  for (int64_t q = 0; q < cp; ++q)
    for (const Span& s : cx.spans_of(q, T)) all.push_back(s);
  std::sort(all.begin(), all.end());
  const int64_t G = int64_t(all.size());
  // This rank's local position -> the block it falls in.
  std::vector<int32_t> block_of(static_cast<size_t>(Tl));
  int64_t p = 0;
  for (const Span& s : mine) {
    int64_t g = 0;
    while (g < G && all[size_t(g)].first != s.first) ++g;
    ATOLL_CHECK(g < G, "moe: span [{}, {}) is not in the row's layout", s.first, s.first + s.second);
    for (int64_t i = 0; i < s.second; ++i) block_of[size_t(p++)] = int32_t(g);
  }
  ATOLL_CHECK(p == Tl, "moe: this rank's spans hold {} positions, its rows {}", p, Tl);
  auto blk = [&](int64_t a) {  // (row, block) index of assignment a
    const int64_t n = a / k;
    return (n / Tl) * G + block_of[size_t(n % Tl)];
  };
  std::vector<int64_t> count(size_t(rows * G * E), 0);  // [row, block, expert]
  for (int64_t a = 0; a < N * k; ++a) ++count[size_t(blk(a) * E + experts[size_t(a)])];
  cx.sum_over_ranks(count);
  std::vector<int64_t> before(count.size(), 0);  // assignments of earlier blocks, per expert
  for (int64_t e = 0; e < E; ++e)
    for (int64_t b = 1; b < rows * G; ++b)
      before[size_t(b * E + e)] = before[size_t((b - 1) * E + e)] + count[size_t((b - 1) * E + e)];
  std::vector<int64_t> kept(size_t(E), 0);
  for (int64_t e = 0; e < E; ++e) {
    int64_t cur = -1, within = 0;
    for (int64_t i = start[size_t(e)]; i < start[size_t(e + 1)]; ++i) {
      const int64_t b = blk(sorted[size_t(i)]);
      within = b == cur ? within + 1 : 0;
      cur = b;
      if (before[size_t(b * E + e)] + within >= cap) break;  // the rest come later still
      ++kept[size_t(e)];
    }
  }
  return kept;
}
}  // namespace

Routing MoELayer::route(const Tensor& x2, int64_t rows) const {
  const int64_t N = x2.size(0), E = c_.n_experts, k = c_.top_k;
  Routing r;
  r.logits = ops::linear_t(x2, gate->value);
  Tensor scores = c_.score == "sigmoid" ? ops::sigmoid(r.logits) : ops::softmax(r.logits);
  r.probs = c_.score == "sigmoid" ? ops::normalize_rows(scores) : scores;
  ops::TopK tk = ops::topk(scores, k);
  r.weights = c_.norm_topk ? ops::normalize_rows(tk.values) : tk.values;
  const int32_t* idx = tk.indices.i32();
  r.experts.assign(idx, idx + N * k);
  r.counts.assign(size_t(E), 0);
  for (int32_t e : r.experts) ++r.counts[size_t(e)];
  // Assignments sorted by expert, (token, slot) order within one: a counting sort, stable.
  std::vector<int64_t> start(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) start[size_t(e + 1)] = start[size_t(e)] + r.counts[size_t(e)];
  std::vector<int32_t> sorted(size_t(N * k));
  std::vector<int64_t> pos(start.begin(), start.end() - 1);
  for (int64_t a = 0; a < N * k; ++a) sorted[size_t(pos[size_t(r.experts[size_t(a)])]++)] = int32_t(a);
  // Capacity is over the whole rows (the cp group's tokens together, as on one rank).
  const int64_t cp = context ? context->ranks() : 1;
  const int64_t cap = c_.drop_tokens ? int64_t(std::ceil(c_.capacity_factor * double(N * cp * k) / double(E))) : N * k;
  r.kept.assign(size_t(E), 0);
  if (c_.drop_tokens && cp > 1) r.kept = context_kept(*context, r.experts, sorted, start, N, k, E, rows, cap);
  std::vector<int32_t> order, token;
  for (int64_t e = 0; e < E; ++e) {
    if (!(c_.drop_tokens && cp > 1)) r.kept[size_t(e)] = std::min(cap, r.counts[size_t(e)]);
    for (int64_t i = 0; i < r.kept[size_t(e)]; ++i) {
      int32_t a = sorted[size_t(start[size_t(e)] + i)];
      order.push_back(a);
      token.push_back(int32_t(a / k));
    }
  }
  const int64_t M = int64_t(order.size());
  r.order = Tensor::from_vector_i32(order, {M});
  r.token = Tensor::from_vector_i32(token, {M});
  return r;
}

Tensor MoELayer::experts(const Tensor& rows, const std::vector<int64_t>& offsets, int64_t first) const {
  ATOLL_CHECK(first >= first_local_expert() && first + int64_t(offsets.size()) - 1 <= first_local_expert() + local_experts(),
              "{}: experts [{}, {}) asked of a layer holding [{}, {})", name(), first, first + int64_t(offsets.size()) - 1,
              first_local_expert(), first_local_expert() + local_experts());
  first -= first_local_expert();  // index into this rank's stacked weights
  if (c_.expert_gemm == "loop" && rows.size(0) > 0) return experts_loop(rows, offsets, first);
  Tensor h = ops::grouped_linear(rows, w_gate_up->value, offsets, first);
  h = c_.swiglu ? ops::swiglu(h) : ops::gelu(h);
  return ops::grouped_linear(h, w_down->value, offsets, first);
}

Tensor MoELayer::experts_loop(const Tensor& rows, const std::vector<int64_t>& offsets, int64_t first) const {
  // `first` indexes this rank's stacked weights. Each expert's weights are a piece of the stack
  // (split copies them, as a framework without strided views would); experts without rows skip.
  const int64_t G = int64_t(offsets.size()) - 1, El = w_gate_up->value.size(0);
  ATOLL_CHECK(rows.size(0) > 0, "{}: a loop of experts over no rows", name());
  std::vector<int64_t> sizes, ones(size_t(El), 1);
  for (int64_t g = 0; g < G; ++g) sizes.push_back(offsets[size_t(g + 1)] - offsets[size_t(g)]);
  std::vector<Tensor> xs = ops::split(rows, sizes, 0), ups = ops::split(w_gate_up->value, ones, 0),
                      downs = ops::split(w_down->value, ones, 0), ys;
  const Tensor none;
  for (int64_t g = 0; g < G; ++g) {
    if (sizes[size_t(g)] == 0) continue;
    const Tensor& wu = ups[size_t(first + g)];
    const Tensor& wd = downs[size_t(first + g)];
    Tensor h = ops::linear(xs[size_t(g)], ops::reshape(wu, {wu.size(1), wu.size(2)}), none);
    h = c_.swiglu ? ops::swiglu(h) : ops::gelu(h);
    ys.push_back(ops::linear(h, ops::reshape(wd, {wd.size(1), wd.size(2)}), none));
  }
  return ys.size() == 1 ? ys[0] : ops::concat(ys, 0);
}

Tensor MoELayer::operator()(const Tensor& x) const { return forward_impl(x, nullptr); }

Tensor MoELayer::forward_with(const Tensor& x, const ExpertFn& expert) const { return forward_impl(x, &expert); }

Tensor MoELayer::forward_impl(const Tensor& x, const ExpertFn* expert) const {
  const int64_t C = c_.dim, E = c_.n_experts, k = c_.top_k;
  ATOLL_CHECK(x.size(-1) == C, "{}: input width {} is not the layer's {}", name(), x.size(-1), C);
  const int64_t N = x.numel() / C;
  Tensor x2 = ops::reshape(x, {N, C});
  ATOLL_CHECK(!(c_.drop_tokens && context && context->ranks() > 1 && tp_ && tp_->sequence_sharded()),
              "{}: model.drop_tokens = true with parallel.cp = {} and parallel.tp: under sequence parallelism the "
              "capacity is each tp rank's own tokens', which with cp is not one rank's; set model.drop_tokens = false "
              "or parallel.tp = 1", name(), context->ranks());
  Routing r = route(x2, x.dim() == 3 ? x.size(0) : 1);
  const int64_t M = r.order.numel();

  Tensor rows = ops::index_select(x2, 0, r.token);                                // [M, C] by expert
  Tensor gate_w = ops::index_select(ops::reshape(r.weights, {N * k, 1}), 0, r.order);  // [M, 1]
  static LocalDispatcher local;
  ExpertDispatcher& d = dispatcher_ ? *dispatcher_ : local;
  ATOLL_CHECK(dispatcher_ || c_.expert_ranks == 1, "{}: holds experts [{}, {}) of {} only and needs an "
              "expert-parallel dispatcher (parallel.ep = {})", name(), first_local_expert(),
              first_local_expert() + local_experts(), E, c_.expert_ranks);
  ExpertBatch b = d.dispatch(rows, r.kept, E);
  ATOLL_CHECK(c_.expert_ranks == 1 || (b.first_expert == first_local_expert() &&
                                       int64_t(b.offsets.size()) - 1 == local_experts()),
              "{}: the dispatcher hands experts from {} ({} of them) to a layer holding [{}, {})", name(),
              b.first_expert, int64_t(b.offsets.size()) - 1, first_local_expert(), first_local_expert() + local_experts());
  ATOLL_CHECK(expert || !d.overlaps_experts() || c_.expert_gemm == "grouped",
              "{}: model.expert_gemm = '{}' cannot run with the tile-overlapped dispatcher (parallel.ep_overlap), "
              "which computes the experts as grouped GEMMs", name(), c_.expert_gemm);
  Tensor y;  // [M, C]
  if (!expert && d.overlaps_experts()) y = d.experts_and_combine(b, w_gate_up->value, w_down->value, c_.swiglu);
  else y = d.combine(expert ? (*expert)(b.rows, b.offsets, b.first_expert) : experts(b.rows, b.offsets, b.first_expert), b);
  Tensor out = ops::segment_sum(ops::mul(y, gate_w), r.token, N);                  // [N, C]
  if (shared) out = ops::add(out, ops::reshape((*shared)(x2), {N, C}));

  // Under sequence parallelism the tp group's tokens make the losses' batch: the counts and the
  // token total summed over tp (integers, exact in f32), each rank's rows adding their terms.
  const bool split = tp_ && tp_->sequence_sharded();
  std::vector<double> count(r.counts.begin(), r.counts.end());
  double Nt = double(N);
  if (split) {
    Tensor t = Tensor::empty({E + 1});
    for (int64_t e = 0; e < E; ++e) t.f32()[e] = float(r.counts[size_t(e)]);
    t.f32()[E] = float(N);
    Tensor sum = tp_->reduce_from_region(t);
    for (int64_t e = 0; e < E; ++e) count[size_t(e)] = double(sum.f32()[e]);
    Nt = double(sum.f32()[E]);
  }
  // Under context parallelism the whole row's tokens make the losses' batch, as on one rank: the
  // counts and the token total summed over the cp group (integers: exact), and each rank's terms
  // of the two sums scaled by the group's size, so that the ranks' losses and gradients averaged
  // over cp, as data parallelism averages them, are the whole sequence's (the same rule as the
  // cross-entropy's loss_share).
  const int64_t cp = context ? context->ranks() : 1;
  if (cp > 1) {
    std::vector<int64_t> c(size_t(E + 1));
    for (int64_t e = 0; e < E; ++e) c[size_t(e)] = int64_t(count[size_t(e)]);
    c[size_t(E)] = int64_t(Nt);
    context->sum_over_ranks(c);
    for (int64_t e = 0; e < E; ++e) count[size_t(e)] = double(c[size_t(e)]);
    Nt = double(c[size_t(E)]);
  }
  // Load balance: E/(k N) sum_e count_e mean_n p[n,e] = sum over p of p * E count_e / (k N^2).
  std::vector<float> cw(size_t(N * E));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e)
      cw[size_t(n * E + e)] = float(double(cp) * double(E) * count[size_t(e)] / (double(k) * Nt * Nt));
  Tensor balance = ops::dot_const(r.probs, Tensor::from_vector(cw, {N, E}));
  // z-loss: logsumexp_n = logits[n,0] - log_softmax(logits)[n,0].
  Tensor col0 = Tensor::from_vector_i32({0}, {1});
  Tensor lse = ops::add(ops::index_select(r.logits, 1, col0),
                        ops::mul(ops::index_select(ops::log_softmax(r.logits), 1, col0), Tensor::full({1}, -1.f)));
  Tensor z = ops::dot_const(ops::mul(lse, lse), Tensor::full({N, 1}, float(double(cp) / Nt)));
  if (split) {  // the group's losses in value; each rank's gradient is its own rows' share
    const Shape bs = balance.shape(), zs = z.shape();
    std::vector<Tensor> parts = ops::split(
        tp_->reduce_from_region(ops::concat({ops::reshape(balance, {1}), ops::reshape(z, {1})}, 0)), {1, 1}, 0);
    balance = ops::reshape(parts[0], bs);
    z = ops::reshape(parts[1], zs);
  }
  balance_value_ = balance.item();
  z_value_ = z.item();
  dropped_fraction_ = 1.0 - double(M) / double(N * k);
  aux_total_ = ops::add(ops::mul(balance, Tensor::full({1}, float(c_.aux_loss_coef))),
                        ops::mul(z, Tensor::full({1}, float(c_.z_loss_coef))));
  Shape s = x.shape();
  return ops::reshape(out, s);
}

}  // namespace atl::nn
