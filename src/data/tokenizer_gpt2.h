// Byte-level BPE in OpenAI's GPT-2 format (Radford et al. 2019; BPE: Sennrich et al. 2016,
// "Neural Machine Translation of Rare Words with Subword Units").
//
// Files: encoder.json maps each token, spelled through GPT-2's byte-to-unicode table (every byte
// becomes a printable character, e.g. space -> "Ġ"), to its id; vocab.bpe holds one merge
// "left right" per line after a "#version" line, ranked by line order. "<|endoftext|>" is the
// end-of-text id (50256 in GPT-2's own files). Encoding pre-tokenizes the text (bpe_pretokenize.h)
// and, within each word, repeatedly merges the adjacent pair of lowest rank.
#pragma once
#include <array>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace atl {

// GPT-2's byte -> code point table and the UTF-8 spelling of raw bytes through it.
const std::array<uint32_t, 256>& gpt2_byte_to_unicode();
std::string gpt2_spell(std::string_view raw_bytes);
// Inverse of gpt2_spell; fails naming the token when a character is outside the table.
std::string gpt2_unspell(std::string_view spelled);

// A BPE vocabulary in memory: the raw bytes of every id (empty for unused ids and for eot), and
// the merges by rank as pairs of ids.
struct BpeVocab {
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> merges;
  int32_t eot = -1;
};

// Reads encoder.json + vocab.bpe; dir_or_file is their directory or the path of either file.
BpeVocab read_gpt2_bpe(const std::string& dir_or_file);
// The same from the two files' contents (enc_name and bpe_name name them in errors): the one parser
// of tokenizer files, which the fuzz target drives.
BpeVocab parse_gpt2_bpe(std::string_view encoder_json, std::string_view vocab_bpe,
                        const std::string& enc_name, const std::string& bpe_name);
// Writes dir/encoder.json and dir/vocab.bpe (creating dir).
void write_gpt2_bpe(const BpeVocab& v, const std::string& dir);

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  explicit Gpt2BpeTokenizer(BpeVocab v, std::string name = "bpe");
  static std::unique_ptr<Gpt2BpeTokenizer> load(const std::string& dir_or_file);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return int32_t(vocab_.tokens.size()); }
  int32_t eot() const override { return vocab_.eot; }
  std::string name() const override { return name_; }

  // BPE of one pre-token, appended to out.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  const BpeVocab& vocab() const { return vocab_; }

 private:
  BpeVocab vocab_;
  std::string name_;
  std::array<int32_t, 256> byte_id_{};
  // (left << 32 | right) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_;
  // Words repeat heavily in text, so their encodings are memoized: bounded, and split into
  // independently locked shards so that threads encoding in parallel rarely wait on each other.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> map;
  };
  static constexpr size_t kCacheShards = 64;
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace atl
