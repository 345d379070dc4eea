// Gradient coding as a data-parallel strategy of `atoll train` (resilience/coded_strategy.h):
// 4 ranks, s = 1 (2 groups of 2 holding the same data), one rank sleeping 2 s per step it computes.
#include <gtest/gtest.h>

#include <algorithm>

#include "train_job.h"

namespace atl::resilience::test {

TEST(TrainerCoded, AStragglerIsNotWaitedForAndTheTrajectoryIsTheUncodedRunsBitForBit) {
  TrainJob job("train_coded");
  const std::vector<std::string> common = {"--checkpoint.every=0", "--train.steps=12"};
  // The uncoded run of the same data: DDP over one rank per group.
  ASSERT_EQ(job.launch(2, "ddp", common, "ddp.log"), 0) << job.log("ddp.log");
  std::vector<std::string> coded = common;
  for (const char* a : {"--parallel.strategy=coded", "--parallel.coded_stragglers=1", "--parallel.coded_delay_rank=2",
                        "--parallel.coded_delay_ms=2000"})
    coded.push_back(a);
  ASSERT_EQ(job.launch(4, "coded", coded, "coded.log"), 0) << job.log("coded.log");
  const std::string log = job.log("coded.log");

  // Not waited for: rank 0 decoded without rank 2's message at every step (its group's other
  // member, rank 3, carried the same gradient).
  EXPECT_NE(log.find("[rank 0] coded data parallel: rank 0: 12 steps decoded, without the message of rank 2 at 12"),
            std::string::npos)
      << log;
  // The step is not slowed: a step of this model takes milliseconds even on a loaded machine; had
  // rank 0 waited for the straggler, each would take at least its 2000 ms sleep. 1000 ms splits the
  // two by a wide margin either way (this is the not-waiting check, not a speed target).
  auto recs = records_with(job.root / "coded/metrics.jsonl", "step_ms");
  ASSERT_EQ(recs.size(), 12u);
  std::vector<double> ms;
  for (auto& r : recs) ms.push_back(r["step_ms"].get<double>());
  std::nth_element(ms.begin(), ms.begin() + 6, ms.end());
  EXPECT_LT(ms[6], 1000.0) << "rank 0's median step";
  // The trajectory: any 3 of the 4 messages decode the mean of the 2 groups' gradients, the sum
  // DDP's all-reduce makes over 2 ranks (a + b = b + a in IEEE arithmetic), so the weights and the
  // optimizer state of the last step are the uncoded run's, bit for bit.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((job.root / "coded/checkpoints/step_00000012" / file).string()),
              read_file((job.root / "ddp/checkpoints/step_00000012" / file).string()))
        << file;
}

TEST(TrainerCoded, AWorldTheCodeCannotSplitIsRefusedNamingTheKey) {
  TrainJob job("train_coded_bad");
  EXPECT_NE(job.launch(3, "run", {"--parallel.strategy=coded", "--parallel.coded_stragglers=1"}, "a.log"), 0);
  const std::string log = job.log("a.log");
  EXPECT_NE(log.find("parallel.coded_stragglers = 1 needs (s + 1) to divide the 3 ranks"), std::string::npos) << log;
}

}  // namespace atl::resilience::test
