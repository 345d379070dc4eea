// The disaggregated placement (rl/disaggregated.h): a rollout rank generates with exactly the
// trainer's weights of the version it says (bitwise: the trainer regenerates every batch itself
// from a snapshot of that version and compares every token and every behaviour log-prob bit), on
// policy (rl.max_staleness 0) and one step off (1); the rollout payload round-trips and the weight
// hash sees one flipped bit; and an end-to-end run through `atoll launch` on 3 ranks (2 trainers
// and 1 rollout rank) trains on-policy with the ratio exactly 1 at every RL step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "core/error.h"
#include "core/threads.h"
#include "nn/model.h"
#include "parallel/harness.h"
#include "rl/belayer.h"
#include "rl/disaggregated.h"
#include "rl/rl_engine.h"
#include "tiny_model.h"
#include "two_turn_samples.h"

namespace atl::rl {
namespace {

using rltest::kTinyModel;


RlConfig disagg_config(int staleness) {
  Config c = Config::parse(std::string(kTinyModel) + "\n[rl]\nplacement = \"disaggregated\"\nrollout_ranks = 1\n" +
                               "max_staleness = " + std::to_string(staleness) + "\nprompts = 3\ngroup_size = 2\n" +
                               "temperature = 1.0\n",
                           "test");
  return RlConfig::from_config(c, 7);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.f32(), b.f32(), size_t(a.numel()) * 4) == 0;
}

// A rank of the 2-rank tests (rank 0 trains, rank 1 generates) when ATOLL_RL_DISAGG_STALENESS is
// set; alone (one process, no job), the placement is refused with the key named.
TEST(RlDisaggregated, RankProgram) {
  const char* st = std::getenv("ATOLL_RL_DISAGG_STALENESS");
  if (!st) {
    RlEngine eng(disagg_config(0));
    auto m = rltest::tiny_model(1);
    try {
      eng.setup(*m, nullptr, 0, 1);
      FAIL() << "a one-process disaggregated run was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rl.rollout_ranks"), std::string::npos) << e.what();
    }
    return;
  }
  const int S = std::atoi(st);
  set_num_threads(1);
  auto world = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
  const bool rollout = world->rank() == 1;
  auto part = world->split(rollout ? 1 : 0, world->rank());  // as the trainer splits the job
  RlEngine eng(disagg_config(S));
  // Different initial weights on the rollout rank: only the push can make its rollouts match.
  auto m = rltest::tiny_model(rollout ? 99 : 11);
  eng.attach_job(std::move(world), rollout);
  eng.setup(*m, part.get(), rollout ? 1 : 0, 1);
  if (rollout) {
    eng.serve();  // returns when the trainer's engine is destroyed
    return;
  }
  std::map<int64_t, std::unique_ptr<nn::Model>> snapshot;  // version -> the trainer's weights then
  for (int64_t k = 0; k < 4; ++k) {
    snapshot[k] = nn::model_from_metadata(m->config_metadata());
    Tensor dst = snapshot[k]->flat_values();
    dst.copy_from(m->flat_values());
    const RolloutBatch& b = eng.next_batch();
    const int64_t want_version = std::max<int64_t>(0, k - S);
    ASSERT_EQ(b.policy_version, want_version) << "step " << k;
    // The trainer generates the same step's rollouts itself with that version's weights.
    RolloutBatch want = eng.rollouts(*snapshot[want_version], k, 0, false);
    ASSERT_EQ(want.B, b.B);
    ASSERT_EQ(want.T, b.T);
    for (int64_t r = 0; r < b.B; ++r) {
      EXPECT_EQ(b.samples[size_t(r)].completion, want.samples[size_t(r)].completion) << "step " << k << " row " << r;
      EXPECT_EQ(b.samples[size_t(r)].reward.total, want.samples[size_t(r)].reward.total);
    }
    EXPECT_TRUE(same_bits(b.old_logp, want.old_logp)) << "step " << k << ": behaviour log-probs differ";
    if (k > S) {  // and not the current weights' (staleness 1), nor the previous ones' (staleness 0)
      const Tensor other = RlEngine::score_logprobs(*snapshot[S == 0 ? k - 1 : k], b);
      EXPECT_FALSE(same_bits(b.old_logp, other)) << "step " << k;
    }
    Tensor loss = eng.loss(*m, b);
    clear_tape();
    nlohmann::json mt = eng.step_metrics();
    EXPECT_EQ(mt.at("staleness").get<int64_t>(), k - want_version);
    if (k - want_version == 0) {
      EXPECT_EQ(mt.at("ratio").get<double>(), 1.0) << "step " << k;
    }
    EXPECT_GT(mt.at("sync_ms").get<double>(), 0.0);
    EXPECT_GE(mt.at("sync_buckets").get<int64_t>(), 1);
    // An update: every weight moves (as an optimizer step would move them).
    Tensor w = m->flat_values();
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] += 0.02f * float(std::sin(double(i) * 0.37 + double(k)));
  }
}

