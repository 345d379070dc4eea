// Mixed precision: bf16 matmuls with fp32 master weights stay close to the fp32 model.
#include <gtest/gtest.h>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "models/gpt/gpt.h"

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
