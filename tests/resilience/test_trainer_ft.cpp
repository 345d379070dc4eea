// The trainer's fault-tolerance hooks end to end with the `atoll` command: a quorum-mode run that
// loses a replica to kill -9 and gets it back (its disk checkpoint, then healed from a live peer),
// and a distributed launch that the pre-run gate refuses before step 1.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "comm/tcp_store.h"
#include "proc.h"
#include "train_job.h"
#include "resilience/lighthouse.h"
#include "resilience/progress_record.h"

namespace atl::resilience::test {
namespace fs = std::filesystem;
namespace {

// The quorum and spare tests' job: 200 documents, 120 steps, a checkpoint every 10.
struct Corpus : TrainJob {
  fs::path cfg = root / "tiny.toml";
  Corpus() : TrainJob("ft_train", {200, 120, 10, 10}) {}
};

}  // namespace

TEST(QuorumTrainer, AKilledReplicaComesBackHealedAndAllEndWithBitwiseEqualCheckpoints) {
  Corpus c;
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = std::chrono::milliseconds(600);
  lo.min_replicas = 3;
  Lighthouse lh(lo);
  auto replica = [&](int r, bool resume) {
    std::vector<std::string> argv = {atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "run").string(),
                                     "--fault.tolerance=quorum", "--fault.commit_hashes=true"};
    if (resume) argv.push_back("--resume");
    return spawn(argv,
                 {"RANK=" + std::to_string(r), "WORLD_SIZE=3", "ATOLL_LIGHTHOUSE=127.0.0.1:" + std::to_string(lh.port()),
                  "OMP_NUM_THREADS=1"},
                 (c.root / ("r" + std::to_string(r) + (resume ? "b" : "") + ".log")).string());
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) pids.push_back(replica(r, false));
  // Until replica 1 has a disk checkpoint (step 20) to come back from.
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(c.root / "run/replica1/checkpoints/step_00000020")) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << lh.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pids[1], SIGKILL);
  EXPECT_EQ(wait_for(pids[1], 10), 128 + SIGKILL);
  // The replacement starts only once the survivors have gone on without replica 1: started at
  // once, it can join the very next quorum at the step its checkpoint holds, and then there is
  // nothing to heal (the run is still correct, but this test is about going on and healing).
  t0 = std::chrono::steady_clock::now();
  while (read_file((c.root / "r0.log").string()).find("quorum 2 of 2 replicas") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << lh.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_t back = replica(1, true);
  for (int r : {0, 2}) EXPECT_EQ(wait_for(pids[size_t(r)], 120), 0) << read_file((c.root / ("r" + std::to_string(r) + ".log")).string());
  EXPECT_EQ(wait_for(back, 60), 0) << read_file((c.root / "r1b.log").string());
  std::string log0 = read_file((c.root / "r0.log").string()), log1 = read_file((c.root / "r1b.log").string());
  EXPECT_NE(log0.find("quorum 2 of 2 replicas"), std::string::npos) << log0;  // went on without replica 1
  EXPECT_NE(log1.find("healed from replica"), std::string::npos) << log1;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    std::string ref = read_file((c.root / "run/replica0/checkpoints/step_00000120" / f).string());
    ASSERT_FALSE(ref.empty()) << f;
    for (int r : {1, 2})
      EXPECT_TRUE(read_file((c.root / ("run/replica" + std::to_string(r)) / "checkpoints/step_00000120" / f).string()) ==
                  ref)
          << "replica " << r << "'s " << f << " differs from replica 0's";
  }
  // fault.commit_hashes (what bench/ft_soak.sh checks): every committed step's record carries the
  // weights' hash and the commit's wall-clock time; the replicas that committed a step agree on it,
  // the returned replica from its healed step on, and the hash moves with the weights.
  std::map<int64_t, std::string> ref;
  double last_t = 0;
  for (auto& rec : records_with(c.root / "run/replica0/metrics.jsonl", "param_hash")) {
    ref[rec["step"].get<int64_t>()] = rec["param_hash"].get<std::string>();
    EXPECT_GE(rec["committed_unix_s"].get<double>(), last_t);
    last_t = rec["committed_unix_s"].get<double>();
  }
  EXPECT_EQ(ref.size(), 120u);
  std::set<std::string> distinct;
  for (auto& [s, h] : ref) distinct.insert(h);
  EXPECT_EQ(distinct.size(), ref.size()) << "one hash for different weights";
  size_t compared = 0;
  for (int r : {1, 2})
    for (auto& rec : records_with(c.root / ("run/replica" + std::to_string(r)) / "metrics.jsonl", "param_hash")) {
      EXPECT_EQ(rec["param_hash"].get<std::string>(), ref[rec["step"].get<int64_t>()])
          << "replica " << r << " at step " << rec["step"];
      ++compared;
    }
  EXPECT_GT(compared, 200u);  // replica 2's 120 steps and replica 1's before and after its death
}

