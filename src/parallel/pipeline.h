// Pipeline parallelism: the model's blocks cut into stages over the mesh's pp axis, micro-batches
// flowing forward as activations and backward as their gradients (the communicator's send_async /
// recv_async), in the order a schedule (pipeline_schedule.h) lists for each rank.
//
// Layout. [parallel] pp = p stages (mesh.h), pp_virtual = v chunks per rank (interleaved only),
// pp_layers = [..] blocks per virtual stage (v·p entries; default: as even as possible, earlier
// stages taking the remainder). Virtual stage s = c·p + r runs on pp rank r as its chunk c.
// Stage 0 also owns the lower root (embeddings), stage v·p-1 the upper root (final norm, head)
// and computes the loss. A head tied to the embedding (Model::head_reads_lower_root) keeps a copy
// of the lower root on the last stage too; after backward the first and last stage add their
// gradients of it (as Megatron-LM does for tied word embeddings), so both copies step alike.
//
// A step (PipelineParallel, driven like any DataParallel by the trainer):
//   zero_grad(); loss = forward_backward(inputs, targets);   // m = inputs.size() micro-batches
//   finish_backward();    // tied gradients summed, then averaged over the dp axis
//   coef = clip_coefficient(grad_norm(), max);               // global: squared norms summed over pp
//   step({lr_scale, coef});  // each stage's optimizer on its own parameters (ZeRO-1 shards them over dp)
// Under ZeRO-3 (and HSDP, per replica) a stage's parameters live on the dp ranks that step them:
// forward_backward all-gathers the stage's others for all its micro-batches, finish_backward
// reduce-scatters the gradients and drops them again (see docs/pipeline.md for why not per
// micro-batch). Under cp (pp x cp) the stages' blocks ring over each stage's cp group, the
// activations between stages are the cp ranks' chunks, and dp below means dp x cp (HSDP: its
// shard group dp_shard x cp, replicated over dp_replicate).
// Every stage gets the same micro-batches; the first reads the inputs, the last the targets. The
// loss is the mean over micro-batches of each micro-batch's mean loss (backward seeded with 1/m),
// as one process accumulating m micro-batches computes it.
//
// Every rank builds and initialises the whole model (so any layout starts from the same weights),
// then the constructor shrinks the model's flat buffers to its own stages' parameters
// (Module::retain_parameters): the others' values and gradients are undefined and the optimizer
// state is made for the rank's own parameters only. Checkpoints gather the full model and
// optimizer state on rank 0 under their usual names (they load under any layout).
// sync_full_model() gives every rank the whole model's values for a while (for evaluation and
// sampling, which run the model in one process; a load binds them too): the other stages' values
// are allocated outside the flat buffers, without gradients, and freed by the next step.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/pipeline_stages.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline_schedule.h"

namespace atl::parallel {

class TensorParallel;

// The optimizer over the parameters a rank steps (whole ones: its stages', under ZeRO its dp share
// of them); null: AdamW from the AdamWConfig (OptimizerPlacement::per_rank builds the [optim] one).
using StageOptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef> params)>;

struct PipelineConfig {
  int64_t pp = 1;
  std::string schedule = "1f1b";  // parallel.pp_schedule
  int64_t virtual_stages = 1;     // parallel.pp_virtual
  std::vector<int64_t> layers;    // parallel.pp_layers (empty: even)
  // Reads pp_schedule, pp_virtual, pp_layers of [parallel] (pp comes from the mesh).
  static PipelineConfig from_config(Config& cfg, int64_t pp);
};

// [first, last) blocks of each of `stages` virtual stages; `layers` as parallel.pp_layers. Throws
// naming the key when there are fewer blocks than stages or the list does not fit.
std::vector<std::pair<int64_t, int64_t>> pipeline_stage_blocks(int64_t blocks, int64_t stages,
                                                               const std::vector<int64_t>& layers);

// Refuses a pipeline layout that cannot apply to the model, before anything is built: a model
// that cannot be cut into stages, fewer blocks than stages, a pp_layers list that does not fit,
// a schedule that cannot run p stages with m micro-batches and v chunks.
void check_pipeline_layout(const nn::Model& model, const PipelineConfig& pc, int64_t micro_batches);

// One action as it ran: steady-clock seconds (the same clock on every process of a machine).
struct ActionSpan {
  PipeOp op;
  int mb, chunk;
  double t0, t1;
};

