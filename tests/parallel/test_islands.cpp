// Training across islands (src/lowcomm) end to end through `atoll launch -- atoll train`:
// DiLoCo with H = 1 and outer SGD(lr 1, no momentum) over a linear inner optimizer is DDP;
// Streaming DiLoCo with P = 1, tau = 0, alpha = 0 is DiLoCo; after every outer step the islands
// hold bitwise the same parameters (read from checkpoints, which carry every island's state);
// stopped and resumed runs are bit-exact; bad island layouts are refused before step 1; an island
// whose link drops mid-sync makes the others fail with a message. Iso-C on a known matrix. Sync
// policies (workload_aware, matched_random) decide alike on every island.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "comm/tcp_store.h"
#include "harness.h"
#include "launch_fixture.h"
#include "lowcomm/iso_merge.h"
#include "lowcomm/lowcomm.h"
#include "optim/sgd.h"
#include "tensor/safetensors.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

// A 2-block GPT-2 tiny, 6 steps, neither evaluated nor checkpointed unless a test says so; every
// run goes through `atoll launch` (one rank an island too).
struct Islands : LaunchFixture {
  Islands()
      : LaunchFixture("islands",
                      "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
                      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
                      "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
                      "keep = 100\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n",
                      4242) {}
  int train(const std::string& run, int ranks, std::vector<std::string> extra, bool expect_fail = false) {
    return LaunchFixture::train(run, ranks, std::move(extra), expect_fail, /*always_launch=*/true);
  }
  std::vector<nlohmann::json> metrics(const std::string& run) {
    std::ifstream f(root / run / "metrics.jsonl");
    std::vector<nlohmann::json> out;
    std::string line;
    while (std::getline(f, line))
      if (!line.empty()) {
        auto j = nlohmann::json::parse(line);
        if (j.contains("loss")) out.push_back(j);
      }
    return out;
  }
};

// Every tensor of a checkpoint file, concatenated in file order.
std::vector<float> all_of(const TensorFile& f, const std::string& prefix = "") {
  std::vector<float> v;
  for (auto& [n, t] : f.tensors)
    if (t.dtype() == DType::f32 && n.rfind(prefix, 0) == 0 && (prefix.empty() ? n.rfind("lowcomm.", 0) != 0 : true)) {
      auto x = t.contiguous().to_vector();
      v.insert(v.end(), x.begin(), x.end());
    }
  return v;
}
std::vector<float> model_of(const fs::path& ck) { return all_of(load_safetensors((ck / "model.safetensors").string())); }

}  // namespace

// Averaging the parameters of islands that each took one SGD step equals one step on the
// averaged gradient (SGD is linear in the gradient; AdamW is not, so the inner optimizer here is
// SGD with momentum, and clipping, which uses each island's own norm, is off). What differs is
// rounding: x - 1 * mean(x - x_i) against x - lr * mean(g), a few ulps per step; over 6 steps
// that stays far below 1e-6 (measured ~1e-7 relative, printed).
TEST(Islands, DiLoCoWithOneInnerStepEqualsDdp) {
  Islands f;
  const std::vector<std::string> sgd = {"--optim.type=sgd", "--optim.sgd.lr=0.5", "--optim.sgd.momentum=0.9",
                                        "--train.grad_clip=0"};
  ASSERT_EQ(f.train("ddp", 2, sgd), 0);
  ASSERT_EQ(f.train("diloco", 2, with(sgd, {"--parallel.islands=2", "--lowcomm.method=diloco", "--lowcomm.inner_steps=1",
                                            "--lowcomm.outer_lr=1", "--lowcomm.outer_momentum=0"})),
            0);
  EXPECT_NE(f.log("diloco").find("islands: diloco over 2 islands, H = 1"), std::string::npos) << f.log("diloco");
  auto ddp = model_of(f.ckpt("ddp", 6)), dl = model_of(f.ckpt("diloco", 6));
  ASSERT_FALSE(ddp.empty());
  // The comparison means something only if training moved the parameters.
  Islands* g = &f;
  ASSERT_EQ(g->train("init", 2, with(sgd, {"--train.steps=1", "--optim.sgd.lr=0"})), 0);
  EXPECT_GT(rel_diff(ddp, model_of(f.ckpt("init", 1))), 1e-3) << "training did not move the parameters";
  double d = rel_diff(dl, ddp);
  std::printf("DiLoCo H=1 vs DDP: relative difference %.2e\n", d);
  EXPECT_LT(d, 1e-6);
  // Each outer step sent the pseudo-gradient once over the islands' link.
  auto m = f.metrics("diloco");
  ASSERT_EQ(m.size(), 6u);
  for (auto& j : m) EXPECT_TRUE(j.contains("sync")) << j.dump();
}

