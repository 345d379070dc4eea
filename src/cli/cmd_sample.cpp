// `atoll sample --weights PATH [--prompt TEXT]... [--tokens N] ...`: text from a trained model,
// generated with a KV cache (models/gpt/generate.h); several --prompt make one batch.
#include <CLI/CLI.hpp>

#include "cli/command.h"
#include "cli/model_weights.h"
#include "models/gpt/generate.h"
#include "data/tokenizer.h"

namespace atl::cli {
namespace {

int run_sample(int argc, char** argv) {
  CLI::App app{"Generate text from a trained model"};
  std::string weights, tokenizer = "byte";
  std::vector<std::string> prompts;
  int64_t tokens = 200, n_head = 0;
  nn::SamplingConfig s;
  s.temperature = 0.8f;
  s.top_k = 40;
  bool no_cache = false;
  app.add_option("--weights,-w", weights,
                 "a checkpoint directory, a run directory (its latest checkpoint), or a model.safetensors file "
                 "(atoll's, or a Hugging Face GPT-2 file)")
      ->required();
  app.add_option("--prompt,-p", prompts, "text to continue (default: start of a document); repeat for a batch");
  app.add_option("--tokens,-n", tokens, "tokens to generate (per prompt)");
  app.add_option("--temperature,-t", s.temperature, "softmax temperature (0: greedy)");
  app.add_option("--top-k", s.top_k, "sample among the k most likely tokens (0: all)");
  app.add_option("--top-p", s.top_p, "then among the fewest tokens whose probability reaches p, in (0, 1]");
  app.add_option("--stop", s.stop_tokens, "token id that ends a prompt's generation (repeatable)");
  app.add_option("--tokenizer", tokenizer, "tokenizer spec: byte, or a BPE directory");
  app.add_option("--seed", s.seed, "random seed");
  app.add_option("--n-head", n_head, "attention heads of a Hugging Face file (default n_embd / 64)");
  app.add_flag("--no-cache", no_cache, "recompute the whole context for every token (slow; for checks)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Refused before anything is loaded, naming the flag.
  ATOLL_CHECK(tokens >= 0, "--tokens must be 0 or more, got {}", tokens);
  ATOLL_CHECK(n_head >= 0, "--n-head must be positive (or 0 for n_embd / 64), got {}", n_head);
  s.validate("--");

  LoadedModel lm = load_model(weights, n_head);
  auto tok = load_tokenizer(tokenizer);
  ATOLL_CHECK(tok->vocab_size() <= lm.model->config().vocab_size,
              "tokenizer '{}' has {} tokens, more than the model's vocabulary of {}", tokenizer, tok->vocab_size(),
              lm.model->config().vocab_size);
  if (prompts.empty()) prompts.push_back("");
  std::vector<std::vector<int32_t>> ids;
  for (const auto& p : prompts) {
    ids.push_back(p.empty() ? std::vector<int32_t>{tok->eot()} : tok->encode(p));
    ATOLL_CHECK(!ids.back().empty(), "prompt '{}' encodes to no tokens", p);
  }
  nn::GenerateOptions o;
  o.max_new_tokens = tokens;
  o.sampling = s;
  o.use_cache = !no_cache;
  auto out = nn::generate(*lm.model, ids, o);
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<int32_t> gen = out[i].tokens;
    for (auto& t : gen)
      if (t == tok->eot()) t = '\n';
    if (out.size() > 1) std::printf("=== sample %zu ===\n", i + 1);
    std::printf("%s%s\n", prompts[i].c_str(), tok->decode(gen).c_str());
  }
  return 0;
}

Registrar reg({"sample", "generate text from a trained model", run_sample});

}  // namespace
}  // namespace atl::cli
