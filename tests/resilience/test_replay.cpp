// SCOUT's in-situ replay and clean-replay certificates (resilience/scout_replay.h) over real Gloo
// ranks training the toy model data-parallel, every step audited by cross-replay:
//  - a bit flipped in one rank's gradient share BEFORE the all-reduce (every rank then averages
//    the same bad gradient, so the signatures see nothing) is named by the replay, exactly that
//    rank; with 2 ranks it is inconclusive, never a wrong rank;
//  - a rank slow during a step is confirmed as a straggler (its share is fast elsewhere), while a
//    share slow wherever it is computed is named as slow data and no rank is blamed;
//  - the checkpoints after the corruption carry a tainted certificate, and recovery resumes from
//    the last clean one (plain resume selection would take the newest, corrupted, one).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "comm/communicator.h"
#include "ft_toy.h"
#include "proc.h"
#include "rank_programs.h"
#include "resilience/checkpoint.h"
#include "resilience/scout_replay.h"
#include "resilience/step_signature.h"

namespace atl::resilience::test {
namespace {

constexpr int kStragglerStep = 4, kSdcStep = 8, kSlowShareStep = 12, kSteps = 20, kCkptEvery = 5;

struct Line {
  int64_t step;
  std::string sdc, stragglers, slow, inconclusive, signature;
};

std::string tag_for(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("atoll_replay_" + name + std::to_string(::getpid()))).string();
}

// Runs the rank program; returns rank 0's log.
std::string run(int world, int steps, bool inject, const std::string& name) {
  std::string tag = tag_for(name);
  std::filesystem::remove_all(tag + ".ckpt");
  auto codes = run_ranks(world, "replay", tag, 120,
                         {"ATOLL_REPLAY_STEPS=" + std::to_string(steps), "ATOLL_REPLAY_INJECT=" + std::to_string(inject),
                          "ATOLL_REPLAY_CKPT=" + tag + ".ckpt"});
  std::string log0 = read_file(tag + ".log0");
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
  return log0;
}

std::vector<Line> parse(const std::string& log) {
  std::vector<Line> v;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string k;
    l >> k;
    if (k != "audit") continue;
    Line x;
    l >> x.step >> x.sdc >> x.stragglers >> x.slow >> x.inconclusive >> x.signature;
    v.push_back(x);
  }
  return v;
}

std::string value_of(const std::string& log, const std::string& key) {
  auto p = log.find(key + " ");
  if (p == std::string::npos) return "";
  auto e = log.find('\n', p);
  return log.substr(p + key.size() + 1, e - p - key.size() - 1);
}

}  // namespace

TEST(ScoutReplay, FourRanksNameAPreAllReduceCorruptionAStragglerAndASlowShareExactly) {
  std::string log = run(4, kSteps, true, "four");
  auto v = parse(log);
  ASSERT_EQ(v.size(), size_t(kSteps)) << log;
  for (auto& x : v) {
    // Lists are "-" when empty, else comma-separated ranks (or shares).
    EXPECT_EQ(x.sdc, x.step == kSdcStep ? "2" : "-") << "step " << x.step << "\n" << log;
    EXPECT_EQ(x.stragglers, x.step == kStragglerStep ? "1" : "-") << "step " << x.step << "\n" << log;
    EXPECT_EQ(x.slow, x.step == kSlowShareStep ? "3" : "-") << "step " << x.step << "\n" << log;
    EXPECT_EQ(x.inconclusive, "-") << "step " << x.step;
    // What the replay adds: the corruption entered before the all-reduce, so every replica holds
    // the same (bad) gradient and the signatures call the step clean.
    if (x.step == kSdcStep) {
      EXPECT_EQ(x.signature, "clean") << log;
    }
  }
  // Checkpoints at 5, 10, 15, 20; the corruption at step 8 taints 10 and everything after it.
  EXPECT_EQ(value_of(log, "resume-plain"), "20") << log;
  EXPECT_EQ(value_of(log, "resume-certified"), "5") << log;
  EXPECT_NE(log.find("step_00000010: its replay certificate is not clean: step 8"), std::string::npos) << log;
  EXPECT_NE(log.find("step_00000020: its replay certificate is not clean: descends from"), std::string::npos) << log;
  std::filesystem::remove_all(tag_for("four") + ".ckpt");
}