// The same arithmetic reached by a different schedule: one fragment holding every parameter,
// applied at once and not mixed, must give DiLoCo's bits.
TEST(Islands, StreamingWithOneFragmentAndNoOverlapEqualsDiLoCo) {
  Islands f;
  const std::vector<std::string> common = {"--parallel.islands=2", "--lowcomm.inner_steps=2", "--checkpoint.every=2"};
  ASSERT_EQ(f.train("diloco", 2, with(common, {"--lowcomm.method=diloco"})), 0);
  ASSERT_EQ(f.train("stream", 2, with(common, {"--lowcomm.method=streaming", "--lowcomm.fragments=1",
                                               "--lowcomm.overlap_steps=0", "--lowcomm.mixing=0"})),
            0);
  for (int s : {2, 4, 6}) {
    auto a = model_of(f.ckpt("diloco", s)), b = model_of(f.ckpt("stream", s));
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(rel_diff(b, a), 0.0) << "step " << s;
  }
  // And with 2 fragments overlapped by one step it is a different method (the test would see it).
  ASSERT_EQ(f.train("stream2", 2, with(common, {"--lowcomm.method=streaming", "--lowcomm.fragments=2",
                                                "--lowcomm.overlap_steps=1"})),
            0);
  EXPECT_GT(rel_diff(model_of(f.ckpt("stream2", 6)), model_of(f.ckpt("diloco", 6))), 1e-6);
  EXPECT_NE(f.log("stream2").find("2 fragments, overlap 1 steps"), std::string::npos) << f.log("stream2");
}

// 4 ranks = 2 islands of 2 (DDP inside, each rank sending half the pseudo-gradient across): the
// checkpoint after each outer step holds island 1's parameters bitwise equal to island 0's; one
// taken mid-round shows them apart (so the comparison can fail).
// With an int8 exchange (error feedback per rank) too: the islands decode the same bits, and the
// pseudo-gradient costs under a third of fp32's bytes.
TEST(Islands, AfterEveryOuterStepAllIslandsHoldTheSameParameters) {
  int64_t fp32_bytes = 0;
  // And 4 islands of one rank (their states gathered for the checkpoint while the exchanges go on).
  for (std::string method : {"diloco", "isoloco", "diloco_int8", "diloco_m4"}) {
    Islands f;
    const int M = method == "diloco_m4" ? 4 : 2;
    std::vector<std::string> args = {"--parallel.islands=" + std::to_string(M), "--lowcomm.inner_steps=2",
                                     "--checkpoint.every=1", "--lowcomm.method=" + method.substr(0, method.find('_'))};
    if (method == "diloco_int8") args.push_back("--lowcomm.exchange=int8");
    ASSERT_EQ(f.train(method, 4, args), 0);
    for (int s = 1; s <= 6; ++s) {
      TensorFile opt = load_safetensors((f.ckpt(method, s) / "optimizer.safetensors").string());
      std::vector<float> i1 = all_of(opt, "lowcomm.island" + std::to_string(M - 1) + ".model.");
      std::vector<float> i0 = model_of(f.ckpt(method, s));
      ASSERT_EQ(i1.size(), i0.size()) << method << " step " << s;
      if (s % 2 == 0) EXPECT_EQ(rel_diff(i1, i0), 0.0) << method << ": islands differ after outer step at " << s;
      else EXPECT_GT(rel_diff(i1, i0), 0.0) << method << ": islands equal mid-round at step " << s;
    }
    auto m = f.metrics(method);
    ASSERT_EQ(m.size(), 6u);
    const auto& sync = m[1].at("sync");
    EXPECT_GT(sync.at("wan_bytes").get<int64_t>(), 0);
    if (method == "diloco") fp32_bytes = sync.at("wan_bytes").get<int64_t>();
    if (method == "diloco_int8") {
      EXPECT_NE(f.log(method).find("exchange int8"), std::string::npos) << f.log(method);
      EXPECT_LT(3 * sync.at("wan_bytes").get<int64_t>(), fp32_bytes);
    }
    EXPECT_GT(sync.at("compute_util").get<double>(), 0.0);
    EXPECT_LE(sync.at("compute_util").get<double>(), 1.0);
  }
}

