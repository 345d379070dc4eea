#include "models/moe/moe_model.h"

#include <cmath>
#include <cstring>
#include <map>

namespace atl::nn {

MoEBlock::MoEBlock(std::string prefix, const GPTConfig& a, const MoEConfig* m, const TensorParallelContext* tp)
    : Module(std::move(prefix)) {
  input_layernorm = child<Norm>("input_layernorm", a.n_embd, true, false, a.norm_eps);
  self_attn = child<Attention>("self_attn", a, tp);
  post_attention_layernorm = child<Norm>("post_attention_layernorm", a.n_embd, true, false, a.norm_eps);
  if (m) moe = child<MoELayer>("mlp", *m, tp);
  else dense = child<FeedForward>("mlp", a.n_embd, a.ffn(), a.swiglu, tp);
}

Tensor MoEBlock::operator()(const Tensor& x) const {
  Tensor r = ops::add(x, (*self_attn)((*input_layernorm)(x)));
  Tensor h = (*post_attention_layernorm)(r);
  return ops::add(r, moe ? (*moe)(h) : (*dense)(h));
}

MoEModel::MoEModel(const MoEModelConfig& c, const TensorParallelContext* tp) : Model(""), c_(c), tp_(tp) {
  c_.validate();
  const GPTConfig& a = c_.attn;  // Attention keeps a reference: c_ outlives the children
  int64_t V = a.vocab_size;
  if (tp_) {
    check_tensor_parallel(a, tp_->size());  // whole heads per rank (models/gpt/parallelize.cpp)
    auto [lo, hi] = shard_range(V, tp_->rank(), tp_->size());
    vocab_lo_ = lo, V = hi - lo;
  }
  embed_tokens = child<Embedding>("model.embed_tokens", V, a.n_embd);
  for (int64_t i = 0; i < a.n_layer; ++i)
    layers.push_back(
        child<MoEBlock>("model.layers." + std::to_string(i), a, i < c_.n_dense_layers ? nullptr : &c_.moe, tp_));
  norm = child<Norm>("model.norm", a.n_embd, true, false, a.norm_eps);
  if (!a.tied_head) lm_head = child<Linear>("lm_head", a.n_embd, V, false, ParamRole::head);
  materialize();
}

void MoEModel::init_weights(uint64_t seed) {
  if (tp_) {  // the whole model's initialisation (this ep rank's experts), this tp rank's pieces of it
    MoEModel full(c_);
    full.init_weights(seed);
    ParallelPlan plan = full.parallelize();
    for (Parameter* p : parameters()) {
      Parameter* f = full.find(p->name);
      p->value.copy_from(take_shard(f->value, shard_rule(plan, p->name, f->shape), tp_->rank(), tp_->size()));
    }
    auto mine = sharded_expert_parameters(), theirs = full.sharded_expert_parameters();
    for (size_t i = 0; i < mine.size(); ++i) mine[i]->value.copy_from(theirs[i]->value);
    return;
  }
  // GPT-2's scheme: N(0, 0.02), output projections scaled by 1/sqrt(2 n_layer), norms 1.
  Rng rng(seed, 0);
  const float proj_std = 0.02f / std::sqrt(2.f * float(c_.attn.n_layer));
  auto std_of = [&](const std::string& n) {
    return n.find("c_proj") != std::string::npos || n.find("down_proj") != std::string::npos ? proj_std : 0.02f;
  };
  // Sharded experts come right after their layer's router in the unsharded order; the stream is
  // drawn one expert at a time (the same values, at most one expert's scratch) and this rank's kept.
  std::map<const Parameter*, const MoELayer*> after_gate;
  for (MoELayer* m : moe_layers())
    if (!m->sharded_experts().empty()) after_gate[m->gate] = m;
  for (Parameter* p : parameters()) {
    if (p->shape.size() == 1) p->value.fill(1.f);
    else rng.fill_normal(p->value, 0.f, std_of(p->name));
    auto it = after_gate.find(p);
    if (it == after_gate.end()) continue;
    const MoELayer* m = it->second;
    for (Parameter* q : m->sharded_experts()) {
      const int64_t per = shape_numel(q->shape) / q->shape[0];
      Tensor scratch = Tensor::empty({per});
      for (int64_t e = 0; e < c_.moe.n_experts; ++e) {
        rng.fill_normal(scratch, 0.f, std_of(q->name));
        const int64_t l = e - m->first_local_expert();
        if (l >= 0 && l < m->local_experts())
          std::memcpy(q->value.f32() + l * per, scratch.f32(), size_t(per) * sizeof(float));
      }
    }
  }
}

std::unique_ptr<Model> MoEModel::expert_shard(int64_t ranks, int64_t rank) const {
  MoEModelConfig c = c_;
  c.moe.expert_ranks = ranks;
  c.moe.expert_rank = rank;
  return std::make_unique<MoEModel>(c, tp_);
}

double MoEModel::activation_bytes(int64_t batch, int64_t seq) const {
  // Korthikanti et al.'s per-layer count, roughly, in fp32: ~16 C per token for attention and
  // norms, the routed rows' 3F + 2C per chosen expert; and the logits with softmax and gradient.
  const double tok = double(batch * seq), C = double(c_.attn.n_embd), F = double(c_.moe.expert_ffn);
  return 4.0 * tok * double(c_.attn.n_layer) * (16.0 * C + double(c_.moe.top_k) * (3.0 * F + 2.0 * C)) +
         12.0 * tok * double(c_.attn.vocab_size);
}

std::vector<Parameter*> MoEModel::sharded_expert_parameters() const {
  std::vector<Parameter*> v;
  for (MoELayer* m : moe_layers())
    for (Parameter* q : m->sharded_experts()) v.push_back(q);
  return v;
}

void MoEModel::set_recompute(std::vector<Recompute> per_block) {
  full_moe_.assign(layers.size(), false);
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->self_attn->recompute_core = i < per_block.size() && per_block[i] == Recompute::selective;
    if (i < per_block.size() && per_block[i] == Recompute::full && layers[i]->moe) {
      full_moe_[i] = true;
      per_block[i] = Recompute::none;  // hidden() checkpoints it, not run_blocks
    }
  }
  Model::set_recompute(std::move(per_block));
}