TEST(ScoutReplay, TwoRanksAreInconclusiveOnCorruptionNeverAWrongRank) {
  std::string log = run(2, kSteps, true, "two");
  auto v = parse(log);
  ASSERT_EQ(v.size(), size_t(kSteps)) << log;
  for (auto& x : v) {
    EXPECT_EQ(x.sdc, "-") << "step " << x.step << ": a rank was blamed without a majority\n" << log;
    EXPECT_EQ(x.inconclusive, x.step == kSdcStep ? "0,1" : "-") << "step " << x.step << "\n" << log;
    // Timing needs no vote: rank 1's share is fast on rank 0, so rank 1 itself is slow.
    EXPECT_EQ(x.stragglers, x.step == kStragglerStep ? "1" : "-") << "step " << x.step << "\n" << log;
  }
  EXPECT_EQ(value_of(log, "resume-certified"), "5") << log;
  std::filesystem::remove_all(tag_for("two") + ".ckpt");
}

TEST(ScoutReplay, ACleanRunOf100StepsFindsNothingAndEveryCheckpointIsCertified) {
  std::string log = run(4, 100, false, "clean");
  auto v = parse(log);
  ASSERT_EQ(v.size(), size_t(100)) << log;
  int bad = 0;
  for (auto& x : v)
    if (x.sdc != "-" || x.stragglers != "-" || x.slow != "-" || x.inconclusive != "-") {
      ADD_FAILURE() << "step " << x.step << ": " << x.sdc << " " << x.stragglers << " " << x.slow << " " << x.inconclusive;
      if (++bad > 5) break;
    }
  EXPECT_EQ(value_of(log, "resume-certified"), "100") << log;
  std::filesystem::remove_all(tag_for("clean") + ".ckpt");
}

TEST(ScoutReplay, JudgeNeedsAStrictMajorityPerShare) {
  // rows: [own hash, own ms, witnesses, (share, hash, ms) x 2]; 3 ranks, rank r replays r-1, r-2.
  auto row = [](uint64_t own, int r, uint64_t h1, uint64_t h2) {
    auto b = [](double d) {
      int64_t x;
      std::memcpy(&x, &d, 8);
      return x;
    };
    return std::vector<int64_t>{int64_t(own), b(10), 2, (r + 2) % 3, int64_t(h1), b(10), (r + 1) % 3, int64_t(h2), b(10)};
  };
  // Share hashes are 100 + share; rank 1 gets everything it computes wrong (+7).
  auto clean = judge_replays({row(100, 0, 102, 101), row(101, 1, 100, 102), row(102, 2, 101, 100)}, 2);
  EXPECT_TRUE(clean.clean()) << clean.message;
  auto bad = judge_replays({row(100, 0, 102, 101), row(108, 1, 107, 109), row(102, 2, 101, 100)}, 2);
  EXPECT_EQ(bad.sdc, std::vector<int>{1}) << bad.message;
  EXPECT_TRUE(bad.inconclusive.empty()) << bad.message;
}

