#include "train/trainer.h"

#include <csignal>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "comm/communicator.h"
#include "core/log.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "optim/adamw.h"
#include "optim/muon.h"
#include "optim/param_groups.h"
#include "optim/dion3.h"
#include "optim/periodic_row_muon.h"
#include "parallel/dion3_dist.h"
#include "parallel/muon_owner.h"
#include "parallel/prmuon_sharded.h"
#include "parallel/sharded_muon.h"
#include "optim/clip.h"
#include "parallel/data_parallel.h"
#include "resilience/checkpoint.h"
#include "data/corpus.h"
#include "data/data_loader.h"
#include "train/metrics.h"
#include "train/preflight.h"
#include "train/run_dir.h"
#include "train/stop_signals.h"
#include "data/tokenizer.h"

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
  nn::GPTConfig mc;
  std::unique_ptr<nn::GPT> model;
  // Distributed runs (WORLD_SIZE > 1 in the environment, as `atoll launch` sets) get a
  // communicator; a single process gets none and the data-parallel layer reduces to the plain loop.
  std::unique_ptr<comm::Communicator> comm;
  parallel::ParallelConfig pc;
  std::unique_ptr<parallel::DataParallel> dp;
  bool dist_muon_used = false;
  std::string dist_note;  // which distributed form the matrix optimizer took, for the log
  int rank = 0, world = 1;
  std::string backend;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<DataLoader> train_data, val_data;
  Rng sample_rng;
  std::string config_text;
  RunDirOptions run_dir_opts;  // issue 10: --overwrite (train/run_dir.h)

  Checkpoint make_checkpoint(int64_t step) {
    Checkpoint ck;
    dp->full_state(ck.model, ck.optimizer);  // collective: gathers shards
    ck.model_metadata = model->config_metadata();
    auto rs = sample_rng.state();
    ck.state = {{"step", step},
                {"sample_rng", std::vector<uint64_t>(rs.begin(), rs.end())},
                {"train_data", train_data->state().to_json()},
                {"config", config_text},
                // What evaluate() scores, so that `atoll eval` can repeat it on this checkpoint.
                {"eval", {{"data_dir", o.data_dir}, {"batch_size", o.batch_size}, {"seq_len", o.seq_len},
                          {"steps", o.eval_steps}, {"world_size", world}, {"matmul_dtype", o.matmul_dtype}}}};
    return ck;
  }

  double evaluate() {
    NoGradGuard ng;
    val_data->reset();
    int64_t B = o.batch_size, T = o.seq_len;
    Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
    double total = 0;
    for (int64_t i = 0; i < o.eval_steps; ++i) {
      val_data->next_batch(x.i32(), y.i32());
      total += model->loss(x, y).item();
    }
    return dp->average(total / double(o.eval_steps));
  }

  std::string sample() {
    std::vector<int32_t> prompt = o.sample_prompt.empty() ? std::vector<int32_t>{tok->eot()} : tok->encode(o.sample_prompt);
    auto seq = model->generate(prompt, o.sample_tokens, o.sample_temperature, o.sample_top_k, sample_rng);
    std::vector<int32_t> gen(seq.begin() + int64_t(prompt.size()), seq.end());
    for (auto& t : gen)
      if (t == tok->eot()) t = int32_t('\n');
    return (o.sample_prompt.empty() ? "" : o.sample_prompt) + tok->decode(gen);
  }
};

