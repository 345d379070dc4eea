// train.memory_budget_gb (train/memory_budget.h): the layout chooser takes the cheapest layout
// that fits (resident before offloaded; ddp, zero1, zero2, zero3; experts with the dense layers
// before sharded over ep), holds what the config fixes, and refuses a budget nothing fits naming
// the key; through the trainer, a budget below the resident estimate moves AdamW's moments to a
// memory-mapped file and trains exactly as resident AdamW does.
#include <gtest/gtest.h>

#include "train/memory_budget.h"
#include "train/metrics.h"
#include "trainer_fixture.h"

using namespace atl;
using namespace atl::test;

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Experts dominate, as in fine-grained MoE models: 1 M dense parameters, 8 M in 8 experts, 4 ranks.
BudgetModel moe_like() {
  BudgetModel m;
  m.dense_params = 1e6;
  m.expert_params = 8e6;
  m.n_experts = 8;
  m.ranks = 4;
  m.activations = 1e6;
  return m;
}
}  // namespace

TEST(MemoryBudget, ChoosesTheCheapestLayoutThatFits) {
  const BudgetModel m = moe_like();
  // Model states: weights 4 + gradients 4 + AdamW 8 bytes per parameter (plan/memory_model.h).
  BudgetLayout l = choose_layout(m, 1e12);
  EXPECT_EQ(l.describe(), (BudgetLayout{"ddp", 1, false, 0}.describe()));
  EXPECT_DOUBLE_EQ(l.bytes, 16 * 9e6 + 1e6);
  // Below ddp (145 MB) but above zero1 (4 + 4 + 8/4 per parameter = 91 MB).
  l = choose_layout(m, 100e6);
  EXPECT_EQ(l.strategy, "zero1");
  EXPECT_EQ(l.ep, 1);
  // zero1 with the experts sharded over ep = 4: dense 10 B/param, experts 16/4: 10 + 32 + 1 = 43 MB.
  l = choose_layout(m, 50e6);
  EXPECT_EQ(l.strategy, "zero1");
  EXPECT_EQ(l.ep, 4);
  EXPECT_FALSE(l.offload);
  EXPECT_DOUBLE_EQ(l.bytes, 10e6 + 32e6 + 1e6);
  // Below plain zero3 (16 * 9e6 / 4 + 1e6 = 37 MB): only offloading AdamW's moments fits;
  // zero1 + ep 4 offloaded: dense 8, experts 8 * 8e6 / 4, activations: 25 MB.
  const double plain_zero3 = layout_bytes(m, BudgetLayout{"zero3", 1, false, 0});
  EXPECT_DOUBLE_EQ(plain_zero3, 37e6);
  l = choose_layout(m, 30e6);
  EXPECT_EQ(l.strategy, "zero1");
  EXPECT_EQ(l.ep, 4);
  EXPECT_TRUE(l.offload);
  EXPECT_LT(l.bytes, plain_zero3);
  // Tighter: zero3 offloaded (8 * 9e6 / 4 + 1e6 = 19 MB).
  l = choose_layout(m, 20e6);
  EXPECT_EQ(l.strategy, "zero3");
  EXPECT_EQ(l.ep, 1);
  EXPECT_TRUE(l.offload);
  // What the config fixes is held: zero3 named, ep = 2 named.
  l = choose_layout(m, 1e12, "zero3", 2);
  EXPECT_EQ(l.strategy, "zero3");
  EXPECT_EQ(l.ep, 2);
  // Nothing fits: the key, the smallest estimate.
  try {
    choose_layout(m, 10e6);
    ADD_FAILURE() << "a 10 MB budget was accepted";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("train.memory_budget_gb"), std::string::npos) << w;
    EXPECT_NE(w.find("smallest estimate"), std::string::npos) << w;
  }
  // A model without experts is never given ep > 1.
  BudgetModel dense = m;
  dense.n_experts = 0;
  for (const BudgetLayout& c : budget_candidates(dense, "", 0, -1)) EXPECT_EQ(c.ep, 1) << c.describe();
}

