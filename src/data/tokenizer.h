// Tokenizers: text <-> token ids. Two kinds: "byte" (the 256 byte values plus an end-of-text id,
// no training needed) and byte-level BPE in OpenAI's GPT-2 file format (tokenizer_gpt2.h), either
// GPT-2's own encoder.json/vocab.bpe or one trained by `atoll tokenizer train`.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace atl {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids. "<|endoftext|>" inside the text is ordinary text; documents are delimited by
  // inserting eot() ids, never by encoding the marker.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids to text (raw bytes: a cut through a multi-byte character yields invalid UTF-8).
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int32_t vocab_size() const = 0;
  virtual int32_t eot() const = 0;  // the end-of-text id that separates documents
  virtual std::string name() const = 0;
};

// Byte-level: id b < 256 is byte b, 256 is end-of-text; vocab 257.
class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return 257; }
  int32_t eot() const override { return 256; }
  std::string name() const override { return "byte"; }
};

// spec: "byte", or a GPT-2 BPE tokenizer given as a directory holding encoder.json + vocab.bpe
// (or the path of either file). Errors say how to obtain one.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// The spec in a form that names the same tokenizer from any working directory ("byte", or the
// absolute directory of a BPE tokenizer); used to tell whether prepared data still matches.
std::string canonical_tokenizer_spec(const std::string& spec);

}  // namespace atl
