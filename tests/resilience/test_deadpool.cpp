// DeadPool (resilience/peer_snapshot.h, deadpool.h, the lighthouse's spare pool): in-memory peer
// snapshots that survive a cut or corrupt transfer, and kill -9 of a slot in a 3-slot job with one
// spare (the job goes on at full size, bitwise equal to an uninterrupted run) or none (the quorum
// goes on without the slot and says so).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "dp_toy.h"
#include "proc.h"
#include "resilience/deadpool.h"
#include "resilience/lighthouse.h"
#include "resilience/line_socket.h"
#include "resilience/peer_snapshot.h"

namespace atl::resilience::test {
namespace {

using namespace std::chrono_literals;

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("atoll_dp_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A snapshot sent through a sender, waited for.
void send(SnapshotSender& s, int64_t step, const std::string& blob) {
  s.snapshot(step, {{blob.data(), blob.size()}});
  s.fence();
  ASSERT_TRUE(s.wait_acked(step, 10s)) << "step " << step << " never acknowledged";
}

// A PUT by hand: the header, then only `send_bytes` of the payload, then the connection closes (a
// sender killed mid-transfer) or, when send_bytes is everything, a payload whose CRC is wrong.
std::string raw_put(int port, int owner, int64_t step, const std::string& payload, size_t send_bytes, uint32_t crc) {
  LineConn c(connect_to("127.0.0.1", port, 5000ms));
  c.send_line(fmt::format("PUT {} {} {} {}", owner, step, payload.size(), crc));
  c.send_bytes(payload.data(), send_bytes);
  std::string reply;
  if (send_bytes == payload.size()) c.read_line(reply, 5000ms);
  return reply;
}

}  // namespace

// Double buffering at the holder: a transfer cut halfway (its sender died) and one whose checksum
// fails are refused, and the owner's previous complete snapshot is what a spare gets; a later good
// one replaces it. At the owner: the copy is of the state at snapshot() time, so changing the state
// after fence() does not change what was sent.
TEST(PeerSnapshot, HolderKeepsTheLastCompleteSnapshotWhenATransferIsCutOrCorrupt) {
  SnapshotHolder holder("127.0.0.1", 0);
  std::string addr = "127.0.0.1:" + std::to_string(holder.port());
  SnapshotSender sender(3, [&] { return addr; });
  std::string a(100000, 'a');
  send(sender, 7, a);
  a.assign(a.size(), 'z');  // after fence(): the live state moves on, the snapshot must not
  auto got = fetch_snapshot("127.0.0.1", holder.port(), 3, 5000ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 7);
  EXPECT_EQ(got->blob, std::string(100000, 'a'));

  std::string b(200000, 'b');
  EXPECT_EQ(raw_put(holder.port(), 3, 8, b, b.size() / 2, crc32c(b)), "");  // cut: no answer
  EXPECT_EQ(raw_put(holder.port(), 3, 9, b, b.size(), crc32c(b) ^ 1u).rfind("BAD", 0), 0u);
  for (int i = 0; i < 200 && holder.rejected() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(holder.rejected(), 2);
  got = fetch_snapshot("127.0.0.1", holder.port(), 3, 5000ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 7) << "a cut or corrupt transfer replaced the complete snapshot";
  EXPECT_EQ(got->blob, std::string(100000, 'a'));
  EXPECT_FALSE(fetch_snapshot("127.0.0.1", holder.port(), 4, 5000ms).has_value()) << "owner 4 sent nothing";

  send(sender, 10, b);
  got = fetch_snapshot("127.0.0.1", holder.port(), 3, 5000ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_EQ(got->blob, b);
  EXPECT_EQ(holder.received(), 2);
}

// The holder dies and comes back at another address (a spare took its slot): the sender's failed
// transfer is retried against the address it resolves again, and nothing newer is lost.
TEST(PeerSnapshot, SenderFindsAReplacedHolderAtItsNewAddress) {
  auto h1 = std::make_unique<SnapshotHolder>("127.0.0.1", 0);
  std::mutex mu;
  std::string addr = "127.0.0.1:" + std::to_string(h1->port());
  SnapshotSender sender(0, [&] {
    std::lock_guard<std::mutex> lk(mu);
    return addr;
  });
  send(sender, 1, "one");
  h1.reset();
  sender.snapshot(2, {});  // an empty snapshot is a snapshot too
  sender.fence();
  std::string two = "two";
  std::this_thread::sleep_for(100ms);  // it fails against the dead address meanwhile
  SnapshotHolder h2("127.0.0.1", 0);
  {
    std::lock_guard<std::mutex> lk(mu);
    addr = "127.0.0.1:" + std::to_string(h2.port());
  }
  send(sender, 3, two);
  auto got = fetch_snapshot("127.0.0.1", h2.port(), 0, 5000ms);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 3);
  EXPECT_EQ(got->blob, "two");
  EXPECT_GE(sender.stats().failures, 1) << "the dead holder was never tried";
}

namespace {

struct DpLog {
  std::vector<std::pair<int64_t, int64_t>> commits;  // (step, wall ms)
  std::vector<std::pair<int64_t, int64_t>> heals;    // (from, to) from "rolled own state forward"
  int64_t restored_step = -1, restored_at = -1, final_step = -1;
  std::string hash, weights_hash, text;
};

DpLog parse(const std::string& path) {
  DpLog r;
  r.text = read_file(path);
  std::istringstream in(r.text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string k;
    l >> k;
    if (k == "commit") {
      int64_t s, t;
      l >> s >> t;
      r.commits.push_back({s, t});
    } else if (k == "rolled") {
      auto f = line.find("from step "), t = line.find(" to ");
      r.heals.push_back({std::atoll(line.c_str() + f + 10), std::atoll(line.c_str() + t + 4)});
    } else if (k == "restored") {
      auto s = line.find("of step ");
      auto at = line.rfind(" at ");
      r.restored_step = std::atoll(line.c_str() + s + 8);
      r.restored_at = std::atoll(line.c_str() + at + 4);
    } else if (k == "final") {
      l >> r.final_step >> r.hash >> r.weights_hash;
    }
  }
  return r;
}

pid_t start(int id, int slots, int steps, const Lighthouse& lh, int sleep_ms, int every, bool spare,
            const std::string& tag) {
  return spawn({self_exe(), "--dp-replica", std::to_string(id), std::to_string(slots), std::to_string(steps),
                std::to_string(lh.port()), std::to_string(sleep_ms), std::to_string(every), spare ? "1" : "0"},
               {"ATOLL_FT_HEARTBEAT_MS=100", "OMP_NUM_THREADS=1"}, tmp(tag + ".log"));
}

int64_t min_step(const Lighthouse& lh, int n) {
  auto j = nlohmann::json::parse(lh.status());
  int64_t m = -1;
  int k = 0;
  for (auto& r : j["replicas"])
    if (r["alive"].get<bool>()) {
      int64_t s = r["step"].get<int64_t>();
      m = k++ == 0 ? s : std::min(m, s);
    }
  return k == n ? m : -1;
}

// Each step 1..steps committed once, in order, except steps a heal brought.
void expect_every_step_once(const DpLog& l, int64_t first, int64_t steps, const std::string& who) {
  int64_t want = first;
  for (auto& [st, t] : l.commits) {
    if (st != want) {
      bool healed = std::any_of(l.heals.begin(), l.heals.end(), [&](auto& h) { return h.first == want - 1 && h.second == st - 1; });
      ASSERT_TRUE(healed) << who << ": step " << st << " follows step " << want - 1 << " without a heal:\n" << l.text;
    }
    want = st + 1;
  }
  EXPECT_EQ(want, steps + 1) << who << ":\n" << l.text;
}

}  // namespace

// kill -9 of slot 1 of 3 mid-run, one spare in the pool: the spare takes slot 1, restores it from
// slot 2's in-memory copy (rolling slot 1's own RNG forward over the steps since that snapshot,
// snapshots every 3 steps), the communicator is rebuilt over the new membership and the job goes
// on at full size. Every step's shares of all 3 slots are counted exactly once, so each process
// ends bitwise equal to its slot in the one-process uninterrupted reference (fixed-point sums: the
// order of summation does not matter; a lost, doubled or skipped share, or a wrong RNG, changes
// the hash).
TEST(DeadPool, ASpareTakesAKilledSlotsPlaceAndTheJobEndsBitwiseEqualToAnUninterruptedRun) {
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = 600ms;
  lo.min_replicas = 3;
  lo.slots = 3;
  lo.refill_timeout = 15s;
  Lighthouse lh(lo);
  const int steps = 60, sleep_ms = 20, every = 3;
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) pids.push_back(start(i, 3, steps, lh, sleep_ms, every, false, "s" + std::to_string(i)));
  pid_t spare = start(100, 3, steps, lh, sleep_ms, every, true, "spare");
  auto t0 = std::chrono::steady_clock::now();
  while (min_step(lh, 3) < 20) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, 60s) << lh.status();
    std::this_thread::sleep_for(2ms);
  }
  std::this_thread::sleep_for(7ms);
  ::kill(pids[1], SIGKILL);
  int64_t killed_at = wall_ms();
  EXPECT_EQ(wait_for(pids[1], 10), 128 + SIGKILL);
  std::map<int, DpLog> logs;
  for (int i : {0, 2}) {
    EXPECT_EQ(wait_for(pids[size_t(i)], 120), 0) << read_file(tmp("s" + std::to_string(i) + ".log"));
    logs[i] = parse(tmp("s" + std::to_string(i) + ".log"));
  }
  EXPECT_EQ(wait_for(spare, 60), 0) << read_file(tmp("spare.log"));
  DpLog sp = parse(tmp("spare.log"));
  auto ref = dp_reference(3, steps);
  ASSERT_NE(ref[0], ref[1]) << "the slots' own RNGs must make their hashes differ, or the check below is weak";
  auto st = nlohmann::json::parse(lh.status());
  EXPECT_EQ(st["swaps"], nlohmann::json::parse("[[1,100]]")) << st.dump();
  EXPECT_TRUE(st["vacant"].empty()) << st.dump();
  for (auto& [i, l] : logs) {
    EXPECT_EQ(l.text.find("no spare left"), std::string::npos) << "slot " << i << " ran a reduced quorum:\n" << l.text;
    expect_every_step_once(l, 1, steps, "slot " + std::to_string(i));
    EXPECT_EQ(l.final_step, steps);
    EXPECT_EQ(l.hash, ref[size_t(i)]) << "slot " << i << " differs from the uninterrupted run:\n" << l.text;
  }
  ASSERT_GE(sp.restored_step, 0) << sp.text;
  // The snapshot is at most `every` steps (+1: the step in flight at the kill) behind the job.
  int64_t job_at_kill = 0;
  for (auto& [s, t] : logs[0].commits)
    if (t <= killed_at) job_at_kill = s;
  EXPECT_GE(sp.restored_step, job_at_kill - every) << sp.text;
  EXPECT_LE(sp.restored_step, job_at_kill + 1) << sp.text;
  ASSERT_FALSE(sp.commits.empty()) << sp.text;
  expect_every_step_once(sp, sp.commits.front().first, steps, "the spare");
  EXPECT_EQ(sp.final_step, steps) << sp.text;
  EXPECT_EQ(sp.hash, ref[1]) << "the spare is not bitwise slot 1 of the uninterrupted run:\n" << sp.text;
  int64_t next = -1;
  for (auto& [s, t] : logs[0].commits)
    if (t > killed_at) {
      next = t;
      break;
    }
  ASSERT_GT(next, 0);
  EXPECT_LE(next - killed_at, 10000) << "hot swap slower than the issue's 10 s target:\n"
                                     << logs[0].text << logs[2].text << sp.text;
  std::printf("hot swap: spare restored slot 1 from the snapshot of step %lld (job at step %lld) %lld ms after the "
              "kill; next full-size commit %lld ms after the kill\n",
              static_cast<long long>(sp.restored_step), static_cast<long long>(job_at_kill),
              static_cast<long long>(sp.restored_at - killed_at), static_cast<long long>(next - killed_at));
  for (auto n : {"s0", "s1", "s2", "spare"}) std::filesystem::remove(tmp(std::string(n) + ".log"));
}

