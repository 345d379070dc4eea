#include "train/trainer.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "autograd/weight_cast_cache.h"
#include "comm/communicator.h"
#include "core/log.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "lowcomm/codec_checkpoint.h"
#include "lowcomm/lowcomm.h"
#include "nn/recompute.h"
#include "optim/clip.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/optim/placement.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "resilience/checkpoint.h"
#include "tensor/allocator.h"
#include "train/data_centric_step.h"
#include "train/fault_campaign_hook.h"
#include "train/fault_hooks.h"
#include "train/gemm_peak_cache.h"
#include "train/join_step.h"
#include "train/memory_budget.h"
#include "train/metrics.h"
#include "train/preflight.h"
#include "train/replay_hook.h"
#include "train/run_dir.h"
#include "train/stop_signals.h"
#include "train/task.h"

namespace atl {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

TrainOptions TrainOptions::from_config(Config& c) {
  TrainOptions o;
  o.run_dir = c.get_string("run.dir", o.run_dir);
  o.data_dir = c.get_string("data.dir", o.data_dir);
  o.tokenizer = c.get_string("data.tokenizer", o.tokenizer);
  o.auto_prepare = c.get_bool("data.auto_prepare", o.auto_prepare);
  o.steps = c.get_int("train.steps", o.steps, 1, int64_t(1) << 40);
  o.batch_size = c.get_int("train.batch_size", o.batch_size, 1, 1 << 20);
  o.seq_len = c.get_int("train.seq_len", o.seq_len, 1, 1 << 20);
  o.grad_accum = c.get_int("train.grad_accum", o.grad_accum, 1, 1 << 20);
  o.seed = c.get_int("train.seed", o.seed, 0);
  o.threads = c.get_int("train.threads", o.threads, 0, 4096);
  o.grad_clip = float(c.get_float("train.grad_clip", o.grad_clip, 0.0, 1e9));
  o.schedule.warmup_steps = c.get_int("train.warmup_steps", 10, 0);
  o.schedule.min_ratio = float(c.get_float("train.min_lr_ratio", 0.1, 0.0, 1.0));
  o.schedule.kind = c.get_string("train.schedule", "cosine", {"cosine", "constant"}) == "cosine" ? "cosine" : "constant";
  o.schedule.total_steps = o.steps;
  o.stop_after = c.get_int("train.stop_after", 0, 0);
  o.fault_nan_at_step = c.get_int("fault.nan_at_step", 0, 0);
  read_fault_options(c, o);  // issue 14: [fault] tolerance, lighthouse, heartbeat_ms, gate, phase_guard
  o.matmul_dtype = c.get_string("train.dtype", "f32", {"f32", "bf16"});
  o.eval_every = c.get_int("eval.every", o.eval_every, 0);
  o.eval_steps = c.get_int("eval.steps", o.eval_steps, 1);
  o.sample_every = c.get_int("sample.every", o.sample_every, 0);
  o.sample_tokens = c.get_int("sample.tokens", o.sample_tokens, 1);
  o.sample_temperature = float(c.get_float("sample.temperature", o.sample_temperature, 0.0, 100.0));
  o.sample_top_k = c.get_int("sample.top_k", o.sample_top_k, 0);
  o.sample_prompt = c.get_string("sample.prompt", o.sample_prompt);
  o.ckpt_every = c.get_int("checkpoint.every", o.ckpt_every, 0);
  o.ckpt_keep = c.get_int("checkpoint.keep", o.ckpt_keep, 1);
  o.log_every = c.get_int("log.every", o.log_every, 1);
  o.peak_gflops = c.get_float("hardware.peak_gflops", o.peak_gflops, 0.0);
  return o;
}

double measure_gemm_peak_gflops() {
  const int64_t n = 1024;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  cpu::gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // warm up
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    cpu::gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, 2.0 * double(n * n * n) / s / 1e9);
  }
  return best;
}

// s with every byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD.
static std::string valid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size() && !(n == 2 && c < 0xC2) && c <= 0xF4;
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok && n >= 3) {  // no overlong forms, surrogates or code points past U+10FFFF
      auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 > 0x9F) && !(c == 0xF0 && c1 < 0x90) &&
           !(c == 0xF4 && c1 > 0x8F);
    }
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

struct Trainer::Impl {
  TrainOptions o;
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<Task> task;
  // Distributed runs (WORLD_SIZE > 1 in the environment, as `atoll launch` sets) get a
  // communicator; a single process gets none and the data-parallel layer reduces to the plain loop.
  std::unique_ptr<comm::Communicator> comm;
  // issue 14: [fault] campaign: the DDP's gradient buckets checked against their senders' checksums
  // (payload_corruption); between comm and dp, so that it outlives dp and comm outlives it.
  std::unique_ptr<resilience::GradientChecksumComm> grad_check;
  parallel::ParallelConfig pc;
  std::unique_ptr<parallel::Mesh> mesh;
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<nn::ContextAttention> cp;  // ring attention over the mesh's cp axis (cp > 1)
  std::unique_ptr<lowcomm::LowComm> lowcomm;  // training across islands (lowcomm/lowcomm.h); null without
  std::unique_ptr<parallel::TensorParallel> tp;  // tp > 1: the context this rank's model shard computes through
  parallel::PipelineParallel* pipe = nullptr;  // dp, when [parallel] pp > 1 (parallel/pipeline.h)
  std::unique_ptr<parallel::ExpertShards> experts;  // ep > 1: this rank's experts and their dispatcher
  std::unique_ptr<DataCentricStep> dcp;  // issue 12: data.varlen_tokens > 0 (train/data_centric_step.h)
  MemoryBudget budget;  // issue 12: train.memory_budget_gb, and where the optimizer state lives
  std::string placement_note;  // how the optimizer is placed over the ranks, for the log
  int rank = 0, world = 1;
  bool serving = false;  // a rank the task runs itself (Task::reserved_ranks)
  std::string backend;
  Rng sample_rng;
  std::string config_text;
  RunDirOptions run_dir_opts;  // issue 10: --overwrite (train/run_dir.h)
  std::unique_ptr<QuorumHook> ft;  // issue 14: [fault] tolerance = "quorum"
  std::unique_ptr<SignatureHook> sig;  // issue 14: [fault] signatures
  std::unique_ptr<CampaignHook> campaign;  // issue 14: [fault] campaign
  std::unique_ptr<ReplayHook> replay;  // issue 14: [fault] replay_every (SCOUT's cross-replay)
  std::string init_param_hash, config_canonical;

