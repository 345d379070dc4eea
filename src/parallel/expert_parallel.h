// Expert parallelism (GShard, Lepikhin et al. 2020; DeepSeek-MoE): the routed experts of every
// MoE layer are divided over the mesh's ep axis (rank p of P holds experts [p E/P, (p+1) E/P)),
// and the rows routed to an expert travel to its rank and back through the dispatcher injected
// into the model (nn::ExpertDispatcher, nn/moe.h):
//
//   all_to_all  the token counts are exchanged first (one all-gather of each rank's per-expert
//               counts, so every rank knows every pair's count), then the rows in one all-to-all
//               padded to the largest pair count: a persistent buffer that grows when a pair
//               exceeds it (no-drop routing can send a rank far more than its share) and never
//               overflows. Combine is the same exchange reversed; so are both backwards.
//   all_gather  the reference: every rank gathers every rank's rows and picks its experts';
//               combine scatters the results into a zero buffer and reduce-scatters it.
//
// Both give bit-identical results (each row is copied, never summed with a nonzero). Within an
// expert the rows arrive ordered by source rank, then by the source's order, which on a
// rank-major batch is the order one rank holding every expert would use.
//
// Tile-level overlap ("Fine-grained Computation-Communication Overlap via Tile-level Signaling
// and Scheduling for Mixture-of-Experts", issue 12's seed): see experts_and_combine in
// expert_parallel.cpp (parallel.ep_overlap).
//
// Storage: with the trainer (apply_expert_parallel) each rank holds only its own experts, their
// gradients and optimizer state, reduced over the ranks replicating them (expert_shards.h). The
// dispatchers also run a model holding every expert on each rank (the weights' first dimension
// says which), as the layer-level tests do.
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "nn/model.h"
#include "nn/moe.h"
#include "parallel/expert_shards.h"
#include "parallel/mesh.h"

namespace atl::parallel {

// Refuses layouts expert parallelism cannot run (experts not divisible by ep, a model without
// experts), naming the keys; before any communication.
void check_expert_layout(const MeshShape& mesh, const nn::Model& model);

// The tile overlap's granularity: experts compute in tiles of at most tile_rows rows; the tiles
// bound for one destination are sent in `messages` messages of consecutive tiles (each closed
// once it holds ceil(rows / messages) rows), or one message per tile with messages = 0. Fewer,
// larger messages pay the per-message cost (latency, a shaped link's bursts) fewer times; more of
// them start the return exchange sooner. Numerics do not depend on either.
// backward: the backward's two exchanges tiled as well (parallel.ep_overlap_backward, default
// on): the output gradients reach the experts in the same messages, each computed as it lands
// (this rank's own rows first), and each tile's input gradient goes back to its source as soon
// as it is done, while the next tiles and then the weight gradients compute. Off: the backward
// is the plain path's two blocking all-to-alls around the whole-tensor kernels.
struct OverlapGrain {
  int64_t tile_rows = 64;
  int64_t messages = 4;
  bool backward = true;
};

// The dispatcher over an ep group (ep: its communicator, null for one process).
std::unique_ptr<nn::ExpertDispatcher> make_expert_dispatcher(const std::string& kind, comm::Communicator* ep,
                                                             bool overlap = false, OverlapGrain grain = {});

// [parallel] ep > 1: checks the layout, reads parallel.ep_dispatcher (all_to_all | all_gather)
// and parallel.ep_overlap (with parallel.ep_overlap_messages, OverlapGrain::messages, and
// parallel.ep_overlap_backward, OverlapGrain::backward), replaces `model` by this rank's expert shard (only its experts
// allocated; call before anything else holds the model) with the dispatcher injected, and returns
// the shards' state (the caller keeps it as long as the model runs; attach() it once the
// data-parallel strategy exists). world: the job's communicator (the replica groups are split
// from it; a collective). ep = 1: nullptr, nothing changes.
std::unique_ptr<ExpertShards> apply_expert_parallel(Config& cfg, std::unique_ptr<nn::Model>& model, Mesh& mesh,
                                                    comm::Communicator* world);

// Buffer growths of an all_to_all dispatcher so far (tests; 0 for other kinds).
int64_t dispatcher_buffer_growths(const nn::ExpertDispatcher& d);

}  // namespace atl::parallel