class PipelineParallel final : public DataParallel {
 public:
  // world: the job's communicator; mesh: over it, with pp > 1 (and one data-parallel axis:
  // dp_replicate under ddp, dp_shard under zero1/2/3; both under hsdp), cp allowed (the ring
  // injected into the model before), tp allowed (the model being this rank's shard; under ZeRO the
  // constructor agrees the dp placement over the tp axis: collective over it). micro_batches: m
  // per step. make_opt: see StageOptimizerFactory (called by the constructor only).
  PipelineParallel(nn::Model& model, comm::Communicator* world, Mesh& mesh, const PipelineConfig& pc,
                   int64_t micro_batches, const std::string& dp_strategy, const AdamWConfig& ac,
                   StageOptimizerFactory make_opt = {});
  ~PipelineParallel() override;
  std::string name() const override;

  // Under tensor parallelism (a mesh with tp > 1, the model being this rank's shard): the context,
  // for the gradient norm and the checkpoint's gathers over tp. The caller runs
  // TensorParallel::finish_backward after finish_backward (under ZeRO-3 / HSDP it sums the
  // partial gradients of the parameters this rank keeps, the same on the group's ranks).
  void set_tensor_parallel(TensorParallel* tp);
  // Runs the schedule over the micro-batches; returns their mean loss (known on every rank).
  double forward_backward(const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets);
  void zero_grad() override;
  void finish_backward() override;
  double grad_norm() override;
  void step(const StepContext& ctx) override;
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state) override;
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                       const std::string& what) override;
  // Collective over the pp axis: every parameter's value copied from the stage that owns it (the
  // others' allocated until the next step).
  void sync_full_model();

  int stage_rank() const { return r_; }
  int stages() const { return p_; }
  const PipeSchedule& schedule() const { return sched_; }
  const std::vector<std::pair<int64_t, int64_t>>& stage_blocks() const { return blocks_; }
  // This rank's actions in the last forward_backward.
  const std::vector<ActionSpan>& timeline() const { return spans_; }
  // The parameters this rank computes gradients for and steps (its stages', tied copies included).
  const std::vector<nn::Parameter*>& owned() const { return owned_; }
  // Those whose values, gradients (and under ZeRO-1/2/3 optimizer state) live in the model's flat
  // buffers between steps: owned(), except under ZeRO-3, where only those this dp rank steps.
  std::vector<nn::Parameter*> resident() const;
  // Per model parameter (Module::parameters() order): the pp rank that owns it (the tied head's
  // copy on the last stage not counted).
  const std::vector<int>& owners() const { return owner_pp_; }
  // The lower root's parameters the tied head reads (empty without a tied head): owned by the
  // first stage, copied on the last.
  const std::vector<nn::Parameter*>& tied() const { return tied_; }
  // Whether this rank holds q's gradient averaged over dp after finish_backward (under ZeRO-2
  // only its dp owner does; otherwise every rank of the stage).
  bool holds_reduced_grad(const nn::Parameter* q) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  const nn::PipelineStages* stages_;
  comm::Communicator *pp_comm_ = nullptr, *dp_comm_ = nullptr;  // dp_comm_: dp (x cp); under HSDP its shard group
  comm::Communicator* rep_comm_ = nullptr;  // HSDP: dp_replicate
  // Point-to-point traffic goes over copies of the pp and world groups: ranks send and receive
  // different numbers of messages, and a communicator's collectives count on equal sequences.
  std::unique_ptr<comm::Communicator> pp_p2p_, world_p2p_;
  int p_ = 1, r_ = 0, v_ = 1, m_ = 1, cp_ = 1;
  PipeSchedule sched_;
  std::vector<std::pair<int64_t, int64_t>> blocks_;  // per virtual stage
  std::vector<nn::Parameter*> owned_, norm_params_, tied_;
  std::vector<int> owner_pp_;       // per model parameter: the pp rank that owns it
  std::vector<nn::Parameter*> dp_owned_;  // ZeRO-1: what this dp rank steps
  std::vector<int> dp_owner_;       // per owned_ parameter: its dp rank (ZeRO-1), else -1
  bool zero1_ = false, zero2_ = false, stale_ = false, full_resident_ = false;  // zero1_, zero2_: also under zero3
  bool zero3_ = false, stage_gathered_ = false;
  std::vector<int> place_on_dp(const std::vector<int64_t>& sizes) const;
  void bind_stage();     // ZeRO-3: the stage's parameters this dp rank does not step, allocated
  void gather_stage();   // ZeRO-3: bind_stage, then all-gathered from their dp owners
  void release_stage();  // ZeRO-3: those parameters' values and gradients dropped
  void reduce_scatter_grads();
  void place_optimizer(const std::vector<int64_t>& sizes);  // ZeRO-1/2: dp_owner_ and opt_
  AdamWConfig ac_;
  StageOptimizerFactory make_opt_;
  TensorParallel* tp_ = nullptr;
  void release_unowned();
  void bind_unowned();
  std::vector<nn::Parameter*> unowned();
  uint64_t steps_run_ = 0;
  std::vector<ActionSpan> spans_;
};

}  // namespace atl::parallel