// Stopped mid-round (step 4 of rounds of 3; Streaming with an exchange in flight), resumed:
// the same parameters and the same losses, bit for bit, as the run that never stopped. With a
// codec too (nvfp4: error feedback and stochastic rounding, whose residuals and counters every
// rank saves — 2 islands of 2 ranks; int8 per Streaming fragment, its exchange in flight over
// the resume point; gift_int8, whose learned geometry is saved too, every matrix transformed):
// without them in the checkpoint, the outer step after the resume would differ.
TEST(Islands, StoppedAndResumedIsBitExact) {
  Islands f;
  for (auto method : std::vector<std::vector<std::string>>{
           {"--lowcomm.method=diloco"},
           {"--lowcomm.method=streaming", "--lowcomm.fragments=2", "--lowcomm.overlap_steps=1"},
           {"--lowcomm.method=diloco", "--lowcomm.exchange=nvfp4"},
           {"--lowcomm.method=streaming", "--lowcomm.fragments=2", "--lowcomm.overlap_steps=1",
            "--lowcomm.exchange=int8"},
           {"--lowcomm.method=diloco", "--lowcomm.gift_min_anisotropy=1", "--lowcomm.exchange=gift_int8"}}) {
    std::string tag = method[0].substr(method[0].find('=') + 1);
    if (method.back().rfind("--lowcomm.exchange=", 0) == 0) tag += "_" + method.back().substr(19);
    const int ranks = tag == "diloco_nvfp4" ? 4 : 2;
    auto args = with({"--parallel.islands=2", "--lowcomm.inner_steps=3", "--train.steps=8"}, method);
    ASSERT_EQ(f.train(tag + "_full", ranks, args), 0);
    ASSERT_EQ(f.train(tag + "_cut", ranks, with(args, {"--train.stop_after=4"})), 0);
    if (tag != "diloco" && tag != "streaming") {
      TensorFile opt = load_safetensors((f.ckpt(tag + "_cut", 4) / "optimizer.safetensors").string());
      int64_t residuals = 0;
      for (auto& [n, t] : opt.tensors)
        if (n.rfind("lowcomm.exchange.rank" + std::to_string(ranks - 1) + ".", 0) == 0 &&
            n.find(".residual") != std::string::npos)
          residuals += t.numel();
      EXPECT_GT(residuals, 0) << tag << ": the last rank's error feedback is not in the checkpoint";
      if (tag == "diloco_gift_int8") {
        EXPECT_NE(opt.find("lowcomm.exchange.rank1.pseudo_gradient.gift"), nullptr) << "GIFT's geometry is not in the checkpoint";
      }
    }
    ASSERT_EQ(f.train(tag + "_cut", ranks, with(args, {"--resume"})), 0);
    EXPECT_NE(f.log(tag + "_cut").find("resumed from"), std::string::npos) << f.log(tag + "_cut");
    EXPECT_EQ(rel_diff(model_of(f.ckpt(tag + "_cut", 8)), model_of(f.ckpt(tag + "_full", 8))), 0.0) << tag;
    auto a = f.metrics(tag + "_full"), b = f.metrics(tag + "_cut");
    ASSERT_EQ(a.size(), 8u);
    ASSERT_EQ(b.size(), 8u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].at("loss"), b[i].at("loss")) << tag << " step " << i + 1;
  }
}

