// Causal attention with bf16 products (attention_bf16.h). Unlike the fp32 kernels (FlashAttention's
// online softmax over 64×64 tiles, attention_forward.inc) it materialises a chunk of heads' whole
// T×T score matrices: the matrix engine wants few large products, and the chunk is sized so that
// its scores, probabilities and their gradients (12 bytes per score) stay within a budget. The
// products run over the full square (see row_block), the masked half being zeros.
//
// Rounding, the same places as PyTorch's bf16 autocast: q, k, v and dO are rounded to bf16; the
// scores S = scale·q·kᵀ and dP = dO·vᵀ are fp32; the softmax P and dS = P∘(dP − D)·scale are
// computed in fp32 and rounded to bf16 only as operands of P·V, Pᵀ·dO, dSᵀ·q and dS·k. D is the
// row sum of P∘dP (equal to dO·O, Dao 2023, and exactly consistent with the P used).
#include "kernels/cpu/attention_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

namespace {

// About L2-sized: at d384 (T=256) 2 heads per chunk; 0.8-6 MiB measured alike, 24 MiB 35% slower
// in backward (bench_kernels, one thread, loaded).
constexpr int64_t kChunkBytes = int64_t(2) << 20;

// Rows per causal block: the whole sequence. Blocks of 64 rows would skip most of the masked
// triangle (5/8 of the square at T=256), but their operands (the first kend rows of each head's
// k and v, a block's scores) are not dense over the batch, and oneDNN 2.6 then leaves its AMX
// brgemm kernel for gemm:jit: measured 2.5x slower in all (bench_kernels, one thread).
int64_t row_block(int64_t T) { return T; }

int64_t chunk_heads(int64_t BH, int64_t T) { return std::clamp<int64_t>(kChunkBytes / (12 * T * T), 1, BH); }

inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // Round to nearest even (f32_to_bf16's rule; the values here are finite).
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// f32_to_bf16's rule including NaN (kept quiet): for the output's copy, which must be the cast's bits.
inline uint16_t round_bf16_any(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

// rows [B,T] of `src` (row stride `ld`, head h at column h·hd) → head-major bf16 [B·H][T][hd].
void gather_heads(bf16* dst, const float* src, int64_t ld, int64_t B, int64_t T, int64_t H, int64_t hd) {
#pragma omp parallel for schedule(static) if(parallel : B * T * H * hd >= detail::kMinParallelWork)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t b = bt / T, t = bt % T;
    const float* s = src + bt * ld;
    for (int64_t h = 0; h < H; ++h) {
      uint16_t* d = reinterpret_cast<uint16_t*>(dst + ((b * H + h) * T + t) * hd);
      const float* sh = s + h * hd;
#pragma omp simd
      for (int64_t e = 0; e < hd; ++e) d[e] = round_bf16(sh[e]);
    }
  }
}

}  // namespace

bool attention_bf16_supported(std::string* why_not) {
  const Isa isa = active_isa();
  if (isa == Isa::amx || isa == Isa::avx512_bf16) return true;
  if (why_not) *why_not = std::string("the active path ") + isa_name(isa) + " has no bf16 dot products";
  return false;
}

void attention_bf16_pack(bf16* packed, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t hd) {
  const int64_t n = B * H * T * hd, S = 3 * H * hd;
  for (int64_t part = 0; part < 3; ++part) gather_heads(packed + part * n, qkv + part * H * hd, S, B, T, H, hd);
}