void run_two_ranks(int staleness) {
  const std::string tag =
      (std::filesystem::temp_directory_path() / ("atoll_rl_disagg_" + std::to_string(::getpid()))).string();
  auto codes = parallel::test::run_rank_programs(2, "RlDisaggregated.RankProgram",
                                                 {"ATOLL_RL_DISAGG_STALENESS=" + std::to_string(staleness)}, tag, 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    const std::string log = parallel::test::read_file(tag + ".log" + std::to_string(r));
    EXPECT_EQ(codes[r], 0) << "staleness " << staleness << ", rank " << r << ":\n" << log;
    EXPECT_NE(log.find("[  PASSED  ] 1 test"), std::string::npos) << log;
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
}

TEST(RlDisaggregated, RolloutRankGeneratesWithTheTrainersWeightsOnPolicy) { run_two_ranks(0); }
TEST(RlDisaggregated, RolloutRankGeneratesWithTheTrainersWeightsOneStepOff) { run_two_ranks(1); }

TEST(RlDisaggregated, PayloadRoundTripsAndTheHashSeesOneBit) {
  Config c = Config::parse(std::string(kTinyModel) + "\n[rl]\nprompts = 3\ngroup_size = 2\n", "test");
  RlEngine eng(RlConfig::from_config(c, 3));
  auto m = rltest::tiny_model(5);
  eng.setup(*m, nullptr, 0, 1);
  RolloutBatch b = eng.rollouts(*m, 2);
  b.policy_version = 17;
  b.gen_s = 0.25;
  uint64_t h = 0;
  RolloutBatch d = decode_rollouts(encode_rollouts(b, 0xfeedbeefcafe1234ull), &h);
  EXPECT_EQ(h, 0xfeedbeefcafe1234ull);
  EXPECT_EQ(d.policy_version, 17);
  EXPECT_EQ(d.gen_s, 0.25);
  ASSERT_EQ(d.B, b.B);
  EXPECT_TRUE(same_bits(d.old_logp, b.old_logp));
  EXPECT_EQ(std::memcmp(d.input.i32(), b.input.i32(), size_t(b.B * b.T) * 4), 0);
  EXPECT_EQ(std::memcmp(d.target.i32(), b.target.i32(), size_t(b.B * b.T) * 4), 0);
  for (int64_t r = 0; r < b.B; ++r) {
    EXPECT_EQ(d.samples[size_t(r)].problem.answer, b.samples[size_t(r)].problem.answer);
    EXPECT_EQ(d.samples[size_t(r)].reward.total, b.samples[size_t(r)].reward.total);
    EXPECT_EQ(d.samples[size_t(r)].group, b.samples[size_t(r)].group);
  }
  std::vector<int32_t> words = encode_rollouts(b, 1);
  words.pop_back();
  EXPECT_THROW(decode_rollouts(words, nullptr), Error);  // a torn payload is refused
  std::vector<Tensor> params;
  for (nn::Parameter* p : m->parameters()) params.push_back(p->value);
  const uint64_t before = weights_hash(params);
  reinterpret_cast<uint32_t*>(params.back().f32())[params.back().numel() - 1] ^= 1u;  // the last bit of all
  EXPECT_NE(weights_hash(params), before);
}

// Multi-turn episodes (session 11): each sample's reply mask and turns travel with its tokens, so
// the trainer's re-packed batch masks the replies' targets as the rollout rank's did.
TEST(RlDisaggregated, PayloadCarriesTheRepliesMasks) {
  const std::vector<Sample> s = rltest::two_turn_samples();
  const RolloutBatch b = pack_rollouts(s);
  const RolloutBatch d = decode_rollouts(encode_rollouts(b, 5), nullptr);
  ASSERT_EQ(d.B, 2);
  ASSERT_EQ(d.T, b.T);
  EXPECT_EQ(d.samples[0].env, s[0].env);
  EXPECT_TRUE(d.samples[1].env.empty());
  EXPECT_EQ(d.samples[0].turns, 2);
  EXPECT_EQ(d.samples[1].turns, 1);
  EXPECT_EQ(d.own, b.own);
  EXPECT_EQ(std::memcmp(d.target.i32(), b.target.i32(), size_t(b.B * b.T) * 4), 0);
  EXPECT_EQ(d.target.i32()[b.first[0] + 2], -1) << "the reply's first token is a target after the exchange";
}

// Through the trainer and `atoll launch`: 3 ranks, ranks 0-1 train (DDP), rank 2 generates.
TEST(RlDisaggregated, ThreeRanksThroughLaunchTrainOnPolicy) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_disagg_launch_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "3", "--timeout", "30", "--", atoll, "train",
                                   cfg, "--run.dir=" + (root / "run").string(), "--train.steps=8", "--rl.sft_steps=3",
                                   "--rl.prompts=4", "--rl.group_size=4", "--eval.every=8", "--rl.eval_size=20",
                                   "--sample.every=0", "--hardware.peak_gflops=1", "--rl.placement=disaggregated",
                                   "--rl.rollout_ranks=1", "--rl.max_staleness=0"};
  const std::string log = (root / "log").string();
  const int rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 120);
  const std::string out = parallel::test::read_file(log);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("over 2 ranks"), std::string::npos) << out;  // the trainers' DDP leaves the rollout rank out
  std::ifstream f(root / "run" / "metrics.jsonl");
  int rl_steps = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") != "rl") continue;
    ++rl_steps;
    // On policy with the pushed weights: every step's ratio is exactly 1, not only the first's.
    EXPECT_EQ(j.at("ratio").get<double>(), 1.0) << line;
    EXPECT_EQ(j.at("clip_frac").get<double>(), 0.0) << line;
    EXPECT_EQ(j.at("staleness").get<int64_t>(), 0) << line;
    EXPECT_EQ(j.at("rollout_version").get<int64_t>(), j.at("step").get<int64_t>() - 1) << line;
    if (j.at("rl_step").get<int64_t>() == 1) {
      EXPECT_EQ(j.at("kl").get<double>(), 0.0) << line;
    }
    EXPECT_GT(j.at("sync_ms").get<double>(), 0.0) << line;  // rank 0 pushed, timed
    EXPECT_GE(j.at("sync_buckets").get<int64_t>(), 1) << line;
    EXPECT_GT(j.at("gen_ms").get<double>(), 0.0) << line;
    EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << line;
  }
  EXPECT_EQ(rl_steps, 5);
  std::filesystem::remove_all(root);
}

