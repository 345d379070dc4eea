// The pre-run invariant gate (resilience/invariant_gate.h) and the phase-boundary fingerprints
// (resilience/phase_guard.h): seeded misconfigurations refused with the odd rank named, in one
// process (compare_run_facts) and across real rank processes (check_run_invariants over Gloo).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "proc.h"
#include "rank_programs.h"
#include "resilience/invariant_gate.h"
#include "resilience/phase_guard.h"

namespace atl::resilience::test {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A clean job of `world` ranks: rank r reads windows [r*100, (r+1)*100).
RunFacts clean(int r, int world) {
  RunFacts f;
  f.config_hash = hash_hex("[train]\nsteps = 10\n");
  f.param_hash = hash_hex("weights");
  f.param_count = 1234;
  f.dtype = "f32";
  f.layout = "world=" + std::to_string(world) + " local=" + std::to_string(world) + " mesh=dp" + std::to_string(world) +
             " strategy=ddp";
  f.data_space = "train windows of files " + hash_hex("files");
  f.shards = {{int64_t(r) * 100, int64_t(r + 1) * 100}};
  f.batches_per_epoch = 50;
  return f;
}

struct Misconfig {
  const char* name;
  const char* expect;  // in the message
  std::function<void(RunFacts&, uint64_t)> apply;
};

// The seeded misconfigurations: each changes one rank's facts (the rank and the value from the seed).
const std::vector<Misconfig>& misconfigs() {
  static const std::vector<Misconfig> m = {
      {"config drift (one key changed)", "config hash",
       [](RunFacts& f, uint64_t s) { f.config_hash = hash_hex("[train]\nsteps = " + std::to_string(11 + s % 7) + "\n"); }},
      {"another init seed", "parameter hash", [](RunFacts& f, uint64_t s) { f.param_hash = hash_hex(std::to_string(s)); }},
      {"another model size", "parameter count", [](RunFacts& f, uint64_t s) { f.param_count += 1 + int64_t(s % 100); }},
      {"bf16 on one rank", "dtype", [](RunFacts& f, uint64_t) { f.dtype = "bf16"; }},
      {"wrong WORLD_SIZE", "world layout",
       [](RunFacts& f, uint64_t s) { f.layout = "world=" + std::to_string(5 + s % 3) + " local=4 mesh=dp4 strategy=ddp"; }},
      {"wrong ranks per node", "world layout", [](RunFacts& f, uint64_t) { f.layout += " local=2"; }},
      {"another strategy", "world layout", [](RunFacts& f, uint64_t) { f.layout += " strategy=zero2"; }},
      {"another data directory", "data index space", [](RunFacts& f, uint64_t s) { f.data_space += "x" + std::to_string(s); }},
      {"a shard that overlaps the previous one", "data shards overlap",
       [](RunFacts& f, uint64_t s) { f.shards[0].first -= 1 + int64_t(s % 50); }},
      {"a duplicated RANK (the same shard twice)", "data shards overlap",
       [](RunFacts& f, uint64_t) { f.shards[0] = {0, 100}; }},
      {"uneven token packing (one batch fewer)", "batch count",
       [](RunFacts& f, uint64_t s) { f.batches_per_epoch -= 1 + int64_t(s % 3); }},
      {"a longer sequence on one rank (fewer batches, another config)", "config hash",
       [](RunFacts& f, uint64_t s) {
         f.config_hash = hash_hex("[train]\nseq_len = 256\n");
         f.batches_per_epoch /= 2;
       }},
  };
  return m;
}

// The rank a case changes: never rank 0 for the overlap cases that copy rank 0's shard.
int odd_rank(size_t k, int world) { return 1 + int(mix(k + 77) % uint64_t(world - 1)); }

}  // namespace

TEST(InvariantGate, CleanFactsPassAndEachSeededMisconfigurationNamesItsRank) {
  const int world = 4;
  std::vector<RunFacts> all;
  for (int r = 0; r < world; ++r) all.push_back(clean(r, world));
  EXPECT_TRUE(compare_run_facts(all).empty());
  for (size_t k = 0; k < misconfigs().size(); ++k) {
    auto& m = misconfigs()[k];
    auto facts = all;
    int odd = odd_rank(k, world);
    m.apply(facts[size_t(odd)], mix(k));
    auto problems = compare_run_facts(facts);
    ASSERT_FALSE(problems.empty()) << m.name;
    std::string joined;
    for (auto& p : problems) joined += p + "\n";
    EXPECT_NE(joined.find(m.expect), std::string::npos) << m.name << ":\n" << joined;
    EXPECT_NE(joined.find("rank " + std::to_string(odd)), std::string::npos) << m.name << ":\n" << joined;
  }
}

// Across real processes (3 ranks over Gloo): each case is refused on every rank, in well under a
// second each, naming the rank; the clean facts pass before and after.
TEST(InvariantGate, RefusesEachSeededMisconfigurationOnEveryRankBeforeStepOne) {
  std::string tag = (std::filesystem::temp_directory_path() / ("atoll_gate_" + std::to_string(::getpid()))).string();
  auto codes = run_ranks(3, "gate", tag, 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    std::string log = read_file(tag + ".log" + std::to_string(r));
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("refused " + std::to_string(misconfigs().size()) + " of " + std::to_string(misconfigs().size())),
              std::string::npos)
        << log;
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
}

