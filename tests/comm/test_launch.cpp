// `atoll launch`: the environment it gives each rank, output prefixes, fail-fast teardown, and
// the fault tests: a rank killed (or stopped) mid-collective makes every other rank fail, naming
// it and the collective, within the configured timeout, and the launcher names the failed rank.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "comm/tcp_store.h"
#include "comm_test_util.h"

using namespace atl::comm::test;

TEST(Launch, SetsTorchrunEnvironmentAndPrefixesOutput) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "3", "--",
                "sh", "-c", "echo env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR; echo to-stderr >&2"},
               20);
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  for (int r = 0; r < 3; ++r) {
    std::string R = std::to_string(r);
    EXPECT_EQ(count_of(p.out, "[rank " + R + "] env " + R + " " + R + " 3 3 0 127.0.0.1\n"), 1) << p.out;
    EXPECT_EQ(count_of(p.out, "[rank " + R + "] to-stderr\n"), 1) << p.out;
  }
}

TEST(Launch, FailingRankStopsTheJobAndIsNamed) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "3", "--grace", "0.5", "--",
                "sh", "-c", "if [ $RANK = 2 ]; then sleep 0.3; exit 7; fi; sleep 60"},
               30);
  EXPECT_FALSE(p.timed_out);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_LT(p.seconds, 10);
  EXPECT_NE(p.out.find("job failed: rank 2 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("exited with code 7"), std::string::npos) << p.out;
}

// --outlive N (issue 15, RL's shadow rank): the job goes on without up to N failed ranks (not
// restarted) and ends with the others' status; one more failure stops it as without the option.
TEST(Launch, OutliveLetsTheJobGoOnWithoutAFailedRank) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "3", "--outlive", "1", "--grace", "0.5", "--",
                "sh", "-c", "if [ $RANK = 2 ]; then exit 7; fi; sleep 1; echo finished $RANK"},
               30);
  EXPECT_FALSE(p.timed_out);
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  EXPECT_NE(p.out.find("rank 2 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("exited with code 7; the job goes on without it (1 of 1)"), std::string::npos) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 0] finished 0\n") + count_of(p.out, "[rank 1] finished 1\n"), 2) << p.out;
  Proc q = run({atoll_exe(), "launch", "--nproc-per-node", "3", "--outlive", "1", "--grace", "0.5", "--",
                "sh", "-c", "if [ $RANK != 0 ]; then sleep 0.$RANK; exit 7; fi; sleep 60"},
               30);
  EXPECT_FALSE(q.timed_out);
  EXPECT_NE(q.exit_code(), 0) << q.out;
  EXPECT_LT(q.seconds, 10);
  EXPECT_NE(q.out.find("job failed: rank 2 (pid"), std::string::npos) << q.out;
}

TEST(Launch, MissingCommandIsAnError) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "2"}, 10);
  EXPECT_NE(p.exit_code(), 0);
  EXPECT_NE(p.out.find("no command"), std::string::npos) << p.out;
}

// issue 14: torchrun's whole-job restart (--max-restarts without --ft). Rank 1 fails in the first
// two starts; each time rank 0 (which would sleep a minute) is torn down and both start again, with
// TORCHELASTIC_RESTART_COUNT counting the starts; the third start succeeds and so does the job.
TEST(Launch, MaxRestartsStartsTheWholeJobAgainWithTorchrunsRestartCount) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "2", "--max-restarts", "3", "--grace", "0.5", "--",
                "sh", "-c",
                "echo start $RANK $TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS; "
                "if [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then if [ $RANK = 1 ]; then sleep 0.2; exit 5; fi; "
                "sleep 60; fi; echo done $RANK"},
               60);
  EXPECT_FALSE(p.timed_out);
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  for (int r = 0; r < 2; ++r)
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(count_of(p.out, fmt::format("[rank {}] start {} {} 3\n", r, r, k)), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 0] done 0\n") + count_of(p.out, "[rank 1] done 1\n"), 2) << p.out;
  EXPECT_NE(p.out.find("restarting the whole job (restart 1 of 3, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: "
                       "rank 1 (pid"),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("(restart 2 of 3, TORCHELASTIC_RESTART_COUNT=2)"), std::string::npos) << p.out;
  EXPECT_EQ(count_of(p.out, "restarting the whole job"), 2) << p.out;
  EXPECT_EQ(p.out.find("job failed"), std::string::npos) << p.out;
}

