// GPT under context parallelism and activation recomputation: the parts of the forward that
// differ when each rank holds only some spans of every row (Liu et al. 2023, "Ring Attention with
// Blockwise Transformers"; the ring itself is src/parallel/context_parallel.cpp). Embeddings,
// norms, MLPs and the head are per token and run unchanged on the local tokens; positions are the
// tokens' global ones (learned positions gather their rows, RoPE rotates each span at its offset),
// or with packed documents each token's position in its document (set_position_ids);
// attention goes through the injected ContextAttention. Under cp x tp the model is the tp shard:
// the ring runs over this rank's heads, and sequence parallelism splits the cp rank's tokens.
#include "models/gpt/gpt.h"

namespace atl::nn {

namespace {

// RoPE at per-token positions pos [B, T] i32 (packed documents): each maximal run of consecutive
// positions in a row is one rotation at its first position, the same call a document alone gets.
Tensor rope_at(const Tensor& qkv, const Tensor& pos, int64_t H, int64_t KV, int64_t hd, float theta) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  ATOLL_CHECK(pos.dtype() == DType::i32 && pos.dim() == 2 && pos.size(0) == B && pos.size(1) == T,
              "position ids {} for rows [{}, {}]", shape_str(pos.shape()), B, T);
  const int32_t* p = pos.i32();
  std::vector<Tensor> rows = B == 1 ? std::vector<Tensor>{qkv} : ops::split(qkv, std::vector<int64_t>(size_t(B), 1), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* r = p + b * T;
    std::vector<int64_t> sizes, offsets;
    for (int64_t t = 0; t < T; ++t)
      if (t == 0 || r[t] != r[t - 1] + 1) sizes.push_back(1), offsets.push_back(r[t]);
      else ++sizes.back();
    if (sizes.size() == 1) {
      rows[size_t(b)] = ops::rope(rows[size_t(b)], H, KV, hd, theta, offsets[0]);
      continue;
    }
    std::vector<Tensor> parts = ops::split(rows[size_t(b)], sizes, 1);
    for (size_t i = 0; i < parts.size(); ++i) parts[i] = ops::rope(parts[i], H, KV, hd, theta, offsets[i]);
    rows[size_t(b)] = ops::concat(parts, 1);
  }
  return B == 1 ? rows[0] : ops::concat(rows, 0);
}

}  // namespace

Tensor GPT::learned_positions(const Tensor& pos) const {
  ATOLL_CHECK(pos.dtype() == DType::i32 && pos.dim() == 2, "position ids must be [B, T] i32, got {}",
              shape_str(pos.shape()));
  const int64_t B = pos.size(0), T = pos.size(1);
  std::vector<int32_t> flat(pos.i32(), pos.i32() + B * T);
  Tensor rows = ops::index_select(wpe->weight->value, 0, Tensor::from_vector_i32(flat, {B * T}));
  return ops::reshape(rows, {B, T, c_.n_embd});
}

Tensor Attention::core(const Tensor& qkv_in) const {
  const int64_t H = heads_, KV = kv_heads_, hd = c_.head_dim();  // this rank's heads under tp
  Tensor qkv = qkv_in;
  const Tensor docs = doc_ids ? *doc_ids : Tensor();
  if (!context) {
    if (c_.rope) qkv = positions ? rope_at(qkv, *positions, H, KV, hd, c_.rope_theta) : ops::rope(qkv, H, KV, hd, c_.rope_theta);
    return docs.defined() ? ops::attention(qkv, H, KV, hd, /*causal=*/true, docs) : ops::attention(qkv, H, KV, hd);
  }
  const int64_t T = qkv.size(1) * context->ranks();
  if (c_.rope && positions) {
    qkv = rope_at(qkv, take_spans(*positions, context->spans(T)), H, KV, hd, c_.rope_theta);
  } else if (c_.rope) {
    const std::vector<Span> spans = context->spans(T);
    if (spans.size() == 1) {
      qkv = ops::rope(qkv, H, KV, hd, c_.rope_theta, spans[0].first);
    } else {
      std::vector<int64_t> sizes;
      for (auto [s, n] : spans) sizes.push_back(n);
      std::vector<Tensor> parts = ops::split(qkv, sizes, 1);
      for (size_t i = 0; i < parts.size(); ++i)
        parts[i] = ops::rope(parts[i], H, KV, hd, c_.rope_theta, spans[i].first);
      qkv = ops::concat(parts, 1);
    }
  }
  return context->attention(qkv, H, KV, hd, T, /*causal=*/true, docs);
}