Tensor MoEModel::embed(const Tensor& tokens) const {
  ATOLL_CHECK(tokens.dim() == 2, "model input must be [B,T] token ids");
  ATOLL_CHECK(tokens.size(1) <= c_.attn.block_size, "sequence length {} exceeds block_size {}", tokens.size(1),
              c_.attn.block_size);
  // Under cp every layer below sees this rank's spans of each row only (positions: Attention::core).
  const Tensor tok = context_ ? take_spans(tokens, context_->spans(tokens.size(1))) : tokens;
  return tp_ ? tp_->vocab_embedding(tok, embed_tokens->weight->value, vocab_lo_, Tensor())
             : ops::embedding(tok, embed_tokens->weight->value, Tensor());
}

Tensor MoEModel::run_block(size_t i, const Tensor& in, Tensor& aux) const {
  MoEBlock* b = layers[i];
  if (!b->moe || i >= full_moe_.size() || !full_moe_[i] || !grad_enabled()) {
    Tensor y = (*b)(in);
    if (b->moe) aux = b->moe->aux_loss();
    return y;
  }
  // Full recompute of an MoE block: the checkpoint's one output carries the block's output and
  // its auxiliary loss, so that the loss's gradient reaches the recomputed router too.
  Tensor packed = checkpoint("recompute_block", in, [b](const Tensor& xi) {
    Tensor y = (*b)(xi);
    return ops::concat({ops::reshape(y, {y.numel()}), ops::reshape(b->moe->aux_loss(), {1})}, 0);
  });
  std::vector<Tensor> parts = ops::split(packed, {in.numel(), 1}, 0);
  aux = ops::reshape(parts[1], b->moe->aux_loss().shape());
  return ops::reshape(parts[0], in.shape());
}

