// Distributed data parallel (Li et al., "PyTorch Distributed: Experiences on Accelerating Data
// Parallel Training", VLDB 2020): every rank holds the whole model and optimizer; gradients are
// summed in buckets of the flat gradient buffer (views, no copies), each bucket's all-reduce
// started from a gradient hook as soon as its last gradient is final, so communication overlaps
// the rest of backward; finish_backward() waits for them. Parameters start as rank 0's.
// With a codec ([parallel] codec, comm/codec.h) each bucket goes through the compressed
// all-reduce instead (in finish_backward, not overlapped), GIFT seeing the bucket's whole matrices.
#pragma once
#include "comm/compressed_allreduce.h"
#include "parallel/data_parallel.h"
#include "parallel/flat_layout.h"

namespace atl::parallel {

struct CommTiming {
  double wait_s = 0;  // time finish_backward() spent waiting for the gradient reductions
  int64_t steps = 0;
};

class DDP final : public DataParallel {
 public:
  // opt: the optimizer over the model's full parameters; null builds AdamW from ac.
  DDP(nn::Model& model, comm::Communicator* comm, int64_t bucket_elems, const AdamWConfig& ac,
      std::unique_ptr<Optimizer> opt = nullptr, const comm::CodecSpec& codec = {});
  ~DDP() override;
  std::string name() const override { return "ddp"; }
  void zero_grad() override;
  void finish_backward() override;
  double grad_norm() override;
  void step(const StepContext& ctx) override;
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state) override;
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                       const std::string& what) override;
  size_t num_buckets() const { return layout_.buckets.size(); }
  const CommTiming& timing() const { return timing_; }
  // Seconds the bucket all-reduces take on their own (blocking, on a scratch buffer): with
  // timing().wait_s it gives the share of communication hidden behind backward.
  double time_reductions();
  // The compressed all-reduce (null without a codec): its byte counts.
  const comm::CompressedAllReducer* compressor() const { return compressor_.get(); }
  comm::CompressedAllReducer* gradient_codec() override { return compressor_.get(); }
  std::vector<std::pair<std::string, int64_t>> gradient_codec_tensors() const override;

 private:
  void on_grad_ready(int param);
  void launch(size_t b);

  FlatLayout layout_;
  std::vector<int> pending_;
  std::vector<comm::WorkPtr> work_;
  std::vector<bool> ready_;  // with a codec: the bucket's gradients are final
  CommTiming timing_;
  std::unique_ptr<comm::CompressedAllReducer> compressor_;
  std::vector<std::vector<comm::MatrixSpan>> bucket_mats_;  // GIFT: whole matrices per bucket
};

}  // namespace atl::parallel
