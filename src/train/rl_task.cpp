// RL post-training as a trainer task ([train] task = "rl"): the trainer's loop drives the steps of
// src/rl's engine (rl/rl_engine.h): its batch request generates and scores rollouts, its loss is
// the algorithm's, its evaluation is the held-out accuracy (val_loss = 1 - accuracy), and the
// engine's per-step measurements go into metrics.jsonl. Keys in [rl] (docs/rl.md).
#include "rl/rl_engine.h"
#include "train/task.h"
#include "train/trainer.h"

namespace atl {
namespace {

class RlTask final : public Task {
 public:
  RlTask(Config& cfg, const TrainOptions& o) : eng_(rl::RlConfig::from_config(cfg, uint64_t(o.seed))) {}
  std::string name() const override { return "rl"; }
  void setup(nn::Model& model, const TaskEnv& env) override { eng_.setup(model, env.comm, env.rank, env.world); }
  const Batch& next_batch() override {
    const rl::RolloutBatch& b = eng_.next_batch();
    batch_.input = b.input;
    batch_.target = b.target;
    return batch_;
  }
  // The batch is always the one next_batch() just made (the engine keeps its per-token tensors).
  Tensor loss(const nn::Model& model, const Batch&) override { return eng_.loss(model, eng_current()); }
  double evaluate(const nn::Model& model) override { return 1.0 - eng_.heldout_accuracy(model); }
  std::string sample(const nn::Model& model, Rng&) override { return eng_.sample(model); }
  int64_t tokens_per_batch() const override { return eng_.tokens_per_batch(); }
  int64_t sequence_length() const override { return eng_.sequence_length(); }
  nlohmann::json data_state() const override { return eng_.state(); }
  void set_data_state(const nlohmann::json& s, const TaskEnv&) override { eng_.set_state(s); }
  nlohmann::json step_metrics() override { return eng_.step_metrics(); }
  float lr_multiplier() const override { return eng_.lr_multiplier(); }
  void save_tensors(std::vector<std::pair<std::string, Tensor>>& out) const override { eng_.save_tensors(out); }
  void load_tensors(const std::vector<std::pair<std::string, Tensor>>& in) override { eng_.load_tensors(in); }
  int reserved_ranks(int world) const override { return eng_.reserved_ranks(world); }
  void attach_job(std::unique_ptr<comm::Communicator> job, bool reserved) override {
    eng_.attach_job(std::move(job), reserved);
  }
  void serve(nn::Model&) override { eng_.serve(); }

 private:
  const rl::RolloutBatch& eng_current() { return eng_.current(); }
  rl::RlEngine eng_;
  Batch batch_;
};

TaskRegistrar rl_task("rl", [](Config& cfg, const TrainOptions& o) -> std::unique_ptr<Task> {
  return std::make_unique<RlTask>(cfg, o);
});

}  // namespace
}  // namespace atl