  Checkpoint make_checkpoint(int64_t step) {
    Checkpoint ck;
    dp->full_state(ck.model, ck.optimizer);  // collective: gathers shards
    if (tp && !pipe) tp->full_state(ck.model, ck.optimizer);  // the whole model (a pipeline gathers tp itself)
    if (experts) experts->full_state(ck.model, ck.optimizer);  // every rank's experts
    ck.model_metadata = model->config_metadata();
    auto rs = sample_rng.state();
    ck.state = {{"step", step},
                {"sample_rng", std::vector<uint64_t>(rs.begin(), rs.end())},
                {"train_data", task->data_state()},
                {"config", config_text},
                // What evaluate() scores, so that `atoll eval` can repeat it on this checkpoint.
                {"eval", {{"data_dir", o.data_dir}, {"batch_size", o.batch_size}, {"seq_len", o.seq_len},
                          {"steps", o.eval_steps}, {"world_size", world}, {"matmul_dtype", o.matmul_dtype}}}};
    if (lowcomm) lowcomm->save_state(ck.model, ck.optimizer, ck.state);  // collective: every island's state
    lowcomm::save_gradient_codec(*dp, comm.get(), ck.optimizer, ck.state);  // after lowcomm's island gathers
    task->save_tensors(ck.optimizer);  // "task." entries (RL's reference), beside the optimizer's
    if (replay) ck.state["replay_certificate"] = replay->chain().certify(step).to_json();  // in the manifest's checksum
    return ck;
  }

  double evaluate() {
    if (pipe) pipe->sync_full_model();
    if (pipe && experts) experts->sync_full_model();  // pp x ep: every stage's experts of this ep rank
    double v = task->evaluate(*model);
    return lowcomm ? lowcomm->world_average(v) : dp->average(v);
  }
  // The task reads data as a data-parallel rank: the stages of a pipeline, the ranks of a tp group
  // and those of a cp group share every batch (the task sees the dp coordinate and size).
  TaskEnv data_env() const {
    if (ft) return ft->task_env();  // issue 14: a quorum replica reads its replica's share
    if (pipe) {  // (under hsdp the replicas' shards in order: the mesh's rank order)
      // Across islands each island's pipelines read their own rows, as without pp.
      const int64_t dp = pc.mesh.dp(), dp_rank = mesh->coord("dp_replicate") * pc.mesh.dp_shard + mesh->coord("dp_shard");
      return TaskEnv{int(mesh->coord("island") * dp + dp_rank), int(pc.mesh.island * dp), comm.get(), rank};
    }
    if (tp) {  // each island reads its own rows; HSDP's data coordinate is replica-major, as the mesh orders them
      const int64_t dp = pc.mesh.dp(), dp_rank = mesh->coord("dp_replicate") * pc.mesh.dp_shard + mesh->coord("dp_shard");
      return TaskEnv{int(mesh->coord("island") * dp + dp_rank), int(pc.mesh.island * dp), comm.get(), rank};
    }
    const int cp_ranks = int(pc.mesh.cp);
    if (pc.strategy == "coded")  // issue 14: a group of s + 1 ranks reads one shard (resilience/coded_strategy.h)
      return TaskEnv{rank / (pc.coded_stragglers + 1), world / (pc.coded_stragglers + 1), comm.get(), rank};
    return TaskEnv{rank / cp_ranks, world / cp_ranks, comm.get(), rank};
  }
};

