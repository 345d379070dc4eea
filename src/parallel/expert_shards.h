// Expert parallelism's storage (GShard, Lepikhin et al. 2020; DeepSeek-MoE): each rank allocates
// only the routed experts of its ep coordinate (nn::MoEConfig::expert_ranks), their gradients and
// their AdamW state, outside the model's flat buffers, so that data parallelism (DDP, ZeRO, HSDP)
// handles the dense parameters only. Each expert's gradient is then summed over the ranks that
// replicate it — the ranks of the same ep coordinate, "dp within ep" — and divided, like the dense
// gradients, by the number of data-parallel ranks: the gradient of the job's mean loss, as one
// process holding every expert computes it (the ep group's tokens reach an expert through the
// dispatcher, so its owner's gradient already sums over its ep group).
//
// The gradient norm is the whole model's: the dense part's (the strategy's) and the experts'
// squares summed over the ep group (replicas counted once). Checkpoints hold the whole model and a
// single-rank AdamW's state under their usual names (the experts gathered over the ep group), so a
// run resumes under any ep, or none.
//
// Under a pipeline (pp x ep, set_pipeline) a rank steps the experts of its own stages' MoE layers
// only: their replicas are the ranks of the same pp and ep coordinates, the gradient norm's
// squares add up over the ep group and then over pp (as the pipeline sums its stages'), the other
// stages' experts hold no values, gradients or optimizer state between steps (sync_full_model
// binds their values for an evaluation), and a checkpoint takes every stage's experts from their
// stage over the pp axis before the ep gather.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/model.h"
#include "nn/moe.h"
#include "optim/adamw.h"
#include "tensor/safetensors.h"

namespace atl::parallel {

class ExpertShards {
 public:
  // model: an expert shard (nn::ExpertModel::expert_shard) with the dispatcher injected; ep: its
  // ep group (group rank = ep coordinate); replicas: the ranks holding the same experts (null or
  // size 1: none).
  ExpertShards(nn::Model& model, std::unique_ptr<nn::ExpertDispatcher> dispatcher, comm::Communicator* ep,
               std::unique_ptr<comm::Communicator> replicas);
  ~ExpertShards();
  nn::ExpertDispatcher& dispatcher() { return *dispatcher_; }
  // The model was rebuilt after the expert shard (tensor parallelism's shard of it, ep x tp):
  // takes its expert parameters and injects the dispatcher into it. Before attach().
  void rebind(nn::Model& model);
  // pp > 1: this rank's stages are pipe's; pp: the pipeline axis (the ranks of this ep coordinate
  // on every stage). Releases the other stages' experts. Before attach().
  void set_pipeline(const class PipelineParallel& pipe, comm::Communicator* pp);
  // Under a pipeline: every stage's experts' values bound here from their stage (collective over
  // pp), for an evaluation; released by the next zero_grad(). Without one: nothing.
  void sync_full_model();

  // Once the data-parallel strategy is built: the experts' AdamW, and the divisor of the
  // gradients (the strategy's data-parallel ranks). other_optimizer: the job's [optim] places
  // another optimizer (Muon, groups), which sharded experts do not take yet: refused.
  void attach(const AdamWConfig& ac, int data_ranks, bool other_optimizer = false);

  void zero_grad();
  // After the strategy's finish_backward: experts' gradients summed over their replicas / ranks.
  void finish_backward();
  // The whole model's gradient norm from the dense part's (collective over the ep group).
  double grad_norm(double dense_norm);
  void step(const StepContext& ctx);

  // Appends the experts, gathered over the ep group, to the whole model's state (collective).
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state);
  // Takes this rank's slices of the experts out of the whole model's state (loading them), so
  // that what is left is the dense model's. `what` names the checkpoint in errors.
  void local_state(std::vector<std::pair<std::string, Tensor>>& model_sd, TensorFile& opt_state,
                   const std::string& what);

  // Bytes this rank holds for the experts: values, gradients and optimizer state.
  int64_t bytes() const;
  // The same for the whole model's experts (every rank's share).
  int64_t full_bytes() const;
  int ep_size() const { return ep_ ? ep_->size() : 1; }

 private:
  Tensor gather(const Tensor& local) const;  // [L, ...] on each ep rank -> [E, ...]

  nn::Model* model_;
  std::unique_ptr<nn::ExpertDispatcher> dispatcher_;
  comm::Communicator* ep_;
  std::unique_ptr<comm::Communicator> replicas_;
  std::vector<nn::Parameter*> params_;  // the experts this rank steps (under a pipeline: its stages')
  // Under a pipeline: every MoE layer's experts of this ep rank, the pp rank of each one's stage.
  std::vector<nn::Parameter*> all_;
  std::vector<int> owner_;
  comm::Communicator* pp_ = nullptr;
  bool others_bound_ = false;
  bool mine(size_t i) const { return !pp_ || owner_[i] == pp_->rank(); }
  void release_others();
  std::unique_ptr<AdamW> opt_;
  float divisor_ = 1.f;
};

}  // namespace atl::parallel
