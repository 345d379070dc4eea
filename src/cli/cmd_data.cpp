// `atoll data prepare`: text files (or, by default, Debian's fortunes) -> llm.c token shards.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "data/corpus.h"

namespace {

int run_prepare(int argc, char** argv) {
  CLI::App app{"Tokenize text into llm.c token shards (train_*.bin, val_*.bin, meta.json)"};
  atl::PrepareOptions opt;
  opt.out_dir = "data/fortunes";
  int64_t seed = int64_t(opt.seed);
  app.add_option(
      "--input", opt.inputs,
      "text files or directories; omitted: Debian's fortunes (/usr/share/games/fortunes)");
  app.add_option("--tokenizer", opt.tokenizer,
                 "\"byte\" or a GPT-2 BPE directory (encoder.json + vocab.bpe)")
      ->capture_default_str();
  app.add_option("--out", opt.out_dir, "output directory")->capture_default_str();
  app.add_option("--val-fraction", opt.val_fraction, "share of documents held out for validation")
      ->check(CLI::Range(0.0, 0.99))
      ->capture_default_str();
  app.add_option("--shard-tokens", opt.shard_tokens, "tokens per shard file")
      ->check(CLI::Range(int64_t(1), int64_t(2'000'000'000)))
      ->capture_default_str();
  app.add_option("--seed", seed, "document shuffle seed")->capture_default_str();
  bool force = false;
  app.add_flag("--force", force, "prepare again even if the output is up to date");
  CLI11_PARSE(app, argc, argv);
  opt.seed = uint64_t(seed);
  if (opt.inputs.empty()) opt.inputs = atl::default_corpus_files();
  nlohmann::json meta;
  if (!force && atl::prepared_data_matches(opt)) {
    meta = atl::read_data_meta(opt.out_dir);
    std::printf("%s is up to date (use --force to prepare again)\n", opt.out_dir.c_str());
  } else {
    meta = atl::prepare_data(opt);
  }
  std::printf(
      "%s: tokenizer %s (vocab %d), %lld train tokens in %zu shards, %lld val tokens, "
      "%lld + %lld documents\n",
      opt.out_dir.c_str(), meta["tokenizer_name"].get<std::string>().c_str(),
      meta["vocab_size"].get<int>(), meta["tokens"]["train"].get<long long>(),
      meta["shards"]["train"].size(), meta["tokens"]["val"].get<long long>(),
      meta["documents"]["train"].get<long long>(), meta["documents"]["val"].get<long long>());
  if (long long bad = meta.value("invalid_utf8_replaced", 0LL); bad > 0)
    std::printf("note: %lld byte(s) of invalid UTF-8 in the input were replaced by U+FFFD\n", bad);
  return 0;
}

atl::cli::Registrar prepare_cmd({"data prepare", "tokenize text into token shards for training",
                                 run_prepare});

}  // namespace
