// Matrix products through oneDNN's matmul primitive (Debian libdnnl), which picks its own kernel
// at run time: AMX-BF16/AMX-INT8 tiles on Sapphire Rapids and later, AVX-512 BF16/VNNI or AVX2
// elsewhere. Transposes and row strides become memory-descriptor strides, so no operand is
// copied here; alpha is the output scale and beta a sum post-op. Creating a primitive costs far
// more than running a small one, so primitives are cached by everything that defines them (the
// training step repeats a few dozen shapes).
#include <oneapi/dnnl/dnnl.hpp>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace atl::cpu {

namespace {

using dt = dnnl::memory::data_type;

struct Key {
  int kind;  // the dtypes: 0 f32, 1 bf16, 2 s8
  int threads;  // a primitive sizes its blocking for the thread count it was made under
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  uint32_t alpha, beta;  // bit patterns
  int64_t batch = 1, sa = 0, sb = 0, sc = 0;  // batched products: matrices at these element strides
  bool bias = false;                          // an fp32 row vector added to every row of C
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = size_t(k.kind * 4096 + k.threads) * 0x9e3779b97f4a7c15ull;
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t(k.alpha), int64_t(k.beta),
                      int64_t(k.ta) * 2 + int64_t(k.tb) + 4 * int64_t(k.bias), k.batch, k.sa, k.sb, k.sc})
      h = (h ^ size_t(v)) * 0x100000001b3ull;
    return h;
  }
};

struct Engine {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::unordered_map<Key, dnnl::matmul, KeyHash> cache;
};
Engine& engine() {
  static Engine e;
  return e;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// op(A)[M,K]: element (m,k) at m*lda + k, or k*lda + m when A is stored transposed; a batched
// product prepends a batch dimension with the matrices' element strides.
void descs(const Key& k, dt a_dt, dt b_dt, dt c_dt, dnnl::memory::desc& a, dnnl::memory::desc& b,
           dnnl::memory::desc& c) {
  using dims = dnnl::memory::dims;
  const dims as = k.ta ? dims{1, k.lda} : dims{k.lda, 1}, bs = k.tb ? dims{1, k.ldb} : dims{k.ldb, 1};
  if (k.batch == 1 && k.sa == 0) {
    a = dnnl::memory::desc(dims{k.M, k.K}, a_dt, as);
    b = dnnl::memory::desc(dims{k.K, k.N}, b_dt, bs);
    c = dnnl::memory::desc(dims{k.M, k.N}, c_dt, dims{k.ldc, 1});
    return;
  }
  a = dnnl::memory::desc(dims{k.batch, k.M, k.K}, a_dt, dims{k.sa, as[0], as[1]});
  b = dnnl::memory::desc(dims{k.batch, k.K, k.N}, b_dt, dims{k.sb, bs[0], bs[1]});
  c = dnnl::memory::desc(dims{k.batch, k.M, k.N}, c_dt, dims{k.sc, k.ldc, 1});
}

dnnl::matmul& primitive(const Key& k, dt a_dt, dt b_dt, dt c_dt) {
  Engine& e = engine();
  std::lock_guard<std::mutex> lock(e.mu);
  auto it = e.cache.find(k);
  if (it != e.cache.end()) return it->second;
  // A training step repeats a few dozen shapes; prompts of many lengths would grow the cache
  // without bound, so it starts over past a size no step reaches.
  if (e.cache.size() >= 4096) e.cache.clear();
  dnnl::memory::desc a, b, c;
  descs(k, a_dt, b_dt, c_dt, a, b, c);
  dnnl::primitive_attr attr;
  float alpha, beta;
  std::memcpy(&alpha, &k.alpha, 4);
  std::memcpy(&beta, &k.beta, 4);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  try {
    dnnl::matmul::primitive_desc pd(
        k.bias ? dnnl::matmul::desc(a, b, dnnl::memory::desc({1, k.N}, dt::f32, {k.N, 1}), c) : dnnl::matmul::desc(a, b, c),
        attr, e.eng);
    return e.cache.emplace(k, dnnl::matmul(pd)).first->second;
  } catch (const dnnl::error& err) {
    fail("oneDNN matmul {}x{}x{} (ta={}, tb={}): {}", k.M, k.N, k.K, k.ta, k.tb, err.what());
  }
}

void run(dnnl::matmul& p, const Key& k, dt a_dt, dt b_dt, dt c_dt, const void* A, const void* B, void* C,
         const float* bias = nullptr) {
  Engine& e = engine();
  dnnl::memory::desc ad, bd, cd;
  descs(k, a_dt, b_dt, c_dt, ad, bd, cd);
  dnnl::memory am(ad, e.eng, const_cast<void*>(A)), bm(bd, e.eng, const_cast<void*>(B)), cm(cd, e.eng, C);
  thread_local dnnl::stream s(e.eng);
  if (bias) {
    dnnl::memory biasm(dnnl::memory::desc({1, k.N}, dt::f32, {k.N, 1}), e.eng, const_cast<float*>(bias));
    p.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_BIAS, biasm}, {DNNL_ARG_DST, cm}});
  } else {
    p.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  }
  s.wait();
}

