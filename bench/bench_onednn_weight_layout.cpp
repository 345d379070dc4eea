// Should the bf16 step hand oneDNN its weights pre-packed? oneDNN's AMX matmul (brgemm) copies a
// plain B operand into its blocked VNNI layout on every call (jit_brgemm_matmul_copy_b_*, a large
// share of the bf16 step's profile); asking the primitive for its preferred weights layout
// (format `any`) and reordering the weight into it once per weight version would remove those
// copies. This measures both on the d384 step's weight products, one primitive each, in alternated
// rounds: plain (B copied inside every call) against pre-packed (B reordered once, outside the
// timing), process CPU seconds per call (the machine is shared: wall time means little), medians.
// Also prints the CPU model and the kernel oneDNN picked, and the one-off reorder's cost.
//
//   bench_onednn_weight_layout [rounds=5] [calls=20]
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "kernels/cpu/isa.h"

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

double cpu_s() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Shape {
  const char* what;
  int64_t M, N, K;
  bool tb;  // B read transposed (the weight stored [N, K])
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5, calls = argc > 2 ? std::atoi(argv[2]) : 20;
  const Shape shapes[] = {
      {"c_attn forward", 2048, 1152, 384, false}, {"c_fc forward", 2048, 1536, 384, false},
      {"mlp c_proj forward", 2048, 384, 1536, false}, {"c_attn dX", 2048, 384, 1152, true},
      {"c_fc dX", 2048, 384, 1536, true}, {"head forward (128-row block)", 128, 8192, 384, true},
      {"head dX", 2048, 384, 8192, false},
  };
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream s(eng);
  std::printf("cpu: %s; isa %s\n", atl::cpu::cpu_features().model.c_str(), atl::cpu::isa_name(atl::cpu::best_isa()));
  std::printf("%-30s %8s %10s %10s %8s %10s  %s\n", "product", "MxNxK", "plain ms", "packed ms", "ratio",
              "reorder ms", "kernel");
  for (const Shape& sh : shapes) {
    const dnnl::memory::desc a({sh.M, sh.K}, dt::bf16, dims{sh.K, 1});
    const dnnl::memory::desc bplain({sh.K, sh.N}, dt::bf16, sh.tb ? dims{1, sh.K} : dims{sh.N, 1});
    const dnnl::memory::desc c({sh.M, sh.N}, dt::f32, dims{sh.N, 1});
    const dnnl::memory::desc bany({sh.K, sh.N}, dt::bf16, dnnl::memory::format_tag::any);
    dnnl::matmul::primitive_desc pplain(dnnl::matmul::desc(a, bplain, c), eng);
    dnnl::matmul::primitive_desc ppacked(dnnl::matmul::desc(a, bany, c), eng);
    const dnnl::memory::desc bpacked = ppacked.weights_desc();
    std::vector<uint16_t> A(size_t(sh.M * sh.K)), B(size_t(sh.K * sh.N)), Bp(bpacked.get_size() / 2 + 1);
    for (size_t i = 0; i < A.size(); ++i) A[i] = uint16_t(0x3f00 + i % 255);  // values in [0.5, 1)
    for (size_t i = 0; i < B.size(); ++i) B[i] = uint16_t(0xbf00 + i % 253);
    std::vector<float> C(size_t(sh.M * sh.N));
    dnnl::memory am(a, eng, A.data()), bm(bplain, eng, B.data()), bpm(bpacked, eng, Bp.data()), cm(c, eng, C.data());
    dnnl::matmul mplain(pplain), mpacked(ppacked);
    std::vector<double> tp, tk, tr;
    for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
      double t0 = cpu_s();
      for (int i = 0; i < calls; ++i)
        mplain.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
      s.wait();
      double t1 = cpu_s();
      dnnl::reorder(bm, bpm).execute(s, bm, bpm);
      s.wait();
      double t2 = cpu_s();
      for (int i = 0; i < calls; ++i)
        mpacked.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bpm}, {DNNL_ARG_DST, cm}});
      s.wait();
      double t3 = cpu_s();
      if (r == 0) continue;
      tp.push_back((t1 - t0) / calls);
      tr.push_back(t2 - t1);
      tk.push_back((t3 - t2) / calls);
    }
    char mnk[48];
    std::snprintf(mnk, sizeof mnk, "%ldx%ldx%ld", long(sh.M), long(sh.N), long(sh.K));
    std::printf("%-30s %8s %10.3f %10.3f %8.3f %10.3f  %s\n", sh.what, mnk, 1e3 * median(tp), 1e3 * median(tk),
                median(tk) / median(tp), 1e3 * median(tr), ppacked.impl_info_str());
  }
  std::printf("ratio = packed / plain CPU time per call (medians of %d rounds of %d calls); > 1: pre-packing loses\n",
              rounds, calls);
  return 0;
}