// N restarts used up: the job fails naming the rank, says it gave up, and starts no more.
TEST(Launch, MaxRestartsUsedUpFailsNamingTheRankAndSaysSo) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "2", "--max-restarts", "1", "--grace", "0.5", "--",
                "sh", "-c", "echo start $RANK $TORCHELASTIC_RESTART_COUNT; if [ $RANK = 1 ]; then exit 5; fi; sleep 60"},
               60);
  EXPECT_FALSE(p.timed_out);
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_EQ(count_of(p.out, "restarting the whole job"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 1] start 1 1\n"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 1] start 1 2\n"), 0) << p.out;
  EXPECT_NE(p.out.find("job failed: rank 1 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("exited with code 5"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("gave up: every one of the 1 restart(s) allowed (--max-restarts)"), std::string::npos) << p.out;
}

// Across nodes (two launchers on loopback, torchrun's --nnodes/--node-rank/--rdzv): rank 1, on
// node 1, fails in the first start; node 1's launcher tears it down, node 0's hears of it through
// node 0's control store and tears rank 0 down, and both start their ranks again, together, with
// the same TORCHELASTIC_RESTART_COUNT; the second start succeeds on both nodes.
TEST(Launch, MaxRestartsAcrossNodesStartsEveryNodesRanksAgainTogether) {
  const int port = atl::comm::pick_free_port("127.0.0.1");
  const std::string rank_cmd =
      "echo start $RANK $TORCHELASTIC_RESTART_COUNT $WORLD_SIZE $GROUP_RANK; if [ $TORCHELASTIC_RESTART_COUNT -lt 1 ]; "
      "then if [ $RANK = 1 ]; then sleep 0.3; exit 5; fi; sleep 60; fi; echo done $RANK";
  auto node = [&](int n) {
    return fmt::format("'{}' launch --nnodes 2 --node-rank {} --nproc-per-node 1 --rdzv 127.0.0.1:{} --max-restarts 2 "
                       "--grace 0.5 -- sh -c '{}'",
                       atoll_exe(), n, port, rank_cmd);
  };
  const std::string script = node(1) + " > \"$T\" 2>&1 & N1=$!; " + node(0) + "; echo node0-status $?; wait $N1; " +
                             "echo node1-status $?; cat \"$T\"; rm -f \"$T\"";
  Proc p = run({"sh", "-c", "T=$(mktemp); " + script}, 60);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.out.find("node0-status 0"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("node1-status 0"), std::string::npos) << p.out;
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(count_of(p.out, fmt::format("[rank {}] start {} {} 2 {}\n", r, r, k, r)), 1) << p.out;
    EXPECT_EQ(count_of(p.out, fmt::format("[rank {}] done {}\n", r, r)), 1) << p.out;
  }
  EXPECT_EQ(count_of(p.out, "restarting the whole job (restart 1 of 2, TORCHELASTIC_RESTART_COUNT=1)"), 2) << p.out;
  // Both launchers name rank 1 from the nodes' records in the control store, node 0 too.
  EXPECT_EQ(count_of(p.out, "TORCHELASTIC_RESTART_COUNT=1): failed rank 1: rank 1 (pid"), 2) << p.out;
  EXPECT_EQ(count_of(p.out, "TORCHELASTIC_RESTART_COUNT=1): on another node"), 0) << p.out;
  EXPECT_EQ(count_of(p.out, "restart 2 of 2"), 0) << p.out;
  EXPECT_LT(p.seconds, 30) << p.out;
}

