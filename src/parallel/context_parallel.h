// Context parallelism (ring attention: Liu, Zaharia & Abbeel 2023, "Ring Attention with Blockwise
// Transformers for Near-Infinite Context"; the head–tail causal balance of Megatron-LM's context
// parallelism and Brandon et al. 2023, "Striped Attention"). Every row of a batch is split over
// the mesh's cp ranks; rank i holds chunks i and 2cp−1−i of 2cp (balanced: with a causal mask the
// early chunk sees few keys and the late one many, so every rank does the same work), or chunk i
// of cp (unbalanced). Each rank runs the model on its tokens; attention passes the key/value
// blocks around the ring (send to rank i+1, receive from rank i−1), computing the local queries
// against the block it holds while the next one is in flight, and merges the blocks' partial
// results with the online-softmax rule (running log-sum-exp). Backward is a ring too: each block
// travels again with an accumulator for its dK/dV, every rank adding its queries' share, and the
// accumulator comes home after cp hops; dQ stays local. See docs/context_parallel.md.
#pragma once
#include <memory>

#include "comm/communicator.h"
#include "nn/context_attention.h"
#include "nn/model.h"
#include "parallel/mesh.h"

namespace atl::parallel {

// The spans rank `rank` of `cp` holds in a row of T positions (T divisible by 2cp balanced, by cp otherwise).
std::vector<nn::Span> context_spans(int64_t T, int cp, int rank, bool balanced);

// Time spent by ring attention on this thread since the last reset, for the benchmark's
// hidden-communication share: compute (the block kernels and merges) and waiting on transfers.
struct RingTimes {
  double compute_s = 0, wait_s = 0;
  int64_t exchanges = 0;
};
RingTimes& ring_times();

// The ring over comm (a cp group; null or size 1: local attention over the row). qkv is this
// rank's [B, Tl, (H+2KV)*hd] at context_spans(T, size, rank, balanced); doc_ids [B, T] or undefined.
// Differentiable in qkv; every rank of the group must call it with the same shapes.
Tensor ring_attention(comm::Communicator* comm, const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, int64_t T,
                      bool causal, const Tensor& doc_ids, bool balanced = true);

class RingAttention final : public nn::ContextAttention {
 public:
  RingAttention(comm::Communicator* cp_group, bool balanced = true);
  int64_t ranks() const override { return cp_; }
  std::vector<nn::Span> spans(int64_t T) const override;
  std::vector<nn::Span> spans_of(int64_t rank, int64_t T) const override;
  Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, int64_t T, bool causal,
                   const Tensor& doc_ids) const override;
  double loss_share(int64_t kept_local) const override;
  void sum_over_ranks(std::vector<int64_t>& v) const override;

 private:
  comm::Communicator* comm_;
  int cp_, rank_;
  bool balanced_;
};

// Refuses, before anything is built, a cp > 1 that the model does not plan or a seq_len that
// does not split into 2·cp chunks (cp unbalanced), naming the key.
// `where` says where seq_len was set ("run.toml:12"), for the message.
void check_context_parallel(const MeshShape& mesh, const nn::Model& model, int64_t seq_len, bool balanced = true,
                            const std::string& where = "");
// For a mesh with cp > 1: checks that the model plans sequence parallelism and that seq_len
// splits into 2·cp chunks (naming train.seq_len), and injects ring attention over the mesh's cp
// axis into the model. Returns what the model now points to (keep it alive), null when cp = 1.
std::unique_ptr<nn::ContextAttention> apply_context_parallel(nn::Model& model, Mesh& mesh, int64_t seq_len,
                                                             bool balanced = true, const std::string& where = "");

}  // namespace atl::parallel
