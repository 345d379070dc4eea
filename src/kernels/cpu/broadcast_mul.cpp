// Elementwise product with NumPy broadcasting over a merged plan (kernels/broadcast.h). Forward
// walks the output row by row (last merged dim innermost). Backward: an operand that is not
// broadcast takes dout·other elementwise; a broadcast one sums dout·other over the dims it is
// broadcast along, one task per element of the operand, so no two threads write the same place.
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

namespace {

using kernels::Broadcast;

// Offsets of row r (all dims but the last) in a, b and the output.
inline void row_offsets(const Broadcast& bc, int64_t r, int64_t* oa, int64_t* ob) {
  int64_t a = 0, b = 0;
  for (int d = bc.ndim - 2; d >= 0; --d) {
    const int64_t c = r % bc.size[d];
    r /= bc.size[d];
    a += c * bc.sa[d];
    b += c * bc.sb[d];
  }
  *oa = a;
  *ob = b;
}

// out[i] (+)= x[i*sx] * y[i*sy] over n, the strides 0 or 1.
template <bool Acc>
inline void row_mul(float* out, const float* x, int64_t sx, const float* y, int64_t sy, int64_t n) {
  if (sx && sy) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = (Acc ? out[i] : 0.0f) + x[i] * y[i];
  } else if (sx) {
    const float v = y[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = (Acc ? out[i] : 0.0f) + x[i] * v;
  } else if (sy) {
    const float v = x[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = (Acc ? out[i] : 0.0f) + v * y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = (Acc ? out[i] : 0.0f) + x[0] * y[0];
  }
}

bool broadcast_somewhere(const int64_t* s, const Broadcast& bc) {
  for (int d = 0; d < bc.ndim; ++d)
    if (s[d] == 0 && bc.size[d] > 1) return true;
  return false;
}

// dx += Σ over x's broadcast dims of dout·y, for an operand x with strides sx (0: broadcast).
void reduce_grad(float* dx, const int64_t* sx, const float* dout, const float* y, const int64_t* sy,
                 const Broadcast& bc) {
  int64_t os[kernels::kMaxBroadcastDims];
  int64_t acc = 1, nx = 1, nr = 1;
  int kept[kernels::kMaxBroadcastDims], red[kernels::kMaxBroadcastDims], nk = 0, nred = 0;
  for (int d = bc.ndim - 1; d >= 0; --d) {
    os[d] = acc;
    acc *= bc.size[d];
  }
  for (int d = 0; d < bc.ndim; ++d) {
    if (sx[d]) {
      kept[nk++] = d;
      nx *= bc.size[d];
    } else {
      red[nred++] = d;
      nr *= bc.size[d];
    }
  }
#pragma omp parallel for schedule(static) if(parallel : bc.numel >= detail::kMinParallelWork)
  for (int64_t e = 0; e < nx; ++e) {
    int64_t o0 = 0, y0 = 0;
    for (int k = 0; k < nk; ++k) {
      const int d = kept[k];
      const int64_t c = (e / sx[d]) % bc.size[d];
      o0 += c * os[d];
      y0 += c * sy[d];
    }
    double s = 0;
    for (int64_t r = 0; r < nr; ++r) {
      int64_t o = o0, yo = y0, rr = r;
      for (int k = nred - 1; k >= 0; --k) {
        const int d = red[k];
        const int64_t c = rr % bc.size[d];
        rr /= bc.size[d];
        o += c * os[d];
        yo += c * sy[d];
      }
      s += double(dout[o]) * y[yo];
    }
    dx[e] += float(s);
  }
}

// dx += dout·y elementwise for an operand x that is not broadcast (same layout as the output).
void full_grad(float* dx, const float* dout, const float* y, const int64_t* sy, const Broadcast& bc) {
  const int64_t n = bc.size[bc.ndim - 1], rows = bc.numel / n;
  Broadcast t = bc;
  for (int d = 0; d < bc.ndim; ++d) t.sb[d] = sy[d];
#pragma omp parallel for schedule(static) if(parallel : bc.numel >= detail::kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t unused, oy;
    row_offsets(t, r, &unused, &oy);
    row_mul<true>(dx + r * n, dout + r * n, 1, y + oy, t.sb[bc.ndim - 1], n);
  }
}

}  // namespace

void mul_forward(float* out, const float* a, const float* b, const Broadcast& bc) {
  const int64_t n = bc.size[bc.ndim - 1], rows = bc.numel / n;
  const int64_t la = bc.sa[bc.ndim - 1], lb = bc.sb[bc.ndim - 1];
#pragma omp parallel for schedule(static) if(parallel : bc.numel >= detail::kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    int64_t oa, ob;
    row_offsets(bc, r, &oa, &ob);
    row_mul<false>(out + r * n, a + oa, la, b + ob, lb, n);
  }
}

void mul_backward(float* da, float* db, const float* dout, const float* a, const float* b, const Broadcast& bc) {
  if (da) {
    if (broadcast_somewhere(bc.sa, bc))
      reduce_grad(da, bc.sa, dout, b, bc.sb, bc);
    else
      full_grad(da, dout, b, bc.sb, bc);
  }
  if (db) {
    if (broadcast_somewhere(bc.sb, bc))
      reduce_grad(db, bc.sb, dout, a, bc.sa, bc);
    else
      full_grad(db, dout, a, bc.sa, bc);
  }
}

}  // namespace atl::cpu
