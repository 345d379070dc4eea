// Training a byte-level BPE vocabulary on a corpus (Sennrich et al. 2016, "Neural Machine
// Translation of Rare Words with Subword Units"; byte-level variant of GPT-2, Radford et al. 2019).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/tokenizer_gpt2.h"

namespace atl {

struct BpeTrainOptions {
  int32_t vocab_size = 4096;   // including the 256 bytes and <|endoftext|>
  int64_t min_pair_count = 2;  // stop early when no pair occurs this often
};

// Learns merges over the GPT-2 pre-tokens of the documents. Ids: the 256 bytes in GPT-2's order
// (so they agree with GPT-2's own first 256 ids), then one id per merge, then <|endoftext|> last.
// Deterministic: ties between equally frequent pairs go to the smaller (left id, right id).
BpeVocab train_bpe(const std::vector<std::string>& documents, const BpeTrainOptions& opt);

}  // namespace atl
