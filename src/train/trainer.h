// The training loop: data → forward → backward → clip → optimizer step, with the schedule,
// gradient accumulation, periodic evaluation and sampling, telemetry and checkpoints.
// Everything is read from one Config; unknown keys are rejected before the first step.
// The trainer composes its parts by name from the config: the model family ([model] family,
// nn/model.h), the task ([train] task, task.h), the optimizers ([optim], optim/param_groups.h) and
// their distributed placements (parallel/optim/placement.h), the data-parallel strategy.
// Started by `atoll launch` (WORLD_SIZE > 1) it trains data-parallel on a device mesh
// (parallel/mesh.h): [parallel] strategy = "ddp" (default), "zero1", "zero2", "zero3" or "hsdp",
// or the mesh axes (dp_shard = 2, ...), bucket_mb, hsdp_shard_size, backend (see
// parallel/data_parallel.h); each rank reads its share of every batch, rank 0 alone reports and
// writes metrics and checkpoints, and tokens/s is the whole job's.
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "nn/model.h"
#include "optim/optimizer.h"
#include "train/schedule.h"

namespace atl {

struct TrainOptions {
  // [run]
  std::string run_dir = "runs/default";
  // [data]
  std::string data_dir = "data/fortunes-byte", tokenizer = "byte";
  bool auto_prepare = true;  // prepare the default corpus into data_dir when it is missing
  // [train]
  int64_t steps = 200, batch_size = 8, seq_len = 128, grad_accum = 1, seed = 1337, threads = 0;
  float grad_clip = 1.f;
  LrSchedule schedule;
  // [eval] / [sample] / [checkpoint] / [log]
  int64_t eval_every = 50, eval_steps = 8;
  int64_t sample_every = 100, sample_tokens = 64;
  float sample_temperature = 1.f;
  int64_t sample_top_k = 40;
  std::string sample_prompt = "";
  int64_t ckpt_every = 100, ckpt_keep = 3;
  int64_t log_every = 1;
  double peak_gflops = 0;  // 0: measure a quick fp32 GEMM peak at startup
  // Stop after this many steps of this invocation (tests use it to interrupt a run); 0 = never.
  int64_t stop_after = 0;
  // [fault] injection for resilience tests: at this step one weight becomes NaN; 0 = off.
  int64_t fault_nan_at_step = 0;
  // [fault] (issue 14, docs/fault_tolerance.md): tolerance = "quorum" runs each rank as a replica of
  // fault-tolerant data parallelism (resilience/quorum.h) against a lighthouse ("HOST:PORT", else
  // ATOLL_LIGHTHOUSE); gate: the pre-run invariant gate; phase_guard: collective fingerprints at
  // every phase boundary (both on distributed runs only); signatures: per-step SCOUT signatures
  // and consensus (DDP).
  std::string fault_tolerance = "none", fault_lighthouse;
  int64_t fault_heartbeat_ms = 100;
  bool fault_gate = true, fault_phase_guard = true, fault_signatures = false;
  // DeadPool: a quorum replica's state sent to the next replica's memory every N committed steps
  // (0 = off); a spare waits in the lighthouse's pool and takes a dead replica's place.
  int64_t fault_snapshot_every = 0;
  int64_t fault_snapshot_copies = 1;  // 2: also in the replica after next (resilience/deadpool.h)
  bool fault_spare = false;
  // commit_hashes: in quorum mode, each committed step's metrics record carries the weights' hash
  // and the wall-clock time of the commit ("param_hash", "committed_unix_s"), so that a soak can
  // check every replica committed the same weights at every step (bench/ft_soak.sh). Off by
  // default: it hashes the whole model every step.
  bool fault_commit_hashes = false;
  // progress: publish RUN_DIR/progress/rank<R>.progress (or under ATOLL_PROGRESS_DIR) for the
  // external watcher, `atoll watch` (resilience/progress_record.h).
  bool fault_progress = true;
  // replay_every: SCOUT's cross-replay of every N-th step (0 = off; DDP): each rank's gradient share
  // recomputed by replay_witnesses other ranks before the update (train/replay_hook.h). With
  // replay_repair a step whose share did not reproduce is computed again (a second time: the run
  // stops naming the rank); resume_certified: --resume takes the newest checkpoint whose replay
  // certificate is clean (needs replay_every = 1: a certificate covers only audited steps).
  int64_t fault_replay_every = 0, fault_replay_witnesses = 2;
  bool fault_replay_repair = true, fault_resume_certified = false;
  std::string fault_replay_where;  // where replay_every was set, for errors
  // Test injection for the replay: at this step rank flip_grad_rank flips one bit of its own
  // gradient share before the all-reduce (on the first computation only, or on every one).
  int64_t fault_flip_grad_at_step = 0, fault_flip_grad_rank = 0;
  bool fault_flip_grad_every_attempt = false;
  // campaign: a fault-injection campaign file fired inside this run (train/fault_campaign_hook.h).
  std::string fault_campaign;
  // [train] dtype: "bf16" multiplies in bf16 with fp32 master weights (mixed precision).
  std::string matmul_dtype = "f32";

  static TrainOptions from_config(Config& cfg);
};

struct TrainResult {
  int64_t start_step = 0;  // where this invocation started (the checkpoint resumed from, or 0)
  int64_t final_step = 0;
  bool stopped_by_signal = false;  // SIGTERM/SIGINT: stopped early with a checkpoint
  double final_loss = 0, final_val_loss = -1;
  double tokens_per_s = 0, mfu = 0;
};

class Trainer {
 public:
  // Reads the whole config (model, optimizer, training) and rejects unknown keys.
  explicit Trainer(Config& cfg);
  ~Trainer();
  // resume: continue from run_dir's newest complete, verified checkpoint when there is one.
  // Without it a run dir holding a run is refused unless [run] overwrite (see train/run_dir.h).
  TrainResult run(bool resume);
  // Under ZeRO-3/HSDP ([parallel] strategy) a rank holds only its shards of the weights between
  // steps; the checkpoints hold the full model.
  nn::Model& model();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A quick fp32 GEMM peak (GFLOP/s) of this machine at the current thread count.
double measure_gemm_peak_gflops();

}  // namespace atl