TEST(QuorumTrainer, CommitHashesWithoutQuorumModeAreRefusedNamingTheKey) {
  Corpus c;
  const std::string log = (c.root / "refused.log").string();
  pid_t p = spawn({atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "run").string(),
                   "--fault.commit_hashes=true"},
                  {"OMP_NUM_THREADS=1"}, log);
  EXPECT_NE(wait_for(p, 60), 0);
  EXPECT_NE(read_file(log).find("fault.commit_hashes (command line (--fault.commit_hashes)) records quorum commits"), std::string::npos)
      << read_file(log);
  EXPECT_FALSE(fs::exists(c.root / "run/metrics.jsonl"));
}

// DeadPool through `atoll train`: 3 replicas sending their state to the next one's memory every 5
// steps, one spare waiting in the lighthouse's pool. kill -9 of replica 1 after step 20: the spare
// takes slot 1, restores it from replica 2's in-memory copy (no disk, no --resume), heals the steps
// since that snapshot from a live peer, and the job goes on at full size: the three final model and
// optimizer files (replica 0, replica 2, the spare as slot 1) are byte-identical.
TEST(QuorumTrainer, ASpareTakesAKilledReplicasPlaceFromItsPeerSnapshotAndAllEndBitwiseEqual) {
  Corpus c;
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = std::chrono::milliseconds(600);
  lo.min_replicas = 3;
  lo.slots = 3;
  Lighthouse lh(lo);
  auto replica = [&](int r, bool spare) {
    std::vector<std::string> argv = {atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "run").string(),
                                     "--fault.tolerance=quorum", "--fault.snapshot_every=5"};
    if (spare) argv.push_back("--fault.spare=true");
    return spawn(argv,
                 {"RANK=" + std::to_string(spare ? 0 : r), "ATOLL_SPARE_ID=" + std::to_string(r), "WORLD_SIZE=3",
                  "ATOLL_LIGHTHOUSE=127.0.0.1:" + std::to_string(lh.port()), "OMP_NUM_THREADS=1"},
                 (c.root / ("d" + std::to_string(r) + ".log")).string());
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) pids.push_back(replica(r, false));
  pid_t spare = replica(100, true);
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(c.root / "run/replica1/checkpoints/step_00000020")) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60)) << lh.status();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pids[1], SIGKILL);
  EXPECT_EQ(wait_for(pids[1], 10), 128 + SIGKILL);
  for (int r : {0, 2}) EXPECT_EQ(wait_for(pids[size_t(r)], 120), 0) << read_file((c.root / ("d" + std::to_string(r) + ".log")).string());
  EXPECT_EQ(wait_for(spare, 60), 0) << read_file((c.root / "d100.log").string());
  std::string log0 = read_file((c.root / "d0.log").string()), logs = read_file((c.root / "d100.log").string());
  EXPECT_NE(logs.find("restored from its peer's in-memory snapshot of step"), std::string::npos) << logs;
  EXPECT_EQ(log0.find("no spare left"), std::string::npos) << log0;
  EXPECT_EQ(log0.find("quorum 2 of 2 replicas"), std::string::npos) << "the job ran at reduced size:\n" << log0;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    std::string ref = read_file((c.root / "run/replica0/checkpoints/step_00000120" / f).string());
    ASSERT_FALSE(ref.empty()) << f;
    for (const char* d : {"run/replica2", "run/replica1.spare100"})
      EXPECT_TRUE(read_file((c.root / d / "checkpoints/step_00000120" / f).string()) == ref)
          << d << "'s " << f << " differs from replica 0's";
  }
}

