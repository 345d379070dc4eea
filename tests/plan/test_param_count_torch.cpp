// Parameter counts checked against an independent count: tools/plan_param_count.py builds the
// same shapes with torch.nn and counts their parameters.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "plan/model_spec.h"

using namespace atl::plan;

namespace {
nlohmann::json shape(const ModelSpec& m) {
  return {{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads}, {"kv_heads", m.kv_heads},
          {"head_dim", m.head_dim}, {"ffn", m.ffn}, {"ffn_type", m.ffn_type}, {"vocab", m.vocab}, {"seq", m.seq},
          {"tied_head", m.tied_head}, {"bias", m.bias}, {"norm", m.norm}, {"position", m.position},
          {"qk_norm", m.qk_norm}, {"experts", m.experts}, {"expert_ffn", m.expert_ffn}};
}
}  // namespace

TEST(PlanModelTorch, CountsEqualTorchNnModules) {
  std::vector<ModelSpec> ms;
  ModelSpec gpt = model_preset("gpt2-124m");
  gpt.layers = 2, gpt.vocab = 5000;
  ms.push_back(gpt);
  ModelSpec llama = model_preset("llama3-8b");
  llama.layers = 2, llama.hidden = 512, llama.heads = 8, llama.kv_heads = 2, llama.ffn = 1376, llama.vocab = 3000;
  ms.push_back(llama);
  ModelSpec qwen = model_preset("qwen3-32b");
  qwen.layers = 1, qwen.hidden = 256, qwen.heads = 4, qwen.kv_heads = 2, qwen.head_dim = 96, qwen.ffn = 640, qwen.vocab = 1000;
  ms.push_back(qwen);
  ModelSpec moe = llama;
  moe.experts = 4, moe.top_k = 2, moe.expert_ffn = 256;
  ms.push_back(moe);
  nlohmann::json arg = nlohmann::json::array();
  for (auto& m : ms) arg.push_back(shape(m));
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/plan_param_count.py '" + arg.dump() + "'";
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, f)) out += buf;
  ASSERT_EQ(pclose(f), 0) << cmd << "\n" << out;
  std::istringstream in(out);
  for (auto& m : ms) {
    long long torch_count = -1;
    ASSERT_TRUE(in >> torch_count) << out;
    EXPECT_EQ(m.total_params(), torch_count) << m.name;
  }
}