// The same kill with the pool empty: the lighthouse says the slot is vacant, the survivors say
// they go on without it, and they finish every step, equal to each other (the skipped share makes
// them differ from the full-size reference, which is the point of a spare).
TEST(DeadPool, WithNoSpareLeftTheQuorumGoesOnWithoutTheSlotAndSaysSo) {
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = 600ms;
  lo.min_replicas = 3;
  lo.slots = 3;
  Lighthouse lh(lo);
  const int steps = 40, sleep_ms = 20;
  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i) pids.push_back(start(i, 3, steps, lh, sleep_ms, 1, false, "n" + std::to_string(i)));
  auto t0 = std::chrono::steady_clock::now();
  while (min_step(lh, 3) < 10) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, 60s) << lh.status();
    std::this_thread::sleep_for(2ms);
  }
  ::kill(pids[2], SIGKILL);
  int64_t killed_at = wall_ms();
  EXPECT_EQ(wait_for(pids[2], 10), 128 + SIGKILL);
  std::map<int, DpLog> logs;
  for (int i : {0, 1}) {
    EXPECT_EQ(wait_for(pids[size_t(i)], 120), 0) << read_file(tmp("n" + std::to_string(i) + ".log"));
    logs[i] = parse(tmp("n" + std::to_string(i) + ".log"));
    EXPECT_NE(logs[i].text.find("no spare left for slot(s) 2"), std::string::npos) << logs[i].text;
    EXPECT_EQ(logs[i].final_step, steps) << logs[i].text;
    int64_t next = -1;
    for (auto& [s, t] : logs[i].commits)
      if (t > killed_at) {
        next = t;
        break;
      }
    ASSERT_GT(next, 0) << logs[i].text;
    EXPECT_LE(next - killed_at, 2000) << "without a spare the quorum must not wait:\n" << logs[i].text;
  }
  EXPECT_EQ(logs[0].weights_hash, logs[1].weights_hash);
  EXPECT_NE(logs[0].hash, dp_reference(3, steps)[0]) << "slot 2's share was skipped: the run cannot equal the full one";
  auto st = nlohmann::json::parse(lh.status());
  EXPECT_EQ(st["vacant"], nlohmann::json::parse("[2]")) << st.dump();
  EXPECT_TRUE(st["swaps"].empty()) << st.dump();
  for (auto n : {"n0", "n1", "n2"}) std::filesystem::remove(tmp(std::string(n) + ".log"));
}