template <typename TA, typename TB, typename TC>
void matmul(int kind, dt a_dt, dt b_dt, dt c_dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
            const TA* A, int64_t lda, const TB* B, int64_t ldb, float beta, TC* C, int64_t ldc) {
  const Key k{kind, num_threads(), ta, tb, M, N, K, lda, ldb, ldc, bits(alpha), bits(beta)};
  run(primitive(k, a_dt, b_dt, c_dt), k, a_dt, b_dt, c_dt, A, B, C);
}

}  // namespace

void gemm_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // C = beta*C
  matmul(0, dt::f32, dt::f32, dt::f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                      const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_bf16_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  matmul(1, dt::bf16, dt::bf16, dt::f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_batched_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                              int64_t lda, int64_t sa, const bf16* B, int64_t ldb, int64_t sb, float beta, float* C,
                              int64_t ldc, int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0 || batch == 1) {
    for (int64_t i = 0; i < batch; ++i)
      gemm_bf16_onednn(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
    return;
  }
  Key k{1, num_threads(), ta, tb, M, N, K, lda, ldb, ldc, bits(alpha), bits(beta)};
  k.batch = batch;
  k.sa = sa;
  k.sb = sb;
  k.sc = sc;
  run(primitive(k, dt::bf16, dt::bf16, dt::f32), k, dt::bf16, dt::bf16, dt::f32, A, B, C);
}

void gemm_bf16_bias_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                           const bf16* B, int64_t ldb, const float* bias, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) std::memcpy(C + i * ldc, bias, size_t(N) * sizeof(float));
    return;
  }
  Key k{1, num_threads(), ta, tb, M, N, K, lda, ldb, ldc, bits(1.0f), bits(0.0f)};
  k.bias = true;
  run(primitive(k, dt::bf16, dt::bf16, dt::f32), k, dt::bf16, dt::bf16, dt::f32, A, B, C, bias);
}

std::string onednn_matmul_impl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t batch) {
  Key k{1, num_threads(), ta, tb, M, N, K, ta ? M : K, tb ? K : N, N, bits(1.0f), bits(0.0f)};
  if (batch > 1) {
    k.batch = batch;
    k.sa = M * K;
    k.sb = K * N;
    k.sc = M * N;
  }
  dnnl::memory::desc a, b, c;
  descs(k, dt::bf16, dt::bf16, dt::f32, a, b, c);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine().eng);
  return pd.impl_info_str();
}

void gemm_s8_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const int8_t* B,
                    int64_t ldb, int32_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_s8_reference(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  matmul(2, dt::s8, dt::s8, dt::s32, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = "?";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx2_vnni: isa = "avx2_vnni"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    default: isa = "other"; break;
  }
  return fmt::format("oneDNN {}.{}.{} (up to {})", v->major, v->minor, v->patch, isa);
}

void onednn_cap_isa(Isa isa) {
  // Takes effect only before oneDNN's first primitive (later calls fail and are ignored): a path
  // forced at start-up (ATOLL_ISA, hardware.isa) then also bounds what oneDNN dispatches to.
  dnnl::cpu_isa cap = dnnl::cpu_isa::all;
  switch (isa) {
    case Isa::avx2: cap = dnnl::cpu_isa::avx2; break;
    case Isa::avx512: cap = dnnl::cpu_isa::avx512_core_vnni; break;
    case Isa::avx512_bf16: cap = dnnl::cpu_isa::avx512_core_bf16; break;
    case Isa::amx: cap = dnnl::cpu_isa::all; break;
  }
  try {
    dnnl::set_max_cpu_isa(cap);
  } catch (const dnnl::error&) {
  }
}

}  // namespace atl::cpu