// The rank program: toy data parallelism; each step's shares are cross-replayed (two witnesses)
// before the update, and the signatures exchanged after the all-reduce. Injections (rank 2, or the
// last rank on 2 ranks): at kSdcStep one bit of every gradient share that rank computes flips;
// at kStragglerStep rank 1 is slow in everything it computes; at kSlowShareStep the last share is
// slow wherever it is computed. Rank 0 keeps checkpoints with certificates every kCkptEvery steps.
int replay_rank_program() {
  try {
    auto comm = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
    const int r = comm->rank(), n = comm->size();
    const int steps = std::atoi(std::getenv("ATOLL_REPLAY_STEPS"));
    const bool inject = std::atoi(std::getenv("ATOLL_REPLAY_INJECT")) != 0;
    const std::string ckdir = std::getenv("ATOLL_REPLAY_CKPT");
    const int sdc_rank = n > 2 ? 2 : n - 1;
    ToyModel m;
    CertificateChain chain;
    CheckpointStore store(ckdir, 100);
    uint64_t collectives = 0;
    for (int s = 1; s <= steps; ++s) {
      // A share of the step, computed on this rank with this rank's (possibly faulty) hardware.
      auto compute = [&](int share) {
        auto t0 = std::chrono::steady_clock::now();
        std::vector<float> g = m.grad(s, share * kG / n, (share + 1) * kG / n);
        if (inject && s == kStragglerStep && r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(700));
        if (inject && s == kSlowShareStep && share == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(700));
        if (inject && s == kSdcStep && r == sdc_rank) {
          uint32_t b;
          std::memcpy(&b, &g[3], 4);
          b ^= 1u << 12;
          std::memcpy(&g[3], &b, 4);
        }
        ShareRun run{buffer_hash(g.data(), g.size() * 4),
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()};
        return std::make_pair(g, run);
      };
      StepSignature sig;
      sig.step = s;
      sig.param_hash = m.hash();
      auto [g, own] = compute(r);
      sig.compute_ms = own.ms;
      // The replay needs the state the step started from: m is unchanged until apply below.
      ReplayFinding f = cross_replay(*comm, own, [&](int share) { return compute(share).second; });
      ++collectives;
      chain.audited(s, f);
      Tensor gt = Tensor::empty({kDim}, DType::f32);
      std::memcpy(gt.raw(), g.data(), kDim * 4);
      comm->all_reduce(gt);
      ++collectives;
      std::memcpy(g.data(), gt.raw(), kDim * 4);
      sig.grad_hash = buffer_hash(g.data(), g.size() * 4);
      sig.fingerprint = collectives * 1000003 + kDim;
      Consensus c = find_outliers(exchange_signatures(*comm, sig), ConsensusOptions{1e9, 1e9});  // values only
      ++collectives;
      m.apply(g);
      auto csv = [](const std::vector<int>& v) {
        std::string x;
        for (int i : v) x += (x.empty() ? "" : ",") + std::to_string(i);
        return x.empty() ? std::string("-") : x;
      };
      if (r == 0) {
        std::printf("audit %d %s %s %s %s %s\n", s, csv(f.sdc).c_str(), csv(f.stragglers).c_str(),
                    csv(f.slow_shares).c_str(), csv(f.inconclusive).c_str(),
                    c.verdict == Consensus::clean ? "clean" : "flagged");
        if (!f.clean() || !f.slow_shares.empty()) std::printf("  %s\n", f.message.c_str());
      }
      if (s % kCkptEvery == 0) {
        ReplayCertificate cert = chain.certify(s);
        if (r == 0) {
          Checkpoint ck;
          Tensor w = Tensor::empty({kDim}, DType::f32);
          std::memcpy(w.raw(), m.w.data(), kDim * 4);
          ck.model = {{"w", w}};
          ck.state = {{"step", s}, {"sample_rng", nlohmann::json::array()}, {"train_data", nlohmann::json::object()},
                      {"replay_certificate", cert.to_json()}};
          store.save(s, ck);
        }
      }
    }
    comm->barrier();
    if (r == 0) {
      auto plain = choose_resume_checkpoint(ckdir);
      auto cert = choose_certified_checkpoint(ckdir);
      std::printf("resume-plain %lld\n", plain.chosen ? static_cast<long long>(plain.chosen->step) : -1LL);
      std::printf("resume-certified %lld\n", cert.chosen ? static_cast<long long>(cert.chosen->step) : -1LL);
      for (auto& why : cert.rejected) std::printf("  rejected %s\n", why.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace atl::resilience::test