TEST(Islands, BadLayoutsAreRefusedBeforeTheFirstStep) {
  Islands f;
  EXPECT_NE(f.train("three", 2, {"--parallel.islands=3"}, true), 0);
  std::string log = f.log("three");
  EXPECT_NE(log.find("does not divide WORLD_SIZE = 2"), std::string::npos) << log;
  EXPECT_EQ(log.find("step     1"), std::string::npos) << log;
  // (hsdp inside the islands, refused here until session 8, is composed: test_islands_sharded.cpp.)
  EXPECT_NE(f.train("tau", 2, {"--parallel.islands=2", "--lowcomm.method=streaming", "--lowcomm.inner_steps=2",
                               "--lowcomm.overlap_steps=2"}, true), 0);
  EXPECT_NE(f.log("tau").find("lowcomm.overlap_steps = 2"), std::string::npos) << f.log("tau");
  // A method's key under another method is unknown, not silently ignored.
  EXPECT_NE(f.train("key", 2, {"--parallel.islands=2", "--lowcomm.fragments=2"}, true), 0);
  EXPECT_NE(f.log("key").find("lowcomm.fragments"), std::string::npos) << f.log("key");
}

// Islands whose exchange codecs differ (or one names a codec this build lacks) are refused on
// every rank before step 1, each rank's setting named. The ranks are started directly, each
// with its own command line (the launcher gives every rank the same one).
TEST(Islands, ACodecMismatchAcrossIslandsIsRefusedOnEveryRank) {
  Islands f;
  for (auto [other, why] : {std::pair<std::string, std::string>{"nvfp4", "rank 1: codec=nvfp4"},
                            {"int9", "'int9' (command line"}}) {
    int port = comm::pick_free_port();
    std::vector<int> codes(2, -2);
    std::vector<std::thread> th;
    for (int r = 0; r < 2; ++r)
      th.emplace_back([&, r] {
        codes[size_t(r)] = run_command(
            {atoll_exe(), "train", f.cfg.string(), "--run.dir=" + (f.root / ("mm" + std::to_string(r))).string(),
             "--parallel.islands=2", "--lowcomm.exchange=" + (r == 0 ? std::string("int8") : other)},
            {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2",
             "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port), "ATOLL_COMM_TIMEOUT=20",
             "OMP_NUM_THREADS=1"},
            (f.root / ("mm.log" + std::to_string(r))).string(), 60);
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < 2; ++r) {
      std::string log = read_file((f.root / ("mm.log" + std::to_string(r))).string());
      EXPECT_NE(codes[size_t(r)], 0) << log;
      EXPECT_NE(codes[size_t(r)], -1) << "rank " << r << " hung:\n" << log;
      EXPECT_NE(log.find("ranks disagree on the gradient codec (lowcomm.exchange"), std::string::npos) << log;
      EXPECT_NE(log.find("rank 0: codec=int8"), std::string::npos) << log;
      if (other == "nvfp4" || r == 1) EXPECT_NE(log.find(why), std::string::npos) << log;
      EXPECT_EQ(log.find("step     1"), std::string::npos) << log;
    }
  }
}

// Island 1 goes silent in its second exchange (no closed socket: a dropped link). Island 0 must
// give up within its communicator timeout (3 s here) with a message naming the collective, not
// hang. The ranks are started directly (no launcher that would stop them when one dies).
TEST(Islands, AnIslandWhoseLinkDropsMakesTheOthersFailWithAMessage) {
  Islands f;
  int port = comm::pick_free_port();
  std::vector<int> codes(2, -2);
  std::vector<std::thread> th;
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r)
    th.emplace_back([&, r] {
      codes[size_t(r)] = run_command(
          {atoll_exe(), "train", f.cfg.string(), "--run.dir=" + (f.root / "drop").string(), "--parallel.islands=2",
           "--lowcomm.inner_steps=2", "--fault.island_drop_at_sync=2"},
          {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=2",
           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port), "ATOLL_COMM_TIMEOUT=3", "OMP_NUM_THREADS=1"},
          (f.root / ("drop.log" + std::to_string(r))).string(), 60);
    });
  th[0].join();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  th[1].join();
  std::string log0 = read_file((f.root / "drop.log0").string());
  EXPECT_NE(codes[0], 0) << log0;
  EXPECT_NE(codes[0], -1) << "island 0 hung instead of failing:\n" << log0;
  EXPECT_LT(s, 30) << log0;
  EXPECT_NE(log0.find("all_reduce"), std::string::npos) << log0;
  EXPECT_NE(read_file((f.root / "drop.log1").string()).find("drops its link"), std::string::npos);
}