Tensor MoEModel::hidden(const Tensor& tokens) const {
  ATOLL_CHECK(tokens.dim() == 2, "model input must be [B,T] token ids");
  begin_forward();
  if (tp_) tp_->begin_forward(tokens.size(0), tokens.size(1) / (context_ ? context_->ranks() : 1));
  Tensor x = embed(tokens);
  aux_.assign(layers.size(), Tensor());
  x = run_blocks(x, layers.size(), [this](size_t i, const Tensor& in) { return run_block(i, in, aux_[i]); });
  return (*norm)(x);
}

// Pipeline stages: embed / blocks / norm + head + cross-entropy, as hidden() and loss() run them.
// A dense block under "full" recompute is checkpointed here as run_blocks does; an MoE block's
// own checkpoint (run_block) carries its auxiliary loss.
void MoEModel::stage_begin(const Shape& in) const {
  if (tp_) tp_->begin_forward(in.at(0), in.at(1) / (context_ ? context_->ranks() : 1));
}

Shape MoEModel::stage_hidden_shape(const Shape& in) const {
  const int64_t T = in.at(1) / (context_ ? context_->ranks() : 1);
  if (tp_ && tp_->sequence_sharded()) return {in.at(0) * T / tp_->size(), c_.attn.n_embd};
  return {in.at(0), T, c_.attn.n_embd};
}

Tensor MoEModel::stage_input(const Tensor& tokens) const { return embed(tokens); }

Tensor MoEModel::stage_blocks(const Tensor& x, int64_t first, int64_t last) const {
  ATOLL_CHECK(0 <= first && first <= last && last <= int64_t(layers.size()), "blocks [{}, {}) of {}", first, last,
              layers.size());
  Tensor y = x;
  stage_aux_ = Tensor();
  staged_.resize(layers.size(), false);
  for (int64_t i = first; i < last; ++i) {
    const size_t b = size_t(i);
    staged_[b] = true;
    if (recompute(b) == Recompute::full && grad_enabled()) {  // a dense block (set_recompute)
      y = checkpoint("recompute_block", y, [this, b](const Tensor& xi) {
        Tensor none;
        return run_block(b, xi, none);
      });
      continue;
    }
    Tensor a;
    y = run_block(b, y, a);
    if (a.defined() && grad_enabled()) stage_aux_ = stage_aux_.defined() ? ops::add(stage_aux_, a) : a;
  }
  return y;
}

Tensor MoEModel::stage_take_aux_loss() const {
  Tensor a = stage_aux_;
  stage_aux_ = Tensor();
  return a;
}

Tensor MoEModel::stage_loss(const Tensor& x, const Tensor& targets) const {
  const Tensor tgt = context_ ? take_spans(targets, context_->spans(targets.size(1))) : targets;
  const Tensor h = (*norm)(x);
  Tensor l = tp_ ? tp_->vocab_cross_entropy(logits_of(h), tgt, vocab_lo_)
                 : ops::cross_entropy(logits_of(h), tgt, /*reuse_logits=*/true);
  return context_ ? context_share_of_loss(l, tgt, *context_) : l;
}

Tensor MoEModel::logits_of(const Tensor& h) const {
  if (!tp_) return lm_head ? (*lm_head)(h) : ops::linear_t(h, embed_tokens->weight->value);
  // The untied head [C, V_r] is column-parallel; the tied one is the embedding's rows [V_r, C].
  if (!lm_head) return tp_->vocab_logits(h, embed_tokens->weight->value);
  Tensor l = tp_->column_linear(h, lm_head->weight->value, Tensor());
  return ops::reshape(l, {l.numel() / l.size(-1), l.size(-1)});
}

Tensor MoEModel::forward(const Tensor& tokens) const {
  ATOLL_CHECK(!context_, "MoEModel::forward under context parallelism would give this rank's spans' logits only; "
              "the training and evaluation loss is loss()");
  Tensor l = logits_of(hidden(tokens));
  if (!tp_) return l;
  ATOLL_CHECK(!grad_enabled(), "MoEModel::forward under tensor parallelism is for inference (the loss never gathers)");
  return tp_->gather_vocab(l, c_.attn.vocab_size).view({tokens.size(0), tokens.size(1), c_.attn.vocab_size});
}