// A job that ends normally: finished replicas are not failures, so no spare takes their place, and
// the waiting spare is told it is not needed and exits.
// [fault] snapshot_copies = 2: slot s's snapshot also lives in slot s+2. Slot 1 and its first
// holder (slot 2) lost together: with two copies the spare that takes slot 1 restores it from
// slot 0's memory; with one copy the same loss leaves no snapshot to restore.
TEST(DeadPool, WithTwoCopiesASlotAndItsFirstHolderLostTogetherAreRestoredFromTheSecond) {
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.min_replicas = 3;
  lo.slots = 3;
  Lighthouse lh(lo);
  for (int copies : {2, 1}) {
    SCOPED_TRACE(copies);
    std::vector<std::unique_ptr<PeerCheckpointer>> pc;
    for (int s = 0; s < 3; ++s)
      pc.push_back(std::make_unique<PeerCheckpointer>("127.0.0.1", lh.port(), s, 3, 4, "127.0.0.1", copies));
    std::vector<std::string> state;
    for (int s = 0; s < 3; ++s) state.push_back(fmt::format("the state of slot {} at step 8 ({} copies)", s, copies));
    for (int s = 0; s < 3; ++s) {
      pc[size_t(s)]->after_commit(8, {{state[size_t(s)].data(), state[size_t(s)].size()}});
      pc[size_t(s)]->fence();
      ASSERT_TRUE(pc[size_t(s)]->sender().wait_acked(8, 10s));
      if (copies == 2) ASSERT_TRUE(pc[size_t(s)]->second_sender()->wait_acked(8, 10s));
      else EXPECT_EQ(pc[size_t(s)]->second_sender(), nullptr);
    }
    pc[1].reset();  // slot 1 and its first holder, slot 2, lost together
    pc[2].reset();
    PeerCheckpointer spare("127.0.0.1", lh.port(), 1, 3, 4, "127.0.0.1", copies);
    if (copies == 2) {
      auto snap = spare.fetch_own(4s);
      ASSERT_TRUE(snap.has_value());
      EXPECT_EQ(snap->step, 8);
      EXPECT_EQ(snap->blob, state[1]);
    } else {
      EXPECT_THROW(spare.fetch_own(2s), atl::Error) << "one copy: its only holder is gone";
    }
  }
  // Two copies need a slot after next that is not the slot itself: refused with 2 slots.
  EXPECT_THROW(PeerCheckpointer("127.0.0.1", lh.port(), 0, 2, 4, "127.0.0.1", 2), atl::Error);
}