// A = U diag(s) V^T with known s: Iso-C must give mean(s) U V^T, i.e. every singular value equal
// to the mean and the singular vectors kept. Double-precision Jacobi, rounded to f32 once: 1e-5
// relative covers f32 storage of A and of the result (~6e-8 each) with room for the sweeps.
TEST(Islands, IsoCEqualizesTheSingularValuesOfAKnownMatrix) {
  for (auto [m, n] : {std::pair<int, int>{12, 5}, {5, 12}, {8, 8}}) {
    const int r = std::min(m, n);
    std::mt19937 rng(7);
    std::normal_distribution<double> nd;
    // Orthonormal columns by Gram-Schmidt.
    auto orth = [&](int rows) {
      std::vector<double> Q(static_cast<size_t>(rows * r));
      for (int k = 0; k < r; ++k) {
        for (int i = 0; i < rows; ++i) Q[size_t(i * r + k)] = nd(rng);
        for (int j = 0; j < k; ++j) {
          double dot = 0;
          for (int i = 0; i < rows; ++i) dot += Q[size_t(i * r + k)] * Q[size_t(i * r + j)];
          for (int i = 0; i < rows; ++i) Q[size_t(i * r + k)] -= dot * Q[size_t(i * r + j)];
        }
        double nn = 0;
        for (int i = 0; i < rows; ++i) nn += Q[size_t(i * r + k)] * Q[size_t(i * r + k)];
        for (int i = 0; i < rows; ++i) Q[size_t(i * r + k)] /= std::sqrt(nn);
      }
      return Q;
    };
    auto U = orth(m), V = orth(n);
    std::vector<double> s(static_cast<size_t>(r));
    double mean = 0;
    for (int k = 0; k < r; ++k) mean += s[size_t(k)] = 10.0 / (1 + 3 * k);  // anisotropic: 10 down to ~0.8
    mean /= r;
    std::vector<float> A(static_cast<size_t>(m * n)), want(static_cast<size_t>(m * n));
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double a = 0, w = 0;
        for (int k = 0; k < r; ++k) {
          a += U[size_t(i * r + k)] * s[size_t(k)] * V[size_t(j * r + k)];
          w += U[size_t(i * r + k)] * mean * V[size_t(j * r + k)];
        }
        A[size_t(i * n + j)] = float(a);
        want[size_t(i * n + j)] = float(w);
      }
    auto got_s = lowcomm::jacobi_svd(A.data(), m, n);
    for (int k = 0; k < r; ++k) EXPECT_NEAR(got_s[size_t(k)], s[size_t(k)], 1e-5 * s[0]) << m << "x" << n << " sigma " << k;
    std::vector<float> B = A;
    lowcomm::iso_c(B.data(), m, n);
    EXPECT_LT(rel_diff(B, want), 1e-5) << m << "x" << n;
    auto iso_s = lowcomm::jacobi_svd(B.data(), m, n);
    for (int k = 0; k < r; ++k) EXPECT_NEAR(iso_s[size_t(k)], mean, 1e-5 * mean) << m << "x" << n << " sigma " << k;
    EXPECT_GT(rel_diff(A, want), 0.1) << "the input must not already be isotropic";
  }
}

namespace {
std::string testbed() { return std::string(ATOLL_SOURCE_DIR) + "/scripts/wan_testbed.sh"; }
}  // namespace