Trainer::Trainer(Config& cfg) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = TrainOptions::from_config(cfg);
  I.mc = nn::GPTConfig::from_config(cfg, "model");
  // AdamW's hyperparameters live in [optim.adamw], where the optimizer factory reads them too.
  AdamWConfig ac;
  ac.lr = float(cfg.get_float("optim.adamw.lr", 6e-4, 0.0, 10.0));
  ac.beta1 = float(cfg.get_float("optim.adamw.beta1", 0.9, 0.0, 1.0));
  ac.beta2 = float(cfg.get_float("optim.adamw.beta2", 0.95, 0.0, 1.0));
  ac.eps = float(cfg.get_float("optim.adamw.eps", 1e-8, 0.0, 1.0));
  ac.weight_decay = float(cfg.get_float("optim.adamw.weight_decay", 0.1, 0.0, 10.0));
  // Plain AdamW everywhere (also when a group is routed to "adamw" explicitly) keeps checkpoints
  // interchangeable with the ZeRO strategies; any other choice ([optim] type = "muon", or another
  // optimizer for a group) goes through the optimizer factory.
  const std::string hidden_type =
      cfg.get_string("optim.type", "adamw", {"adamw", "muon", "prmuon", "dion3", "soap", "adams", "lion"});
  bool grouped = hidden_type != "adamw";
  for (const char* g : {"optim.embed", "optim.head", "optim.vector"})
    if (!grouped && cfg.has(g)) grouped = cfg.get_string(g, "adamw") != "adamw";
  I.pc = parallel::ParallelConfig::from_config(cfg);
  I.backend = cfg.get_string("parallel.backend", "auto", {"auto", "gloo", "mpi"});
  bool dist_muon = cfg.get_bool("optim.muon.distributed", true);

  comm::DistEnv env = comm::DistEnv::from_environment();
  if (env.world_size > 1) {
    I.comm = comm::make_communicator(I.backend);
    I.rank = I.comm->rank();
    I.world = I.comm->size();
    if (!env.store_hosted_externally) log::set_rank(I.rank);  // `atoll launch` prefixes lines itself
    // Only rank 0 reports progress; the others speak up for warnings and errors.
    if (I.rank != 0 && log::level() < log::Level::warn) log::set_level(log::Level::warn);
  }
  I.mc.validate();
  // issue 10: a job that cannot fit is refused before it allocates anything (train/preflight.h).
  check_memory_before_start(cfg, I.mc, {I.o.batch_size, I.o.seq_len, hidden_type, I.pc.strategy, I.o.matmul_dtype,
                                        env.world_size, env.local_world_size});
  I.model = std::make_unique<nn::GPT>(I.mc);
  std::unique_ptr<Optimizer> opt;
  parallel::ShardedOptimizerFactory sharded;
  // Dion3's selection scope on several ranks ("global": exact single-rank Dion3; "local": top-k per
  // shard, no norm exchange); read whenever Dion3 is chosen so that the key is always valid.
  const std::string dion3_scope =
      hidden_type == "dion3" ? cfg.get_string("optim.dion3.scope", "global", {"global", "local"}) : "global";
  if (grouped && I.pc.strategy != "ddp") {
    // ZeRO shards the optimizer over equal flat chunks: the Muon family (owners orthogonalize whole
    // matrices, sharded_muon.h) with AdamW on everything else; nothing else is sharded that way.
    for (const char* g : {"embed", "head", "vector"}) {
      std::string t = cfg.get_string(std::string("optim.") + g, "adamw");
      ATOLL_CHECK(t == "adamw", "optim.{} = '{}' cannot run under parallel.strategy = '{}': ZeRO shards the groups "
                  "besides the hidden matrices with AdamW only; remove the key or use parallel.strategy = 'ddp'",
                  g, t, I.pc.strategy);
    }
    ATOLL_CHECK(hidden_type == "muon" || hidden_type == "prmuon",
                "[optim] type = '{}' cannot run under parallel.strategy = '{}': ZeRO shards AdamW, Muon and "
                "Periodic Row-wise Muon only; use parallel.strategy = 'ddp'{}",
                hidden_type, I.pc.strategy,
                hidden_type == "dion3" ? " (Dion3 then shards its momentum by slice across the ranks)" : "");
    parallel::ShardedMuonConfig smc;
    smc.type = hidden_type;
    if (hidden_type == "prmuon") smc.prm = prmuon_config_from(cfg, "optim.prmuon");
    else smc.prm.muon = muon_config_from(cfg, "optim.muon");
    smc.adamw = ac;
    sharded = [smc](nn::GPT& m, const parallel::FlatLayout& l, comm::Communicator* g) {
      return std::unique_ptr<parallel::ShardedOptimizer>(std::make_unique<parallel::ShardedMuon>(m, l, g, smc));
    };
    I.dist_muon_used = env.world_size > 1;
  } else if (grouped) {
    // On several ranks the matrix optimizers take their distributed forms: Muon's Newton-Schulz work
    // is split among matrix owners (DMuon), PRMuon keeps row-sharded momentum, Dion3 slice-sharded.
    OptimizerOverride distributed = [&](Config& c, const std::string& type, std::vector<ParamRef>& ps) {
      std::unique_ptr<Optimizer> o;
      if (!I.comm) return o;
      if (type == "muon" && dist_muon) {
        I.dist_muon_used = true;
        o = std::make_unique<parallel::MuonOwner>(ps, parallel::MuonOwnerConfig{muon_config_from(c, "optim.muon")},
                                                  I.comm.get());
      } else if (type == "prmuon") {
        PeriodicRowMuonConfig pc = prmuon_config_from(c, "optim.prmuon");
        if (!pc.normalize_rows) return o;  // column norms span the row shards: keep it replicated
        I.dist_note = " (PRMuon momentum sharded by rows, refreshes orthogonalized by owner ranks)";
        o = std::make_unique<parallel::PrMuonSharded>(
            ps, parallel::PrMuonShardedConfig{pc, /*reduce_grads=*/false}, I.comm.get());
      } else if (type == "dion3") {
        I.dist_note = " (Dion3 momentum sharded by slice, " + dion3_scope + " selection)";
        o = std::make_unique<parallel::Dion3Dist>(ps, dion3_config_from(c, "optim.dion3"),
                                                  parallel::parse_select_scope(dion3_scope), I.comm.get());
      }
      return o;
    };
    opt = make_optimizer(cfg, I.model->param_refs(), distributed);  // reads (and so validates) its keys
  }
  I.run_dir_opts = RunDirOptions::from_config(cfg);  // issue 10
  // The CPU kernels' path, detected at run time or forced (hardware.isa, ATOLL_ISA): the first line.
  log::info("{}", cpu::select_isa(cfg.get_string("hardware.isa", "auto", cpu::isa_choices()),
                                  "hardware.isa (" + cfg.where("hardware.isa") + ")"));
  // Unknown keys are reported once everything that reads the config has read it.
  cfg.finish();
  I.config_text = cfg.source();

  int threads = int(I.o.threads);
  if (threads == 0 && env.local_world_size > 1)  // share the cores among this node's ranks
    threads = std::max(1, int(std::thread::hardware_concurrency()) / env.local_world_size);
  set_num_threads(threads);
  set_matmul_dtype(dtype_from_name(I.o.matmul_dtype));
  I.tok = load_tokenizer(I.o.tokenizer);
  if (!fs::exists(fs::path(I.o.data_dir) / "meta.json") && I.o.auto_prepare) {
    if (I.rank == 0) {
      log::info("preparing the default corpus (Debian fortunes) into {} ...", I.o.data_dir);
      prepare_default_corpus(I.o.data_dir, I.o.tokenizer);
    }
    if (I.comm) I.comm->barrier();  // the others wait for rank 0's data
  }
  check_prepared_tokenizer(I.o.data_dir, I.o.tokenizer);  // ids of another tokenizer mean nothing
  ATOLL_CHECK(I.mc.vocab_size >= I.tok->vocab_size(), "model.vocab_size {} is smaller than the tokenizer's {}",
              I.mc.vocab_size, I.tok->vocab_size());
  ATOLL_CHECK(I.o.seq_len <= I.mc.block_size, "train.seq_len {} exceeds model.block_size {}", I.o.seq_len,
              I.mc.block_size);
  I.train_data = std::make_unique<DataLoader>(I.o.data_dir, "train", int(I.o.batch_size), int(I.o.seq_len), I.rank,
                                              I.world, uint64_t(I.o.seed));
  // Evaluation is split like training: each rank scores its share of the validation rows.
  I.val_data = std::make_unique<DataLoader>(I.o.data_dir, "val", int(I.o.batch_size), int(I.o.seq_len), I.rank,
                                            I.world, uint64_t(I.o.seed));
  // Both splits before step 1: a bad id in the validation shards would otherwise surface only at
  // the first evaluation, after training time is spent.
  I.train_data->validate_vocab(int32_t(I.mc.vocab_size));
  I.val_data->validate_vocab(int32_t(I.mc.vocab_size));

  I.model->init_weights(uint64_t(I.o.seed));
  I.dp = parallel::make_data_parallel(*I.model, I.comm.get(), I.pc, ac, std::move(opt), sharded);
  I.sample_rng = Rng(uint64_t(I.o.seed), 1000);
}