// Two ranks of `atoll train` whose configs differ in one key: refused by the gate, on both ranks,
// before any step runs, in seconds, naming the config hash.
TEST(PreRunGate, AtollTrainRefusesRanksWhoseConfigsDifferBeforeStepOne) {
  Corpus c;
  int port = comm::pick_free_port();
  std::vector<pid_t> pids;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    pids.push_back(spawn({atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "gate").string(),
                          r == 1 ? "--train.seq_len=16" : "--train.seq_len=32"},
                         {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r),
                          "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                          "ATOLL_COMM_TIMEOUT=30", "OMP_NUM_THREADS=1"},
                         (c.root / ("g" + std::to_string(r) + ".log")).string()));
  for (int r = 0; r < 2; ++r) {
    std::string log = (c.root / ("g" + std::to_string(r) + ".log")).string();
    EXPECT_NE(wait_for(pids[size_t(r)], 60), 0) << read_file(log);
    std::string text = read_file(log);
    EXPECT_NE(text.find("pre-run gate"), std::string::npos) << text;
    EXPECT_NE(text.find("config hash"), std::string::npos) << text;
    EXPECT_EQ(text.find("step     1/"), std::string::npos) << "a step ran:\n" << text;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
}

// issue 14's watcher through the trainer: `atoll launch --watch` of two DDP ranks of `atoll train`.
// Each rank's record ends done at the last step, with time in data, compute and collective waits
// and the collectives it ran; the watcher raised no alarm on the clean run.
TEST(WatchTrainer, AtollTrainPublishesItsPhasesAndCollectivesForTheWatcher) {
  Corpus c;
  const fs::path dir = c.root / "progress";
  pid_t p = spawn({atoll_exe(), "launch", "--nproc-per-node", "2", "--watch", "--watch-hang-s", "30", "--watch-dir",
                   dir.string(), "--", atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "run").string(),
                   "--train.steps=30"},
                  {"OMP_NUM_THREADS=1"}, (c.root / "launch.log").string());
  ASSERT_EQ(wait_for(p, 120), 0) << read_file((c.root / "launch.log").string());
  const std::string log = read_file((c.root / "launch.log").string());
  EXPECT_EQ(log.find("hang:"), std::string::npos) << log;
  for (int r = 0; r < 2; ++r) {
    auto rec = read_progress((dir / ("rank" + std::to_string(r) + ".progress")).string());
    ASSERT_TRUE(rec.has_value()) << r;
    EXPECT_EQ(rec->rank, r);
    EXPECT_EQ(rec->step, 30);
    EXPECT_EQ(rec->phase, Phase::done);
    for (Phase ph : {Phase::data, Phase::compute, Phase::collective, Phase::checkpoint})
      EXPECT_GT(rec->phase_ns[size_t(ph)], 0) << "rank " << r << " spent no time in " << phase_name(ph);
    EXPECT_GE(rec->ops_finished, 30);  // at least the gradient all-reduce of every step
    EXPECT_EQ(rec->ops_failed, 0);
    EXPECT_EQ(rec->inflight, 0);
  }
}

// `atoll launch --ft --watch`: the watcher is tolerant of what quorum mode survives. Replica 1 of 3
// is killed (its pid read from its progress record) after its step-20 checkpoint; the launcher
// starts it again with --resume, the job ends normally, and the watcher never stops it.
TEST(WatchTrainer, UnderLaunchFtAKilledReplicaIsNoHangAndTheJobFinishes) {
  Corpus c;
  const fs::path dir = c.root / "progress";
  pid_t p = spawn({atoll_exe(), "launch", "--nproc-per-node", "3", "--ft", "--heartbeat-timeout-ms", "600", "--watch",
                   "--watch-hang-s", "3", "--watch-dir", dir.string(), "--", atoll_exe(), "train", c.cfg.string(),
                   "--run.dir=" + (c.root / "run").string()},
                  {"OMP_NUM_THREADS=1"}, (c.root / "launch.log").string());
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(c.root / "run/replica1/checkpoints/step_00000020")) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(90)) << read_file((c.root / "launch.log").string());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto rec = read_progress((dir / "rank1.progress").string());
  ASSERT_TRUE(rec.has_value());
  ASSERT_GT(rec->pid, 0);
  ::kill(rec->pid, SIGKILL);
  ASSERT_EQ(wait_for(p, 180), 0) << read_file((c.root / "launch.log").string());
  const std::string log = read_file((c.root / "launch.log").string());
  EXPECT_NE(log.find("starting it again"), std::string::npos) << log;
  EXPECT_EQ(log.find("the watcher named a hang"), std::string::npos) << log;
}