// A topology file is checked before any namespace is made (so without root too): exit 2, the
// reason named.
TEST(Islands, WanTestBedRefusesMalformedTopologiesWithTheReason) {
  Islands f;
  struct Case {
    const char* text;
    const char* reason;
  };
  for (const Case& c : {Case{"ranks_per_island = 2\n", "missing key 'islands'"},
                        Case{"islands = 2\nranks_per_island = 2\n[link]\nrate = \"fast\"\n", "link.rate = 'fast'"},
                        Case{"islands = 2\nranks_per_island = 0\n", "ranks_per_island = 0"},
                        Case{"islands = 2\nranks_per_island = 1\n[link]\nlatency_ms = 1\njitter_ms = 5\n",
                             "link.jitter_ms = 5 exceeds"},
                        Case{"islands = 2\nranks_per_island = 1\nbandwidth = 3\n", "unknown key 'bandwidth'"},
                        Case{"islands = [2\n", "not valid TOML"}}) {
    fs::path topo = f.root / "bad.toml";
    std::ofstream(topo) << c.text;
    std::string log = (f.root / "bad.log").string();
    int rc = run_command({testbed(), topo.string(), "--", "echo never"}, {}, log, 30);
    std::string out = read_file(log);
    EXPECT_EQ(rc, 2) << c.text << out;
    EXPECT_NE(out.find(c.reason), std::string::npos) << c.text << out;
    EXPECT_EQ(out.find("never"), std::string::npos) << out;
  }
}

// A multi-island `atoll launch` across the test bed (2 islands of 2 ranks, 20 Mbit/s, 20 ms):
// DiLoCo trains, and the bytes the veth counters saw for the extra outer steps of a longer run
// match atoll's own count of what it sent, plus TCP/IP headers and acknowledgements (the two
// runs' start-up, rendezvous and checkpoint traffic cancel in the difference).
TEST(Islands, DiLoCoAcrossTheWanTestBedCountsItsBytes) {
  Islands f;
  fs::path topo = f.root / "wan.toml";
  std::ofstream(topo) << "islands = 2\nranks_per_island = 2\n[link]\nrate = \"20mbit\"\nlatency_ms = 20\n"
                         "jitter_ms = 2\n";
  auto run = [&](int steps, nlohmann::json& stats, int64_t& atoll_bytes) {
    std::string run_dir = (f.root / ("wan" + std::to_string(steps))).string();
    std::string cmd = atoll_exe() + " launch --nnodes $NISLANDS --node-rank $ISLAND_INDEX --nproc-per-node "
                      "$RANKS_PER_ISLAND --rdzv $HOST0_ADDR:29400 --timeout 60 -- " + atoll_exe() + " train " +
                      f.cfg.string() + " --run.dir=" + run_dir + "$ISLAND_INDEX --parallel.islands=$NISLANDS " +
                      "--lowcomm.inner_steps=2 --train.steps=" + std::to_string(steps);
    std::string log = (f.root / "wan.log").string(), js = (f.root / "wan.json").string();
    int rc = run_command({testbed(), topo.string(), "--", cmd}, {"WAN_STATS=" + js}, log, 120);
    std::string out = read_file(log);
    if (rc == 77) return out;
    EXPECT_EQ(rc, 0) << out;
    stats = nlohmann::json::parse(read_file(js));
    std::ifstream m(run_dir + "0/metrics.jsonl");
    std::string line;
    atoll_bytes = 0;
    while (std::getline(m, line))
      if (line.find("\"sync\"") != std::string::npos)
        atoll_bytes = nlohmann::json::parse(line).at("sync").at("wan_bytes_job").get<int64_t>();
    return std::string();
  };
  nlohmann::json s4, s8;
  int64_t a4 = 0, a8 = 0;
  std::string skipped = run(4, s4, a4);
  if (!skipped.empty()) GTEST_SKIP() << "the WAN test bed cannot run here: " << skipped;
  ASSERT_TRUE(run(8, s8, a8).empty());
  ASSERT_GT(a8, a4);
  double veth = double(s8.at("total_bytes").get<int64_t>() - s4.at("total_bytes").get<int64_t>());
  double ratio = veth / double(a8 - a4);
  std::printf("WAN test bed: 2 more outer steps: veth %.0f bytes, atoll's count %lld, ratio %.3f\n", veth,
              (long long)(a8 - a4), ratio);
  EXPECT_GT(ratio, 1.0);
  EXPECT_LT(ratio, 1.15);
}

