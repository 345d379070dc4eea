// Pipeline schedules as data: for each rank, the ordered list of actions it runs in one step
// (forward, backward or weight-gradient pass of micro-batch i on its chunk c), which one runner
// (pipeline.cpp) executes. Registered by name ([parallel] pp_schedule):
//   gpipe        all forwards, then all backwards (Huang et al., "GPipe", 2019)
//   1f1b         warm-up forwards, then one forward one backward, then cool-down backwards
//                (Narayanan et al., "PipeDream-Flush", 2021): bubble (p-1)/(m+p-1), at most p-r
//                micro-batches' activations held on rank r
//   interleaved  1F1B over v chunks per rank (virtual stages; Narayanan et al., "Efficient
//                Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", 2021):
//                bubble (p-1)/(v·m+p-1); needs m a multiple of p
//   zb-h1        1F1B with backward split into B (input gradient) and W (weight gradient), W
//                filling the bubble (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): bubble
//                time (p-1)(F+B-W), a third of 1F1B's when F = B = W
// Virtual stage s = c·p + r lives on rank r as chunk c; stage 0 holds the embedding, stage
// v·p-1 the head and loss. Micro-batches' backwards run in increasing order on every stage, as
// in one process's gradient accumulation, so gradients sum in the same order.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/registry.h"

namespace atl::parallel {

enum class PipeOp : unsigned char { forward, backward, weight };
const char* pipe_op_name(PipeOp op);  // "F", "B", "W"

struct PipeAction {
  PipeOp op;
  int mb;     // micro-batch
  int chunk;  // 0 .. v-1 on this rank
  bool operator==(const PipeAction& o) const { return op == o.op && mb == o.mb && chunk == o.chunk; }
};

struct PipeSchedule {
  std::string name;
  int p = 1, m = 1, v = 1;
  bool split_backward = false;  // B computes input gradients only, W the weight gradients
  std::vector<std::vector<PipeAction>> ranks;  // [p] action lists
};

struct ScheduleEntry {
  bool virtual_stages = false;  // takes parallel.pp_virtual > 1
  bool split_backward = false;
  // Throws (naming the key) when it cannot schedule p stages, m micro-batches, v chunks.
  std::function<PipeSchedule(int p, int m, int v)> make;
};
Registry<ScheduleEntry>& pipeline_schedule_registry();

// Builds and checks (check_schedule) the named schedule.
PipeSchedule make_pipe_schedule(const std::string& name, int p, int m, int v);

// The schedule's timeline when a forward of one chunk costs tf, its backward tb and weight pass
// tw (a fused backward costs tb + tw), sends are asynchronous and free, and a rank blocks on a
// receive: per rank the start of each action. Throws when an action is missing or repeated or
// when the ranks would wait on each other forever.
struct SimTimeline {
  std::vector<std::vector<double>> start;  // [rank][action]
  double makespan = 0;
  double bubble = 0;  // idle share of p·makespan
};
SimTimeline simulate(const PipeSchedule& s, double tf = 1, double tb = 1, double tw = 1);
void check_schedule(const PipeSchedule& s);

// Makers (one file each).
PipeSchedule make_gpipe(int p, int m, int v);
PipeSchedule make_1f1b(int p, int m, int v);
PipeSchedule make_interleaved_1f1b(int p, int m, int v);
PipeSchedule make_zb_h1(int p, int m, int v);

}  // namespace atl::parallel