// kill -9 of rank 2 in the middle of a stream of all_reduces.
TEST(Fault, KilledRankIsNamedByEveryOtherRankAndTheLauncher) {
  const double timeout = 8;
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "3", "--timeout", "8", "--grace", "5", "--",
                self_exe(), "--worker", "fault", "2", "kill", "20"},
               60);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_LT(p.seconds, timeout + 5) << p.out;
  EXPECT_NE(p.out.find("job failed: rank 2 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("killed by signal 9 (SIGKILL)"), std::string::npos) << p.out;
  for (int r : {0, 1}) {
    // Each survivor reports on its own line, naming the collective and the dead rank, and
    // exits with the worker's error code (3), not by the launcher's SIGTERM.
    std::string pre = "[rank " + std::to_string(r) + "] worker error: all_reduce #";
    size_t at = p.out.find(pre);
    ASSERT_NE(at, std::string::npos) << p.out;
    std::string line = p.out.substr(at, p.out.find('\n', at) - at);
    EXPECT_NE(line.find("rank 2 died"), std::string::npos) << line;
    EXPECT_NE(p.out.find("rank " + std::to_string(r) + " exited with code 3"), std::string::npos) << p.out;
  }
}

// A rank that stops answering (SIGSTOP) without dying: the others time out, say so, and exit.
TEST(Fault, StoppedRankMakesOthersTimeOutNotHang) {
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "2", "--timeout", "2", "--grace", "1", "--",
                self_exe(), "--worker", "fault", "1", "stop", "10"},
               40);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_LT(p.seconds, 10) << p.out;
  size_t at = p.out.find("[rank 0] worker error: all_reduce #");
  ASSERT_NE(at, std::string::npos) << p.out;
  std::string line = p.out.substr(at, p.out.find('\n', at) - at);
  EXPECT_NE(line.find("rank 1 (last started: all_reduce #10) stopped answering: not in all_reduce #11"),
            std::string::npos) << line;
  // Issue 10: the wait is not silent (with a 2 s timeout, a line after 1 s).
  EXPECT_NE(p.out.find("all_reduce #11: still waiting after 1 s (gives up after 2 s)"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("rank 0 exited with code 3"), std::string::npos) << p.out;
  // issue 14: rank 0 exits first, but the job failed because of rank 1, which rank 0's collective
  // blamed in its report to the launcher's store; the launcher names rank 1, and says both.
  EXPECT_NE(p.out.find("job failed: rank 1 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("when torn down, blamed by rank(s) 0 whose collective failed: rank 1 (last started: "
                       "all_reduce #10) stopped answering"),
            std::string::npos)
      << p.out;
  EXPECT_NE(p.out.find("; rank 0 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find(") exited with code 3 first, its collective having failed"), std::string::npos) << p.out;
}

#ifdef ATOLL_HAVE_MPI
// Under mpirun, mpirun itself notices the dead rank, names it, and ends the job.
TEST(Fault, MpiKilledRankEndsTheJobAndIsNamed) {
  Proc p = run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "ATOLL_COMM_TIMEOUT=8",
                self_exe(), "--worker", "fault", "2", "kill", "20"},
               40, {"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1"});
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_LT(p.seconds, 13) << p.out;
  EXPECT_NE(p.out.find("process rank 2"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("signal 9"), std::string::npos) << p.out;
}

// A stopped rank: our deadline turns MPI's endless wait into an error, then MPI_Abort ends the job.
TEST(Fault, MpiStoppedRankTimesOutNotHangs) {
  Proc p = run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "ATOLL_COMM_TIMEOUT=2",
                self_exe(), "--worker", "fault", "1", "stop", "10"},
               40, {"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1"});
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_LT(p.seconds, 10) << p.out;
  EXPECT_NE(p.out.find("worker error: all_reduce #11 on mpi rank 0 (of 2) failed: no answer within the timeout of 2.0 s"),
            std::string::npos) << p.out;
}
#endif

