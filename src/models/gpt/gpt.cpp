#include "models/gpt/gpt.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>


namespace atl::nn {

namespace {
int64_t local_size(int64_t n, const TensorParallelContext* tp) {
  if (!tp) return n;
  auto [lo, hi] = shard_range(n, tp->rank(), tp->size());
  return hi - lo;
}
int64_t tp_size(const TensorParallelContext* tp) { return tp ? tp->size() : 1; }
}  // namespace

Attention::Attention(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp)
    : Module(std::move(prefix)), c_(c), tp_(tp), heads_(c.n_head / tp_size(tp)), kv_heads_(c.n_kv_head / tp_size(tp)) {
  int64_t hd = c.head_dim();
  c_attn = child<Linear>("c_attn", c.n_embd, (heads_ + 2 * kv_heads_) * hd, c.bias);
  c_proj = child<Linear>("c_proj", heads_ * hd, c.n_embd, c.bias);
}

Tensor Attention::operator()(const Tensor& x) const {
  auto bias = [](const Linear* l) { return l->bias ? l->bias->value : Tensor(); };
  Tensor qkv = tp_ ? tp_->column_linear(x, c_attn->weight->value, bias(c_attn)) : (*c_attn)(x);
  Tensor a = recompute_core && grad_enabled()
                 ? checkpoint("recompute_attention", qkv, [this](const Tensor& q) { return core(q); })
                 : core(qkv);
  return tp_ ? tp_->row_linear(a, c_proj->weight->value, bias(c_proj)) : (*c_proj)(a);
}

MLP::MLP(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp)
    : Module(std::move(prefix)), c_(c), tp_(tp) {
  int64_t f = local_size(c.ffn(), tp);
  c_fc = child<Linear>("c_fc", c.n_embd, c.swiglu ? 2 * f : f, c.bias);
  c_proj = child<Linear>("c_proj", f, c.n_embd, c.bias);
}

Tensor MLP::operator()(const Tensor& x) const {
  auto bias = [](const Linear* l) { return l->bias ? l->bias->value : Tensor(); };
  Tensor h = tp_ ? tp_->column_linear(x, c_fc->weight->value, bias(c_fc)) : (*c_fc)(x);
  h = c_.swiglu ? ops::swiglu(h) : ops::gelu(h);
  return tp_ ? tp_->row_linear(h, c_proj->weight->value, bias(c_proj)) : (*c_proj)(h);
}

Block::Block(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp) : Module(std::move(prefix)) {
  ln_1 = child<Norm>("ln_1", c.n_embd, c.rms_norm, c.bias, c.norm_eps);
  attn = child<Attention>("attn", c, tp);
  ln_2 = child<Norm>("ln_2", c.n_embd, c.rms_norm, c.bias, c.norm_eps);
  mlp = child<MLP>("mlp", c, tp);
}

Tensor Block::operator()(const Tensor& x) const {
  Tensor r = ops::add(x, (*attn)((*ln_1)(x)));
  return ops::add(r, (*mlp)((*ln_2)(r)));
}

GPT::GPT(const GPTConfig& c, const TensorParallelContext* tp) : Model(""), c_(c), tp_(tp) {
  c_.validate();
  if (tp_) check_tensor_parallel(c_, tp_->size());  // parallelize.cpp
  int64_t V = local_size(c_.vocab_size, tp_);
  vocab_lo_ = tp_ ? shard_range(c_.vocab_size, tp_->rank(), tp_->size()).first : 0;
  wte = child<Embedding>("transformer.wte", V, c_.n_embd);
  if (!c_.rope) wpe = child<Embedding>("transformer.wpe", c_.block_size, c_.n_embd);
  for (int64_t i = 0; i < c_.n_layer; ++i) h.push_back(child<Block>("transformer.h." + std::to_string(i), c_, tp_));
  ln_f = child<Norm>("transformer.ln_f", c_.n_embd, c_.rms_norm, c_.bias, c_.norm_eps);
  if (!c_.tied_head) lm_head = declare("lm_head.weight", {V, c_.n_embd}, ParamRole::head);
  materialize();
}

void GPT::init_weights(uint64_t seed) {
  if (tp_) {  // the whole model's initialisation, this rank's pieces of it (any tp size starts alike)
    GPT full(c_);
    full.init_weights(seed);
    ParallelPlan plan = full.parallelize();
    for (Parameter* p : parameters()) {
      Parameter* f = full.find(p->name);
      p->value.copy_from(take_shard(f->value, shard_rule(plan, p->name, f->shape), tp_->rank(), tp_->size()));
    }
    return;
  }
  Rng rng(seed, 0);
  float proj_std = 0.02f / std::sqrt(2.f * float(c_.n_layer));
  for (Parameter* p : parameters()) {
    const std::string& n = p->name;
    bool is_bias = n.size() >= 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    if (p->shape.size() == 1) p->value.fill(is_bias ? 0.f : 1.f);
    else if (n.find("c_proj.weight") != std::string::npos) rng.fill_normal(p->value, 0.f, proj_std);
    else rng.fill_normal(p->value, 0.f, 0.02f);
  }
}

Parameter* GPT::head_weight() const { return c_.tied_head ? wte->weight : lm_head; }

Tensor GPT::hidden(const Tensor& tokens) const {
  ATOLL_CHECK(tokens.dim() == 2, "model input must be [B,T] token ids");
  ATOLL_CHECK(tokens.size(1) <= c_.block_size, "sequence length {} exceeds block_size {}", tokens.size(1), c_.block_size);
  begin_forward();
  Tensor wpe_t = wpe && !pos_ids_.defined() ? wpe->weight->value : Tensor();
  if (tp_) tp_->begin_forward(tokens.size(0), tokens.size(1));
  Tensor x = tp_ ? tp_->vocab_embedding(tokens, wte->weight->value, vocab_lo_, wpe_t)
                 : ops::embedding(tokens, wte->weight->value, wpe_t);
  if (wpe && pos_ids_.defined()) x = ops::add(x, learned_positions(pos_ids_));  // per document (set_position_ids)
  x = run_blocks(x, h.size(), [this](size_t i, const Tensor& in) { return (*h[i])(in); });
  return (*ln_f)(x);
}

Tensor GPT::loss(const Tensor& tokens, const Tensor& targets) const {
  ATOLL_CHECK(targets.shape() == tokens.shape(), "targets {} do not match tokens {}", shape_str(targets.shape()),
              shape_str(tokens.shape()));
  if (context_) return loss_context_parallel(tokens, targets);
  if (tp_) return tp_->vocab_cross_entropy(tp_logits(tokens), targets, vocab_lo_);
  return ops::head_cross_entropy(hidden(tokens), head_weight()->value, targets);
}

Tensor GPT::tp_logits(const Tensor& tokens) const { return tp_->vocab_logits(hidden(tokens), head_weight()->value); }

Tensor GPT::logits(const Tensor& tokens) const {
  if (tp_) {
    ATOLL_CHECK(!grad_enabled(), "GPT::logits under tensor parallelism is for inference (the loss never gathers)");
    return tp_->gather_vocab(tp_logits(tokens), c_.vocab_size).view({tokens.size(0), tokens.size(1), c_.vocab_size});
  }
  return ops::linear_t(hidden(tokens), head_weight()->value);
}

// Pipeline stages (nn/pipeline_stages.h): together exactly loss(), for the whole model or its
// tensor-parallel shard (between blocks a shard under sequence parallelism holds its token rows).
// Under pp x cp every stage holds this rank's cp share of each row (gpt_context.cpp).
void GPT::stage_begin(const Shape& in) const {
  if (tp_) tp_->begin_forward(in.at(0), in.at(1) / (context_ ? context_->ranks() : 1));
}

Shape GPT::stage_hidden_shape(const Shape& in) const {
  const int64_t T = in.at(1) / (context_ ? context_->ranks() : 1);
  if (tp_ && tp_->sequence_sharded()) return {in.at(0) * T / tp_->size(), c_.n_embd};
  return {in.at(0), T, c_.n_embd};
}

Tensor GPT::stage_input(const Tensor& tokens) const {
  ATOLL_CHECK(tokens.dim() == 2, "model input must be [B,T] token ids");
  ATOLL_CHECK(tokens.size(1) <= c_.block_size, "sequence length {} exceeds block_size {}", tokens.size(1), c_.block_size);
  if (context_) return context_embedding(tokens);
  Tensor wpe_t = wpe ? wpe->weight->value : Tensor();
  if (tp_) return tp_->vocab_embedding(tokens, wte->weight->value, vocab_lo_, wpe_t);
  return ops::embedding(tokens, wte->weight->value, wpe_t);
}

Tensor GPT::stage_blocks(const Tensor& x, int64_t first, int64_t last) const {
  ATOLL_CHECK(0 <= first && first <= last && last <= c_.n_layer, "blocks [{}, {}) of {}", first, last, c_.n_layer);
  Tensor y = x;
  for (int64_t i = first; i < last; ++i) {
    const size_t b = size_t(i);
    if (recompute(b) == Recompute::full && grad_enabled())  // [train] recompute, as run_blocks does
      y = checkpoint("recompute_block", y, [this, b](const Tensor& xi) { return (*h[b])(xi); });
    else
      y = (*h[b])(y);
  }
  return y;
}

Tensor GPT::stage_loss(const Tensor& x, const Tensor& targets) const {
  if (context_) return context_head_loss(x, targets);
  if (tp_) return tp_->vocab_cross_entropy(tp_->vocab_logits((*ln_f)(x), head_weight()->value), targets, vocab_lo_);
  return ops::head_cross_entropy((*ln_f)(x), head_weight()->value, targets);
}

namespace {
struct Gpt2Names : StateDictAdapter {
  bool ignorable(const std::string& key) const override { return key == "lm_head.weight"; }
};
}  // namespace

const StateDictAdapter& GPT::state_dict_adapter() const {
  static const Gpt2Names names;
  return names;
}

std::map<std::string, std::string> GPT::config_metadata() const {
  nlohmann::json j = {{"vocab_size", c_.vocab_size}, {"block_size", c_.block_size}, {"n_layer", c_.n_layer},
                      {"n_head", c_.n_head},         {"n_kv_head", c_.n_kv_head},   {"n_embd", c_.n_embd},
                      {"ffn_hidden", c_.ffn()},      {"rms_norm", c_.rms_norm},     {"swiglu", c_.swiglu},
                      {"rope", c_.rope},             {"tied_head", c_.tied_head},   {"bias", c_.bias},
                      {"rope_theta", c_.rope_theta}, {"norm_eps", c_.norm_eps}};
  auto md = Model::config_metadata();
  md["atoll_model"] = j.dump();
  return md;
}

GPTConfig config_from_metadata(const std::map<std::string, std::string>& md) {
  auto it = md.find("atoll_model");
  ATOLL_CHECK(it != md.end(), "weights file has no atoll_model metadata");
  auto j = nlohmann::json::parse(it->second);
  GPTConfig c;
  c.vocab_size = j["vocab_size"];
  c.block_size = j["block_size"];
  c.n_layer = j["n_layer"];
  c.n_head = j["n_head"];
  c.n_kv_head = j["n_kv_head"];
  c.n_embd = j["n_embd"];
  c.ffn_hidden = j["ffn_hidden"];
  c.rms_norm = j["rms_norm"];
  c.swiglu = j["swiglu"];
  c.rope = j["rope"];
  c.tied_head = j["tied_head"];
  c.bias = j["bias"];
  c.rope_theta = j["rope_theta"];
  c.norm_eps = j["norm_eps"];
  c.validate();
  return c;
}

double GPT::flops_per_token(int64_t T) const {
  // Matmul parameters: everything except norms, biases and position embeddings; the tied or
  // untied head counts once as the output projection, the input embedding lookup is free.
  double n = 0;
  if (tp_) {  // this rank holds pieces: count the whole model's matrices from the config
    const double C = double(c_.n_embd), hd = double(c_.head_dim()), F = double(c_.ffn());
    double layer = C * double(c_.n_head + 2 * c_.n_kv_head) * hd + double(c_.n_head) * hd * C +
                   C * F * (c_.swiglu ? 2 : 1) + F * C;
    n = double(c_.n_layer) * layer + double(c_.vocab_size) * C;
    return 6.0 * n + 12.0 * double(c_.n_layer) * double(c_.n_head * c_.head_dim()) * double(T);
  }
  for (Parameter* p : const_cast<GPT*>(this)->parameters()) {
    if (p->shape.size() < 2 || p == (wpe ? wpe->weight : nullptr)) continue;
    if (p == wte->weight && !c_.tied_head) continue;
    n += double(shape_numel(p->shape));
  }
  return 6.0 * n + 12.0 * double(c_.n_layer) * double(c_.n_head * c_.head_dim()) * double(T);
}

std::vector<int32_t> GPT::generate(const std::vector<int32_t>& prompt, int64_t max_new, float temperature,
                                   int64_t top_k, Rng& rng) const {
  NoGradGuard ng;
  std::vector<int32_t> seq = prompt;
  if (seq.empty()) seq.push_back(0);
  for (int64_t s = 0; s < max_new; ++s) {
    int64_t start = std::max<int64_t>(0, int64_t(seq.size()) - c_.block_size);
    std::vector<int32_t> ctx(seq.begin() + start, seq.end());
    Tensor tok = Tensor::from_vector_i32(ctx, {1, int64_t(ctx.size())});
    Tensor lg = logits(tok);
    int64_t V = c_.vocab_size;
    const float* row = lg.f32() + (int64_t(ctx.size()) - 1) * V;
    std::vector<std::pair<float, int32_t>> cand(static_cast<size_t>(V));
    for (int64_t v = 0; v < V; ++v) cand[size_t(v)] = {row[v] / std::max(temperature, 1e-6f), int32_t(v)};
    int64_t k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [](auto& a, auto& b) { return a.first > b.first; });
    double mx = cand[0].first, z = 0;
    for (int64_t i = 0; i < k; ++i) z += std::exp(double(cand[size_t(i)].first) - mx);
    double u = double(rng.uniform()) * z, acc = 0;
    int32_t pick = cand[size_t(k - 1)].second;
    for (int64_t i = 0; i < k; ++i) {
      acc += std::exp(double(cand[size_t(i)].first) - mx);
      if (acc >= u) {
        pick = cand[size_t(i)].second;
        break;
      }
    }
    seq.push_back(pick);
  }
  return seq;
}

}  // namespace atl::nn
