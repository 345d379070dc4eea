// Turning text files into token shards: gathering input files, splitting them into documents,
// tokenizing, a document-level train/val split, and the meta.json that records how the shards
// were made. The default corpus is Debian's fortunes (packages fortunes, fortunes-min).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

// The documents of one file. A file in fortune(6) format — entries separated by lines holding
// only "%" — gives one document per entry; any other file is one document. Empty documents are
// dropped.
std::vector<std::string> split_documents(std::string_view text);

// Expands inputs: a file is itself; a directory gives its regular files, recursively, in sorted
// order, skipping hidden names, symbolic links (fortune's *.u8 aliases) and binary files (holding
// NUL bytes, such as fortune's *.dat indexes). Fails on a path that does not exist.
std::vector<std::string> list_input_files(const std::vector<std::string>& inputs);

// All documents of the files, in order. Fails on a file holding a NUL byte (binary, not text),
// naming it and the offset; invalid UTF-8 is replaced by U+FFFD with a warning per file, and the
// number of bytes replaced goes to *invalid_utf8.
std::vector<std::string> read_documents(const std::vector<std::string>& files,
                                        size_t* invalid_utf8 = nullptr);

// text with each byte that is not part of a valid UTF-8 sequence (overlong forms and surrogates
// included) replaced by U+FFFD; *replaced counts them, *first_bad is the first one's offset.
std::string repair_utf8(std::string_view text, size_t* replaced = nullptr,
                        size_t* first_bad = nullptr);

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories
  std::string tokenizer = "byte";   // tokenizer spec (see load_tokenizer)
  std::string out_dir;
  double val_fraction = 0.05;          // share of documents held out for validation
  int64_t shard_tokens = 100'000'000;  // llm.c's shard size
  uint64_t seed = 1337;                // document shuffle before the split
};

// Tokenizes every document (each one preceded by the tokenizer's end-of-text id, as GPT-2 and
// llm.c do), shuffles the documents with the seed, holds out val_fraction of them, and writes
// out_dir/train_NNNNNN.bin, out_dir/val_NNNNNN.bin and out_dir/meta.json (written last, so a
// directory with meta.json is complete). Shards are uint16 up to 65536 ids and uint32 above.
// Refuses, touching nothing, an out_dir holding shards atoll did not write. Returns meta.json.
nlohmann::json prepare_data(const PrepareOptions& opt);

// True when out_dir/meta.json records exactly these options and its shards are present.
bool prepared_data_matches(const PrepareOptions& opt);

// The fortune files of Debian's fortunes and fortunes-min packages (the non-offensive ones); fails
// saying how to install them when absent. dir defaults to /usr/share/games/fortunes.
std::vector<std::string> default_corpus_files(const std::string& dir = "");

// Prepares the default corpus into out_dir unless it is already there with the same tokenizer
// (idempotent); returns meta.json.
nlohmann::json prepare_default_corpus(const std::string& out_dir,
                                      const std::string& tokenizer_spec = "byte");

// Fails, saying how to fix it, unless dir holds data prepared with this tokenizer (same spec and
// same encoder.json/vocab.bpe content): ids of one tokenizer mean nothing to another.
void check_prepared_tokenizer(const std::string& dir, const std::string& tokenizer_spec);

// Reads out_dir/meta.json; fails saying to run `atoll data prepare` when it is missing.
nlohmann::json read_data_meta(const std::string& dir);

}  // namespace atl