// SIGTERM (or Ctrl-C) to the launcher stops every rank and fails the job.
TEST(Launch, SignalToLauncherStopsAllRanks) {
  std::string script = fmt::format(
      "'{}' launch --nproc-per-node 2 -- sh -c 'echo started; exec sleep 60' & L=$!; sleep 0.5; kill -TERM $L; "
      "wait $L; echo launcher-status $?",
      atoll_exe());
  Proc p = run({"sh", "-c", script}, 30);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_LT(p.seconds, 10) << p.out;
  EXPECT_NE(p.out.find("launcher-status 1"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("job failed: interrupted by signal 15"), std::string::npos) << p.out;
  EXPECT_EQ(count_of(p.out, "was killed by signal 15 (SIGTERM)"), 2) << p.out;
}

// torchrun compatibility: PyTorch's own env:// rendezvous (rank 0 hosts a TCPStore at
// MASTER_PORT) works under `atoll launch`, which keeps its store on a separate port. This is what
// lets the benchmarks run PyTorch DDP/FSDP and atoll under the same launcher.
TEST(Launch, TorchDistributedRunsUnderTheLauncher) {
  const char* py =
      "import torch, torch.distributed as d\n"
      "d.init_process_group('gloo')\n"
      "t = torch.full((3,), float(d.get_rank() + 1)); d.all_reduce(t)\n"
      "print('torch', d.get_rank(), d.get_world_size(), t.tolist())\n"
      "d.destroy_process_group()\n";
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", "2", "--", ATOLL_PYTHON, "-c", py}, 90);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 0] torch 0 2 [3.0, 3.0, 3.0]\n"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[rank 1] torch 1 2 [3.0, 3.0, 3.0]\n"), 1) << p.out;
}

namespace {

// Whether pid is a live process (a zombie waiting for a reaper counts as gone).
bool alive(int pid) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  std::getline(f, s);
  size_t close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z';
}

// Reads dir/pid.<rank> for each rank, waiting for the files (bounded).
std::vector<int> rank_pids(const std::string& dir, int n) {
  std::vector<int> pids;
  for (int r = 0; r < n; ++r) {
    int pid = 0;
    for (int i = 0; i < 200 && pid == 0; ++i) {
      std::ifstream f(dir + "/pid." + std::to_string(r));
      if (!(f >> pid)) pid = 0;
      if (pid == 0) usleep(50000);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Waits up to seconds for every pid to be gone; returns the survivors.
std::vector<int> survivors(const std::vector<int>& pids, double seconds) {
  auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::vector<int> left;
  do {
    left.clear();
    for (int p : pids)
      if (alive(p)) left.push_back(p);
    if (left.empty()) break;
    usleep(50000);
  } while (std::chrono::steady_clock::now() < until);
  return left;
}

std::string scratch_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "atoll_launch_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace

// Issue 10: kill -9 of the launcher used to leave its ranks training for minutes. The
// parent-death signal (SIGTERM) ends them.
TEST(Launch, KilledLauncherTakesItsRanksWithIt) {
  std::string d = scratch_dir("pdeath");
  std::string script = fmt::format(
      "'{}' launch --nproc-per-node 2 -- sh -c 'echo $$ > {}/pid.$RANK; exec sleep 60' > /dev/null 2>&1 & L=$!; "
      "i=0; while [ $i -lt 200 ] && ! [ -s {}/pid.1 ]; do sleep 0.05; i=$((i+1)); done; kill -9 $L; echo killed",
      atoll_exe(), d, d);
  Proc p = run({"sh", "-c", script}, 30);
  ASSERT_NE(p.out.find("killed"), std::string::npos) << p.out;
  std::vector<int> pids = rank_pids(d, 2);
  ASSERT_GT(pids[0], 0);
  ASSERT_GT(pids[1], 0);
  std::vector<int> left = survivors(pids, 10);
  for (int s : left) ::kill(s, SIGKILL);  // do not leave them behind when the test fails
  EXPECT_TRUE(left.empty()) << left.size() << " rank(s) outlived their launcher";
  std::filesystem::remove_all(d);
}

// A rank that does not act on SIGTERM still goes, by the watchdog (comm/launcher_watch.h), and
// says why.
TEST(Launch, RankOfADeadLauncherExitsWithAMessage) {
  std::string d = scratch_dir("watch");
  std::string script = fmt::format(
      "ATOLL_LAUNCHER_GRACE=1 '{}' launch --nproc-per-node 2 -- '{}' --worker orphan {} > /dev/null 2>&1 & L=$!; "
      "i=0; while [ $i -lt 400 ] && ! [ -s {}/pid.1 ]; do sleep 0.05; i=$((i+1)); done; sleep 0.3; kill -9 $L; "
      "echo killed $L",
      atoll_exe(), self_exe(), d, d);
  Proc p = run({"sh", "-c", script}, 40);
  ASSERT_NE(p.out.find("killed"), std::string::npos) << p.out;
  std::vector<int> pids = rank_pids(d, 2);
  ASSERT_GT(pids[0], 0);
  ASSERT_GT(pids[1], 0);
  std::vector<int> left = survivors(pids, 15);
  for (int s : left) ::kill(s, SIGKILL);
  EXPECT_TRUE(left.empty()) << left.size() << " rank(s) outlived their launcher";
  for (int r = 0; r < 2; ++r) {
    std::ifstream f(d + "/err." + std::to_string(r));
    std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(err.find("atoll: rank " + std::to_string(r) + ": its launcher (`atoll launch`, pid"), std::string::npos)
        << err;
    EXPECT_NE(err.find("is gone; stopping"), std::string::npos) << err;
  }
  std::filesystem::remove_all(d);
}
