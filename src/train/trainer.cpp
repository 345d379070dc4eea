#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "core/log.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "resilience/checkpoint.h"
#include "train/corpus.h"
#include "train/data_loader.h"
#include "train/metrics.h"
#include "train/tokenizer.h"

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

struct Trainer::Impl {
  TrainOptions o;
  nn::GPTConfig mc;
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<DataLoader> train_data, val_data;
  Rng sample_rng;
  std::string config_text;

  Checkpoint make_checkpoint(int64_t step) {
    Checkpoint ck;
    ck.model = model->state_dict();
    ck.model_metadata = model->config_metadata();
    opt->save_state(ck.optimizer, "");
    auto rs = sample_rng.state();
    ck.state = {{"step", step},
                {"sample_rng", std::vector<uint64_t>(rs.begin(), rs.end())},
                {"train_data", train_data->state().to_json()},
                {"config", config_text}};
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
    return total / double(o.eval_steps);
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
  AdamWConfig ac;
  ac.lr = float(cfg.get_float("optim.lr", 6e-4, 0.0, 10.0));
  ac.beta1 = float(cfg.get_float("optim.beta1", 0.9, 0.0, 1.0));
  ac.beta2 = float(cfg.get_float("optim.beta2", 0.95, 0.0, 1.0));
  ac.eps = float(cfg.get_float("optim.eps", 1e-8, 0.0, 1.0));
  ac.weight_decay = float(cfg.get_float("optim.weight_decay", 0.1, 0.0, 10.0));
  cfg.finish();
  I.config_text = cfg.source();

  set_num_threads(int(I.o.threads));
  set_matmul_dtype(dtype_from_name(I.o.matmul_dtype));
  I.tok = load_tokenizer(I.o.tokenizer);
  if (!fs::exists(fs::path(I.o.data_dir) / "meta.json") && I.o.auto_prepare) {
    log::info("preparing the default corpus (Debian fortunes) into {} ...", I.o.data_dir);
    prepare_default_corpus(I.o.data_dir, I.o.tokenizer);
  }
  ATOLL_CHECK(I.mc.vocab_size >= I.tok->vocab_size(), "model.vocab_size {} is smaller than the tokenizer's {}",
              I.mc.vocab_size, I.tok->vocab_size());
  ATOLL_CHECK(I.o.seq_len <= I.mc.block_size, "train.seq_len {} exceeds model.block_size {}", I.o.seq_len,
              I.mc.block_size);
  I.train_data = std::make_unique<DataLoader>(I.o.data_dir, "train", int(I.o.batch_size), int(I.o.seq_len), 0, 1, uint64_t(I.o.seed));
  I.val_data = std::make_unique<DataLoader>(I.o.data_dir, "val", int(I.o.batch_size), int(I.o.seq_len), 0, 1, uint64_t(I.o.seed));
  I.train_data->validate_vocab(int32_t(I.mc.vocab_size));

  I.model = std::make_unique<nn::GPT>(I.mc);
  I.model->init_weights(uint64_t(I.o.seed));
  I.opt = std::make_unique<AdamW>(I.model->param_refs(), ac);
  I.sample_rng = Rng(uint64_t(I.o.seed), 1000);
}

Trainer::~Trainer() = default;
nn::GPT& Trainer::model() { return *impl_->model; }

TrainResult Trainer::run(bool resume) {
  auto& I = *impl_;
  const TrainOptions& o = I.o;
  CheckpointStore store((fs::path(o.run_dir) / "checkpoints").string(), int(o.ckpt_keep));
  int64_t start = 0;
  if (resume) {
    if (auto p = store.latest()) {
      Checkpoint ck = CheckpointStore::load(*p);
      I.model->load_state_dict(ck.model, *p);
      TensorFile of;
      of.tensors = std::move(ck.optimizer);
      I.opt->load_state(of, "");
      start = ck.state.at("step").get<int64_t>();
      auto rs = ck.state.at("sample_rng").get<std::vector<uint64_t>>();
      Rng::State st;
      std::copy(rs.begin(), rs.end(), st.begin());
      I.sample_rng.set_state(st);
      I.train_data->set_state(DataLoaderState::from_json(ck.state.at("train_data")));
      log::info("resumed from {} at step {}", *p, start);
    } else {
      log::info("no checkpoint in {}: starting from scratch", store.dir());
    }
  }
  MetricsLog metrics((fs::path(o.run_dir) / "metrics.jsonl").string(), start > 0);
  double peak = o.peak_gflops > 0 ? o.peak_gflops : measure_gemm_peak_gflops();
  double flops_tok = I.model->flops_per_token(o.seq_len);
  int64_t tokens_per_step = o.batch_size * o.seq_len * o.grad_accum;
  log::info("model: {} ({:.2f}M parameters), {} threads, {} tokens/step, fp32 GEMM peak {:.1f} GFLOP/s", I.mc.describe(),
            double(I.model->num_params()) / 1e6, num_threads(), tokens_per_step, peak);

  Tensor x = Tensor::empty({o.batch_size, o.seq_len}, DType::i32), y = Tensor::empty({o.batch_size, o.seq_len}, DType::i32);
  TrainResult res;
  double ema_step_s = 0;
  int64_t last_good_ckpt = start;
  for (int64_t step = start; step < o.steps; ++step) {
    auto t0 = Clock::now();
    I.model->zero_grad();
    if (o.fault_nan_at_step == step + 1) I.model->flat_values().f32()[0] = std::numeric_limits<float>::quiet_NaN();
    double loss_sum = 0;
    for (int64_t m = 0; m < o.grad_accum; ++m) {
      I.train_data->next_batch(x.i32(), y.i32());
      Tensor loss = I.model->loss(x, y);
      loss_sum += loss.item();
      backward(loss, 1.f / float(o.grad_accum));
    }
    double loss = loss_sum / double(o.grad_accum);
    double norm = grad_norm(I.model->flat_grads());
    if (!std::isfinite(loss) || !std::isfinite(norm)) {
      fail("training diverged at step {}: loss {}, gradient norm {}; stopping without saving (last good checkpoint: {})",
           step + 1, loss, norm, last_good_ckpt > 0 ? store.latest().value_or("none") : std::string("none"));
    }
    float lr_scale = o.schedule.at(step);
    I.opt->step({lr_scale, clip_coefficient(norm, o.grad_clip)});
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ema_step_s = step == start ? dt : 0.9 * ema_step_s + 0.1 * dt;
    double tps = double(tokens_per_step) / dt;
    double mfu = flops_tok * tps / (peak * 1e9);
    res.final_step = step + 1;
    res.final_loss = loss;
    res.tokens_per_s = tps;
    res.mfu = mfu;
    nlohmann::json rec = {{"step", step + 1}, {"loss", loss},        {"lr_scale", lr_scale}, {"grad_norm", norm},
                          {"tokens_per_s", tps}, {"mfu", mfu},      {"step_ms", dt * 1e3},
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
      rec["sample"] = s;
      log::info("step {:>5} | sample: {}", step + 1, s);
    }
    metrics.write(rec);
    bool stop_now = o.stop_after > 0 && step + 1 - start >= o.stop_after;
    if ((o.ckpt_every > 0 && (step + 1) % o.ckpt_every == 0) || step + 1 == o.steps || stop_now) {
      std::string p = store.save(step + 1, I.make_checkpoint(step + 1));
      last_good_ckpt = step + 1;
      log::info("checkpoint: {}", p);
    }
    if (stop_now) break;
  }
  return res;
}

}  // namespace atl
