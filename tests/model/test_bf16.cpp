// Mixed precision: bf16 matmuls with fp32 master weights stay close to the fp32 model.
#include <gtest/gtest.h>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "models/gpt/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "core/threads.h"

#include <cmath>
#include <cstdio>

using namespace atl;

namespace {
struct PrecisionGuard {
  ~PrecisionGuard() { set_matmul_dtype(DType::f32); }
};
}  // namespace

TEST(MixedPrecision, Bf16LossAndGradientsTrackFp32) {
  PrecisionGuard guard;
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt2-tiny");
  nn::GPT model(cfg);
  model.init_weights(5);
  Rng rng(3, 0);
  std::vector<int32_t> tok(2 * 32), tgt(2 * 32);
  for (auto& t : tok) t = int32_t(rng.below(257));
  for (auto& t : tgt) t = int32_t(rng.below(257));
  Tensor x = Tensor::from_vector_i32(tok, {2, 32}), y = Tensor::from_vector_i32(tgt, {2, 32});

  model.zero_grad();
  Tensor l32 = model.loss(x, y);
  backward(l32);
  Tensor g32 = model.flat_grads().clone();

  set_matmul_dtype(DType::bf16);
  model.zero_grad();
  Tensor l16 = model.loss(x, y);
  backward(l16);
  Tensor g16 = model.flat_grads().clone();

  EXPECT_NE(l32.item(), l16.item()) << "bf16 mode did not change the arithmetic";
  EXPECT_NEAR(l16.item(), l32.item(), 1e-2 * l32.item());
  EXPECT_LT(rel_error(g16, g32), 3e-2);
}

// 100 AdamW steps of the tiny GPT on a fixed batch of random tokens, fp32 against bf16 matmuls on
// every bf16 GEMM path this CPU has (the portable widening path everywhere, AVX-512 BF16 and AMX
// where present). bf16 rounds each matmul operand to 8 significant bits (relative error up to
// 2^-9 ≈ 0.2%); with fp32 master weights and fp32 gradient accumulation those errors do not
// compound through the weights, so the loss curve must stay close (relative) to fp32's at every
// step (bound below) and training must make the same progress: both fall by over a third (memorising the batch).
// Measured on the Intel Xeon (AMX) dev machine: worst gaps 1.5% (portable), 0.9% (AVX-512 BF16),
// 0.7% (AMX); the bound 3% leaves room for other CPUs' summation orders, which the chaotic
// dynamics of 100 steps amplify. One thread: the tiny matmuls do not need more, and a loaded
// machine would otherwise spend the test spinning in OpenMP barriers.
TEST(MixedPrecision, Bf16TrainingTracksFp32For100StepsOnEveryPath) {
  PrecisionGuard guard;
  const cpu::Isa saved = cpu::active_isa();
  const int saved_threads = num_threads();
  set_num_threads(1);
  auto train = [](DType dt) {
    set_matmul_dtype(dt);
    nn::GPTConfig cfg = nn::GPTConfig::preset("gpt2-tiny");
    nn::GPT model(cfg);
    model.init_weights(11);
    AdamW opt(model.param_refs(), AdamWConfig{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f});
    Rng rng(5, 0);
    std::vector<int32_t> tok(4 * 32), tgt(4 * 32);
    for (auto& t : tok) t = int32_t(rng.below(257));
    for (auto& t : tgt) t = int32_t(rng.below(257));
    Tensor x = Tensor::from_vector_i32(tok, {4, 32}), y = Tensor::from_vector_i32(tgt, {4, 32});
    std::vector<float> losses;
    for (int s = 0; s < 100; ++s) {
      model.zero_grad();
      Tensor l = model.loss(x, y);
      backward(l);
      opt.step({1.f, clip_coefficient(grad_norm(model.flat_grads()), 1.f)});
      losses.push_back(l.item());
    }
    return losses;
  };
  cpu::set_isa(cpu::Isa::avx2);  // the fp32 run's kernels do not depend on the path; fix it anyway
  const std::vector<float> ref = train(DType::f32);
  ASSERT_LT(ref.back(), ref.front() * 0.66f) << "fp32 did not learn: the comparison would be vacuous";
  int paths = 0;
  for (cpu::Isa i : {cpu::Isa::avx2, cpu::Isa::avx512_bf16, cpu::Isa::amx}) {
    std::string why;
    if (!cpu::isa_supported(i, &why)) {
      std::printf("[ SKIPPED  ] bf16 training on %s: %s\n", cpu::isa_name(i), why.c_str());
      continue;
    }
    cpu::set_isa(i);
    ++paths;
    const std::vector<float> l16 = train(DType::bf16);
    float worst = 0;
    for (size_t s = 0; s < ref.size(); ++s) worst = std::max(worst, std::fabs(l16[s] - ref[s]) / ref[s]);
    std::printf("bf16 on %s (%s): loss %.4f -> %.4f (fp32 %.4f -> %.4f), worst relative gap %.4f\n",
                cpu::isa_name(i), cpu::gemm_bf16_path(), l16.front(), l16.back(), ref.front(), ref.back(), worst);
    EXPECT_LT(worst, 0.03f) << cpu::isa_name(i);
    EXPECT_GT(worst, 0.0f) << cpu::isa_name(i) << ": bf16 changed nothing";
    EXPECT_LT(l16.back(), l16.front() * 0.66f) << cpu::isa_name(i);
  }
  EXPECT_GE(paths, 1);
  cpu::set_isa(saved);
  set_num_threads(saved_threads);
}