// rl.journal_dir with the disaggregated placement: the rollout rank generates each trainer's batch
// through Belayer's journal (rl/belayer.h), one file per trainer stream and step, and the trainers
// train on it on policy (ratio exactly 1: the journaled batch is scored like any other). At the end
// only the last RL step's journals are left (step k's is removed when k + 1 starts), one per
// trainer, each with every rollout of the batch finished exactly once.
TEST(RlDisaggregated, RolloutRankJournalsEachTrainersBatch) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_disagg_journal_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "3", "--timeout", "30", "--", atoll, "train",
                                   cfg, "--run.dir=" + (root / "run").string(), "--train.steps=8", "--rl.sft_steps=3",
                                   "--rl.prompts=4", "--rl.group_size=4", "--eval.every=0", "--sample.every=0",
                                   "--hardware.peak_gflops=1", "--rl.placement=disaggregated", "--rl.rollout_ranks=1",
                                   "--rl.max_staleness=0", "--rl.journal_dir=" + (root / "journal").string()};
  const std::string log = (root / "log").string();
  const int rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 120);
  ASSERT_EQ(rc, 0) << parallel::test::read_file(log);
  std::ifstream f(root / "run" / "metrics.jsonl");
  int rl_steps = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") != "rl") continue;
    ++rl_steps;
    EXPECT_EQ(j.at("ratio").get<double>(), 1.0) << line;
  }
  EXPECT_EQ(rl_steps, 5);
  std::map<std::string, std::string> journals;  // stream prefix -> file
  for (const auto& e : std::filesystem::directory_iterator(root / "journal")) {
    const std::string name = e.path().filename().string();
    journals[name.substr(0, name.find("_v"))] = e.path().string();
  }
  ASSERT_EQ(journals.size(), 2u) << "one journal per trainer stream, the last step's only";
  for (const std::string stream : {"rollouts_r0_s4", "rollouts_r1_s4"}) {
    ASSERT_TRUE(journals.count(stream)) << stream;
    const JournalState js = JournalState::read(journals[stream]);
    ASSERT_EQ(js.requests.size(), 16u) << stream;
    for (const auto& [id, e] : js.requests) EXPECT_TRUE(e.done) << stream << " rollout " << id;
  }
  std::filesystem::remove_all(root);
}

