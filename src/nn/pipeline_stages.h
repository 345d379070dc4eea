// What pipeline parallelism (parallel/pipeline.h) needs of a model: its forward cut at the
// boundaries of its blocks (Model::blocks()). The first stage turns the input into the first
// block's input, every stage runs a contiguous range of blocks, the last stage turns the last
// block's output into the loss. The pieces must compose to exactly Model::loss (same ops in the
// same order), so a pipelined step computes what one process computes.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace atl::nn {

class PipelineStages {
 public:
  virtual ~PipelineStages() = default;
  // Called on every stage before its forward of a micro-batch with this input shape (a
  // tensor-parallel shard starts its context's forward there: every stage's collectives need the
  // batch's B and T).
  virtual void stage_begin(const Shape& input) const {}
  // The model's input -> the first block's input (embeddings), recording the graph.
  virtual Tensor stage_input(const Tensor& input) const = 0;
  // Blocks [first, last) over hidden states x.
  virtual Tensor stage_blocks(const Tensor& x, int64_t first, int64_t last) const = 0;
  // The shape of the hidden states between blocks for an input of this shape ([B,T] -> [B,T,C]).
  virtual Shape stage_hidden_shape(const Shape& input) const = 0;
  // The last block's output -> the scalar training loss against target (final norm, head, loss).
  virtual Tensor stage_loss(const Tensor& x, const Tensor& target) const = 0;
  // The auxiliary losses (an MoE router's balance and z-losses) of the blocks the last
  // stage_blocks call ran, summed, in that call's graph; undefined when they have none. Model::loss
  // adds them to the cross-entropy, so stage_loss does not: the pipeline seeds their gradient with
  // the loss's seed on the stage that ran them (the router's gradient then is one process's) and
  // adds their value to the loss it reports. Taken once per stage_blocks call.
  virtual Tensor stage_take_aux_loss() const { return Tensor(); }
};

}  // namespace atl::nn
