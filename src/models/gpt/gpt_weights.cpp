#include "models/gpt/gpt_weights.h"

#include <cstdlib>
#include <set>

#include "models/gpt/gpt.h"

namespace atl::nn {

namespace {

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

GptWeights from_hf(TensorFile& tf, const std::string& what, int64_t n_head) {
  GptWeights w;
  w.from_hf = true;
  std::map<std::string, Tensor> by;
  for (auto& [n, t] : tf.tensors) {
    std::string name = n.rfind("transformer.", 0) == 0 ? n.substr(12) : n;
    if (ends_with(name, ".attn.bias") && t.dim() == 4) continue;  // the causal mask buffer
    if (ends_with(name, ".attn.masked_bias")) continue;
    by[name == "lm_head.weight" ? name : "transformer." + name] = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  }
  auto need = [&](const std::string& n) -> const Tensor& {
    auto it = by.find(n);
    ATOLL_CHECK(it != by.end(),
                "{}: no atoll_model metadata, and not a Hugging Face GPT-2 file either (no tensor '{}' or '{}')", what,
                n, n.substr(12));
    return it->second;
  };
  const Tensor& wte = need("transformer.wte.weight");
  const Tensor& wpe = need("transformer.wpe.weight");
  ATOLL_CHECK(wte.dim() == 2 && wpe.dim() == 2 && wpe.size(1) == wte.size(1),
              "{}: wte {} and wpe {} are not [vocab, n_embd] and [positions, n_embd]", what, shape_str(wte.shape()),
              shape_str(wpe.shape()));
  GPTConfig c;  // GPT-2's architecture: LayerNorm with bias, GELU, learned positions, tied head
  c.vocab_size = wte.size(0);
  c.n_embd = wte.size(1);
  c.block_size = wpe.size(0);
  std::set<int64_t> layers;
  for (auto& [n, t] : by)
    if (n.rfind("transformer.h.", 0) == 0) {
      char* end = nullptr;
      long long i = std::strtoll(n.c_str() + 14, &end, 10);
      ATOLL_CHECK(end != n.c_str() + 14 && *end == '.' && i >= 0, "{}: tensor '{}' is not named h.N.<...>", what, n);
      layers.insert(int64_t(i));
    }
  c.n_layer = int64_t(layers.size());
  ATOLL_CHECK(c.n_layer > 0 && *layers.rbegin() == c.n_layer - 1, "{}: blocks h.N are not numbered 0..{}", what,
              c.n_layer - 1);
  const Tensor& fc = need("transformer.h.0.mlp.c_fc.weight");
  c.ffn_hidden = fc.size(1);
  if (n_head <= 0) {
    ATOLL_CHECK(c.n_embd % 64 == 0, "{}: n_embd {} is not a multiple of 64; say the head count (--n-head)", what,
                c.n_embd);
    n_head = c.n_embd / 64;
  }
  c.n_head = c.n_kv_head = n_head;
  c.validate();
  if (auto it = by.find("lm_head.weight"); it != by.end()) {
    // A tied head saved explicitly is wte again; a different one would be silently dropped.
    const Tensor& lm = it->second;
    bool same = lm.shape() == wte.shape();
    for (int64_t i = 0; same && i < lm.numel(); ++i) same = lm.f32()[i] == wte.f32()[i];
    ATOLL_CHECK(same, "{}: lm_head.weight differs from wte.weight; an untied GPT-2 head is not supported here", what);
  }
  for (auto& [n, t] : by) w.tensors.emplace_back(n, t);
  w.config = c;
  return w;
}

}  // namespace

GptWeights gpt_weights(TensorFile tf, const std::string& what, int64_t n_head) {
  if (!tf.metadata.count("atoll_model")) return from_hf(tf, what, n_head);
  GptWeights w;
  w.config = config_from_metadata(tf.metadata);
  w.tensors = std::move(tf.tensors);
  return w;
}

}  // namespace atl::nn