void attention_bf16_forward(float* out, float* lse, const bf16* packed, int64_t B, int64_t T, int64_t H, int64_t hd,
                            bf16* out_bf16) {
  const int64_t BH = B * H, n = BH * T * hd, TT = T * T, OS = H * hd;
  const bf16 *Q = packed, *Kh = packed + n, *V = packed + 2 * n;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t nb = chunk_heads(BH, T);
  float* S = detail::scratch<float, 40>(size_t(nb * TT));
  bf16* P = detail::scratch<bf16, 40>(size_t(nb * TT));
  float* O = detail::scratch<float, 41>(size_t(nb * T * hd));
  const int64_t R = row_block(T);
  for (int64_t h0 = 0; h0 < BH; h0 += nb) {
    const int64_t c = std::min(nb, BH - h0), off = h0 * T * hd;
    // Row block [i0, i0+R) sees keys [0, i0+R): the products skip the masked upper triangle.
    for (int64_t i0 = 0; i0 < T; i0 += R) {
      const int64_t r = std::min(R, T - i0), kend = i0 + r;
      gemm_bf16_batched(false, true, r, kend, hd, scale, Q + off + i0 * hd, hd, T * hd, Kh + off, hd, T * hd, 0.0f,
                        S + i0 * T, T, TT, c);
    }
#pragma omp parallel for schedule(static) if(parallel : c * TT >= detail::kMinParallelWork)
    for (int64_t row = 0; row < c * T; ++row) {
      const int64_t i = row % T, bh = h0 + row / T;
      float* s = S + row * T;
      uint16_t* p = reinterpret_cast<uint16_t*>(P + row * T);
      const int64_t nv = i + 1, kend = std::min(T, (i / R + 1) * R);  // causal: keys 0..i of the block's kend
      float m = -INFINITY;
      for (int64_t j = 0; j < nv; ++j) m = std::max(m, s[j]);
      const float l = detail::exp_sum_seq(s, s, nv, m);
      const float inv = 1.0f / l;
#pragma omp simd
      for (int64_t j = 0; j < nv; ++j) p[j] = round_bf16(s[j] * inv);
      std::fill(p + nv, p + kend, uint16_t(0));
      lse[bh * T + i] = m + std::log(l);
    }
    for (int64_t i0 = 0; i0 < T; i0 += R) {
      const int64_t r = std::min(R, T - i0), kend = i0 + r;
      gemm_bf16_batched(false, false, r, hd, kend, 1.0f, P + i0 * T, T, TT, V + off, hd, T * hd, 0.0f,
                        O + i0 * hd, hd, T * hd, c);
    }
#pragma omp parallel for schedule(static) if(parallel : c * T * hd >= detail::kMinParallelWork)
    for (int64_t row = 0; row < c * T; ++row) {
      const int64_t t = row % T, bh = h0 + row / T, b = bh / H, h = bh % H;
      std::memcpy(out + (b * T + t) * OS + h * hd, O + row * hd, size_t(hd) * sizeof(float));
      if (out_bf16) {
        uint16_t* d = reinterpret_cast<uint16_t*>(out_bf16 + (b * T + t) * OS + h * hd);
        const float* o = O + row * hd;
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) d[e] = round_bf16_any(o[e]);
      }
    }
  }
}