Tensor MoEModel::loss(const Tensor& tokens, const Tensor& targets) const {
  ATOLL_CHECK(targets.shape() == tokens.shape(), "targets {} do not match tokens {}", shape_str(targets.shape()),
              shape_str(tokens.shape()));
  const Tensor tgt = context_ ? take_spans(targets, context_->spans(targets.size(1))) : targets;
  Tensor l = tp_ ? tp_->vocab_cross_entropy(logits_of(hidden(tokens)), tgt, vocab_lo_)
                 : ops::cross_entropy(logits_of(hidden(tokens)), tgt, /*reuse_logits=*/true);
  // The cross-entropy as this rank's share of the cp group's mean; the auxiliary losses carry
  // their own cp scaling (nn/moe.cpp), so they are added as they are.
  if (context_) l = context_share_of_loss(l, tgt, *context_);
  // The auxiliary losses train the router; an evaluation (no gradients) scores the cross-entropy alone.
  if (grad_enabled())
    for (const Tensor& a : aux_)
      if (a.defined()) l = ops::add(l, a);
  return l;
}

std::vector<MoELayer*> MoEModel::moe_layers() const {
  std::vector<MoELayer*> v;
  for (MoEBlock* b : layers)
    if (b->moe) v.push_back(b->moe);
  return v;
}

void MoEModel::set_context_attention(const ContextAttention* cp) {
  if (cp && cp->ranks() > 1) {
    // cp x tp splits each cp rank's share again over tp (sequence parallelism, as GPT's does):
    // the routers' counts and token totals are summed over tp, then over cp (nn/moe.cpp).
    // Token dropping: the capacity is the whole rows', served in the rows' order across the cp
    // group (nn/moe.cpp, context_kept).
  }
  context_ = cp && cp->ranks() > 1 ? cp : nullptr;
  for (MoEBlock* b : layers) {
    b->self_attn->context = context_;
    if (b->moe) b->moe->context = context_;
  }
}

void MoEModel::set_expert_dispatcher(ExpertDispatcher* d) {
  for (MoELayer* m : moe_layers()) m->set_dispatcher(d);
}

std::vector<std::pair<std::string, double>> MoEModel::step_metrics() const {
  // Under a pipeline a rank reports the MoE layers of its own stages (the others never run here
  // in training; an evaluation's forward would leave its figures in them).
  double bal = 0, z = 0, drop = 0;
  size_t count = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const MoELayer* m = layers[i]->moe;
    if (!m || (!staged_.empty() && !staged_[i])) continue;
    bal += m->last_balance_loss();
    z += m->last_z_loss();
    drop += m->last_dropped_fraction();
    ++count;
  }
  const double n = double(std::max<size_t>(1, count));
  return {{"moe_balance_loss", bal / n}, {"moe_z_loss", z / n}, {"moe_dropped", drop / n}};
}

std::map<std::string, std::string> MoEModel::config_metadata() const {
  auto md = Model::config_metadata();
  for (auto& [k, v] : c_.metadata()) md[k] = v;
  return md;
}

double MoEModel::flops_per_token(int64_t T) const {
  if (tp_) return MoEModel(c_).flops_per_token(T);  // a shard holds pieces: count the whole model's (once per run)
  double n = 0;
  const double active = double(c_.moe.top_k) / double(c_.moe.n_experts);
  for (Parameter* p : const_cast<MoEModel*>(this)->parameters()) {
    if (p->shape.size() < 2 || p == embed_tokens->weight) continue;
    n += double(shape_numel(p->shape)) * (p->role == ParamRole::expert ? active : 1.0);
  }
  for (Parameter* q : sharded_expert_parameters())  // this rank's share of the sharded experts
    n += double(shape_numel(q->shape)) * double(c_.moe.expert_ranks) * active;
  if (!lm_head) n += double(shape_numel(embed_tokens->weight->shape));  // the tied head's matmul
  const GPTConfig& a = c_.attn;
  return 6.0 * n + 12.0 * double(a.n_layer) * double(a.n_head * a.head_dim()) * double(T);
}

}  // namespace atl::nn
