// Join in `atoll train` (train/join_step.h): finite data ([data] epochs = 1) that runs out one
// batch earlier on rank 1 than on rank 0 (187 windows of 64 tokens: 94 slots for rank 0, 93 for
// rank 1). The job must end by itself after rank 0's last batch, and each step must be the mean
// over the ranks that had data: the steps both had data are plain DDP's, and the last one is rank
// 0's gradient alone.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "train_job.h"

namespace atl::resilience::test {
namespace fs = std::filesystem;

TEST(TrainerJoin, UnevenDataTerminatesAndEachStepIsTheMeanOverTheRanksWithData) {
  TrainJob job("train_join");
  // B = 1 and T = 64 on this corpus: 375 windows, 188 for rank 0 and 187 for rank 1. steps is far
  // out (the lr schedule's length); the data ends the run.
  const std::vector<std::string> shape = {"--train.batch_size=1", "--train.seq_len=64", "--train.steps=100000",
                                          "--checkpoint.every=187", "--log.every=50"};
  std::vector<std::string> joined = shape;
  joined.push_back("--data.epochs=1");
  ASSERT_EQ(job.launch(2, "join", joined, "join.log"), 0) << job.log("join.log");
  const std::string log = job.log("join.log");
  ASSERT_NE(log.find("join: finite data, steps of data per rank: 188, 187"), std::string::npos) << log;
  EXPECT_NE(log.find("join: every rank's data ran out after step 188"), std::string::npos) << log;

  auto recs = records_with(job.root / "join/metrics.jsonl", "join_active");
  ASSERT_EQ(recs.size(), 188u);
  for (const auto& r : recs) {
    const int64_t step = r["step"];
    SCOPED_TRACE(step);
    const auto& l = r["join_losses"];
    ASSERT_EQ(r["join_active"], step <= 187 ? 2 : 1);
    if (step <= 187) {
      // Two floats carry each rank's loss to ~1e-14 and the mean is taken in double.
      EXPECT_NEAR(r["loss"].get<double>(), (l[0].get<double>() + l[1].get<double>()) / 2, 1e-12);
    } else {
      EXPECT_TRUE(l[1].is_null());  // rank 1 had no data: its loss counts for nothing
      EXPECT_EQ(r["loss"].get<double>(), l[0].get<double>());
    }
  }
  // The steps with data on both ranks are DDP's: the same job on endless lockstep data, stopped at
  // step 187, ends with the same bits.
  std::vector<std::string> lockstep = shape;
  lockstep.push_back("--train.stop_after=187");
  ASSERT_EQ(job.launch(2, "ddp", lockstep, "ddp.log"), 0) << job.log("ddp.log");
  const fs::path j187 = job.root / "join/checkpoints/step_00000187", j188 = job.root / "join/checkpoints/step_00000188";
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((j187 / f).string()), read_file((job.root / "ddp/checkpoints/step_00000187" / f).string())) << f;
  // The last step is rank 0's gradient alone, not halved by a rank without data: one rank resumed
  // from step 187 reads slot 2 x 187 = 374 of the epoch, rank 0's last window, and its step 188 is
  // the joined run's, bit for bit (rank 1 added exactly zero, and the divisor was 1).
  fs::create_directories(job.root / "one/checkpoints");
  fs::copy(j187, job.root / "one/checkpoints/step_00000187", fs::copy_options::recursive);
  std::vector<std::string> argv = {atoll_exe(), "train", (job.root / "tiny.toml").string(),
                                   "--run.dir=" + (job.root / "one").string(), "--resume", "--train.stop_after=1"};
  argv.insert(argv.end(), shape.begin(), shape.end());
  ASSERT_EQ(wait_for(spawn(argv, {"OMP_NUM_THREADS=1"}, (job.root / "one.log").string()), 120), 0)
      << job.log("one.log");
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((j188 / f).string()), read_file((job.root / "one/checkpoints/step_00000188" / f).string()))
        << f;
}

}  // namespace atl::resilience::test
