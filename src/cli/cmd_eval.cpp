// `atoll eval WEIGHTS --data DIR`: loss and perplexity of a model on a token data set.
//
// Which batches: the first --steps batches of B rows of T+1 tokens of the split, read in shard
// order (DataLoader's validation order, no shuffling). For a checkpoint written by `atoll train`,
// B, T, --steps, the world size and the matmul dtype default to those of the trainer's own
// evaluation (recorded in the checkpoint's state.json): each of W ranks scores its share of the
// rows and the ranks' means are averaged, exactly as Trainer::evaluate does, so the loss printed
// equals the val_loss the trainer logged for that step. Elsewhere (a plain file, or an older
// checkpoint) the defaults are B=8, T=min(block_size, 1024), the whole split, one rank.
#include <CLI/CLI.hpp>
#include <cmath>

#include "autograd/precision.h"
#include "cli/command.h"
#include "cli/model_weights.h"
#include "data/data_loader.h"

namespace atl::cli {
namespace {

int run_eval(int argc, char** argv) {
  CLI::App app{"Loss and perplexity of a model on a data set"};
  std::string weights, data, split = "val", dtype;
  int64_t B = 0, T = 0, steps = -1, world = 0, n_head = 0;
  bool json = false;
  app.add_option("weights", weights,
                 "a run directory (its latest checkpoint), a checkpoint directory, or a .safetensors file "
                 "(atoll's, or a Hugging Face GPT-2 file)")
      ->required();
  app.add_option("--data", data, "token shards: a directory from `atoll data prepare`, or a glob")->required();
  app.add_option("--split", split, "which split of the directory to score (val or train)");
  app.add_option("--batch-size", B, "rows per batch (default: the trainer's, else 8)");
  app.add_option("--seq-len", T, "tokens per row (default: the trainer's, else min(block_size, 1024))");
  app.add_option("--steps", steps, "batches (per rank) to score; 0: the whole split (default: the trainer's eval.steps, else 0)");
  app.add_option("--world-size", world, "ranks whose row shares are averaged, as in a distributed run (default: the trainer's, else 1)");
  app.add_option("--dtype", dtype, "matmul dtype, f32 or bf16 (default: the trainer's, else f32)");
  app.add_option("--n-head", n_head, "attention heads of a Hugging Face file (default n_embd / 64)");
  app.add_flag("--json", json, "print one JSON object (full precision) instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ATOLL_CHECK(B >= 0 && T >= 0 && world >= 0 && n_head >= 0 && steps >= -1,
              "--batch-size, --seq-len, --world-size and --n-head must be positive, --steps 0 or more");
  ATOLL_CHECK(split == "val" || split == "train", "--split must be val or train, got '{}'", split);

  LoadedModel lm = load_model(weights, n_head);
  const nn::GPTConfig& c = lm.model->config();
  // The trainer's evaluation setup, when the checkpoint records it.
  nlohmann::json ev = lm.state.is_object() && lm.state.contains("eval") ? lm.state["eval"] : nlohmann::json();
  auto from_ckpt = [&](int64_t& v, const char* key, int64_t def) {
    if (v > 0 || (std::string(key) == "steps" && v == 0)) return;
    v = ev.contains(key) ? ev[key].get<int64_t>() : def;
  };
  from_ckpt(B, "batch_size", 8);
  from_ckpt(T, "seq_len", std::min<int64_t>(c.block_size, 1024));
  from_ckpt(steps, "steps", 0);
  from_ckpt(world, "world_size", 1);
  if (dtype.empty()) dtype = ev.contains("matmul_dtype") ? ev["matmul_dtype"].get<std::string>() : "f32";
  ATOLL_CHECK(dtype == "f32" || dtype == "bf16", "--dtype must be f32 or bf16, got '{}'", dtype);
  ATOLL_CHECK(T <= c.block_size, "--seq-len {} exceeds the model's block_size {}", T, c.block_size);
  set_matmul_dtype(dtype_from_name(dtype));

  NoGradGuard ng;
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  double total = 0;
  int64_t per_rank = steps;
  for (int64_t r = 0; r < world; ++r) {
    DataLoader dl(data, split, int(B), int(T), int(r), int(world));
    dl.validate_vocab(int32_t(c.vocab_size));
    if (steps == 0) per_rank = int64_t(dl.batches_per_epoch());
    ATOLL_CHECK(per_rank > 0, "the {} split of {} holds fewer than one batch of {}x{} tokens per rank; use a smaller "
                "--batch-size or --seq-len", split, data, B, T);
    double rank_sum = 0;
    for (int64_t i = 0; i < per_rank; ++i) {
      dl.next_batch(x.i32(), y.i32());
      rank_sum += lm.model->loss(x, y).item();
    }
    total += rank_sum / double(per_rank);
  }
  const double loss = total / double(world), ppl = std::exp(loss);
  const int64_t ntok = per_rank * world * B * T;
  const std::string origin = lm.from_hf ? "Hugging Face GPT-2 weights" : "atoll weights";
  if (json) {
    nlohmann::json j = {{"loss", loss},        {"perplexity", ppl}, {"batches_per_rank", per_rank},
                        {"world_size", world}, {"batch_size", B},   {"seq_len", T},
                        {"tokens", ntok},      {"split", split},    {"weights", lm.file}};
    if (lm.state.is_object() && lm.state.contains("step")) j["step"] = lm.state["step"];
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("model: %s (%s, %s%s)\n", c.describe().c_str(), origin.c_str(), lm.file.c_str(),
              lm.state.is_object() && lm.state.contains("step")
                  ? (", step " + std::to_string(lm.state["step"].get<int64_t>())).c_str()
                  : "");
  std::printf("data: %s split of %s, %lld batches of %lldx%lld per rank x %lld rank(s) = %lld tokens%s\n",
              split.c_str(), data.c_str(), (long long)per_rank, (long long)B, (long long)T, (long long)world,
              (long long)ntok, ev.is_object() ? " (the trainer's evaluation batches)" : "");
  std::printf("loss %.6f  perplexity %.4f\n", loss, ppl);
  return 0;
}

Registrar reg({"eval", "loss and perplexity of a model on a data set", run_eval});

}  // namespace
}  // namespace atl::cli