Trainer::Trainer(Config& cfg) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = TrainOptions::from_config(cfg);
  // issue 12: train.memory_budget_gb chooses the layouts the config leaves open (train/memory_budget.h).
  I.budget = apply_memory_budget(cfg, I.o.batch_size, I.o.seq_len, comm::DistEnv::from_environment().world_size);
  I.task = task_registry().lookup(cfg, "train.task", "lm")(cfg, I.o);
  I.pc = parallel::ParallelConfig::from_config(cfg);
  I.backend = cfg.get_string("parallel.backend", "auto", {"auto", "gloo", "mpi"});

  comm::DistEnv env = comm::DistEnv::from_environment();
  // issue 14: a quorum replica trains alone between its steps' quorums (fault_hooks.h).
  if (I.o.fault_tolerance == "quorum") I.ft = std::make_unique<QuorumHook>(I.o, env);
  if (env.world_size > 1 && !I.ft) {
    I.comm = comm::make_communicator(I.backend);
    I.rank = I.comm->rank();
    I.world = I.comm->size();
    // A task may run some of the job's ranks itself (RL's rollout ranks): the trainer runs on the rest.
    if (const int keep = I.task->reserved_ranks(I.world); keep > 0) {
      I.serving = I.rank >= I.world - keep;
      std::unique_ptr<comm::Communicator> part = I.comm->split(I.serving ? 1 : 0, I.rank);
      I.task->attach_job(std::move(I.comm), I.serving);
      I.comm = std::move(part);
      I.world = I.comm->size();  // I.rank stays the job's: the first ranks train
    }
    if (!env.store_hosted_externally) log::set_rank(I.rank);  // `atoll launch` prefixes lines itself
    // Only rank 0 reports progress; the others speak up for warnings and errors.
    if (I.rank != 0 && log::level() < log::Level::warn) log::set_level(log::Level::warn);
  }
  // The device mesh from [parallel] (mesh.h), checked against the job's size.
  I.pc.resolve_mesh(cfg, I.world, env.local_world_size);
  I.mesh = std::make_unique<parallel::Mesh>(I.comm.get(), I.pc.mesh);
  I.model = nn::make_model(cfg, "model");  // [model] family (default "gpt")
  // Across islands, data parallelism runs over the island's ranks (lowcomm/lowcomm.h).
  I.lowcomm = lowcomm::make_lowcomm(cfg, *I.mesh, I.comm.get());
  comm::Communicator* dp_comm = I.lowcomm ? I.lowcomm->island_comm() : I.comm.get();
  parallel::check_mesh_supported(I.pc.mesh, *I.model);
  I.experts = parallel::apply_expert_parallel(cfg, I.model, *I.mesh, I.comm.get());  // ep > 1: this rank's experts
  I.dcp = DataCentricStep::from_config(cfg, I.o, I.pc.mesh, I.world);  // issue 12: layout per batch
  I.tp = parallel::apply_tensor_parallel(cfg, I.model, *I.mesh, I.pc.strategy,  // this rank's shard (tp > 1)
                                         I.o.batch_size * I.o.seq_len);
  if (I.experts && I.tp) I.experts->rebind(*I.model);  // ep x tp: the experts of the tp shard
  // On the shard (it is a new model): recomputation, and ring attention over its heads (cp x tp).
  nn::apply_recompute_config(cfg, *I.model);  // [train] recompute (nn/recompute.h)
  I.cp = parallel::apply_context_parallel(*I.model, *I.mesh, I.o.seq_len, true, cfg.where("train.seq_len"));  // [parallel] cp
  const parallel::PipelineConfig ppc = parallel::PipelineConfig::from_config(cfg, I.pc.mesh.pp);
  parallel::check_pipeline_layout(*I.model, ppc, I.o.grad_accum);  // a bad layout is refused before step 1
  // issue 10: a job that cannot fit is refused before it allocates activations or data (train/preflight.h).
  TrainShape shape{I.o.batch_size, I.o.seq_len, cfg.get_string("optim.type", "adamw"), I.pc.strategy,
                   I.o.matmul_dtype, env.world_size, env.local_world_size};
  shape.tp = I.pc.mesh.tp;  // the worst rank's share under tp and pp
  shape.pp = ppc.pp;
  shape.cp = I.pc.mesh.cp;
  shape.micro_batches = I.o.grad_accum;
  shape.pp_schedule = ppc.schedule;
  shape.sequence_parallel = I.tp && I.tp->sequence_parallel();
  check_memory_before_start(cfg, *I.model, shape);
  const bool sharding = parallel::strategy_registry().get(I.pc.strategy).sharding;
  // A pipeline's ranks step whole parameters (their stages'): any optimizer, as on one rank.
  // (tp: whole-matrix optimizers step their split matrices whole, parallel/optim/tp_whole_matrix.h.)
  parallel::OptimizerPlacement placement = ppc.pp > 1 ? parallel::place_pipeline_optimizer(cfg, I.tp.get())
                                                      : parallel::place_optimizer(cfg, *I.model, dp_comm, sharding, I.pc.strategy,
                                                                                  I.tp.get());
  I.placement_note = placement.note;
  const bool placement_adamw_only = !placement.full && !placement.sharded && !placement.per_rank;
  if (I.budget.offload) {
    ATOLL_CHECK(placement_adamw_only, "train.optimizer_state = \"mmap\" offloads AdamW's moments only; remove the "
                "[optim] type / group keys");
    placement.adamw.offload_dir = I.budget.offload_dir;
  }
  I.run_dir_opts = RunDirOptions::from_config(cfg);  // issue 10
  // The CPU kernels' path, detected at run time or forced (hardware.isa, ATOLL_ISA): the first line.
  log::info("{}", cpu::select_isa(cfg.get_string("hardware.isa", "auto", cpu::isa_choices()),
                                  "hardware.isa (" + cfg.where("hardware.isa") + ")"));
  // fp32 GEMM library: the measured rule, or one forced (hardware.gemm_f32, ATOLL_GEMM_F32).
  log::info("{}", cpu::select_gemm_f32(cfg.get_string("hardware.gemm_f32", "auto", cpu::gemm_f32_choices()),
                                       "hardware.gemm_f32 (" + cfg.where("hardware.gemm_f32") + ")"));
  // bf16 GEMM kernel: oneDNN where the CPU has bf16 instructions, or one forced (hardware.gemm_bf16,
  // ATOLL_GEMM_BF16).
  log::info("{}", cpu::select_gemm_bf16(cfg.get_string("hardware.gemm_bf16", "auto", cpu::gemm_bf16_choices()),
                                        "hardware.gemm_bf16 (" + cfg.where("hardware.gemm_bf16") + ")"));
  // Unknown keys are reported once everything that reads the config has read it.
  cfg.finish();
  I.config_text = cfg.source();
  // issue 14: what the pre-run gate compares; the run dir may be a per-host path (one per island
  // or replica), so it is left out.
  I.config_canonical = cfg.canonical({"run.dir"});

  int threads = int(I.o.threads);
  if (threads == 0 && env.local_world_size > 1)  // share the cores among this node's ranks
    threads = std::max(1, int(std::thread::hardware_concurrency()) / env.local_world_size);
  set_num_threads(threads);
  set_matmul_dtype(dtype_from_name(I.o.matmul_dtype));
  if (ppc.pp == 1) I.task->setup(*I.model, I.data_env());

  I.model->init_weights(uint64_t(I.o.seed));
  // tp: the whole model (built, then cut) and the shard's initialisation from whole-size tensors
  // left their blocks in the allocator's cache; give them back rather than hold them for the run.
  if (I.tp) allocator_for(Device::cpu()).release_cache();
  I.init_param_hash = parameter_hash(*I.model);  // issue 14: for the pre-run gate, before any sharding
  if (ppc.pp > 1) {
    ATOLL_CHECK(!I.ft, "parallel.pp = {} with fault.tolerance = \"quorum\": quorum replicas are data-parallel "
                "only", ppc.pp);
    // Across islands the pipeline runs over the island's ranks (its checkpoint gathers the island's
    // model on the island's rank 0, where lowcomm's island gathers expect it).
    auto pipe = std::make_unique<parallel::PipelineParallel>(*I.model, I.lowcomm ? dp_comm : I.comm.get(), *I.mesh,
                                                             ppc, I.o.grad_accum, I.pc.strategy, placement.adamw,
                                                             placement.per_rank);
    if (I.tp) pipe->set_tensor_parallel(I.tp.get());  // pp x tp: stages of this rank's tp shard
    I.pipe = pipe.get();
    I.dp = std::move(pipe);
    // Stages of one pipeline share data ranks: rank 0 prepares the data before the others look.
    const TaskEnv e = I.data_env();
    if (I.rank == 0) I.task->setup(*I.model, TaskEnv{e.rank, e.world, nullptr});
    I.comm->barrier();
    if (I.rank != 0) I.task->setup(*I.model, TaskEnv{e.rank, e.world, nullptr});
  } else {
    if (I.tp) dp_comm = parallel::data_parallel_comm(*I.mesh);  // tp: the dp axis
    if (!I.o.fault_campaign.empty() && dp_comm && dp_comm->size() > 1 && I.pc.strategy == "ddp" && !I.tp &&
        !I.lowcomm) {
      I.grad_check = std::make_unique<resilience::GradientChecksumComm>(dp_comm, *I.model);
      dp_comm = I.grad_check.get();
    }
    I.dp = parallel::make_data_parallel(*I.model, dp_comm, I.pc, placement.adamw, std::move(placement.full),
                                        placement.sharded, I.mesh.get());
    if (I.tp) I.tp->attach(*I.dp);  // tp x ZeRO-3/HSDP: partial gradients summed per unit (tensor_parallel.h)
  }
  if (I.lowcomm) I.lowcomm->set_pipeline(I.pipe);  // pp inside the islands: per-stage outer state
  if (I.lowcomm) I.lowcomm->attach(*I.model, I.pc.strategy, I.tp.get(), I.dp->value_ranges());
  // pp x ep: the stage's experts only; the divisor is the data-parallel ranks (dp x cp), which a
  // pipeline's communicator (the whole world) is not.
  if (I.experts && I.pipe) I.experts->set_pipeline(*I.pipe, I.mesh->axis("pp"));
  if (I.experts)
    I.experts->attach(placement.adamw, I.pipe ? int(I.pc.mesh.dp() * I.pc.mesh.cp) : I.dp->world(),
                      !placement_adamw_only);
  if (I.dcp) I.dcp->setup(*I.model, I.comm.get());
  I.sample_rng = Rng(uint64_t(I.o.seed), 1000);
}