TEST(MemoryBudget, TrainerOffloadsTheMomentsToFitAndTrainsAsResident) {
  fs::path a = scratch("budget_a"), b = scratch("budget_b");
  std::string data = make_data(a);
  auto config = [&](const fs::path& root, const std::string& train) {
    std::string t = tiny_config_text(root, data, 4);
    const std::string from = "preset = \"gpt2-tiny\"";
    t.replace(t.find(from), from.size(), "family = \"moe\"\npreset = \"moe-tiny\"");
    t.replace(t.find("[train]"), 7, "[train]\n" + train);
    return Config::parse(t, "budget.toml");
  };
  // The estimates for this model and batch, resident and offloaded (one rank: no sharding).
  double resident = 0, offloaded = 0;
  {
    Config c = config(a, "memory_budget_gb = 1000.0\n");
    resident = apply_memory_budget(c, 4, 32, 1).chosen.bytes;
    Config d = config(a, "memory_budget_gb = 1000.0\noptimizer_state = \"mmap\"\n");
    offloaded = apply_memory_budget(d, 4, 32, 1).chosen.bytes;
  }
  ASSERT_LT(offloaded, resident);
  const double budget = (resident + offloaded) / 2 / kGiB;
  {
    Config chk = config(b, "memory_budget_gb = " + std::to_string(budget) + "\n");
    const MemoryBudget mb = apply_memory_budget(chk, 4, 32, 1);
    EXPECT_TRUE(mb.offload) << mb.report;
    EXPECT_LE(mb.chosen.bytes, budget * kGiB) << mb.report;
  }
  Config c = config(b, "memory_budget_gb = " + std::to_string(budget) + "\n");
  Trainer tb(c);
  auto rb = tb.run(false);
  Config r = config(a, "");
  Trainer ta(r);
  auto ra = ta.run(false);
  EXPECT_EQ(rb.final_loss, ra.final_loss) << "offloaded AdamW trained differently from resident AdamW";
  auto recs = read_metrics((b / "run" / "metrics.jsonl").string());
  ASSERT_FALSE(recs.empty());
  EXPECT_TRUE(recs.back().contains("peak_rss_mb")) << recs.back().dump();
  // Too small for anything: refused before the first step, naming the key.
  Config z = config(b, "memory_budget_gb = 0.000001\n");
  try {
    Trainer tz(z);
    ADD_FAILURE() << "a 1 KiB budget was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.memory_budget_gb"), std::string::npos) << e.what();
  }
  fs::remove_all(a);
  fs::remove_all(b);
}