// `atoll launch --ft --spares 1` (DeadPool from the launcher): 3 replicas and one spare started
// together; replica 1 killed with -9 from outside (its pid from its progress record) after its
// step-20 checkpoint. The launcher does not start it again: the spare takes slot 1 from its peer's
// in-memory snapshot (two copies, [fault] snapshot_copies = 2: the newer of slot 2's and slot 0's),
// the job never runs a reduced quorum, and ends 0 with replica 0's, replica 2's and the spare's last
// model and optimizer files byte-identical.
TEST(QuorumTrainer, LaunchFtSparesStartsThePoolAndASpareTakesAKilledReplicasSlotBitwise) {
  Corpus c;
  const fs::path dir = c.root / "progress";
  fs::create_directories(dir);
  pid_t p = spawn({atoll_exe(), "launch", "--nproc-per-node", "3", "--ft", "--spares", "1", "--heartbeat-timeout-ms",
                   "600", "--", atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "run").string(),
                   "--fault.snapshot_every=5", "--fault.snapshot_copies=2"},
                  {"OMP_NUM_THREADS=1", "ATOLL_PROGRESS_DIR=" + dir.string()}, (c.root / "launch.log").string());
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(c.root / "run/replica1/checkpoints/step_00000020")) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(90)) << read_file((c.root / "launch.log").string());
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto rec = read_progress((dir / "rank1.progress").string());
  ASSERT_TRUE(rec.has_value());
  ASSERT_GT(rec->pid, 0);
  ::kill(rec->pid, SIGKILL);
  ASSERT_EQ(wait_for(p, 180), 0) << read_file((c.root / "launch.log").string());
  const std::string log = read_file((c.root / "launch.log").string());
  EXPECT_NE(log.find("atoll launch: rank 1 (pid " + std::to_string(rec->pid) +
                     ") was killed by signal 9 (SIGKILL); a spare takes its slot (DeadPool, 1 of 1 spares)"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("starting it again"), std::string::npos) << log;
  EXPECT_NE(log.find("[spare 3] "), std::string::npos) << log;
  EXPECT_NE(log.find("restored from its peer's in-memory snapshot of step"), std::string::npos) << log;
  EXPECT_EQ(log.find("holder: cannot reach"), std::string::npos) << "both copies' holders are alive: " << log;
  EXPECT_EQ(log.find("no spare left"), std::string::npos) << log;
  EXPECT_EQ(log.find("quorum 2 of 2 replicas"), std::string::npos) << "the job ran at reduced size:\n" << log;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    std::string ref = read_file((c.root / "run/replica0/checkpoints/step_00000120" / f).string());
    ASSERT_FALSE(ref.empty()) << f;
    for (const char* d : {"run/replica2", "run/replica1.spare3"})
      EXPECT_TRUE(read_file((c.root / d / "checkpoints/step_00000120" / f).string()) == ref)
          << d << "'s " << f << " differs from replica 0's";
  }
  // --spares without --ft has no pool to wait in: refused, naming the option.
  pid_t q = spawn({atoll_exe(), "launch", "--nproc-per-node", "2", "--spares", "1", "--", "true"}, {},
                  (c.root / "refused.log").string());
  EXPECT_NE(wait_for(q, 30), 0);
  EXPECT_NE(read_file((c.root / "refused.log").string()).find("--spares 1: spares take a dead replica's place in a "
                                                              "quorum job: use it with --ft"),
            std::string::npos)
      << read_file((c.root / "refused.log").string());
  // A second copy of snapshots that are not taken: refused, naming the key.
  pid_t k = spawn({atoll_exe(), "train", c.cfg.string(), "--run.dir=" + (c.root / "k").string(),
                   "--fault.tolerance=quorum", "--fault.snapshot_copies=2"},
                  {"OMP_NUM_THREADS=1"}, (c.root / "copies.log").string());
  EXPECT_NE(wait_for(k, 30), 0);
  EXPECT_NE(read_file((c.root / "copies.log").string()).find("fault.snapshot_copies"), std::string::npos)
      << read_file((c.root / "copies.log").string());
  EXPECT_NE(read_file((c.root / "copies.log").string()).find("needs fault.snapshot_every > 0"), std::string::npos)
      << read_file((c.root / "copies.log").string());
}