// A rollout rank killed mid-trajectory (fault.rl_kill_after_tokens: SIGKILL after 20 sampled
// tokens of the first RL step's batch, with rollouts half journaled) ends the job; the job resumed
// from its last checkpoint (step 3, the end of SFT) pushes the same weights, and the new rollout
// rank finds its journal (same stream, step, version and weights hash), skips the finished
// rollouts and continues the cut one from its prefix. The batch has every rollout finished exactly
// once, and the run goes on to end bit for bit like an uninterrupted one (every RL step's loss, the
// final weights): no rollout lost, doubled or changed. (A restart, not yet a live shadow rank:
// docs/rl.md, Journaled rollouts.)
TEST(RlDisaggregated, KilledRolloutRankContinuesItsJournalOnResume) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_disagg_kill_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  auto launch = [&](const std::string& run, int steps, std::vector<std::string> extra, std::string* out) {
    std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "3", "--timeout", "30", "--", atoll, "train",
                                     cfg, "--run.dir=" + (root / run).string(), "--train.steps=" + std::to_string(steps),
                                     "--rl.sft_steps=3", "--rl.prompts=4", "--rl.group_size=4", "--eval.every=0",
                                     "--sample.every=0", "--hardware.peak_gflops=1", "--rl.placement=disaggregated",
                                     "--rl.rollout_ranks=1", "--rl.max_staleness=0", "--checkpoint.every=1",
                                     "--rl.journal_dir=" + (root / (run + "_journal")).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const std::string log = (root / (run + std::to_string(steps) + ".log")).string();
    const int rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 120);
    *out = parallel::test::read_file(log);
    return rc;
  };
  std::string out;
  ASSERT_EQ(launch("a", 8, {}, &out), 0) << out;
  EXPECT_NE(launch("b", 8, {"--fault.rl_kill_after_tokens=20"}, &out), 0) << "the rollout rank was to die: " << out;
  std::string journal;
  for (const auto& e : std::filesystem::directory_iterator(root / "b_journal"))
    if (e.path().filename().string().rfind("rollouts_r0_s0_", 0) == 0) journal = e.path().string();
  ASSERT_FALSE(journal.empty()) << "no journal of the first RL step's batch for trainer 0";
  const JournalState before = JournalState::read(journal);
  int done_before = 0, partial = 0;
  for (const auto& [id, e] : before.requests) {
    done_before += e.done;
    partial += !e.done && !e.tokens.empty();
  }
  ASSERT_GT(done_before, 0);
  ASSERT_LT(done_before, 16);
  ASSERT_EQ(partial, 1) << "the rollout rank died mid-trajectory of exactly one rollout";
  // Resume for the one interrupted RL step: its journal is complete, each rollout finished once.
  ASSERT_EQ(launch("b", 4, {"--resume", "--run.overwrite=false"}, &out), 0) << out;
  EXPECT_NE(out.find(std::to_string(done_before) + " requests already done, 1 continued from their prefix"),
            std::string::npos)
      << out;
  const JournalState after = JournalState::read(journal);
  ASSERT_EQ(after.requests.size(), 16u);
  int finished_lines = 0;
  std::ifstream jf(journal);
  for (std::string line; std::getline(jf, line);) finished_lines += line.rfind("D ", 0) == 0;
  EXPECT_EQ(finished_lines, 16) << "a rollout was finished twice or never";
  ASSERT_EQ(launch("b", 8, {"--resume", "--run.overwrite=false"}, &out), 0) << out;
  auto losses = [&](const std::string& run) {
    std::map<int64_t, double> m;
    std::ifstream f(root / run / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.value("phase", "") == "rl") m[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
    }
    return m;
  };
  auto la = losses("a"), lb = losses("b");
  for (int64_t s = 4; s <= 8; ++s) {
    ASSERT_TRUE(la.count(s) && lb.count(s)) << "step " << s;
    EXPECT_EQ(la[s], lb[s]) << "step " << s << " loss";
  }
  const std::string wa = parallel::test::read_file((root / "a/checkpoints/step_00000008/model.safetensors").string());
  const std::string wb = parallel::test::read_file((root / "b/checkpoints/step_00000008/model.safetensors").string());
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "the resumed run's final weights differ from the uninterrupted run's";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace atl::rl