void GPT::set_context_attention(const ContextAttention* cp) {
  context_ = cp;
  for (Block* b : h) b->attn->context = cp;
}

void GPT::set_document_ids(const Tensor& doc_ids) {
  doc_ids_ = doc_ids;
  for (Block* b : h) b->attn->doc_ids = doc_ids.defined() ? &doc_ids_ : nullptr;
}

void GPT::set_position_ids(const Tensor& positions) {
  ATOLL_CHECK(!positions.defined() || !tp_, "per-document positions under tensor parallelism are not supported");
  pos_ids_ = positions;
  for (Block* b : h) b->attn->positions = positions.defined() && c_.rope ? &pos_ids_ : nullptr;
}

void GPT::set_recompute(std::vector<Recompute> per_block) {
  for (size_t i = 0; i < h.size(); ++i) h[i]->attn->recompute_core = i < per_block.size() && per_block[i] == Recompute::selective;
  Model::set_recompute(std::move(per_block));
}

Tensor GPT::loss_context_parallel(const Tensor& tokens, const Tensor& targets) const {
  ATOLL_CHECK(tokens.dim() == 2, "model input must be [B,T] token ids");
  const int64_t T = tokens.size(1);
  ATOLL_CHECK(T <= c_.block_size, "sequence length {} exceeds block_size {}", T, c_.block_size);
  begin_forward();
  // cp x tp: sequence parallelism splits the cp share of every row over tp.
  if (tp_) tp_->begin_forward(tokens.size(0), T / context_->ranks());
  Tensor x = context_embedding(tokens);
  x = run_blocks(x, h.size(), [this](size_t i, const Tensor& in) { return (*h[i])(in); });
  return context_head_loss(x, targets);
}

Tensor GPT::context_embedding(const Tensor& tokens) const {
  const std::vector<Span> spans = context_->spans(tokens.size(1));
  Tensor tok = take_spans(tokens, spans);
  Tensor pos_rows;  // wpe's rows at the local tokens' global positions
  if (wpe && !pos_ids_.defined()) {
    std::vector<int32_t> pos = span_positions(spans);
    pos_rows = ops::index_select(wpe->weight->value, 0, Tensor::from_vector_i32(pos, {int64_t(pos.size())}));
  }
  // cp x tp: this rank's heads and vocabulary rows over its cp share of every row.
  if (tp_) return tp_->vocab_embedding(tok, wte->weight->value, vocab_lo_, pos_rows);
  Tensor x = ops::embedding(tok, wte->weight->value, pos_rows);
  // Packed documents (Data-Centric Parallel): each token at its position inside its document.
  if (wpe && pos_ids_.defined()) x = ops::add(x, learned_positions(take_spans(pos_ids_, spans)));
  return x;
}

Tensor GPT::context_head_loss(const Tensor& x, const Tensor& targets) const {
  Tensor tgt = take_spans(targets, context_->spans(targets.size(1)));
  Tensor loss = tp_ ? tp_->vocab_cross_entropy(tp_->vocab_logits((*ln_f)(x), head_weight()->value), tgt, vocab_lo_)
                    : ops::cross_entropy(ops::linear_t((*ln_f)(x), head_weight()->value), tgt, /*reuse_logits=*/true);
  return context_share_of_loss(loss, tgt, *context_);  // collective over the cp group
}

}  // namespace atl::nn
