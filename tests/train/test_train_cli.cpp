// Issue 10, `atoll train` as a user runs it: a job that cannot fit is refused before it
// allocates; a reader that goes away (`| head`) does not end training; SIGTERM stops with a
// checkpoint; read-only run and checkpoint directories are diagnosed at start-up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <sstream>

#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "core/error.h"
#include "resilience/checkpoint_select.h"
#include "models/gpt/gpt.h"
#include "plan/memory_model.h"
#include "train/preflight.h"
#include "trainer_fixture.h"

using namespace atl;
using namespace atl::test;
namespace fs = std::filesystem;

namespace {

// A config file for the command line: the tiny model on one thread, a progress line every step.
fs::path write_config(const fs::path& root, const std::string& data, int64_t steps) {
  fs::path p = root / "tiny.toml";
  std::ofstream(p) << tiny_config_text(root, data, steps)
                   << "\n";  // the overrides below win over the file
  return p;
}

std::string train_cmd(const fs::path& cfg, const std::string& extra = "") {
  return fmt::format("'{}' train '{}' --train.threads=1 --eval.every=0 --log.every=1 {}", atoll_exe(), cfg.string(),
                     extra);
}

}  // namespace

// The repro: this batch on the default (0.8M-parameter) model used to allocate past the
// machine's memory and be killed by the kernel after 17 s. The address-space limit makes any real
// attempt fail at once, so a refusal with the numbers shows nothing big was allocated first.
TEST(TrainCli, OversizedBatchIsRefusedBeforeAllocating) {
  fs::path a = scratch("oom");
  CmdResult r = run_shell(fmt::format("cd '{}' && ulimit -v 2000000 && '{}' train '{}/configs/default.toml' "
                                      "--train.batch_size=1048576 --run.dir='{}/run'",
                                      a.string(), atoll_exe(), ATOLL_SOURCE_DIR, a.string()));
  EXPECT_EQ(r.exit_code(), 1) << r.out;
  EXPECT_TRUE(contains(r.out, "training needs about")) << r.out;
  EXPECT_TRUE(contains(r.out, "is available")) << r.out;
  EXPECT_TRUE(contains(r.out, "reduce train.batch_size (now 1048576")) << r.out;
  EXPECT_TRUE(contains(r.out, "--train.force=true")) << r.out;
  EXPECT_LT(r.seconds, 10) << "bounded: it must not have started training";
  EXPECT_FALSE(fs::exists(a / "data")) << "the refusal came after preparing data";
  EXPECT_FALSE(fs::exists(a / "run"));
  fs::remove_all(a);
}

TEST(TrainCli, MemoryEstimateScalesAndForceGoesOn) {
  nn::GPT mc(nn::GPTConfig::preset("gpt2-tiny"));
  TrainShape small, big;
  small.batch_size = 4;
  small.seq_len = 32;
  big = small;
  big.batch_size = 4 << 20;
  MemoryEstimate s = estimate_training_memory(mc, small), b = estimate_training_memory(mc, big);
  EXPECT_GT(s.total(), 0);
  EXPECT_LT(s.total(), 64.0 * 1024 * 1024) << "a tiny job must not look big";
  // Activations and logits grow with the batch, model states do not.
  EXPECT_NEAR((b.activations + b.logits) / (s.activations + s.logits), double(4 << 20) / 4, 1e-6 * (4 << 20));
  EXPECT_EQ(b.model_states, s.model_states);
  std::string src;
  EXPECT_GT(available_memory_bytes(&src), 0) << "cannot read /proc/meminfo";
  Config refuse = Config::parse("", "t.toml"), force = Config::parse("[train]\nforce = true\n", "t.toml");
  EXPECT_THROW(check_memory_before_start(refuse, mc, big), Error);
  EXPECT_NO_THROW(check_memory_before_start(force, mc, big));
  EXPECT_NO_THROW(check_memory_before_start(refuse, mc, small));
}

