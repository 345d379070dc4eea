// A variable-length corpus (issue 12, item 5: the data Data-Centric Parallel trains on; seed:
// "Training Variable Long Sequences with Data-Centric Parallel"). Documents are not cut to a fixed
// window: each global batch is a run of whole documents of a shuffled epoch, taken until they hold
// at least `batch_tokens` targets, so one batch may be a hundred short documents and the next one
// long document. Where the lengths come from:
//   - "corpus": the documents of the prepared shards as they are (`atoll data prepare` writes
//     each one after an end-of-text id; fortunes run from a line to pages); a document longer
//     than max_len targets is cut into pieces of max_len (the model's longest row).
//   - "pareto": lengths drawn from a Pareto law (min_len, alpha; capped at max_len), each filled
//     with a consecutive slice of the shards' tokens: real text with a tail as long as wanted.
// Batch k is a function of (seed, k) only, whatever the number of ranks reading it, so a job of
// any layout trains on the same global batches in the same order, and a resumed run needs only
// its step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct VarlenOptions {
  int64_t batch_tokens = 4096;  // targets per global batch (at least; whole documents)
  int64_t max_len = 1024;       // targets of the longest document (longer ones are cut)
  std::string lengths = "corpus";  // "corpus" | "pareto"
  double alpha = 1.2;           // Pareto tail index ("pareto"): smaller is a longer tail
  int64_t min_len = 16;         // Pareto scale: the shortest document ("pareto")
  uint64_t seed = 1337;
};

// One document: tokens[0, n-1) are its inputs, tokens[1, n) its targets (n - 1 of each).
struct VarlenDocument {
  std::vector<int32_t> tokens;
  int64_t targets() const { return int64_t(tokens.size()) - 1; }
};

class VarlenCorpus {
 public:
  // The token stream of the prepared `split` shards in dir, documents split at `eot`.
  static VarlenCorpus from_shards(const std::string& dir, const std::string& split, int32_t eot,
                                  const VarlenOptions& opt);
  // The same from a token stream in memory (tests, synthetic corpora).
  VarlenCorpus(std::vector<int32_t> stream, int32_t eot, const VarlenOptions& opt);

  // Global batch k (0-based; epochs follow each other, each with its own document order).
  std::vector<VarlenDocument> batch(int64_t k);
  int64_t num_documents() const { return int64_t(spans_.size()); }
  // Batches of the epoch last read (epoch 0 before any read): each epoch's order groups
  // documents differently, so epochs differ slightly.
  int64_t batches_per_epoch() const { return int64_t(epoch_batches_.size()) - 1; }
  const VarlenOptions& options() const { return opt_; }
  // The documents' target counts, in corpus order (for statistics and the benchmark's report).
  std::vector<int64_t> lengths() const;
  int32_t max_token() const;

 private:
  void start_epoch(int64_t e);
  std::vector<int32_t> stream_;
  VarlenOptions opt_;
  std::vector<std::pair<int64_t, int64_t>> spans_;  // [begin, end) of each document in stream_
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;          // this epoch's document order
  std::vector<int64_t> epoch_batches_;  // positions in order_ where each batch starts (+ the end)
  std::vector<int64_t> epoch_counts_;   // batches of each epoch seen so far
};

}  // namespace atl
