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