namespace {
// tools/torch_outer_sgd_ref.py: torch.optim.SGD from x0 through the gradients d (steps x n);
// the parameters after each step, or empty (with a failure) when it did not run.
std::vector<std::vector<float>> torch_sgd(double lr, double mu, bool nesterov, const std::vector<float>& x0,
                                          const std::vector<float>& d, int steps) {
  const int n = int(x0.size());
  fs::path in = fs::temp_directory_path() / ("atoll_outer_" + std::to_string(getpid()) + ".txt");
  {
    std::ofstream f(in);
    f.precision(9);
    f << lr << " " << mu << " " << (nesterov ? 1 : 0) << " " << n << " " << steps << "\n";
    for (float v : x0) f << v << " ";
    for (float v : d) f << v << " ";
  }
  std::string log = in.string() + ".out";
  int rc = run_command({"/bin/sh", "-c", std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR +
                                             "/tools/torch_outer_sgd_ref.py < " + in.string()},
                       {}, log, 300);  // `import torch` alone took over 60 s under load 20 (session 8)
  std::string out = read_file(log);
  fs::remove(in);
  fs::remove(log);
  std::vector<std::vector<float>> res;
  if (rc != 0) {
    ADD_FAILURE() << out;
    return res;
  }
  std::istringstream ref(out);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) ref >> v;
    if (!ref) {
      ADD_FAILURE() << out;
      return {};
    }
    res.push_back(x);
  }
  return res;
}
}  // namespace

// The outer optimizer is torch.optim.SGD (Nesterov and plain momentum) fed the pseudo-gradients;
// the inner SGD (optim/sgd.h, no weight decay) is torch.optim.SGD with momentum. Both compute in
// f32 with the same operation order per element, so they agree to an ulp or two: 1e-6 relative.
TEST(Islands, OuterNesterovSgdAndInnerSgdMatchTorch) {
  const int n = 64, steps = 5;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x0(static_cast<size_t>(n)), d(static_cast<size_t>(n * steps));
  for (auto& v : x0) v = nd(rng);
  for (auto& v : d) v = 0.1f * nd(rng);
  for (bool nesterov : {true, false}) {
    lowcomm::LowCommConfig c;
    c.outer_lr = 0.7;
    c.outer_momentum = 0.9;
    c.nesterov = nesterov;
    auto want = torch_sgd(c.outer_lr, c.outer_momentum, nesterov, x0, d, steps);
    ASSERT_EQ(int(want.size()), steps);
    std::vector<float> x = x0, b(static_cast<size_t>(n), 0.f);
    for (int s = 0; s < steps; ++s) {
      lowcomm::outer_sgd(x.data(), b.data(), d.data() + s * n, n, c);
      EXPECT_LT(rel_diff(x, want[size_t(s)]), 1e-6) << "nesterov " << nesterov << " step " << s;
    }
    EXPECT_GT(rel_diff(x, x0), 1e-2) << "the steps must move the parameters";
  }
  // Inner SGD on a [8, 8] parameter: the same gradients, torch's heavy ball.
  auto want = torch_sgd(0.05, 0.9, false, x0, d, steps);
  ASSERT_EQ(int(want.size()), steps);
  Tensor w = Tensor::from_vector(x0, {8, 8}), g = Tensor::zeros({8, 8});
  SgdConfig sc;
  sc.lr = 0.05f;
  sc.momentum = 0.9f;
  Sgd opt({ParamRef{"w", w, g}}, sc);
  for (int s = 0; s < steps; ++s) {
    std::copy(d.begin() + s * n, d.begin() + (s + 1) * n, g.f32());
    opt.step({});
    EXPECT_LT(rel_diff(w.to_vector(), want[size_t(s)]), 1e-6) << "inner sgd step " << s;
  }
}

