// Rollouts that survive a dead worker, after Belayer (fault tolerance for agentic RL): a rollout
// worker appends every token it samples to a journal (one line per token, flushed, so a worker
// killed mid-trajectory leaves its prefixes in the file); a pre-started shadow worker, its weights
// already loaded, reads the journal, skips finished requests, rebuilds each unfinished request's
// KV cache from its logged prefix and continues it.
//
// Token-identical recovery: each request decodes alone (one cache row, B = 1), so its logits
// depend only on its own tokens, never on which other requests share a batch; the shadow replays
// the prefix through the same calls (the prompt as one prefill, then one token per step) and
// re-samples each logged token from the request's own stream Rng(seed, id) — which also
// verifies it — so the cache, the logits and the sampler's state at the takeover point are
// bitwise the dead worker's, and the continuation is the uninterrupted run's.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nn/model.h"
#include "nn/kv_cache.h"
#include "nn/sampling.h"
#include "tensor/rng.h"

namespace atl::rl {

struct RolloutRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
};

// What a journal says about each request: its tokens so far and whether it finished.
struct JournalState {
  struct Entry {
    std::vector<int32_t> tokens;
    bool done = false, stopped = false;
  };
  std::map<int64_t, Entry> requests;
  int64_t torn_lines = 0;  // a last line cut by the kill, ignored
  static JournalState read(const std::string& path);
};

struct WorkerStats {
  int64_t resumed = 0, skipped = 0, fresh = 0;  // requests continued, already done, started anew
  int64_t replayed_tokens = 0, sampled_tokens = 0;
  int64_t followed_tokens = 0;  // of the replayed prefix, tokens a JournalFollower had already replayed
  double seconds = 0, first_token_s = -1;  // first newly sampled token after start
  // Up to the first newly sampled token: reading the journal, prompts' prefills, replaying the prefix.
  double journal_s = 0, prefill_s = 0, replay_s = 0;
};

// One request's decoding between calls: its KV cache, its sampling stream and the logits of its
// next token. step: tokens sampled so far (each fed back, but the last of max_new).
struct DecodeState {
  int64_t id = -1;
  nn::KVCache cache;
  Rng rng;
  Tensor logits;
  int64_t step = 0;
};

class JournalFollower;

class RolloutWorker {
 public:
  // The model must be an nn::PolicyModel; sampling.seed seeds every request's stream.
  RolloutWorker(const nn::Model& model, nn::SamplingConfig s, int64_t max_new_tokens);
  // Runs every request not finished in the journal at `path` (appending to it), resuming those
  // with a logged prefix. die_after > 0: raise SIGKILL on this process after sampling that many
  // new tokens (fault injection for the tests and the benchmark).
  // follow: a shadow's follower of this journal; the request it has followed continues from its state
  // (only the tokens logged since its last poll are replayed).
  WorkerStats run(const std::vector<RolloutRequest>& reqs, const std::string& path, int64_t die_after = 0,
                  JournalFollower* follow = nullptr) const;
  // rl.journal_batched: the batch decoded together as nn::PolicyModel::generate_batch does (one
  // prefill of every prompt, then one [B,1] step of the unfinished rows, row b sampling from
  // Rng(seed, b)), every token journaled: the batch is bitwise the unjournaled one. The lines it
  // writes are a fixed sequence, so a continuation recomputes the batch from the prompts, checks
  // each line the journal already holds against its recomputation and appends the rest (the
  // journal ends byte-equal to an uninterrupted run's). No KV cache is rebuilt per request: the
  // batch's composition decides its logits, so the whole batch is recomputed up to the death.
  WorkerStats run_batched(const std::vector<RolloutRequest>& reqs, const std::string& path,
                          int64_t die_after = 0) const;
  // The calls every decoding makes, worker and follower alike (so their states stay bitwise equal):
  // the prompt as one prefill, then one sample and one fed-back token per step.
  DecodeState start(const RolloutRequest& r) const;
  int32_t sample(DecodeState& d) const;
  void feed(DecodeState& d, int32_t token) const;
  int64_t max_new_tokens() const { return max_new_; }

 private:
  const nn::Model& m_;
  nn::SamplingConfig s_;
  int64_t max_new_;
};

// Belayer's hot standby: a shadow that follows a live worker's journal, replaying each token as it is
// logged through the worker's own calls (so its KV cache and stream stay bitwise the worker's), so
// that when the worker dies only the tokens logged since the last poll() are left to replay. Each
// replayed token is re-sampled and checked against the log. Only the request in progress is held.
class JournalFollower {
 public:
  JournalFollower(const RolloutWorker& w, std::vector<RolloutRequest> reqs, std::string path);
  // Replays the complete lines appended since the last call; returns the tokens replayed.
  int64_t poll();
  const std::string& path() const { return path_; }

 private:
  friend class RolloutWorker;
  const RolloutWorker& w_;
  std::map<int64_t, RolloutRequest> reqs_;
  std::string path_;
  int64_t offset_ = 0;              // bytes of the journal consumed (complete lines only)
  std::optional<DecodeState> live_;  // the request in progress, replayed to its last logged token
  std::vector<int32_t> tokens_;      // its logged tokens
};

}  // namespace atl::rl