void attention_bf16_backward(float* dqkv, const float* dout, const bf16* packed, const float* lse, int64_t B,
                             int64_t T, int64_t H, int64_t hd, bool accumulate) {
  const int64_t BH = B * H, n = BH * T * hd, TT = T * T, S3 = 3 * H * hd;
  const bf16 *Q = packed, *Kh = packed + n, *V = packed + 2 * n;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int64_t nb = chunk_heads(BH, T);
  bf16* dO = detail::scratch<bf16, 41>(size_t(n));
  gather_heads(dO, dout, H * hd, B, T, H, hd);
  float* S = detail::scratch<float, 40>(size_t(nb * TT));
  float* dP = detail::scratch<float, 42>(size_t(nb * TT));
  bf16* P = detail::scratch<bf16, 40>(size_t(nb * TT));
  bf16* dS = detail::scratch<bf16, 42>(size_t(nb * TT));
  float* G = detail::scratch<float, 41>(size_t(3 * nb * T * hd));  // dQ, dK, dV of the chunk
  float *dQ = G, *dK = G + nb * T * hd, *dV = G + 2 * nb * T * hd;
  const int64_t R = row_block(T);
  for (int64_t h0 = 0; h0 < BH; h0 += nb) {
    const int64_t c = std::min(nb, BH - h0), off = h0 * T * hd;
    for (int64_t i0 = 0; i0 < T; i0 += R) {
      const int64_t r = std::min(R, T - i0), kend = i0 + r;
      gemm_bf16_batched(false, true, r, kend, hd, scale, Q + off + i0 * hd, hd, T * hd, Kh + off, hd, T * hd, 0.0f,
                        S + i0 * T, T, TT, c);
      gemm_bf16_batched(false, true, r, kend, hd, 1.0f, dO + off + i0 * hd, hd, T * hd, V + off, hd, T * hd, 0.0f,
                        dP + i0 * T, T, TT, c);
    }
#pragma omp parallel for schedule(static) if(parallel : c * TT >= detail::kMinParallelWork)
    for (int64_t row = 0; row < c * T; ++row) {
      const int64_t i = row % T, bh = h0 + row / T;
      float* s = S + row * T;
      const float* dp = dP + row * T;
      uint16_t* p = reinterpret_cast<uint16_t*>(P + row * T);
      uint16_t* ds = reinterpret_cast<uint16_t*>(dS + row * T);
      const int64_t nv = i + 1, kend = std::min(T, (i / R + 1) * R);
      const float L = lse[bh * T + i];
#pragma omp simd
      for (int64_t j = 0; j < nv; ++j) s[j] = detail::exp_approx(s[j] - L);
      float D = 0.0f;
      for (int64_t j = 0; j < nv; ++j) D += s[j] * dp[j];
#pragma omp simd
      for (int64_t j = 0; j < nv; ++j) {
        p[j] = round_bf16(s[j]);
        ds[j] = round_bf16(s[j] * (dp[j] - D) * scale);
      }
      std::fill(p + nv, p + kend, uint16_t(0));
      std::fill(ds + nv, ds + kend, uint16_t(0));
    }
    // dQ = dS·k over the keys a row block sees; dV = Pᵀ·dO and dK = dSᵀ·q summed over the row
    // blocks, the last (which sees every key) first so that it initialises the whole sum.
    for (int64_t i0 = (T - 1) / R * R; i0 >= 0; i0 -= R) {
      const int64_t r = std::min(R, T - i0), kend = i0 + r;
      const float beta = kend == T ? 0.0f : 1.0f;
      gemm_bf16_batched(false, false, r, hd, kend, 1.0f, dS + i0 * T, T, TT, Kh + off, hd, T * hd, 0.0f,
                        dQ + i0 * hd, hd, T * hd, c);
      gemm_bf16_batched(true, false, kend, hd, r, 1.0f, P + i0 * T, T, TT, dO + off + i0 * hd, hd, T * hd, beta, dV,
                        hd, T * hd, c);
      gemm_bf16_batched(true, false, kend, hd, r, 1.0f, dS + i0 * T, T, TT, Q + off + i0 * hd, hd, T * hd, beta, dK,
                        hd, T * hd, c);
    }
#pragma omp parallel for schedule(static) if(parallel : c * T * hd >= detail::kMinParallelWork)
    for (int64_t row = 0; row < c * T; ++row) {
      const int64_t t = row % T, bh = h0 + row / T, b = bh / H, h = bh % H;
      float* d = dqkv + (b * T + t) * S3 + h * hd;
      const float *gq = dQ + row * hd, *gk = dK + row * hd, *gv = dV + row * hd;
      if (accumulate) {
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) {
          d[e] += gq[e];
          d[H * hd + e] += gk[e];
          d[2 * H * hd + e] += gv[e];
        }
      } else {
        std::memcpy(d, gq, size_t(hd) * sizeof(float));
        std::memcpy(d + H * hd, gk, size_t(hd) * sizeof(float));
        std::memcpy(d + 2 * H * hd, gv, size_t(hd) * sizeof(float));
      }
    }
  }
}

}  // namespace atl::cpu
