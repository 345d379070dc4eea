// What the training loop trains for. The loop (trainer.cpp) drives a Task: it asks for each
// micro-batch, for the loss on it, for an evaluation and for a sample, and saves the position of
// its data in checkpoints; it knows nothing of tokens or logits. Tasks register by name
// ([train] task = "lm", the default: language-model pretraining, lm_task.cpp); diffusion, RL or
// graph tasks register the same way without editing the loop.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"
#include "nn/model.h"
#include "tensor/rng.h"

namespace atl {

struct TrainOptions;

// A micro-batch: the model's input and the target its loss compares against.
struct Batch {
  Tensor input, target;
};

// Where the task runs: this rank of the job, and the job's communicator (null: one process).
struct TaskEnv {
  int rank = 0, world = 1;  // the data's split: this rank's share of `world` (dp coordinate under tp)
  comm::Communicator* comm = nullptr;
  int job_rank = -1;  // this process's rank in the job when it differs from `rank` (-1: rank)
  bool leads() const { return (job_rank < 0 ? rank : job_rank) == 0; }  // prepares shared files
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // Once the model is built, before the first step: data, tokenizer, checks against the model.
  virtual void setup(nn::Model& model, const TaskEnv& env) = 0;
  // This rank's next training micro-batch (valid until the next call).
  virtual const Batch& next_batch() = 0;
  // The training loss on a batch (records the graph when grad is on).
  virtual Tensor loss(const nn::Model& model, const Batch& b) { return model.loss(b.input, b.target); }
  // Mean loss over this rank's share of the evaluation data; the trainer averages over ranks.
  virtual double evaluate(const nn::Model& model) = 0;
  // Something the model produced, for the log; "" when the task or the model has nothing.
  virtual std::string sample(const nn::Model& model, Rng& rng) { return ""; }
  // Tokens (samples) in one micro-batch of this rank, and the length FLOPs are counted at.
  virtual int64_t tokens_per_batch() const = 0;
  virtual int64_t sequence_length() const = 0;
  // The training data's position, saved in checkpoints; restored by a job of any size.
  virtual nlohmann::json data_state() const = 0;
  virtual void set_data_state(const nlohmann::json& s, const TaskEnv& env) = 0;
  // For the pre-run gate (resilience/invariant_gate.h), after setup: {"space": what the shard
  // ranges index, "shards": [[begin, end), ...] this rank reads this epoch, "batches_per_epoch"};
  // null when the task cannot say (the gate then checks the rest).
  virtual nlohmann::json data_facts() const { return nullptr; }
  // Finite data ([data] epochs): the micro-batches this rank has left; -1: endless. The trainer
  // joins a rank that ran out into the others' steps (train/join_step.h).
  virtual int64_t batches_left() const { return -1; }
  // Fields this step adds to its metrics.jsonl record (RL: reward, KL, time split); called after
  // the step's evaluation and sample.
  virtual nlohmann::json step_metrics() { return nlohmann::json::object(); }
  // A factor on the learning-rate schedule for the step whose batch was just taken (a task with
  // phases, RL after a supervised warm start, runs them at different rates).
  virtual float lr_multiplier() const { return 1.0f; }
  // SCOUT's cross-replay ([fault] replay_every, train/replay_hook.h): the micro-batches that data
  // rank `share` of `world` reads from `state` (this rank's data_state() where the step began), so
  // that this rank can recompute another rank's share of a step. can_replay: whether the task can;
  // start_replay positions the replay reader, next_replay_batch reads on (valid until the next call).
  virtual bool can_replay() const { return false; }
  virtual void start_replay(const nlohmann::json& state, int share, int world) {}
  virtual const Batch& next_replay_batch() { throw std::logic_error(name() + " cannot replay another rank's data"); }
  // Tensors of the task's own state (RL's frozen reference), saved in checkpoints beside the
  // optimizer's under names that begin "task."; load_tensors gets them back on resume (a name
  // missing from an older checkpoint is the task's to handle).
  virtual void save_tensors(std::vector<std::pair<std::string, Tensor>>& out) const {}
  virtual void load_tensors(const std::vector<std::pair<std::string, Tensor>>& in) {}
  // Ranks the task runs itself instead of the training loop (RL's rollout ranks): the last n of a
  // job of `world`; 0: none. The trainer then trains over the others only.
  virtual int reserved_ranks(int world) const { return 0; }
  // Where reserved_ranks() > 0, before setup, on every rank: the whole job's communicator (the
  // trainer keeps a split of it) and whether this rank is reserved.
  virtual void attach_job(std::unique_ptr<comm::Communicator> job, bool reserved) {}
  // A reserved rank's run, after setup and the weights' init; the training loop does not run there.
  virtual void serve(nn::Model& model) {}
};

using TaskFactory = std::function<std::unique_ptr<Task>(Config& cfg, const TrainOptions& o)>;
Registry<TaskFactory>& task_registry();
struct TaskRegistrar {
  TaskRegistrar(const std::string& name, TaskFactory f) { task_registry().add(name, std::move(f)); }
};

}  // namespace atl
