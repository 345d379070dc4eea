// `atoll tokenizer train`: byte-level BPE on the user's text, saved in GPT-2's file format;
// `atoll tokenizer encode`: shows how a tokenizer splits a text.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "data/bpe_train.h"
#include "data/corpus.h"
#include "data/tokenizer.h"
#include "data/tokenizer_gpt2.h"

namespace {

int run_train(int argc, char** argv) {
  CLI::App app{"Train a byte-level BPE tokenizer (GPT-2 format: encoder.json + vocab.bpe)"};
  std::vector<std::string> inputs;
  std::string out;
  int vocab = 4096;
  app.add_option("--input", inputs, "text files or directories (fortune files split at '%' lines)")
      ->required();
  app.add_option("--vocab-size", vocab, "ids in all: 256 bytes + merges + <|endoftext|>")
      ->check(CLI::Range(257, (1 << 24) - 1));
  app.add_option("--out", out, "directory to write encoder.json and vocab.bpe into")->required();
  CLI11_PARSE(app, argc, argv);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> docs = atl::read_documents(atl::list_input_files(inputs));
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  atl::BpeTrainOptions opt;
  opt.vocab_size = vocab;
  atl::BpeVocab v = atl::train_bpe(docs, opt);
  atl::write_gpt2_bpe(v, out);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Measure the compression on the training text itself.
  auto tok = atl::load_tokenizer(out);
  size_t ntok = 0;
  for (const auto& d : docs) ntok += tok->encode(d).size();
  std::printf(
      "trained %zu merges (vocab %d) on %zu documents, %zu bytes in %.2f s -> %s\n"
      "compression: %.3f bytes/token on the training text\n",
      v.merges.size(), tok->vocab_size(), docs.size(), bytes, secs, out.c_str(),
      ntok ? double(bytes) / double(ntok) : 0.0);
  return 0;
}

int run_encode(int argc, char** argv) {
  CLI::App app{"Encode a text with a tokenizer and print the ids and pieces"};
  std::string spec = "byte", text;
  app.add_option("--tokenizer", spec, "\"byte\" or a GPT-2 BPE directory");
  app.add_option("text", text, "the text to encode")->required();
  CLI11_PARSE(app, argc, argv);
  auto tok = atl::load_tokenizer(spec);
  auto ids = tok->encode(text);
  for (int32_t id : ids) std::printf("%d\t%s\n", id, atl::gpt2_spell(tok->decode({id})).c_str());
  std::printf("%zu tokens for %zu bytes (%s, vocab %d)\n", ids.size(), text.size(),
              tok->name().c_str(), tok->vocab_size());
  return 0;
}

atl::cli::Registrar train_cmd({"tokenizer train", "train a byte-level BPE tokenizer on text files",
                               run_train});
atl::cli::Registrar encode_cmd({"tokenizer encode", "show how a tokenizer splits a text",
                                run_encode});

}  // namespace