// Communicator::abort(): a collective blocked on a peer that never joins fails at once (not after
// its 30 s timeout), and the communicator stays failed.
TEST(CommAbort, AnAllReduceBlockedOnAPeerFailsAtOnceWhenAborted) {
  std::string tag = (std::filesystem::temp_directory_path() / ("atoll_abort_" + std::to_string(::getpid()))).string();
  auto codes = run_ranks(2, "abort", tag, 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    std::string log = read_file(tag + ".log" + std::to_string(r));
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << log;
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
}

// The step-zero hazard: rank 0 runs an evaluation the other rank skips. Without the fingerprints
// the evaluation's collective would meet the next step's and hang for the communicator timeout
// (30 s here); with them both ranks fail within seconds, naming where each is.
TEST(PhaseGuard, AnEvaluationOnlyOneRankRunsIsCaughtNotHung) {
  std::string tag = (std::filesystem::temp_directory_path() / ("atoll_phase_" + std::to_string(::getpid()))).string();
  auto t0 = std::chrono::steady_clock::now();
  auto codes = run_ranks(2, "phase", tag, 60);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (size_t r = 0; r < codes.size(); ++r) {
    std::string log = read_file(tag + ".log" + std::to_string(r));
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << log;
    EXPECT_NE(log.find("caught: collective desync"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 0 at 'eval' of step 5"), std::string::npos) << log;
    EXPECT_NE(log.find("rank 1 at 'step' of step 6"), std::string::npos) << log;
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
  EXPECT_LT(s, 20.0);
}

int rank_program_main(const std::string& name) {
  if (name == "signatures") return signatures_rank_program();
  if (name == "replay") return replay_rank_program();
  if (name == "campaign") return campaign_rank_program();
  if (name == "watch") return watch_rank_program();
  if (name == "pgc") return pgc_rank_program();
  try {
    auto comm = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
    const int r = comm->rank(), world = comm->size();
    if (name == "abort") {
      if (r == 1) {  // never joins the all-reduce; leaves only after rank 0 must have given up
        std::this_thread::sleep_for(std::chrono::milliseconds(3000));
        return 0;
      }
      Tensor x = Tensor::zeros({1000}, DType::f32);
      auto t0 = std::chrono::steady_clock::now();
      auto w = comm->all_reduce_async(x);
      std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        comm->abort("the test says so");
      });
      std::string what;
      try {
        w->wait();
      } catch (const Error& e) {
        what = e.what();
      }
      killer.join();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      // The worker thread has left the Gloo call too: an operation queued behind it completes.
      bool later_failed = false;
      try {
        comm->barrier();
      } catch (const Error&) {
        later_failed = true;
      }
      std::printf("abort: '%s' after %.0f ms; later op failed: %d\n", what.c_str(), ms, int(later_failed));
      return what.find("aborted: the test says so") != std::string::npos && ms < 1500 && later_failed ? 0 : 1;
    }
    if (name == "gate") {
      check_run_invariants(*comm, clean(r, world));  // a clean launch passes
      size_t refused = 0;
      for (size_t k = 0; k < misconfigs().size(); ++k) {
        RunFacts f = clean(r, world);
        int odd = odd_rank(k, world);
        if (r == odd) misconfigs()[k].apply(f, mix(k));
        auto t0 = std::chrono::steady_clock::now();
        try {
          check_run_invariants(*comm, f);
          std::printf("case %zu (%s): NOT refused\n", k, misconfigs()[k].name);
        } catch (const Error& e) {
          double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          std::string w = e.what();
          bool ok = w.find(misconfigs()[k].expect) != std::string::npos &&
                    w.find("rank " + std::to_string(odd)) != std::string::npos && ms < 5000;
          refused += ok;
          std::printf("case %zu (%s): refused in %.1f ms%s\n%s\n", k, misconfigs()[k].name, ms,
                      ok ? "" : " WITHOUT NAMING IT", w.c_str());
        }
      }
      check_run_invariants(*comm, clean(r, world));
      std::printf("refused %zu of %zu\n", refused, misconfigs().size());
      return refused == misconfigs().size() ? 0 : 1;
    }
    if (name == "phase") {
      check_phase(*comm, "step", 5);  // agreeing ranks pass
      try {
        if (r == 0) {
          check_phase(*comm, "eval", 5);  // only rank 0 evaluates after step 5 ...
          Tensor x = Tensor::zeros({4}, DType::f32);
          comm->all_reduce(x);
        } else {
          check_phase(*comm, "step", 6);  // ... rank 1 goes on to step 6
          Tensor g = Tensor::zeros({1000}, DType::f32);
          comm->all_reduce(g);
        }
        std::printf("not caught\n");
        return 1;
      } catch (const Error& e) {
        std::printf("caught: %s\n", e.what());
        return 0;
      }
    }
    std::fprintf(stderr, "unknown rank program %s\n", name.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}

std::vector<int> run_ranks(int world, const std::string& name, const std::string& tag, double timeout_s,
                           const std::vector<std::string>& env) {
  int port = comm::pick_free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> e = env;
    for (auto& x : std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world), "LOCAL_RANK=" + std::to_string(r),
                          "LOCAL_WORLD_SIZE=" + std::to_string(world), "MASTER_ADDR=127.0.0.1",
                          "MASTER_PORT=" + std::to_string(port), "OMP_NUM_THREADS=1"})
      e.push_back(x);
    pids.push_back(spawn({self_exe(), "--rank-program", name}, e, tag + ".log" + std::to_string(r)));
  }
  std::vector<int> codes;
  for (pid_t p : pids) codes.push_back(wait_for(p, timeout_s));
  return codes;
}

}  // namespace atl::resilience::test
