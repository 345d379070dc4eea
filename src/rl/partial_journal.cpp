// Partial rollouts through Belayer's journal (rl.partial_tokens > 0 with rl.journal_dir): each round
// of a step is journaled as a batch (RolloutWorker::run_batched: generate_batch's own calls, so the
// tokens equal the unjournaled rounds' bit for bit), one file per round, each rollout under its run-
// long id uid * group_size + k. A carried rollout's lines therefore span the rounds of several steps
// and concatenate to its completion.
//
// What a process holding partial rollouts loses when it dies is its pool: the groups carried from
// earlier steps. So after each step the pool carried into the next one is written beside the
// journals (atomically, before the batch is sent): any step a trainer can still wait for has its
// starting pool on disk. A shadow taking over the stream loads it and re-runs the step over the dead
// process's round journals (every logged line recomputed and checked, the rest appended), so its
// batch, and every later one of the stream, is the no-fault run's token for token.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/log.h"
#include "rl/rl_engine.h"

namespace atl::rl {
namespace fs = std::filesystem;
namespace {

uint64_t mix3(uint64_t a, uint64_t b, uint64_t c) {  // as rl_engine.cpp's journal key
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^ c * 0x94D049BB133111EBull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

std::vector<Tensor> values_of(const nn::Model& m) {
  std::vector<Tensor> v;
  for (nn::Parameter* p : const_cast<nn::Model&>(m).parameters()) v.push_back(p->value);
  return v;
}

}  // namespace

std::string RlEngine::pool_path(int seed_rank, int64_t step) const {
  return (fs::path(c_.journal_dir) / fmt::format("rollouts_r{}_s{}_pool", seed_rank, step)).string();
}

void RlEngine::write_pool(int seed_rank, int64_t step) {
  const std::vector<int32_t> w = pool_for(seed_rank).save();
  const std::string path = pool_path(seed_rank, step), tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(w.data()), std::streamsize(w.size() * 4));
    ATOLL_CHECK(f.good(), "rl: cannot write the carried pool {}", tmp);
  }
  fs::rename(tmp, path);  // a reader sees the whole pool or none
}

void RlEngine::adopt_pool(int seed_rank, int64_t step) {
  const std::string path = pool_path(seed_rank, step);
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    // Step 0 starts with no carried group; any later step's pool was written before the previous
    // batch left, so its absence means the journal directory is not this run's.
    ATOLL_CHECK(step == 0, "rl: the shadow takes over stream {} at RL step {} but its carried pool {} is missing (was "
                           "rl.journal_dir cleared?)",
                seed_rank, step, path);
    return;
  }
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ATOLL_CHECK(bytes.size() % 4 == 0, "rl: the carried pool {} is cut ({} bytes)", path, bytes.size());
  std::vector<int32_t> w(bytes.size() / 4);
  std::memcpy(w.data(), bytes.data(), bytes.size());
  pool_for(seed_rank).load(w, path);
}

void RlEngine::take_resume_pools(const PushHeader& h) {
  const std::vector<int> mine = channel_->served();
  for (auto& [t, words] : decode_pools(h.pools)) {
    if (std::find(mine.begin(), mine.end(), t) == mine.end()) continue;  // another rank's, or the shadow
    pool_for(t).load(words, fmt::format("the resumed pool of trainer {}", t));
    if (!c_.journal_dir.empty()) {
      fs::create_directories(c_.journal_dir);
      write_pool(t, h.rl_step);
    }
  }
}

RolloutBatch RlEngine::journaled_partial(const nn::Model& gen, PartialRollouts& pool, int64_t step, int seed_rank,
                                         int64_t version, Rng& draw, uint64_t seed) {
  fs::create_directories(c_.journal_dir);
  if (step > 0) {  // the previous step's rounds and pool: its batch left before this step started
    const std::string prev = fmt::format("rollouts_r{}_s{}_", seed_rank, step - 1);
    for (const auto& e : fs::directory_iterator(c_.journal_dir))
      if (e.path().filename().string().rfind(prev, 0) == 0) fs::remove(e.path());
  }
  const uint64_t key = weights_hash(values_of(gen)) ^ mix3(seed, uint64_t(version), 7);
  const std::string base = fmt::format("rollouts_r{}_s{}_v{}_{:016x}_partial", seed_rank, step, version, key);
  WorkerStats total;
  const auto t0 = std::chrono::steady_clock::now();
  auto round_gen = [&](const std::vector<std::vector<int32_t>>& rows, const std::vector<int64_t>& ids,
                       const nn::SamplingConfig& s, int64_t round) {
    std::vector<RolloutRequest> reqs;
    for (size_t r = 0; r < rows.size(); ++r) reqs.push_back({ids[r], rows[r]});
    const std::string path = (fs::path(c_.journal_dir) / fmt::format("{}_p{}.journal", base, round)).string();
    RolloutWorker w(gen, s, c_.partial_tokens);
    const int64_t die = journal_die_after > 0 ? journal_die_after - journal_sampled_ : 0;
    const double before = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const WorkerStats st = w.run_batched(reqs, path, die);
    if (total.first_token_s < 0 && st.first_token_s >= 0) total.first_token_s = before + st.first_token_s;
    journal_sampled_ += st.sampled_tokens;
    total.fresh += st.fresh;
    total.resumed += st.resumed;
    total.skipped += st.skipped;
    total.replayed_tokens += st.replayed_tokens;
    total.sampled_tokens += st.sampled_tokens;
    total.seconds += st.seconds;
    const JournalState js = JournalState::read(path);
    std::vector<nn::PolicyModel::Completion> comps(rows.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      auto it = js.requests.find(ids[r]);
      ATOLL_CHECK(it != js.requests.end() && it->second.done, "rl: rollout journal {}: rollout {} did not finish its "
                                                              "round", path, ids[r]);
      comps[r].tokens = it->second.tokens;
      comps[r].stopped = it->second.stopped;
    }
    return comps;
  };
  RolloutBatch b = pool.step(gen, version, draw, seed, round_gen);
  journal_stats_ = total;
  if (total.resumed + total.skipped > 0)
    log::warn("rl: partial rollouts of stream {} at RL step {}: continued over a journal ({} rollout rounds already "
              "done, {} continued, {} tokens replayed)",
              seed_rank, step, total.skipped, total.resumed, total.replayed_tokens);
  write_pool(seed_rank, step + 1);  // what the next step continues, before this batch leaves
  return b;
}

}  // namespace atl::rl
