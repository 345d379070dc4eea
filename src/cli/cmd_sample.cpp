// `atoll sample --weights PATH [--prompt TEXT] [--tokens N] ...`: text from a trained model.
#include <CLI/CLI.hpp>
#include <filesystem>

#include "cli/command.h"
#include "models/gpt/gpt.h"
#include "resilience/checkpoint.h"
#include "train/tokenizer.h"

namespace atl::cli {
namespace {

int run_sample(int argc, char** argv) {
  CLI::App app{"Generate text from a trained model"};
  std::string weights, prompt, tokenizer = "byte";
  int64_t tokens = 200, top_k = 40;
  float temperature = 0.8f;
  uint64_t seed = 42;
  app.add_option("--weights,-w", weights,
                 "a checkpoint directory, a run directory (its latest checkpoint), or a model.safetensors file")
      ->required();
  app.add_option("--prompt,-p", prompt, "text to continue (default: start of a document)");
  app.add_option("--tokens,-n", tokens, "tokens to generate");
  app.add_option("--temperature,-t", temperature, "softmax temperature");
  app.add_option("--top-k", top_k, "sample among the k most likely tokens (0: all)");
  app.add_option("--tokenizer", tokenizer, "tokenizer spec: byte, or a BPE directory");
  app.add_option("--seed", seed, "random seed");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  namespace fs = std::filesystem;
  std::string file = weights;
  if (fs::is_directory(weights)) {
    if (fs::exists(fs::path(weights) / "checkpoints" / "latest")) {
      auto p = CheckpointStore((fs::path(weights) / "checkpoints").string()).latest();
      ATOLL_CHECK(p.has_value(), "run directory '{}' has no complete checkpoint", weights);
      file = *p;
    }
    CheckpointStore::verify(file);
    file = (fs::path(file) / "model.safetensors").string();
  }
  TensorFile tf = load_safetensors(file);
  nn::GPT model(nn::config_from_metadata(tf.metadata));
  model.load_state_dict(tf.tensors, file);
  auto tok = load_tokenizer(tokenizer);
  std::vector<int32_t> ids = prompt.empty() ? std::vector<int32_t>{tok->eot()} : tok->encode(prompt);
  Rng rng(seed, 0);
  auto out = model.generate(ids, tokens, temperature, top_k, rng);
  std::vector<int32_t> gen(out.begin() + int64_t(ids.size()), out.end());
  for (auto& t : gen)
    if (t == tok->eot()) t = '\n';
  std::printf("%s%s\n", prompt.c_str(), tok->decode(gen).c_str());
  return 0;
}

Registrar reg({"sample", "generate text from a trained model", run_sample});

}  // namespace
}  // namespace atl::cli