// Under tensor and pipeline parallelism a rank holds its share: tp = 2 halves the weights (norms
// counted as split: a small undercount the estimate accepts), pp = 2 keeps the worst stage's half
// of the blocks plus the embeddings (or the head's table), and a 1F1B stage keeps min(pp, m)
// micro-batches of its half of the blocks in flight (as many layers' activations as one rank),
// GPipe all m of them.
TEST(TrainCli, MemoryEstimateCountsTheTensorAndPipelineSplit) {
  nn::GPT mc(nn::GPTConfig::preset("gpt2-tiny"));
  TrainShape one;
  one.batch_size = 4;
  one.seq_len = 32;
  one.world = 4;
  TrainShape tp = one, pp = one, gpipe = one, tp_zero = one;
  tp.tp = 2;
  pp.pp = 2;
  pp.micro_batches = 4;
  gpipe = pp;
  gpipe.pp_schedule = "gpipe";
  tp_zero = tp;
  tp_zero.strategy = "zero1";
  TrainShape zero = one;
  zero.strategy = "zero1";
  MemoryEstimate o = estimate_training_memory(mc, one), t = estimate_training_memory(mc, tp),
                 p = estimate_training_memory(mc, pp), g = estimate_training_memory(mc, gpipe),
                 tz = estimate_training_memory(mc, tp_zero), z = estimate_training_memory(mc, zero);
  EXPECT_NEAR(t.model_states / o.model_states, 0.5, 1e-9);
  EXPECT_LT(t.activations, 0.6 * o.activations);  // sequence parallel: the block's activations split
  EXPECT_NEAR(t.logits / o.logits, 0.5, 1e-9);    // vocab-parallel logits
  EXPECT_GT(p.model_states / o.model_states, 0.5);
  EXPECT_LT(p.model_states / o.model_states, 0.75);
  EXPECT_NEAR(p.activations, o.activations, 1e-6 * o.activations);
  EXPECT_NEAR(g.activations, 2 * o.activations, 1e-6 * o.activations);
  // ZeRO-1 shards the optimizer state over the data ranks: 4 without tp, 2 with tp = 2.
  EXPECT_LT(z.model_states, o.model_states);
  EXPECT_GT(tz.model_states, 0.5 * z.model_states);
  EXPECT_LT(tz.model_states, t.model_states);
  // A stage under ZeRO-2/3 keeps its whole gradient (and under ZeRO-3 its gathered parameters)
  // through the step (parallel/pipeline.h): at the peak it holds what ZeRO-1 holds.
  TrainShape pp_z1 = pp, pp_z3 = pp;
  pp_z1.strategy = "zero1";
  pp_z3.strategy = "zero3";
  EXPECT_EQ(estimate_training_memory(mc, pp_z3).model_states, estimate_training_memory(mc, pp_z1).model_states);
  EXPECT_LT(estimate_training_memory(mc, pp_z1).model_states, p.model_states);
}

// Under tp a whole-matrix optimizer (Muon) keeps its state of the split matrices whole, with whole
// copies of their weight and gradient (parallel/optim/tp_whole_matrix.h): the estimate counts
// tp - 1 more shards of state and tp more of weight and gradient; an element-wise one (Lion) steps
// its shards, halved at tp2 like AdamW.
TEST(TrainCli, MemoryEstimateCountsWholeMatrixStateUnderTp) {
  nn::GPT mc(nn::GPTConfig::preset("gpt2-tiny"));
  TrainShape one;
  one.batch_size = 4;
  one.seq_len = 32;
  one.world = 2;
  for (const char* o : {"muon", "lion"}) {
    TrainShape a = one;
    a.optimizer = o;
    TrainShape t = a;
    t.tp = 2;
    const double whole = estimate_training_memory(mc, a).model_states, split = estimate_training_memory(mc, t).model_states;
    const plan::StateBytes sb = plan::state_bytes("fp32", o);
    const double psi = whole / (sb.weight + sb.grad + sb.optim);  // one rank's parameters
    const double want = std::string(o) == "muon" ? whole / 2 + psi / 2 * (sb.optim + 2 * (sb.weight + sb.grad)) : whole / 2;
    EXPECT_NEAR(split, want, 1e-9 * want) << o;
    // Under ZeRO without pp Muon keeps its pieces of the tp block's state (sharded_muon.h): no
    // whole copies, the tp shard's states (one data rank here: ZeRO divides by 1).
    TrainShape z = t;
    z.strategy = "zero1";
    EXPECT_NEAR(estimate_training_memory(mc, z).model_states, whole / 2, 1e-9 * whole) << o;
  }
}