Trainer::~Trainer() = default;
nn::Model& Trainer::model() { return *impl_->model; }

TrainResult Trainer::run(bool resume) {
  auto& I = *impl_;
  const TrainOptions& o = I.o;
  if (I.serving) {  // the task's own rank (RL's rollout ranks): no loop, no run dir, no metrics
    I.task->serve(*I.model);
    return TrainResult{};
  }
  // issue 10: SIGTERM/SIGINT stop at a step boundary with a checkpoint, SIGPIPE is ignored; rank 0
  // owns the run dir (lock, no accidental reuse, writable, stale temporaries swept) before anything
  // is read or written there (train/stop_signals.h, train/run_dir.h).
  StopSignalGuard stop_signals;
  RunDirState run_dir_state;
  if (I.rank == 0) run_dir_state = prepare_run_dir(o.run_dir, resume, I.run_dir_opts);
  if (I.comm) I.comm->barrier();
  if (!o.fault_campaign.empty())  // before the progress record: it reads the previous run's
    I.campaign = std::make_unique<CampaignHook>(o, I.comm.get(), I.pc.strategy,
                                                !I.tp && !I.pipe && !I.lowcomm && !I.experts && !I.dcp && I.pc.mesh.cp == 1,
                                                I.dp->gradient_codec() ? nullptr : I.grad_check.get());
  // issue 14: what `atoll watch` reads; a quorum replica is a world of one, named by its replica id.
  ProgressRecordGuard progress(o, I.ft ? I.ft->task_env().rank : I.rank, I.ft ? I.ft->task_env().world : I.world);
  CheckpointStore store((fs::path(o.run_dir) / "checkpoints").string(), int(o.ckpt_keep));
  if (o.fault_replay_every > 0) {  // issue 14: SCOUT's cross-replay (train/replay_hook.h)
    ATOLL_CHECK(I.comm && I.world > 1, "fault.replay_every ({}) replays each rank's share on other ranks: it needs a "
                "distributed run (atoll launch, 2 ranks or more)", o.fault_replay_where);
    ATOLL_CHECK(I.pc.strategy == "ddp" && !I.tp && !I.pipe && !I.lowcomm && !I.experts && !I.dcp && !I.ft &&
                    I.pc.mesh.cp == 1 && I.pc.mesh.dp() == I.world,
                "fault.replay_every ({}) replays a rank's share of a step on ranks that hold the whole model: plain "
                "data parallelism only (parallel.strategy = \"ddp\", no tp, pp, cp, ep, islands, quorum or "
                "data.varlen_tokens; this run has strategy \"{}\", mesh {})",
                o.fault_replay_where, I.pc.strategy, I.pc.mesh.describe());
    ATOLL_CHECK(I.task->can_replay(), "fault.replay_every ({}): task '{}' cannot read another rank's data again{}",
                o.fault_replay_where, I.task->name(), I.task->batches_left() >= 0 ? " (finite data, data.epochs)" : "");
    ATOLL_CHECK(o.fault_flip_grad_rank < I.world, "fault.flip_grad_rank = {} is not a rank of this {}-rank job",
                o.fault_flip_grad_rank, I.world);
    I.replay = std::make_unique<ReplayHook>(o, *I.comm);
  }
  int64_t start = 0;
  std::string resumed_from;
  if (resume) {
    // issue 10: the newest complete, verified checkpoint, whatever `latest` says (with
    // fault.resume_certified, the newest whose replay certificate is clean).
    std::string chosen = resume_checkpoint(store.dir(), I.rank == 0, o.fault_resume_certified);
    if (auto p = &chosen; !chosen.empty()) {
      resumed_from = *p;
      Checkpoint ck = CheckpointStore::load(*p);  // every rank reads it (run_dir must be shared)
      TensorFile of;
      of.tensors = std::move(ck.optimizer);
      lowcomm::load_gradient_codec(*I.dp, I.comm.get(), of.tensors, ck.state, *p);  // DDP/ZeRO error feedback
      if (I.lowcomm) I.lowcomm->load_state(ck.model, of.tensors, ck.state, *p);  // this island's entries
      try {
        if (I.tp) I.tp->local_state(ck.model, of);
        if (I.experts) I.experts->local_state(ck.model, of, *p);
        I.dp->load_full_state(ck.model, of, *p);
      } catch (const Error& e) {  // issue 10: another optimizer's checkpoint is named as such
        std::vector<std::string> names;
        for (auto& [n, t] : of.tensors) names.push_back(n);
        fail_resume_load(*p, names, I.dp->optimizer().name(), e.what());
      }
      if (I.lowcomm) I.lowcomm->finish_load();
      I.task->load_tensors(of.tensors);
      start = ck.state.at("step").get<int64_t>();
      auto rs = ck.state.at("sample_rng").get<std::vector<uint64_t>>();
      Rng::State st;
      std::copy(rs.begin(), rs.end(), st.begin());
      I.sample_rng.set_state(st);
      I.task->set_data_state(ck.state.at("train_data"), I.data_env());
      if (I.replay)  // the chain goes on from the checkpoint's certificate: none is not clean
        I.replay->chain().resume(start, ck.state.contains("replay_certificate") &&
                                            resilience::ReplayCertificate::from_json(ck.state["replay_certificate"]).clean);
      log::info("resumed from {} at step {}", *p, start);
      store.protect(start);  // issue 10: retention keeps the checkpoint this run stands on
    } else {
      log::info("no checkpoint in {}: starting from scratch", store.dir());
    }
  }
  TrainResult res;
  res.final_step = res.start_step = start;
  if (start >= o.steps) {  // issue 10: say so instead of "done: step 0 loss 0.0000"
    if (I.rank == 0)
      log::warn("the run is already at step {} ({}) and train.steps is {}: nothing to train; pass --train.steps "
                "above {} to go on",
                start, resumed_from, o.steps, start);
    progress.finish();
    return res;
  }
  // issue 10: appended, never truncated; the segment line marks what this invocation supersedes.
  MetricsLog metrics(I.rank == 0 ? (fs::path(o.run_dir) / "metrics.jsonl").string() : std::string(), true);
  // issue 14: a whole-job restart by `atoll launch --max-restarts` (torchrun's variable).
  const int restart_count = [] {
    const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
    return v ? std::max(0, std::atoi(v)) : 0;
  }();
  if (restart_count > 0 && I.rank == 0)
    log::warn("restart {} of this job (TORCHELASTIC_RESTART_COUNT): {}", restart_count,
              resumed_from.empty() ? std::string("no checkpoint yet, from step 0") : "resumed from " + resumed_from);
  metrics.begin_segment(start, o.steps, resumed_from, restart_count);
  // issue 18: the peak of the path in use, cached by `atoll bench gemm --save` (gemm_peak_cache.h).
  std::string peak_dtype = "fp32", peak_from = "hardware.peak_gflops";
  double peak = o.peak_gflops;
  if (peak <= 0) {
    std::string note;
    const std::string cache = gemm_peak_cache_path();
    const GemmPeakKey key = current_gemm_peak_key(num_threads());
    if (auto c = cached_gemm_peak(cache, key, o.matmul_dtype, &note)) {
      peak = *c;
      peak_dtype = o.matmul_dtype == "bf16" ? "bf16" : "fp32";
      peak_from = fmt::format("cached for {}, {} threads, fp32 gemm {}, bf16 gemm {} in {}", key.isa, key.threads,
                              key.fp32_lib, key.bf16_lib, cache);
    } else {
      peak = measure_gemm_peak_gflops();
      peak_from = note.empty() ? "measured now; `atoll bench gemm --save` caches it" : "measured now; " + note;
    }
  }
  double flops_tok = I.model->flops_per_token(I.task->sequence_length());
  int64_t tokens_per_step = I.task->tokens_per_batch() * o.grad_accum *
                            (I.world / (I.pc.mesh.cp * I.pc.mesh.tp * I.pc.mesh.pp));  // the whole job's
  log::info("model: {} ({:.2f}M parameters), {} threads, {} tokens/step, {} GEMM peak {:.1f} GFLOP/s ({})",
            I.model->describe(), double(I.model->num_params()) / 1e6, num_threads(), tokens_per_step, peak_dtype,
            peak, peak_from);
  if (I.world > 1)
    log::info("data parallel: {} over {} ranks ({}; mesh {})", I.dp->name(), I.dp->world(), I.comm->backend(),
              I.pc.mesh.describe());
  log::info("optimizer: {}{}{}", I.dp->optimizer().name(), I.placement_note,
            I.budget.offload ? ", moments in a memory-mapped file under " + I.budget.offload_dir : "");
  if (!I.budget.report.empty()) log::info("{}", I.budget.report);
  if (I.lowcomm) log::info("islands: {}", I.lowcomm->describe());

  // issue 14: every rank agrees on what must agree before step 1, or the launch is refused.
  // Under model parallelism (tp, cp, pp) ranks of one model replica hold different shards of the
  // parameters and read the same data, so the gate compares the ranks that hold the same shard:
  // those with equal pp, cp and tp coordinates (a split of the world; the whole world otherwise).
  if (I.comm && o.fault_gate) {
    const auto& m = I.pc.mesh;
    std::unique_ptr<comm::Communicator> same_shard;
    comm::Communicator* gate_comm = I.comm.get();
    if (m.tp * m.cp * m.pp > 1 || I.pc.strategy == "coded") {  // coded: the ranks at one place in their groups
      int64_t color = I.pc.strategy == "coded" ? I.rank % (I.pc.coded_stragglers + 1)
                      : (I.mesh->coord("pp") * m.cp + I.mesh->coord("cp")) * m.tp + I.mesh->coord("tp");
      // pp x ZeRO-3/HSDP: a stage's dp_shard ranks hold different parameters too (parallel/pipeline.h).
      if (I.pipe && (I.pc.strategy == "zero3" || I.pc.strategy == "hsdp"))
        color = color * m.dp_shard + I.mesh->coord("dp_shard");
      same_shard = I.comm->split(int(color), I.rank);
      gate_comm = same_shard.get();
    }
    if (gate_comm && gate_comm->size() > 1)
      run_pre_run_gate(*gate_comm, o, I.config_canonical, I.init_param_hash, *I.model, *I.task,
                       I.pc.mesh.describe() + " strategy=" + I.pc.strategy, I.world);
  }
  const bool guard = I.comm && o.fault_phase_guard && I.world > 1 && I.pc.strategy != "coded";  // coded: no waiting
  if (o.fault_signatures && I.comm && I.world > 1) {
    ATOLL_CHECK(I.pc.strategy == "ddp", "fault.signatures compares the replicas' gradients, which needs "
                "parallel.strategy = \"ddp\" (\"{}\" shards them)", I.pc.strategy);
    I.sig = std::make_unique<SignatureHook>();
  }
  if (I.ft) I.ft->begin(start, *I.model, *I.dp, *I.task, I.sample_rng);
  std::optional<JoinStep> join;  // issue 14: finite data that runs out unevenly (train/join_step.h)
  if (I.task->batches_left() >= 0) {
    ATOLL_CHECK(!I.pipe && !I.dcp && !I.tp && !I.ft && !I.lowcomm && !I.experts && I.pc.mesh.cp == 1,
                "data.epochs (finite data, joined ranks) runs under plain data parallelism only (no pp, tp, cp, ep, "
                "islands, quorum or data.varlen_tokens)");
    join.emplace(*I.task, *I.dp, I.comm.get(), o.grad_accum);
  }

  // issue 12: peak_rss_mb is training's peak, not the model build's (a full model may be built
  // once before an expert shard replaces it).
  if (I.budget.budget_gb > 0) reset_peak_rss();
  double ema_step_s = 0;
  int64_t last_good_ckpt = start;
  for (int64_t step = start; step < o.steps; ++step) {
    auto t0 = Clock::now();
    resilience::ProgressPublisher::instance().set_step(step + 1);
    resilience::ProgressPublisher::instance().set_phase(resilience::Phase::compute);
    if (guard) resilience::check_phase(I.lowcomm ? *I.lowcomm->guard_comm(step) : *I.comm, "step", step + 1);
    if (I.campaign) I.campaign->at_boundary(step + 1, start, *I.model, *I.dp, *I.task, I.data_env());  // fires, detects, repairs
    if (join && !join->begin()) break;  // no rank has data (resumed past the end)
    auto next_batch = [&]() -> const Batch& {  // the watcher tells a starved loader from compute
      resilience::PhaseScope data(resilience::Phase::data);
      return join ? join->next_batch([&]() -> const Batch& { return I.task->next_batch(); }) : I.task->next_batch();
    };
    // issue 14: an audited step holds its gradient sync back to hash its own share first.
    const bool audit = I.replay && I.replay->due(step);
    int attempt = 0;
    // Forward and backward over this rank's micro-batches; the gradients end averaged over the ranks.
    auto compute = [&] {
      I.dp->zero_grad();
      if (audit) I.replay->own_start();
      if (I.experts) I.experts->zero_grad();
      if (o.fault_nan_at_step == step + 1) I.model->flat_values().f32()[0] = std::numeric_limits<float>::quiet_NaN();
      // bf16 weight copies made once for all micro-steps (autograd/weight_cast_cache.h); not under
      // sharded parameters (zero3, hsdp), where holding every layer's copy would undo the sharding.
      std::optional<WeightCastScope> casts;
      if (I.pc.strategy != "zero3" && I.pc.strategy != "hsdp") casts.emplace();
      double loss_sum = 0;
      if (I.dcp) {  // issue 12: this batch's cp degree, split and recompute, chosen from its lengths
        loss_sum = I.dcp->compute(step, *I.model, *I.dp);
        I.dp->finish_backward();
        return loss_sum;
      }
      if (I.pipe) {  // the schedule runs every micro-batch's forward and backward (parallel/pipeline.h)
        std::vector<Tensor> ins, tgts;
        for (int64_t m = 0; m < o.grad_accum; ++m) {
          const Batch& batch = next_batch();
          ins.push_back(batch.input.clone());
          tgts.push_back(batch.target.clone());
        }
        loss_sum = I.pipe->forward_backward(ins, tgts) * double(o.grad_accum);
      }
      const bool tp_first = I.tp && I.tp->sums_before(*I.dp);  // tp x ZeRO-2 (tensor_parallel.h)
      for (int64_t m = 0; !I.pipe && m < o.grad_accum; ++m) {
        const Batch& batch = next_batch();
        I.dp->set_sync(m + 1 == o.grad_accum && !tp_first && !audit);  // no gradient sync on accumulation micro-steps
        Tensor loss = I.task->loss(*I.model, batch);
        loss_sum += loss.item();
        backward(loss, (join ? join->seed() : 1.f) / float(o.grad_accum));  // a joined rank contributes 0
      }
      if (I.sig) I.sig->backward_done();
      if (audit) I.replay->own_done(*I.model, step + 1, attempt);  // before the all-reduce
      if (tp_first) I.tp->finish_backward();
      I.dp->finish_backward();
      if (I.experts) I.experts->finish_backward();
      if (I.tp && !tp_first) I.tp->finish_backward();  // sums the partial gradients of replicated parameters over tp
      return loss_sum / double(o.grad_accum);
    };
    double loss = 0, norm = 0;
    float lr_scale = 0;
    double opt_s = 0;
    auto apply = [&] {
      norm = I.tp ? I.tp->grad_norm(*I.dp) : I.dp->grad_norm();
      if (I.experts) norm = I.experts->grad_norm(norm);
      if (!std::isfinite(loss) || !std::isfinite(norm)) {
        fail("training diverged at step {}: loss {}, gradient norm {}; stopping without saving (last good checkpoint: {})",
             step + 1, loss, norm, last_good_ckpt > 0 ? store.latest().value_or("none") : std::string("none"));
      }
      lr_scale = o.schedule.at(step) * I.task->lr_multiplier();
      if (I.campaign) lr_scale *= I.campaign->lr_factor();  // 1 unless a config_drift is in force
      auto t_opt = Clock::now();
      const StepContext sc{lr_scale, clip_coefficient(norm, o.grad_clip)};
      I.dp->step(sc);
      if (I.experts) I.experts->step(sc);
      opt_s = std::chrono::duration<double>(Clock::now() - t_opt).count();  // for optimizer comparisons
    };
    if (I.ft) {
      // issue 14: the step runs on this step's quorum and counts only when every member finished it;
      // a discarded step is redone (same data); a replica behind the others healed first.
      if (!I.ft->step(step, compute, loss, apply)) continue;
    } else {
      for (;; ++attempt) {
        if (audit) I.replay->replay_witnesses(*I.model, *I.dp, *I.task, o.grad_accum);  // the witnessed shares, first
        if (I.sig) I.sig->step_start(*I.model);
        loss = join ? join->average_loss(compute()) : I.dp->average(compute());  // the job's mean loss
        if (!audit || I.replay->judge(step + 1, attempt, last_good_ckpt > 0 ? store.latest().value_or("") : ""))
          break;
        I.task->set_data_state(I.replay->data_position(), I.data_env());  // discarded: the same data again
      }
      if (I.sig) I.sig->check(*I.comm, step + 1, loss, *I.model);
      apply();
      if (I.campaign) I.campaign->after_update(*I.model, *I.task);
    }
    nlohmann::json sync = I.lowcomm ? I.lowcomm->after_step(step) : nlohmann::json();  // outer steps, if due
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ema_step_s = step == start ? dt : 0.9 * ema_step_s + 0.1 * dt;
    double tps = double(I.dcp ? I.dcp->step_tokens() : tokens_per_step) / dt;
    double mfu = flops_tok * tps / (peak * 1e9 * double(I.world));
    res.final_step = step + 1;
    res.final_loss = loss;
    res.tokens_per_s = tps;
    res.mfu = mfu;
    nlohmann::json rec = {{"step", step + 1}, {"loss", loss},        {"lr_scale", lr_scale}, {"grad_norm", norm},
                          {"tokens_per_s", tps}, {"mfu", mfu},      {"step_ms", dt * 1e3}, {"opt_ms", opt_s * 1e3},
                          {"tokens", (step + 1) * tokens_per_step}};
    if (!sync.is_null()) rec["sync"] = sync;
    if (I.ft && o.fault_commit_hashes) {
      rec["param_hash"] = parameter_hash(*I.model);
      rec["committed_unix_s"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    }
    if (I.dcp) rec.update(I.dcp->record());
    if (audit) {
      rec["replay_ms"] = I.replay->replay_ms();
      if (auto r = I.replay->record(); !r.is_null()) rec["replay"] = r;
    }
    if (I.budget.budget_gb > 0) rec["peak_rss_mb"] = double(peak_rss_bytes()) / (1024.0 * 1024.0);
    for (const auto& [k, v] : I.model->step_metrics()) rec[k] = I.dp->average(v);  // an MoE's balance loss, say
    if (o.log_every > 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      log::info("{}", format_progress({step + 1, o.steps, loss, double(lr_scale), norm, tps, mfu, dt * 1e3,
                                       ema_step_s * double(o.steps - step - 1)}));
    }
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      if (guard) resilience::check_phase(*I.comm, "eval", step + 1);
      resilience::PhaseScope in_eval(resilience::Phase::eval);
      double vl = I.evaluate();
      res.final_val_loss = vl;
      rec["val_loss"] = vl;
      log::info("step {:>5} | val loss {:.4f}", step + 1, vl);
    }
    if (o.sample_every > 0 && (step + 1) % o.sample_every == 0) {
      if (guard) resilience::check_phase(*I.comm, "sample", step + 1);
      resilience::PhaseScope in_sample(resilience::Phase::eval);
      if (I.pipe) I.pipe->sync_full_model();
      if (I.pipe && I.experts) I.experts->sync_full_model();
      std::string s = I.task->sample(*I.model, I.sample_rng);
      if (s.empty()) s = "(the model does not generate)";
      rec["sample"] = valid_utf8(s);  // byte-level samples may cut characters; JSON needs UTF-8
      log::info("step {:>5} | sample: {}", step + 1, s);
    }
    rec.update(I.task->step_metrics());  // the task's own fields (RL: reward, KL, time split)
    if (join) rec.update(join->record());
    if (I.campaign) {
      if (auto d = I.campaign->step_record(); !d.is_null()) rec["campaign"] = d;
      if (step + 1 == o.steps && I.rank == 0) rec["campaign_score"] = I.campaign->summary();
    }
    metrics.write(rec);
    bool stop_now = o.stop_after > 0 && step + 1 - start >= o.stop_after;
    // issue 10: a SIGTERM/SIGINT on any rank stops every rank after the same step, with a checkpoint.
    // Across islands the ranks agree at the end of an outer round (a WAN round trip per step otherwise).
    bool signalled = !I.comm ? stop_requested() != 0
                     : I.lowcomm ? I.lowcomm->round_end(step) && I.lowcomm->world_average(stop_requested() ? 1.0 : 0.0) > 0
                                 : I.dp->average(stop_requested() ? 1.0 : 0.0) > 0;
    if (I.tp) signalled = I.tp->any(signalled);  // the dp average above spans one tp coordinate
    stop_now = stop_now || signalled;
    const bool data_done = join && join->all_done();  // every rank's data ran out: the last step, checkpointed
    stop_now = stop_now || data_done;
    if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps || stop_now ||
        (I.campaign && I.campaign->checkpoint_now())) {
      if (guard) resilience::check_phase(*I.comm, "ckpt", step + 1);
      resilience::PhaseScope in_ckpt(resilience::Phase::checkpoint);
      Checkpoint ck = I.make_checkpoint(step + 1);  // on every rank: gathering is collective
      if (I.rank == 0) {
        if (I.campaign) I.campaign->before_checkpoint(step + 1);  // a checkpoint_io_error due here
        if (I.replay && ck.state["replay_certificate"].value("clean", false)) store.keep_certified(step + 1);
        std::string p;
        try {
          p = store.save(step + 1, ck);
        } catch (const std::exception& e) {
          if (!I.campaign || !I.campaign->checkpoint_failed(step + 1, e.what())) throw;
          p = store.save(step + 1, ck);  // the fault's write error, recorded: written again
        }
        log::info("checkpoint: {}", p);
      }
      if (I.comm) I.comm->barrier();  // no rank goes on (or resumes) before the checkpoint is complete
      if (I.campaign) I.campaign->checkpoint_written(step + 1, store.dir());
      last_good_ckpt = step + 1;
    }
    if (signalled) {
      if (I.rank == 0)
        log::warn("stopped by {} after step {}; the checkpoint is written: continue with --resume",
                  stop_requested() == SIGINT ? "SIGINT" : stop_requested() ? "SIGTERM" : "a signal to another rank",
                  step + 1);
      res.stopped_by_signal = true;
    }
    if (data_done) log::info("join: every rank's data ran out after step {}", step + 1);
    if (stop_now) break;
  }
  progress.finish();
  return res;
}

}  // namespace atl
