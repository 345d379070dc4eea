// The fused CPU kernels of the transformer, llm.c style: plain loops over raw pointers, forward and
// backward side by side, parallel with OpenMP, no allocation on the hot path.
//
// Conventions shared by every kernel here:
//  - activations are row-major [N, C] with N = B*T rows (tokens);
//  - Linear weights are stored [in, out] (the Conv1D layout of Hugging Face GPT-2), so that the
//    safetensors file needs no transposes;
//  - every backward kernel ACCUMULATES (+=) into its gradient outputs, so that the caller can sum
//    contributions from several uses and micro-batches; the one exception is
//    crossentropy_backward, which assigns dlogits (the buffer is too large to clear every step).
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace atl::cpu {

// ---- Linear: out[N,OC] = inp[N,C] · weight[C,OC] + bias[OC] (bias may be null) ----
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t C, int64_t OC);
// Any of dinp, dweight, dbias may be null to skip it.
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC);

// ---- token + position embedding: out[B*T,C] = wte[tok] + wpe[t] (wpe may be null) ----
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C);

// ---- LayerNorm over the last dim; mean and rstd [N] are saved for backward; bias may be null ----
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);

// ---- RMSNorm: out = inp * rstd * weight, rstd [N] saved ----
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     float eps);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C);

// ---- GELU, tanh approximation (GPT-2's), elementwise over n ----
void gelu_forward(float* out, const float* inp, int64_t n);
void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n);

// ---- SwiGLU: inp[N,2F] holds [gate | up]; out[N,F] = silu(gate) * up ----
void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F);
void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F);

// ---- residual: out = a + b over n (backward is dout into both, done by the caller) ----
void add_forward(float* out, const float* a, const float* b, int64_t n);
void add_inplace(float* acc, const float* x, int64_t n);  // acc += x

// ---- RoPE on a packed qkv buffer [B,T,(H+2*KV)*hd]: rotates the q and k heads, copies v.
// Rotate-half convention (Hugging Face Llama): pairs are (i, i+hd/2), frequency theta^(-2i/hd),
// position t + pos_offset.
void rope_forward(float* out, const float* inp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                  float theta, int64_t pos_offset);
void rope_backward(float* dinp, const float* dout, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   float theta, int64_t pos_offset);

// ---- causal self-attention over a packed qkv [B,T,(H+2*KV)*hd] (q heads, then k heads, then v
// heads; query head h reads kv head h / (H/KV)). Blocked with an online softmax: the T×T matrix
// is never stored. out [B,T,H*hd]; lse [B,H,T] (log-sum-exp of the scaled scores) is saved for
// backward, which recomputes the probabilities block by block. Scale is 1/sqrt(hd).
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);

// ---- softmax fused with cross-entropy over logits [N,V]. targets < 0 are ignored (loss 0).
// forward writes the per-row loss and the row's log-sum-exp; backward ASSIGNS
// dlogits = (softmax - onehot(target)) * dlosses[row] (may alias logits).
void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V);
void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V);
// The bf16 head's pass over a block of logits (autograd/head_loss.cpp), bitwise crossentropy_forward,
// then crossentropy_backward in place with every dlosses = g, then f32_to_bf16 of the gradient into
// dlog; but row by row, so that a row is read from L1/L2 the second and third time instead of
// from memory (a block of logits is 4 MiB). logits ends holding the fp32 gradient.
void crossentropy_rows_bf16(float* losses, float* lse, float* logits, bf16* dlog, const int32_t* targets, float g,
                            int64_t N, int64_t V);

// ---- AdamW (decoupled weight decay, Loshchilov & Hutter) over a flat buffer. The gradient is
// multiplied by grad_scale first (global-norm clipping and averaging fold into it). t is the
// 1-based step for bias correction.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
// Sum of squares (in double) for global-norm clipping.
double sum_squares(const float* x, int64_t n);
void scale_inplace(float* x, float s, int64_t n);

}  // namespace atl::cpu
