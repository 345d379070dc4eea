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
#include <string>
#include <vector>

#include "nn/model.h"
#include "nn/sampling.h"

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
  double seconds = 0, first_token_s = -1;  // first newly sampled token after start
};

class RolloutWorker {
 public:
  // The model must be an nn::PolicyModel; sampling.seed seeds every request's stream.
  RolloutWorker(const nn::Model& model, nn::SamplingConfig s, int64_t max_new_tokens);
  // Runs every request not finished in the journal at `path` (appending to it), resuming those
  // with a logged prefix. die_after > 0: raise SIGKILL on this process after sampling that many
  // new tokens (fault injection for the tests and the benchmark).
  WorkerStats run(const std::vector<RolloutRequest>& reqs, const std::string& path, int64_t die_after = 0) const;

 private:
  const nn::Model& m_;
  nn::SamplingConfig s_;
  int64_t max_new_;
};

}  // namespace atl::rl