TEST(DeadPool, ASpareIsReleasedWhenTheJobFinishesWithoutAFailure) {
  LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = 600ms;
  lo.min_replicas = 2;
  lo.slots = 2;
  Lighthouse lh(lo);
  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) pids.push_back(start(i, 2, 15, lh, 5, 1, false, "f" + std::to_string(i)));
  pid_t spare = start(100, 2, 15, lh, 5, 1, true, "fspare");
  for (int i = 0; i < 2; ++i) {
    std::string log = tmp("f" + std::to_string(i) + ".log");
    EXPECT_EQ(wait_for(pids[size_t(i)], 60), 0) << read_file(log);
    EXPECT_EQ(parse(log).final_step, 15) << read_file(log);
  }
  EXPECT_EQ(wait_for(spare, 20), 0) << read_file(tmp("fspare.log"));
  EXPECT_NE(read_file(tmp("fspare.log")).find("spare unused"), std::string::npos) << read_file(tmp("fspare.log"));
  auto st = nlohmann::json::parse(lh.status());
  EXPECT_TRUE(st["swaps"].empty()) << st.dump();
  EXPECT_TRUE(st["vacant"].empty()) << st.dump();
  for (auto n : {"f0", "f1", "fspare"}) std::filesystem::remove(tmp(std::string(n) + ".log"));
}

}  // namespace atl::resilience::test
