// The training data loader: batches of (inputs, targets = inputs shifted by one token) drawn from
// llm.c token shards (shards.h), deterministic for a seed, disjoint across data-parallel ranks and
// resumable at the exact batch.
//
// Sampling: the shards of a split are cut into windows of T+1 tokens at offsets 0, T, 2T, ... (so
// every token is a target exactly once per epoch). Each epoch visits the windows in a permutation
// drawn from (seed, epoch); rank r of W takes permutation positions r, r+W, r+2W, ..., and the
// epoch ends for everyone after floor(windows / W) rows each, so ranks stay in lockstep. A batch is
// B consecutive rows of the rank's sequence, continuing into the next epoch when one runs out.
// The validation split is read in shard order without shuffling.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/shards.h"

namespace atl {

struct DataLoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;     // rows of this rank already consumed in the epoch
  uint64_t num_windows = 0;  // checked on restore: the data must be the same
  uint64_t seed = 0;
  int rank = 0, world_size = 1;

  nlohmann::json to_json() const;
  static DataLoaderState from_json(const nlohmann::json& j);
};

class DataLoader {
 public:
  // pattern_or_dir: a directory from `atoll data prepare` (its <split>_*.bin shards are used) or
  // a glob such as "data/train_*.bin" (taken as is; split then only selects shuffling).
  DataLoader(const std::string& pattern_or_dir, const std::string& split, int B, int T,
             int rank = 0, int world_size = 1, uint64_t seed = 1337);

  // Fills inputs[B*T] and targets[B*T] (row-major [B][T]).
  void next_batch(int32_t* inputs, int32_t* targets);
  void reset();  // back to the first batch of epoch 0 (for validation passes)
  // Finite data that runs out unevenly (the trainer's Join, [data] epochs): rank r takes every slot
  // of its residue class, ceil((windows - r) / W) rows an epoch instead of the lockstep
  // floor(windows / W), so ranks run out at different batches.
  void set_uneven(bool on);
  // Whole batches left before the end of epoch `epochs` - 1.
  uint64_t batches_left(uint64_t epochs) const;

  DataLoaderState state() const;
  void set_state(const DataLoaderState& s);

  // Fails if any token in the data is >= vocab (a model too small for the tokenizer used to
  // prepare the data), and makes next_batch check every batch against vocab from now on.
  void validate_vocab(int32_t vocab);

  uint64_t num_tokens() const { return total_tokens_; }
  uint64_t num_windows() const { return window_start_.back(); }
  uint64_t rows_per_epoch() const { return rows_per_epoch_; }  // per rank
  uint64_t batches_per_epoch() const { return rows_per_epoch_ / uint64_t(B_); }
  uint64_t epoch() const { return epoch_; }
  int B() const { return B_; }
  int T() const { return T_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void start_epoch(uint64_t e);
  void read_window(uint64_t w, int32_t* in, int32_t* tgt) const;

  std::vector<std::string> files_;
  std::vector<ShardReader> shards_;
  std::vector<uint64_t> window_start_;  // prefix sums of windows per shard (size shards+1)
  uint64_t total_tokens_ = 0;
  int B_, T_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  uint64_t rows_per_epoch_ = 0;
  uint64_t epoch_ = 0, position_ = 0;
  std::vector<uint32_t> perm_;  // this epoch's window order (empty: identity)
  int32_t vocab_limit_ = -1;
};

}  // namespace atl