// Under context parallelism a rank keeps the activations and logits of its seq_len / cp tokens of
// every row (the planner's s_local); its weights are the whole model's, or the tp shard's under
// cp x tp, and ZeRO shards them over dp x cp.
TEST(TrainCli, MemoryEstimateCountsTheContextSplit) {
  nn::GPT mc(nn::GPTConfig::preset("gpt2-tiny"));
  TrainShape one;
  one.batch_size = 4;
  one.seq_len = 32;
  one.world = 4;
  TrainShape cp = one, cptp = one, cp_zero = one, zero = one;
  cp.cp = 2;
  cptp.cp = 2;
  cptp.tp = 2;
  zero.strategy = "zero1";
  cp_zero = cp;
  cp_zero.strategy = "zero1";
  MemoryEstimate o = estimate_training_memory(mc, one), c = estimate_training_memory(mc, cp),
                 ct = estimate_training_memory(mc, cptp), cz = estimate_training_memory(mc, cp_zero),
                 z = estimate_training_memory(mc, zero);
  EXPECT_NEAR(c.activations / o.activations, 0.5, 1e-9);  // per token (flash attention's statistics too)
  EXPECT_NEAR(c.logits / o.logits, 0.5, 1e-9);
  EXPECT_EQ(c.model_states, o.model_states);
  EXPECT_NEAR(ct.model_states / o.model_states, 0.5, 1e-9);
  EXPECT_NEAR(ct.logits / o.logits, 0.25, 1e-9);  // half the tokens, half the vocabulary
  EXPECT_LT(ct.activations, 0.3 * o.activations);  // and sequence parallelism within the cp share
  EXPECT_EQ(cz.model_states, z.model_states);  // ZeRO over the 4 ranks of dp x cp
}

// The repro: `atoll train ... | head -2` died of SIGPIPE (status 141), without a message
// or a checkpoint.
TEST(TrainCli, ClosedOutputPipeDoesNotStopTraining) {
  fs::path a = scratch("sigpipe");
  std::string data = make_data(a);
  fs::path cfg = write_config(a, data, 12);
  CmdResult r = run_shell(fmt::format("bash -c \"{} | head -2; echo rc=\\${{PIPESTATUS[0]}}\"", train_cmd(cfg)));
  EXPECT_TRUE(contains(r.out, "rc=0")) << r.out;
  fs::path last = a / "run" / "checkpoints" / "step_00000012";
  EXPECT_TRUE(fs::exists(last)) << r.out;
  EXPECT_EQ(checkpoint_problem(last.string()), "");
  fs::remove_all(a);
}

// Where a stop signal lands (train/stop_signals.h): a handler's frame goes on the receiving thread's
// stack, and oneDNN's AVX2 JIT GEMM runs with its stack pointer inside a heap buffer, so a SIGTERM
// on the training thread there corrupted the heap (1 run in ~17 of `atoll launch` killed under
// load, on an AVX2-only EPYC). `atoll train` therefore blocks SIGTERM and SIGINT in the thread that
// trains (and in every thread it starts) and leaves them to a thread of their own: read here from
// /proc in a running job on two threads, then the SIGTERM still stops it with its checkpoint.
TEST(TrainCli, StopSignalsAreTakenByAThreadThatRunsNoKernel) {
  fs::path a = scratch("sigroute");
  std::string data = make_data(a);
  fs::path cfg = write_config(a, data, 100000);
  fs::path m = a / "run" / "metrics.jsonl";
  CmdResult r = run_shell(fmt::format(
      "'{}' train '{}' --train.threads=2 --eval.every=0 --log.every=1 --checkpoint.every=0 > '{}/out.log' 2>&1 & "
      "P=$!; i=0; while [ $i -lt 600 ]; do [ -f '{}' ] && [ $(wc -l < '{}') -ge 3 ] && break; sleep 0.05; "
      "i=$((i+1)); done; echo pid=$P; for t in /proc/$P/task/*; do echo \"task ${{t##*/}} $(grep SigBlk $t/status)\"; "
      "done; kill -TERM $P; wait $P; echo rc=$?; cat '{}/out.log'",
      atoll_exe(), cfg.string(), a.string(), m.string(), m.string(), a.string()));
  const size_t at = r.out.find("pid=");
  ASSERT_NE(at, std::string::npos) << r.out;
  const long pid = std::stol(r.out.substr(at + 4));
  int tasks = 0, takers = 0;
  bool main_blocks = false;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    long tid = 0;
    unsigned long long blk = 0;
    if (std::sscanf(line.c_str(), "task %ld SigBlk: %llx", &tid, &blk) != 2) continue;
    ++tasks;
    const unsigned long long stop = (1ull << (SIGTERM - 1)) | (1ull << (SIGINT - 1));
    if (tid == pid) main_blocks = (blk & stop) == stop;
    if ((blk & stop) == 0) ++takers;
  }
  EXPECT_GE(tasks, 3) << r.out;  // the trainer, its OpenMP worker, the signal thread (and others)
  EXPECT_TRUE(main_blocks) << "the training thread takes SIGTERM/SIGINT itself\n" << r.out;
  EXPECT_GE(takers, 1) << "no thread takes SIGTERM: it would stay pending\n" << r.out;
  EXPECT_TRUE(contains(r.out, "rc=0")) << r.out;
  EXPECT_TRUE(contains(r.out, "stopped by SIGTERM after step")) << r.out;
  EXPECT_EQ(list_checkpoints((a / "run" / "checkpoints").string()).size(), 1u) << r.out;
  fs::remove_all(a);
}