Trainer::~Trainer() = default;
nn::GPT& Trainer::model() { return *impl_->model; }

TrainResult Trainer::run(bool resume) {
  auto& I = *impl_;
  const TrainOptions& o = I.o;
  // issue 10: SIGTERM/SIGINT stop at a step boundary with a checkpoint, SIGPIPE is ignored; rank 0
  // owns the run dir (lock, no accidental reuse, writable, stale temporaries swept) before anything
  // is read or written there (train/stop_signals.h, train/run_dir.h).
  StopSignalGuard stop_signals;
  RunDirState run_dir_state;
  if (I.rank == 0) run_dir_state = prepare_run_dir(o.run_dir, resume, I.run_dir_opts);
  if (I.comm) I.comm->barrier();
  CheckpointStore store((fs::path(o.run_dir) / "checkpoints").string(), int(o.ckpt_keep));
  int64_t start = 0;
  std::string resumed_from;
  if (resume) {
    // issue 10: the newest complete, verified checkpoint, whatever `latest` says.
    std::string chosen = resume_checkpoint(store.dir(), I.rank == 0);
    if (auto p = &chosen; !chosen.empty()) {
      resumed_from = *p;
      Checkpoint ck = CheckpointStore::load(*p);  // every rank reads it (run_dir must be shared)
      TensorFile of;
      of.tensors = std::move(ck.optimizer);
      try {
        I.dp->load_full_state(ck.model, of, *p);
      } catch (const Error& e) {  // issue 10: another optimizer's checkpoint is named as such
        std::vector<std::string> names;
        for (auto& [n, t] : of.tensors) names.push_back(n);
        fail_resume_load(*p, names, I.dp->optimizer().name(), e.what());
      }
      start = ck.state.at("step").get<int64_t>();
      auto rs = ck.state.at("sample_rng").get<std::vector<uint64_t>>();
      Rng::State st;
      std::copy(rs.begin(), rs.end(), st.begin());
      I.sample_rng.set_state(st);
      // Saved by rank 0 of a job of any size: rank r of W goes on after the rows the whole job
      // consumed (exact when W divides them).
      DataLoaderState ds = DataLoaderState::from_json(ck.state.at("train_data"));
      ds.position = ds.position * uint64_t(ds.world_size) / uint64_t(I.world);
      ds.rank = I.rank;
      ds.world_size = I.world;
      I.train_data->set_state(ds);
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
    return res;
  }
  // issue 10: appended, never truncated; the segment line marks what this invocation supersedes.
  MetricsLog metrics(I.rank == 0 ? (fs::path(o.run_dir) / "metrics.jsonl").string() : std::string(), true);
  metrics.begin_segment(start, o.steps, resumed_from);
  double peak = o.peak_gflops > 0 ? o.peak_gflops : measure_gemm_peak_gflops();
  double flops_tok = I.model->flops_per_token(o.seq_len);
  int64_t tokens_per_step = o.batch_size * o.seq_len * o.grad_accum * I.world;  // the whole job's
  log::info("model: {} ({:.2f}M parameters), {} threads, {} tokens/step, fp32 GEMM peak {:.1f} GFLOP/s", I.mc.describe(),
            double(I.model->num_params()) / 1e6, num_threads(), tokens_per_step, peak);
  if (I.world > 1) log::info("data parallel: {} over {} ranks ({})", I.dp->name(), I.world, I.comm->backend());
  log::info("optimizer: {}{}{}", I.dp->optimizer().name(),
            I.dist_muon_used ? " (Muon matrices orthogonalized by their owner ranks)" : "", I.dist_note);

  Tensor x = Tensor::empty({o.batch_size, o.seq_len}, DType::i32), y = Tensor::empty({o.batch_size, o.seq_len}, DType::i32);
  double ema_step_s = 0;
  int64_t last_good_ckpt = start;
  for (int64_t step = start; step < o.steps; ++step) {
    auto t0 = Clock::now();
    I.dp->zero_grad();
    if (o.fault_nan_at_step == step + 1) I.model->flat_values().f32()[0] = std::numeric_limits<float>::quiet_NaN();
    double loss_sum = 0;
    for (int64_t m = 0; m < o.grad_accum; ++m) {
      I.train_data->next_batch(x.i32(), y.i32());
      I.dp->set_sync(m + 1 == o.grad_accum);  // no gradient sync on accumulation micro-steps
      Tensor loss = I.model->loss(x, y);
      loss_sum += loss.item();
      backward(loss, 1.f / float(o.grad_accum));
    }
    I.dp->finish_backward();
    double loss = I.dp->average(loss_sum / double(o.grad_accum));  // the job's mean loss
    double norm = I.dp->grad_norm();
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      fail("training diverged at step {}: loss {}, gradient norm {}; stopping without saving (last good checkpoint: {})",
           step + 1, loss, norm, last_good_ckpt > 0 ? store.latest().value_or("none") : std::string("none"));
    }
    float lr_scale = o.schedule.at(step);
    auto t_opt = Clock::now();
    I.dp->step({lr_scale, clip_coefficient(norm, o.grad_clip)});
    const double opt_s = std::chrono::duration<double>(Clock::now() - t_opt).count();  // for optimizer comparisons
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ema_step_s = step == start ? dt : 0.9 * ema_step_s + 0.1 * dt;
    double tps = double(tokens_per_step) / dt;
    double mfu = flops_tok * tps / (peak * 1e9 * double(I.world));
    res.final_step = step + 1;
    res.final_loss = loss;
    res.tokens_per_s = tps;
    res.mfu = mfu;
    nlohmann::json rec = {{"step", step + 1}, {"loss", loss},        {"lr_scale", lr_scale}, {"grad_norm", norm},
                          {"tokens_per_s", tps}, {"mfu", mfu},      {"step_ms", dt * 1e3}, {"opt_ms", opt_s * 1e3},
                          {"tokens", (step + 1) * tokens_per_step}};
    if (o.log_every > 0 && ((step + 1) % o.log_every == 0 || step + 1 == o.steps)) {
      log::info("{}", format_progress({step + 1, o.steps, loss, double(lr_scale), norm, tps, mfu, dt * 1e3,
                                       ema_step_s * double(o.steps - step - 1)}));
    }
    if (o.eval_every > 0 && ((step + 1) % o.eval_every == 0 || step + 1 == o.steps)) {
      double vl = I.evaluate();
      res.final_val_loss = vl;
      rec["val_loss"] = vl;
      log::info("step {:>5} | val loss {:.4f}", step + 1, vl);
    }
    if (o.sample_every > 0 && (step + 1) % o.sample_every == 0) {
      std::string s = I.sample();
      rec["sample"] = valid_utf8(s);  // byte-level samples may cut characters; JSON needs UTF-8
      log::info("step {:>5} | sample: {}", step + 1, s);
    }
    metrics.write(rec);
    bool stop_now = o.stop_after > 0 && step + 1 - start >= o.stop_after;
    // issue 10: a SIGTERM/SIGINT on any rank stops every rank after the same step, with a checkpoint.
    bool signalled = I.comm ? I.dp->average(stop_requested() ? 1.0 : 0.0) > 0 : stop_requested() != 0;
    stop_now = stop_now || signalled;
    if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps || stop_now) {
      Checkpoint ck = I.make_checkpoint(step + 1);  // on every rank: gathering is collective
      if (I.rank == 0) {
        std::string p = store.save(step + 1, ck);
        log::info("checkpoint: {}", p);
      }
      if (I.comm) I.comm->barrier();  // no rank goes on (or resumes) before the checkpoint is complete
      last_good_ckpt = step + 1;
    }
    if (signalled) {
      if (I.rank == 0)
        log::warn("stopped by {} after step {}; the checkpoint is written: continue with --resume",
                  stop_requested() == SIGINT ? "SIGINT" : stop_requested() ? "SIGTERM" : "a signal to another rank",
                  step + 1);
      res.stopped_by_signal = true;
    }
    if (stop_now) break;
  }
  return res;
}

}  // namespace atl