// Sync policies decide from what every rank has (the step, the seed, the same trace file), so
// the islands sync at the same steps without a message: 2 islands of 1 rank, checkpoints after
// every step; after each sync (found from metrics.jsonl, not assumed) island 1's parameters equal
// island 0's bitwise, and between syncs they differ. The trace 0, 0, 0.9, 0.9, 0, 0 with H = 2
// makes workload_aware sync after steps 2 and 5 (deferring the one fixed H = 2 would make at 4).
TEST(Islands, SyncPoliciesDecideAlikeOnEveryIsland) {
  Islands f;
  fs::path trace = f.root / "load.txt";
  std::ofstream(trace) << "0\n0\n0.9\n0.9\n0\n0\n";
  const std::vector<std::string> common = {"--parallel.islands=2", "--lowcomm.inner_steps=2", "--checkpoint.every=1",
                                           "--lowcomm.sync_trace=" + trace.string()};
  for (auto policy : std::vector<std::vector<std::string>>{
           {"--lowcomm.sync_policy=workload_aware", "--lowcomm.sync_max_defer=100"},
           {"--lowcomm.sync_policy=matched_random", "--lowcomm.sync_budget=2", "--lowcomm.sync_seed=3"}}) {
    std::string tag = policy[0].substr(policy[0].find('=') + 1);
    ASSERT_EQ(f.train(tag, 2, with(common, policy)), 0);
    auto m = f.metrics(tag);
    ASSERT_EQ(m.size(), 6u);
    std::vector<int> synced;
    for (int s = 1; s <= 6; ++s) {
      bool sync = m[size_t(s - 1)].contains("sync");
      if (sync) synced.push_back(s);
      TensorFile opt = load_safetensors((f.ckpt(tag, s) / "optimizer.safetensors").string());
      std::vector<float> i1 = all_of(opt, "lowcomm.island1.model."), i0 = model_of(f.ckpt(tag, s));
      ASSERT_EQ(i1.size(), i0.size());
      if (sync) EXPECT_EQ(rel_diff(i1, i0), 0.0) << tag << ": islands differ after the sync at step " << s;
      else EXPECT_GT(rel_diff(i1, i0), 0.0) << tag << ": islands equal without a sync at step " << s;
    }
    EXPECT_EQ(synced.size(), 2u) << tag;
    if (tag == "workload_aware") EXPECT_EQ(synced, (std::vector<int>{2, 5}));
  }
  // Stopped after step 3 (between the syncs) and resumed: the controller replays its decisions,
  // so the run ends bit for bit where the one that never stopped did.
  auto wa = with(common, {"--lowcomm.sync_policy=workload_aware", "--lowcomm.sync_max_defer=100"});
  ASSERT_EQ(f.train("wa_cut", 2, with(wa, {"--train.stop_after=3"})), 0);
  ASSERT_EQ(f.train("wa_cut", 2, with(wa, {"--resume"})), 0);
  EXPECT_NE(f.log("wa_cut").find("resumed from"), std::string::npos) << f.log("wa_cut");
  EXPECT_EQ(rel_diff(model_of(f.ckpt("wa_cut", 6)), model_of(f.ckpt("workload_aware", 6))), 0.0);
  auto cut = f.metrics("wa_cut");
  ASSERT_EQ(cut.size(), 6u);
  EXPECT_TRUE(cut[4].contains("sync")) << "the resumed run did not sync after step 5";
  std::ofstream(f.root / "bad.txt") << "0\n0.5\n0.5.1\n";
  EXPECT_NE(f.train("bad", 2, with(common, {"--lowcomm.sync_policy=workload_aware",
                                            "--lowcomm.sync_trace=" + (f.root / "bad.txt").string()}), true), 0);
  EXPECT_NE(f.log("bad").find("bad.txt:3: '0.5.1' is not a number"), std::string::npos) << f.log("bad");
  EXPECT_EQ(f.log("bad").find("step     1"), std::string::npos) << f.log("bad");
}