// The pool is refilled: `--spares 1 --max-restarts 1`. Replica 1 is killed (-9) after its step-20
// checkpoint and spare 3 takes its slot; the launcher starts spare 4 in its place (the one restart
// allowed); replica 2 is killed after its step-60 checkpoint, once spare 4 waits in the pool, and
// spare 4 takes slot 2 instead of replica 2 being started again. The job never runs a reduced
// quorum and ends with replica 0's, spare 3's and spare 4's last files byte-identical. Without the
// refill the second kill found the pool empty and replica 2 was started again with --resume.
TEST(QuorumTrainer, LaunchFtRefillsTheSparePoolSoASecondKilledReplicaIsTakenOverBitwise) {
  Corpus c;
  const fs::path dir = c.root / "progress";
  fs::create_directories(dir);
  const std::string log_path = (c.root / "launch.log").string();
  pid_t p = spawn({atoll_exe(), "launch", "--nproc-per-node", "3", "--ft", "--spares", "1", "--max-restarts", "1",
                   "--heartbeat-timeout-ms", "600", "--", atoll_exe(), "train", c.cfg.string(),
                   "--run.dir=" + (c.root / "run").string(), "--fault.snapshot_every=5"},
                  {"OMP_NUM_THREADS=1", "ATOLL_PROGRESS_DIR=" + dir.string()}, log_path);
  auto kill_after = [&](int rank, const fs::path& checkpoint, const std::string& also) {
    auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(checkpoint) || read_file(log_path).find(also) == std::string::npos) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(120)) return 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    auto rec = read_progress((dir / ("rank" + std::to_string(rank) + ".progress")).string());
    if (!rec || rec->pid <= 0) return 0;
    ::kill(rec->pid, SIGKILL);
    return rec->pid;
  };
  const int first = kill_after(1, c.root / "run/replica1/checkpoints/step_00000020", "");
  if (first <= 0) ::kill(p, SIGTERM);
  ASSERT_GT(first, 0) << read_file(log_path);
  // Spare 4 is in the pool, and the run has gone on past the first takeover.
  const int second = kill_after(2, c.root / "run/replica2/checkpoints/step_00000060", "spare 4: waiting in the pool");
  if (second <= 0) ::kill(p, SIGTERM);  // the launcher tears its ranks down
  ASSERT_GT(second, 0) << read_file(log_path);
  ASSERT_EQ(wait_for(p, 240), 0) << read_file(log_path);
  const std::string log = read_file(log_path);
  EXPECT_NE(log.find("atoll launch: rank 1 (pid " + std::to_string(first) +
                     ") was killed by signal 9 (SIGKILL); a spare takes its slot (DeadPool, 1 of 1 spares)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("atoll launch: starting spare 4 to refill the pool (restart 1 of 1)"), std::string::npos) << log;
  EXPECT_NE(log.find("atoll launch: rank 2 (pid " + std::to_string(second) +
                     ") was killed by signal 9 (SIGKILL); a spare takes its slot (DeadPool, 2 of 2 spares)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("deadpool: spare 4 takes the place of replica 2"), std::string::npos) << log;
  EXPECT_EQ(log.find("starting it again"), std::string::npos) << log;
  EXPECT_EQ(log.find("starting spare 5"), std::string::npos) << "the one restart allowed is used: " << log;
  EXPECT_EQ(log.find("no spare left"), std::string::npos) << log;
  EXPECT_EQ(log.find(" of 2 replicas ("), std::string::npos) << "the job ran at reduced size:\n" << log;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    std::string ref = read_file((c.root / "run/replica0/checkpoints/step_00000120" / f).string());
    ASSERT_FALSE(ref.empty()) << f;
    for (const char* d : {"run/replica1.spare3", "run/replica2.spare4"})
      EXPECT_TRUE(read_file((c.root / d / "checkpoints/step_00000120" / f).string()) == ref)
          << d << "'s " << f << " differs from replica 0's";
  }
}

}  // namespace atl::resilience::test