// SIGTERM (a scheduler's preemption) stops after the current step with a checkpoint, exits 0, and
// the run resumes from exactly there.
TEST(TrainCli, SigtermWritesAFinalCheckpointAndExitsCleanly) {
  fs::path a = scratch("sigterm");
  std::string data = make_data(a);
  fs::path cfg = write_config(a, data, 100000);
  fs::path m = a / "run" / "metrics.jsonl";
  CmdResult r = run_shell(fmt::format(
      "{} --checkpoint.every=0 > '{}/out.log' 2>&1 & P=$!; i=0; while [ $i -lt 600 ]; do "
      "[ -f '{}' ] && [ $(wc -l < '{}') -ge 4 ] && break; sleep 0.05; i=$((i+1)); done; kill -TERM $P; wait $P; "
      "echo rc=$?; cat '{}/out.log'",
      train_cmd(cfg), a.string(), m.string(), m.string(), a.string()));
  EXPECT_TRUE(contains(r.out, "rc=0")) << r.out;
  EXPECT_TRUE(contains(r.out, "stopped by SIGTERM after step")) << r.out;
  auto cks = list_checkpoints((a / "run" / "checkpoints").string());
  ASSERT_EQ(cks.size(), 1u) << r.out;
  EXPECT_EQ(checkpoint_problem(cks[0].path), "");
  int64_t s = cks[0].step;
  CmdResult again = run_shell(train_cmd(cfg, fmt::format("--resume --train.steps={}", s + 2)));
  EXPECT_EQ(again.exit_code(), 0) << again.out;
  EXPECT_TRUE(contains(again.out, fmt::format("at step {}", s))) << again.out;
  EXPECT_TRUE(contains(again.out, fmt::format("done: step {}", s + 2))) << again.out;
  // Ctrl-C does the same.
  CmdResult i = run_shell(fmt::format(
      "{} --resume --checkpoint.every=0 > '{}/int.log' 2>&1 & P=$!; i=0; while [ $i -lt 600 ]; do "
      "[ $(wc -l < '{}') -ge {} ] && break; sleep 0.05; i=$((i+1)); done; kill -INT $P; wait $P; echo rc=$?; "
      "cat '{}/int.log'",
      train_cmd(cfg), a.string(), m.string(), s + 2 + 3 + 3, a.string()));
  EXPECT_TRUE(contains(i.out, "rc=0")) << i.out;
  EXPECT_TRUE(contains(i.out, "stopped by SIGINT after step")) << i.out;
  fs::remove_all(a);
}

// A read-only run dir, or only its checkpoints/, is found before the first step, not at the first
// save. Root ignores permission bits, so this needs a read-only mount (a private mount namespace).
TEST(TrainCli, ReadOnlyRunOrCheckpointDirIsDiagnosedAtStartUp) {
  fs::path a = scratch("readonly");
  std::string data = make_data(a);
  fs::path cfg = write_config(a, data, 8);
  fs::create_directories(a / "run" / "checkpoints");
  auto ro = [&](const fs::path& dir) {
    if (::geteuid() != 0)
      return run_shell(fmt::format("chmod a-w '{}' && {}; chmod u+w '{}'", dir.string(), train_cmd(cfg), dir.string()));
    return run_shell(fmt::format("unshare -m sh -c \"mount --bind '{0}' '{0}' && mount -o remount,bind,ro '{0}' && "
                                 "echo mounted-ro && {1}\"",
                                 dir.string(), train_cmd(cfg)));
  };
  CmdResult probe = ro(a / "run");
  if (::geteuid() == 0 && !contains(probe.out, "mounted-ro"))
    GTEST_SKIP() << "running as root without the right to make a read-only mount (unshare -m): " << probe.out;
  EXPECT_EQ(probe.exit_code(), 1) << probe.out;
  EXPECT_TRUE(contains(probe.out, "run.dir '" + (a / "run").string() + "' is not writable")) << probe.out;
  EXPECT_FALSE(contains(probe.out, "internal error")) << probe.out;
  CmdResult c = ro(a / "run" / "checkpoints");
  EXPECT_EQ(c.exit_code(), 1) << c.out;
  EXPECT_TRUE(contains(c.out, "the checkpoint directory '" + (a / "run" / "checkpoints").string() + "' is not writable"))
      << c.out;
  EXPECT_FALSE(contains(c.out, "step     1/")) << "it trained before finding out: " << c.out;
  EXPECT_FALSE(fs::exists(a / "run" / "metrics.jsonl"));
  fs::remove_all(a);
}