// Session 9: tensor parallelism in the budget. A dense model (8 M parameters, 7.6 M of them in the
// tp-split matrices and tables) on 4 ranks: a rank under tp holds 1/tp of those and the rest whole,
// ZeRO shards over ranks / tp, sequence parallelism splits the activations. tp is tried after every
// resident layout without it and before offloading; a fixed parallel.tp is counted.
TEST(MemoryBudget, TensorParallelismIsCountedAndChosenBeforeOffloading) {
  BudgetModel m;
  m.dense_params = 8e6, m.dense_split_params = 7.6e6;
  m.ranks = 4;
  m.activations = 4e6;
  m.tp_options = {1, 2, 4};
  // Without tp: zero3 is 16 * 8e6 / 4 + 4e6 = 36 MB. With tp 2: 0.4e6 + 7.6e6 / 2 = 4.2e6 parameters
  // per tp rank, zero3 over dp = 2: 16 * 4.2e6 / 2 + 4e6 / 2 = 35.6 MB.
  EXPECT_DOUBLE_EQ(layout_bytes(m, BudgetLayout{"zero3", 1, false, 0, 1}), 36e6);
  EXPECT_DOUBLE_EQ(layout_bytes(m, BudgetLayout{"zero3", 1, false, 0, 2}), 35.6e6);
  // tp 4, ddp over dp = 1: 16 * (0.4e6 + 1.9e6) + 1e6.
  EXPECT_DOUBLE_EQ(layout_bytes(m, BudgetLayout{"ddp", 1, false, 0, 4}), 37.8e6);
  BudgetLayout l = choose_layout(m, 35.8e6);
  EXPECT_EQ(l.tp, 2) << l.describe();
  EXPECT_EQ(l.strategy, "zero3");
  EXPECT_FALSE(l.offload) << "tp before streaming the optimizer state";
  EXPECT_NE(l.describe().find("tp = 2"), std::string::npos) << l.describe();
  // A model the plan cannot split: the same budget offloads. Offloaded, ddp and zero1 keep 8 bytes
  // per parameter (68 MB), zero2 4 + 4/4 (44 MB), zero3 8/4: 16e6 + 4e6 = 20 MB.
  BudgetModel no_tp = m;
  no_tp.tp_options = {1};
  l = choose_layout(no_tp, 35.8e6);
  EXPECT_EQ(l.tp, 1);
  EXPECT_TRUE(l.offload) << l.describe();
  EXPECT_EQ(l.strategy, "zero3");
  EXPECT_DOUBLE_EQ(l.bytes, 20e6);
  // A fixed tp is held and counted (the old budget refused parallel.tp > 1).
  l = choose_layout(m, 1e12, "", 0, -1, 4);
  EXPECT_EQ(l.tp, 4);
  EXPECT_DOUBLE_EQ(l.bytes, 37.8e6);
  for (const BudgetLayout& c : budget_candidates(m, "", 0, -1, 4)) EXPECT_EQ(c.tp, 4) << c.describe();
  // Without sequence parallelism the activations are counted whole.
  m.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(layout_bytes(m, BudgetLayout{"zero3", 1, false, 0, 2}), 33.6e6 + 4e6);
}

// Through the config: GPT-2 tiny on 2 ranks. The plan's split parameters are counted from the
// model (c_attn, c_proj, c_fc, the MLP's c_proj and the vocabulary table), a fixed parallel.tp = 2
// is accepted and lowers the estimate, and a budget between tp 2's estimate and no tp's writes
// parallel.tp = 2 for the mesh.
TEST(MemoryBudget, TheConfigsTensorParallelismIsCountedOrChosen) {
  fs::path a = scratch("budget_tp");
  std::string data = make_data(a);
  auto config = [&](const std::string& train, const std::string& parallel) {
    std::string t = tiny_config_text(a, data, 4);
    t.replace(t.find("[train]"), 7, "[train]\n" + train);
    if (!parallel.empty()) t += "\n[parallel]\n" + parallel;
    return Config::parse(t, "budget.toml");
  };
  Config none = config("memory_budget_gb = 1000.0\n", "tp = 1\nstrategy = \"ddp\"\n");
  const MemoryBudget b1 = apply_memory_budget(none, 4, 32, 2);
  Config two = config("memory_budget_gb = 1000.0\n", "tp = 2\nstrategy = \"ddp\"\n");
  const MemoryBudget b2 = apply_memory_budget(two, 4, 32, 2);
  EXPECT_EQ(b2.chosen.tp, 2) << b2.report;
  EXPECT_LT(b2.chosen.bytes, 0.75 * b1.chosen.bytes) << b1.report << "\n" << b2.report;
  EXPECT_GT(b2.chosen.bytes, 0.5 * b1.chosen.bytes) << "the norms, biases of row-parallel layers and positions stay whole";
  // Between the two: tp 2 is chosen (ddp's no-tp estimate over the budget; the strategy fixed).
  const double budget = (b1.chosen.bytes + b2.chosen.bytes) / 2 / kGiB;
  Config open = config("memory_budget_gb = " + std::to_string(budget) + "\n", "strategy = \"ddp\"\n");
  const MemoryBudget bo = apply_memory_budget(open, 4, 32, 2);
  EXPECT_EQ(bo.chosen.tp, 2) << bo.report;
  EXPECT_FALSE(bo.chosen.offload) << bo.report;
  EXPECT_EQ(open.get_int("parallel.tp", 1), 2) << "the choice reaches the mesh";
  fs::remove_all(a);
}
