// The GPT model against PyTorch (tools/torch_gpt_ref.py, Debian's python3-torch) from identical
// weights: logits, loss, every parameter gradient,
// one AdamW step (the tight optimizer check) and 10 AdamW steps with clipping (losses tight,
// parameters only loosely: the trajectory is chaotic at fp32's noise floor).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "autograd/graph.h"
#include "models/gpt/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tensor/safetensors.h"

using namespace atl;
namespace fs = std::filesystem;

namespace {

struct Case {
  const char* preset;
  int64_t B, T;
};

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("atoll_test_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void run_parity(const Case& cs) {
  nn::GPTConfig cfg = nn::GPTConfig::preset(cs.preset);
  nn::GPT model(cfg);
  model.init_weights(1234);
  Rng rng(99, 0);
  std::vector<int32_t> tok(size_t(cs.B * cs.T)), tgt(size_t(cs.B * cs.T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  for (size_t i = 0; i < tgt.size(); ++i) tgt[i] = i % 7 == 3 ? -1 : int32_t(rng.below(uint64_t(cfg.vocab_size)));
  Tensor tokens = Tensor::from_vector_i32(tok, {cs.B, cs.T}), targets = Tensor::from_vector_i32(tgt, {cs.B, cs.T});

  fs::path dir = tmpdir(cs.preset);
  save_safetensors((dir / "init.safetensors").string(), model.state_dict(), model.config_metadata());
  save_safetensors((dir / "batch.safetensors").string(), {{"tokens", tokens}, {"targets", targets}});
  const float lr = 1e-2f, clip = 1.0f;
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/torch_gpt_ref.py " +
                    (dir / "init.safetensors").string() + " " + (dir / "batch.safetensors").string() + " " +
                    (dir / "ref.safetensors").string() + " --steps 10 --lr 0.01 --clip 1.0";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // The same in float64: fp32's own rounding noise after 10 optimizer steps is the yardstick for
  // how closely two fp32 implementations can agree.
  std::string cmd64 = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/torch_gpt_ref.py " +
                      (dir / "init.safetensors").string() + " " + (dir / "batch.safetensors").string() + " " +
                      (dir / "ref64.safetensors").string() + " --steps 10 --lr 0.01 --clip 1.0 --float64";
  ASSERT_EQ(std::system(cmd64.c_str()), 0) << cmd64;
  TensorFile ref = load_safetensors((dir / "ref.safetensors").string());
  TensorFile ref64 = load_safetensors((dir / "ref64.safetensors").string());

  // Forward and gradients.
  model.zero_grad();
  Tensor logits;
  {
    NoGradGuard ng;
    logits = model.logits(tokens);
  }
  EXPECT_LT(rel_error(logits, ref.get("logits")), 1e-5);
  Tensor loss = model.loss(tokens, targets);
  EXPECT_NEAR(loss.item(), ref.get("loss").item(), 1e-5 * std::abs(ref.get("loss").item()));
  backward(loss);
  double worst = 0;
  std::string worst_name;
  for (nn::Parameter* p : model.parameters()) {
    double e = rel_error(p->grad, ref.get("grad." + p->name));
    if (e > worst) { worst = e; worst_name = p->name; }
  }
  EXPECT_LT(worst, 1e-5) << "worst gradient " << worst_name;
  std::printf("[%s] logits rel err %.2e, worst grad rel err %.2e (%s)\n", cs.preset, rel_error(logits, ref.get("logits")),
              worst, worst_name.c_str());

  // Ten AdamW steps from the same start.
  model.load_state_dict(load_safetensors((dir / "init.safetensors").string()).tensors, "init");
  AdamW opt(model.param_refs(), AdamWConfig{lr, 0.9f, 0.95f, 1e-8f, 0.1f});
  Tensor ref_losses = ref.get("losses");
  // The key bias gets an exactly zero gradient (softmax ignores a constant added to a row of
  // scores), so in any fp32 implementation its Adam update is driven by rounding noise alone; it
  // is left out of the parameter comparisons, the query and value biases are kept.
  auto masked = [&](const std::string& name, Tensor t) {
    if (name.find("c_attn.bias") == std::string::npos) return t;
    Tensor c = t.clone();
    int64_t q = cfg.n_head * cfg.head_dim(), k = cfg.n_kv_head * cfg.head_dim();
    c.slice(0, q, q + k).zero();
    return c;
  };
  // Step 1 is checked element by element. From identical weights, Adam's first update is
  // lr * g / (|g| + eps) in exact arithmetic (bias corrections cancel), so atoll's and PyTorch's
  // parameters may differ only by what their (already checked) gradients' difference makes of that
  // update, plus a few fp32 ulps of the parameter and of the update. Where |g| >> eps the update
  // is lr * sign(g) and rounding in g cannot move it; where |g| is near eps it can, which is why a
  // global relative bound is the wrong tool. This holds on any CPU, whatever its summation order.
  std::map<std::string, std::vector<float>> grads0;
  double worst_ratio = 0;
  int64_t step1_violations = 0;
  std::string worst_step1_name;
  for (int s = 0; s < 10; ++s) {
    model.zero_grad();
    Tensor l = model.loss(tokens, targets);
    backward(l);
    // Step 0 starts from identical weights: 1e-5. Later steps follow diverging fp32 trajectories;
    // a loss is an average over B*T tokens, so it stays within fp32's relative noise of the
    // float64 run (1e-5) or of PyTorch fp32's own distance from it, whichever is larger.
    double l64 = ref64.get("losses").f32()[s], l32 = ref_losses.f32()[s];
    double tol = s == 0 ? 1e-5 * std::abs(l32) : 1.5 * std::abs(l32 - l64) + 1e-5 * std::abs(l64);
    EXPECT_NEAR(l.item(), s == 0 ? l32 : l64, tol) << "step " << s;
    const float coef = clip_coefficient(grad_norm(model.flat_grads()), clip);
    if (s == 0)
      for (nn::Parameter* p : model.parameters()) {
        Tensor g = p->grad.contiguous();
        grads0[p->name].assign(g.f32(), g.f32() + g.numel());
      }
    opt.step({1.f, coef});
    if (s != 0) continue;
    double tnorm2 = 0;
    for (nn::Parameter* p : model.parameters()) {
      Tensor g = ref.get("grad." + p->name);
      for (int64_t i = 0; i < g.numel(); ++i) tnorm2 += double(g.f32()[i]) * g.f32()[i];
    }
    const double tcoef = std::min(1.0, clip / (std::sqrt(tnorm2) + 1e-6));  // clip_grad_norm_'s
    const double eps = 1e-8;
    auto sgn = [&](double g) { return g / (std::abs(g) + eps); };
    for (nn::Parameter* p : model.parameters()) {
      Tensor mine = masked(p->name, p->value).contiguous();
      Tensor theirs = masked(p->name, ref.get("step1." + p->name)).contiguous();
      Tensor tg = ref.get("grad." + p->name).contiguous();
      Tensor key_mask = masked(p->name, Tensor::full(p->value.shape(), 1.f)).contiguous();
      const std::vector<float>& ag = grads0[p->name];
      for (int64_t i = 0; i < mine.numel(); ++i) {
        if (key_mask.f32()[i] == 0.f) continue;
        double explained = lr * std::abs(sgn(double(coef) * ag[size_t(i)]) - sgn(tcoef * tg.f32()[i]));
        double allowed = explained * 1.001 + 8 * 0x1p-24 * (std::abs(theirs.f32()[i]) + lr);
        double d = std::abs(double(mine.f32()[i]) - theirs.f32()[i]);
        if (d > allowed) ++step1_violations;
        if (d / allowed > worst_ratio) { worst_ratio = d / allowed; worst_step1_name = p->name; }
      }
    }
    EXPECT_EQ(step1_violations, 0) << "after one AdamW step, parameters differ from PyTorch's by more than their "
                                      "gradients' difference explains; worst " << worst_step1_name << " at "
                                   << worst_ratio << "x the allowance";
  }
  // After 10 steps at lr 1e-2 the two fp32 trajectories have diverged chaotically from 1e-7
  // rounding differences (PyTorch fp32 itself is 1e-5..1e-4 from its float64 run, depending on
  // the CPU's summation order), so this is no precision check: it only catches a gross error
  // that one step cannot show (state carried wrongly between steps, bias correction by the wrong
  // step count), which moves parameters by >= 1e-2 relative over 10 steps. 1e-3 leaves 10x room
  // above the chaotic drift seen on AMD EPYC and Intel Xeon.
  double worst_final = 0, worst_torch = 0;
  std::string worst_final_name;
  for (nn::Parameter* p : model.parameters()) {
    Tensor r64 = masked(p->name, ref64.get("final." + p->name));
    double ours = rel_error(masked(p->name, p->value), r64);
    worst_torch = std::max(worst_torch, rel_error(masked(p->name, ref.get("final." + p->name)), r64));
    if (ours > worst_final) { worst_final = ours; worst_final_name = p->name; }
  }
  EXPECT_LT(worst_final, 1e-3) << "after 10 AdamW steps, far from the float64 trajectory: " << worst_final_name;
  std::printf("[%s] after 1 AdamW step: worst parameter difference %.2f of its allowance (%s)\n", cs.preset,
              worst_ratio, worst_step1_name.c_str());
  std::printf("[%s] after 10 AdamW steps: atoll vs torch-fp64 worst param rel err %.2e; torch-fp32 vs torch-fp64 %.2e\n",
              cs.preset, worst_final, worst_torch);
  // ATOLL_KEEP_TMP=1 keeps the weights, batch and references for running tools/torch_gpt_ref.py by hand.
  if (!std::getenv("ATOLL_KEEP_TMP")) fs::remove_all(dir);
}

}  // namespace

TEST(GptVsTorch, Gpt2Tiny) { run_parity({"gpt2-tiny", 2, 32}); }
TEST(GptVsTorch, LlamaTiny) { run_parity({"llama-tiny", 2, 32}); }
