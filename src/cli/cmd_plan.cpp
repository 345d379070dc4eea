// `atoll plan …`: the analytical performance model and planner (src/plan), from the command line.
// This file is the only part of the planner that touches the engine: `plan calibrate` times
// atl::cpu::gemm to build the "cpu-local" device's GEMM efficiency curve, a STREAM triad
// (McCalpin 1995), the engine's element-wise, fused-attention (cold caches, by call size) and
// AdamW kernels, and runs `atoll launch … atoll bench comm` to fit the alpha-beta model of
// all-reduce between local ranks (Hockney 1994; Thakur, Rabenseifner & Gropp 2005).
#include <CLI/CLI.hpp>
#include <map>
#include <omp.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/command.h"
#include "cli/number_checks.h"
#include "core/config.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/moe_kernels.h"
#include "models/gpt/gpt.h"
#include "models/gpt/gpt_config.h"
#include "models/moe/moe_config.h"
#include "nn/model.h"
#include "nn/context_attention.h"
#include "parallel/context_parallel.h"
#include "kernels/dispatch.h"
#include "tensor/tensor.h"
#include "plan/plan_input.h"
#include "plan/predict.h"
#include "plan/report.h"
#include "plan/search.h"
#include "plan/sweep.h"
#include "plan/svg_plot.h"
#include "plan/train_config.h"
#include "plan/comm_fit.h"
#include "plan/validation.h"

namespace {

using namespace atl;
using namespace atl::plan;

// Options every planner command shares: an input file and shortcuts for common overrides.
struct InputArgs {
  std::string file, from_atoll;
  std::string model, device;
  int64_t nodes = 0, islands = 0, devices_per_node = 0;
  std::vector<std::string> sets;
  void add(CLI::App& app) {
    app.add_option("config", file, "planner TOML ([model], [cluster], [plan], [run]); see docs/plan.md");
    app.add_option("--model", model, "model preset (e.g. llama3-8b); overrides [model] preset");
    app.add_option("--device", device, "device from the catalog (e.g. h100-sxm, cpu-local)");
    // 0 stands for "not given" below, so a 0 on the command line must be refused, not ignored.
    app.add_option("--nodes", nodes, "nodes per island")->check(cli::integer_in(1, 1 << 20));
    app.add_option("--islands", islands, "number of islands")->check(cli::integer_in(1, 1 << 20));
    app.add_option("--devices-per-node", devices_per_node, "devices per node")->check(cli::integer_in(1, 1 << 16));
    app.add_option("--from-atoll", from_atoll, "take [model] (and train.seq_len) from an atoll train config");
    app.add_option("--set", sets, "override any key: --set plan.tp=8 --set cluster.inter_node.bandwidth_gbs=50");
  }
  Config config() const {
    Config c = file.empty() ? Config::parse("", "<defaults>") : Config::load(file);
    if (!model.empty()) c.set_override("model.preset=\"" + model + "\"");
    if (!device.empty()) c.set_override("cluster.device=\"" + device + "\"");
    if (nodes) c.set_override("cluster.nodes_per_island=" + std::to_string(nodes));
    if (islands) c.set_override("cluster.islands=" + std::to_string(islands));
    if (devices_per_node) c.set_override("cluster.devices_per_node=" + std::to_string(devices_per_node));
    if (!from_atoll.empty()) {
      // The engine's own reading of its [model] section, turned into planner keys.
      nn::MoEModelConfig e = engine_model();
      const nn::GPTConfig& g = e.attn;
      std::vector<std::string> kv = {
          "model.name=\"" + from_atoll + "\"", "model.layers=" + std::to_string(g.n_layer),
          "model.hidden=" + std::to_string(g.n_embd), "model.heads=" + std::to_string(g.n_head),
          "model.kv_heads=" + std::to_string(g.n_kv_head), "model.ffn=" + std::to_string(g.ffn()),
          std::string("model.ffn_type=\"") + (g.swiglu ? "swiglu" : "gelu") + "\"",
          "model.vocab=" + std::to_string(g.vocab_size), "model.seq=" + std::to_string(seq_len(g)),
          std::string("model.tied_head=") + (g.tied_head ? "true" : "false"),
          std::string("model.bias=") + (g.bias ? "true" : "false"),
          std::string("model.norm=\"") + (g.rms_norm ? "rmsnorm" : "layernorm") + "\"",
          std::string("model.position=\"") + (g.rope ? "rope" : "learned") + "\"",
          // The engine's attention is blocked with an online softmax (kernels/cpu/attention_*.cpp):
          // the T×T scores never reach memory, which is the planner's "flash" attention.
          "model.attention=\"flash\"", "model.dropout=false"};
      if (moe_family()) {
        // models/moe: the first n_dense_layers dense, every later layer routed. The planner's shared
        // experts are expert_ffn wide each; a shared_ffn of its own is not expressible there.
        ATOLL_CHECK(e.moe.shared_ffn == 0 || e.moe.shared_ffn == e.moe.expert_ffn,
                    "--from-atoll {}: model.shared_ffn = {} differs from expert_ffn = {}; the planner sizes "
                    "each shared expert as one routed expert", from_atoll, e.moe.shared_ffn, e.moe.expert_ffn);
        for (auto o : {"model.experts=" + std::to_string(e.moe.n_experts), "model.top_k=" + std::to_string(e.moe.top_k),
                       "model.shared_experts=" + std::to_string(e.moe.n_shared),
                       "model.expert_ffn=" + std::to_string(e.moe.expert_ffn),
                       "model.first_dense_layers=" + std::to_string(e.n_dense_layers), std::string("model.moe_every=1")})
          kv.push_back(o);
      }
      for (auto& o : kv) c.set_override(o);
    }
    for (auto& s : sets) c.set_override(s);
    return c;
  }
  bool moe_family() const {
    Config a = Config::load(from_atoll);
    return a.get_string("model.family", "gpt") == "moe";
  }
  // The GPT family's config is the MoE family's attention part with no experts.
  nn::MoEModelConfig engine_model() const {
    Config a = Config::load(from_atoll);
    if (moe_family()) return nn::MoEModelConfig::from_config(a, "model");
    nn::MoEModelConfig e;
    e.attn = nn::GPTConfig::from_config(a, "model");
    return e;
  }
  int64_t seq_len(const nn::GPTConfig& g) const {
    Config a = Config::load(from_atoll);
    return a.get_int("train.seq_len", g.block_size, 1, 1 << 20);
  }
  // Parameters the engine counts for that model (built, not trained), to compare with the plan.
  int64_t engine_params() const {
    Config a = Config::load(from_atoll);
    return nn::make_model(a, "model")->num_params();
  }
};

void write_out(const std::string& path, const std::string& text) {
  auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  write_file(path, text);
}

int run_plan(int argc, char** argv) {
  CLI::App app{"Predict memory, step time, throughput, cost and the bottleneck of one training layout"};
  InputArgs in;
  in.add(app);
  bool explain = false, json = false;
  double tokens = 0;
  app.add_flag("--explain", explain, "print every figure with the formula and inputs that produced it");
  app.add_flag("--json", json, "machine-readable output");
  app.add_option("--tokens", tokens, "tokens to train (default: [run] tokens or 1e12)")->check(cli::finite_number(false));
  std::string emit, emit_keys = "mesh";
  app.add_option("--emit-train-config", emit, "write the layout as the [parallel]/[train] tables of an atoll train config");
  app.add_option("--train-config-keys", emit_keys, "mesh (round-2 [parallel] table), legacy (today's trainer) or both")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  Config cfg = in.config();
  PlanInput pi = read_plan_input(cfg);
  if (!emit.empty()) write_out(emit, train_config_toml(pi.model, pi.cluster, pi.layout, emit_keys));
  PredictOptions po;
  po.explain = explain || json;
  po.train_tokens = tokens > 0 ? tokens : pi.train_tokens;
  po.fault = pi.fault;
  Prediction p = predict(pi.model, pi.cluster, pi.layout, po);
  int64_t engine = in.from_atoll.empty() ? -1 : in.engine_params();
  if (json) {
    auto j = prediction_json(pi.model, pi.cluster, pi.layout, p);
    if (engine >= 0) j["model"]["engine_params"] = engine;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", format_prediction(pi.model, pi.cluster, pi.layout, p).c_str());
    if (engine >= 0)
      std::printf("engine      atoll's nn::GPT counts %lld parameters (planner: %lld)\n", (long long)engine,
                  (long long)pi.model.total_params());
    if (explain) std::printf("%s", format_explain(p).c_str());
  }
  return p.memory.oom ? 3 : 0;
}

int run_search(int argc, char** argv) {
  CLI::App app{"Enumerate valid layouts, rank them and write the cost-vs-time Pareto frontier"};
  InputArgs in;
  in.add(app);
  SearchOptions so;
  size_t top = 10;
  std::string out_dir = "plan-search";
  bool json = false, fixed = false;
  app.add_option("--objective", so.objective, "rank by throughput or cost")
      ->check(CLI::IsMember({"throughput", "cost"}))->capture_default_str();
  app.add_option("--batch-tokens", so.batch_tokens, "tokens per step (global batch)")
      ->check(cli::finite_number(false))->capture_default_str();
  app.add_option("--top", top, "rows to print")->check(cli::integer_in(1, 1 << 20))->capture_default_str();
  app.add_option("--out-dir", out_dir, "where pareto.csv and pareto.svg go")->capture_default_str();
  app.add_flag("--fixed-cluster", fixed, "use the whole cluster only (do not try fewer nodes/islands)");
  app.add_flag("--json", json, "machine-readable output");
  CLI11_PARSE(app, argc, argv);
  Config cfg = in.config();
  PlanInput pi = read_plan_input(cfg);
  so.vary_cluster = !fixed;
  so.train_tokens = pi.train_tokens;
  so.precision = pi.layout.precision, so.optimizer = pi.layout.optimizer;
  if (cfg.has("plan.global_batch")) so.global_batch = pi.layout.global_batch;
  so.decentral = Layout{};
  so.decentral.diloco_h = pi.layout.diloco_h, so.decentral.diloco_compression = pi.layout.diloco_compression;
  so.decentral.gossip_peers = pi.layout.gossip_peers, so.decentral.offload = pi.layout.offload;
  auto t0 = std::chrono::steady_clock::now();
  SearchResult r = search_layouts(pi.model, pi.cluster, so);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::create_directories(out_dir);
  write_out(out_dir + "/pareto.csv", pareto_csv(r.pareto));
  write_out(out_dir + "/pareto.svg",
            render_svg(pareto_plot(r, pi.model.name + " on up to " + std::to_string(pi.cluster.world()) + " × " +
                                          pi.cluster.device.name + ": cost vs time to train")));
  if (json) {
    auto j = search_json(r, top);
    j["seconds"] = secs;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("%s", format_search(r, top).c_str());
    std::printf("searched in %.2f s; wrote %s/pareto.csv and %s/pareto.svg\n", secs, out_dir.c_str(), out_dir.c_str());
  }
  return r.ranked.empty() ? 3 : 0;
}

int run_sweep_cmd(int argc, char** argv) {
  CLI::App app{"Sweep island size, islands, batch or bandwidth and show the scaling regimes"};
  InputArgs in;
  in.add(app);
  SweepOptions so;
  std::string values, out_dir = "plan-sweep";
  bool json = false;
  app.add_option("--param", so.param, "island_size, islands, batch, bandwidth or wan_bandwidth")->capture_default_str();
  app.add_option("--values", values, "comma-separated values, e.g. 1,2,4,8,16")->required();
  app.add_flag("--best", so.best, "search the best layout at every point (default: adapt dp only)");
  app.add_option("--out-dir", out_dir, "where sweep.svg goes")->capture_default_str();
  app.add_flag("--json", json, "machine-readable output");
  CLI11_PARSE(app, argc, argv);
  Config cfg = in.config();
  PlanInput pi = read_plan_input(cfg);
  size_t pos = 0;
  while (pos <= values.size()) {
    size_t c = values.find(',', pos);
    std::string tok = values.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    size_t used = 0;
    double v = NAN;
    try {
      v = std::stod(tok, &used);
    } catch (const std::exception&) {
    }
    ATOLL_CHECK(used == tok.size() && std::isfinite(v) && v > 0,
                "--values: '{}' is not a finite number above 0", tok);
    so.values.push_back(v);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  so.train_tokens = pi.train_tokens;
  so.search.precision = pi.layout.precision, so.search.optimizer = pi.layout.optimizer;
  so.search.micro_batches = {1, 2, 4};
  auto pts = run_sweep(pi.model, pi.cluster, pi.layout, so);
  std::filesystem::create_directories(out_dir);
  write_out(out_dir + "/sweep.svg", render_svg(sweep_plot(pts, so, pi.model.name + " on " + pi.cluster.device.name +
                                                                       ": sweep over " + so.param)));
  if (json) std::printf("%s\n", sweep_json(pts, so).dump(2).c_str());
  else std::printf("%swrote %s/sweep.svg\n", format_sweep(pts, so).c_str(), out_dir.c_str());
  return 0;
}

int run_validate(int argc, char** argv) {
  CLI::App app{"Compare predictions with published measurements (the Megatron-LM tables, then the extended set)"};
  std::string data = std::string(ATOLL_SOURCE_DIR) + "/configs/plan/validation/published.toml";
  std::string extended = std::string(ATOLL_SOURCE_DIR) + "/configs/plan/validation/extended.toml";
  app.add_option("--data", data, "the original published runs (TOML)")->capture_default_str();
  app.add_option("--extended", extended, "the extended set (TOML; empty: skip)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  auto rows = validate_published(load_published(data));
  std::printf("%s\nmedian |error| %.1f%%, worst %.1f%% over %zu runs\n", format_validation(rows).c_str(),
              100 * median_abs_error(rows), 100 * max_abs_error(rows), rows.size());
  if (!extended.empty()) {
    auto ext = validate_published(load_extended(extended));
    std::printf("\nextended set\n%s\nmedian |error| %.1f%%, worst %.1f%% over %zu runs\n",
                format_validation(ext).c_str(), 100 * median_abs_error(ext), 100 * max_abs_error(ext), ext.size());
  }
  return 0;
}

int run_list(int argc, char** argv) {
  CLI::App app{"List the model presets and the device catalog"};
  CLI11_PARSE(app, argc, argv);
  std::printf("model presets\n");
  for (auto& n : known_presets()) {
    ModelSpec m = model_preset(n);
    std::printf("  %-12s %9s params (%s active), %lld layers, hidden %lld, seq %lld\n", n.c_str(),
                human_count(double(m.total_params())).c_str(), human_count(double(m.active_params())).c_str(),
                (long long)m.layers, (long long)m.hidden, (long long)m.seq);
  }
  std::printf("\ndevices (dense peak TFLOP/s bf16 / fp8, memory, bandwidth, USD/h)\n");
  for (auto& d : device_catalog())
    std::printf("  %-12s %7.1f / %7.1f  %6.0f GB  %6.0f GB/s  %5.2f  %s\n", d.name.c_str(), d.bf16 / 1e12,
                d.fp8 / 1e12, d.mem_bytes / 1e9, d.mem_bw / 1e9, d.price_hour, d.note.c_str());
  std::printf("  %-12s from `atoll plan calibrate` (%s)\n", "cpu-local", calibration_path().c_str());
  return 0;
}

// ---- calibration ----

// Seconds a piece of work takes while it has its cores. With one thread that is the process's CPU
// time: on a shared machine the wall clock also counts the time the scheduler gave the core to
// someone else (at load average 5 on 2 cores it doubled a 50 ms sample), and training, measured
// the same way (tools/plan_self_check.sh), is charged the same. Several threads spin at barriers
// while waiting for each other, so their CPU time says less; there the wall clock is used.
class KernelClock {
 public:
  KernelClock() : cpu_(omp_get_max_threads() == 1) { reset(); }
  void reset() { wall0_ = std::chrono::steady_clock::now(), cpu0_ = cpu_now(); }
  double seconds() const {
    if (cpu_) return cpu_now() - cpu0_;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0_).count();
  }
  bool cpu_time() const { return cpu_; }

 private:
  static double cpu_now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  }
  bool cpu_;
  std::chrono::steady_clock::time_point wall0_;
  double cpu0_ = 0;
};

// Seconds per GEMM: each sample repeats the call until it has run for `min_s`, so that tiny
// GEMMs are not lost in timer resolution; the best of `reps` samples filters out interference.
template <typename F>
double time_repeated(F&& call, double flops, int reps, double min_s) {
  call();  // warm-up: page faults, thread pool start
  int64_t iters = std::max<int64_t>(1, int64_t(min_s * 5e9 / flops));
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < reps; ++r) {
    clock.reset();
    for (int64_t i = 0; i < iters; ++i) call();
    best = std::min(best, clock.seconds() / iters);
  }
  return best;
}

double time_gemm(int64_t n, int reps, double min_s) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.f);
  return time_repeated([&] { cpu::gemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); },
                       2.0 * n * n * n, reps, min_s);
}

double time_gemm_bf16(int64_t n, int reps, double min_s) {
  std::vector<float> af(n * n, 0.5f), c(n * n, 0.f);
  std::vector<bf16> a(n * n);
  cpu::f32_to_bf16(af.data(), a.data(), n * n);
  return time_repeated(
      [&] { cpu::gemm_bf16(false, false, n, n, n, 1.f, a.data(), n, a.data(), n, 0.f, c.data(), n); },
      2.0 * n * n * n, reps, min_s);
}

// STREAM-style triad a = b + s·c over arrays far larger than the caches: 3 arrays × 8 bytes moved.
double measure_bandwidth(int64_t n, int reps) {
  std::vector<double> a(n, 0.0), b(n, 1.0), c(n, 2.0);
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < reps; ++r) {
    clock.reset();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0 * c[i];
    best = std::min(best, clock.seconds());
  }
  if (a[n / 2] != 7.0) fail("bandwidth probe computed a wrong value");
  return 3.0 * 8.0 * n / best;
}

// Effective bandwidth of the engine's element-wise kernels on one activation of n_rows × c
// (LayerNorm and GELU forward and backward, a residual add), from the bytes each reads and
// writes: the planner moves its element-wise traffic at this rate rather than STREAM's.
double measure_elementwise(int64_t n_rows, int64_t c, int reps, double min_s) {
  const int64_t n = n_rows * c;
  std::vector<float> x(n, 0.5f), y(n), dy(n, 0.01f), dx(n, 0.f), w(c, 1.f), b(c, 0.f), dw(c), db(c);
  std::vector<float> mean(n_rows), rstd(n_rows);
  auto all = [&] {
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n_rows, c, 1e-5f);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                            rstd.data(), n_rows, c);
    cpu::gelu_forward(y.data(), x.data(), n);
    cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
    cpu::add_forward(y.data(), x.data(), dy.data(), n);
  };
  // Bytes per element: LN fwd 2, LN bwd 4 (dout, x, dinp read+write), GELU fwd 2, bwd 4, add 3.
  const double bytes = 4.0 * n * (2 + 4 + 2 + 4 + 3);
  // time_repeated sizes its loop by FLOPs at 5 GFLOP/s; pass the bytes' equivalent at 5 GB/s.
  return bytes / time_repeated(all, bytes, reps, min_s);
}

// Evicts the caches by touching a buffer twice the last-level cache (at least 64 MB), so that
// the next kernel finds its inputs in memory, as a training step's kernels do: between a layer's
// attention forward and its backward every other kernel of the step has run.
void evict_caches() {
  static std::vector<float> junk;
  if (junk.empty()) {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    junk.assign(size_t(std::max<long>(64L << 20, 2 * std::max(l3, 0L)) / 4), 1.f);
  }
  for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.f;  // one touch per 64-byte line
}

// Evicts only the core's own caches (a buffer of twice the L2, at least 4 MB): the next kernel
// finds its inputs in the L3, as a training step whose working set fits there does (session 9's
// perf of the self-check's one-rank step: its GEMMs 16 ms against 22 ms on the DRAM-cold grid).
void evict_l2() {
  static std::vector<float> junk;
  if (junk.empty()) {
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    junk.assign(size_t(std::max<long>(4L << 20, 2 * std::max(l2, 0L)) / 4), 1.f);
  }
  for (size_t i = 0; i < junk.size(); i += 16) junk[i] += 1.f;
}

// FLOP/s of the engine's fused causal attention (forward + backward), counted as the planner
// counts an attention core: 2·s²·(d_q + d_v) per head forward, backward twice that (so rate =
// 3 × forward FLOPs / (forward + backward time)). Each sample is one call with cold caches
// before the forward and before the backward (evict_caches); warm, back-to-back calls ran
// 10–25% faster than the same kernel inside `atoll train` (perf), cold ones within 8%.
double measure_attention(int64_t B, int64_t T, int64_t H, int64_t hd, int samples) {
  const int64_t C = H * hd;
  std::vector<float> qkv(B * T * 3 * C, 0.1f), dqkv(qkv.size(), 0.f), out(B * T * C), dout(B * T * C, 0.01f);
  std::vector<float> lse(B * H * T);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.01f * float(int(i % 17) - 8);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, hd);  // warm-up: page faults
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < samples; ++r) {
    evict_caches();
    clock.reset();
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, hd);
    double fwd = clock.seconds();
    evict_caches();
    clock.reset();
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, H, H, hd);
    best = std::min(best, fwd + clock.seconds());
  }
  return 3.0 * B * H * 2.0 * T * T * (2.0 * hd) / best;
}

// FLOP/s of the engine's linear layer (cpu::linear_forward, then linear_backward's two GEMMs
// dout·Wᵀ and xᵀ·dout, as autograd calls them; no bias) on N tokens of C inputs and OC outputs,
// counted as the planner counts a linear: 2·N·C·OC forward, twice that backward (rate = 3 ×
// forward FLOPs / (forward + backward time)). The square-GEMM curve does not describe these
// shapes: OpenBLAS packs both operands into panels and writes C in passes of their own, so a
// token-major GEMM with a thin side (tp shards: C or OC of 64–256) spends more of its time in
// packing than a cube of the same FLOPs, and the backward's xᵀ·dout reduces over the tokens.
// Cold caches before the forward and before the backward (evict_caches), as inside a step.
double measure_linear(int64_t N, int64_t C, int64_t OC, int samples, bool cold = true) {
  auto evict = cold ? evict_caches : evict_l2;
  std::vector<float> x(N * C), w(C * OC), y(N * OC), dy(N * OC, 0.01f), dx(N * C, 0.f), dw(C * OC, 0.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(int(i % 13) - 6);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * float(int(i % 7) - 3);
  cpu::linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);  // warm-up: page faults, pool start
  cpu::linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, C, OC);
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < samples; ++r) {
    evict();
    clock.reset();
    cpu::linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
    double fwd = clock.seconds();
    evict();
    clock.reset();
    cpu::linear_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, C, OC);
    best = std::min(best, fwd + clock.seconds());
  }
  return 3.0 * 2.0 * double(N) * double(C) * double(OC) / best;
}

// FLOP/s of the engine's grouped expert kernel (cpu::grouped_gemm_forward, then
// grouped_gemm_backward's dx and dw, as the MoE layer calls them) over G experts of `rows` rows
// each, `inputs` → `outputs`: counted as the planner counts the experts' GEMMs, 2·G·rows·in·out
// forward and twice that backward. Its own register tiles (4 rows × 64 columns) and the
// transpose of every expert's weight in dx are not an OpenBLAS GEMM: the square curve put
// session 7's MoE at 24% below its perf-measured expert time. Cold caches before each pass.
double measure_grouped_experts(int64_t G, int64_t rows, int64_t inputs, int64_t outputs, int samples, bool cold = true) {
  auto evict = cold ? evict_caches : evict_l2;
  const int64_t M = G * rows;
  std::vector<float> x(size_t(M * inputs)), w(size_t(G * inputs * outputs)), y(size_t(M * outputs));
  std::vector<float> dy(y.size(), 0.01f), dx(x.size(), 0.f), dw(w.size(), 0.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * float(int(i % 13) - 6);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * float(int(i % 7) - 3);
  std::vector<int64_t> off(size_t(G + 1));
  for (int64_t g = 0; g <= G; ++g) off[size_t(g)] = g * rows;
  cpu::grouped_gemm_forward(y.data(), x.data(), w.data(), off.data(), G, inputs, outputs);  // warm-up
  cpu::grouped_gemm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), off.data(), G, inputs, outputs);
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < samples; ++r) {
    evict();
    clock.reset();
    cpu::grouped_gemm_forward(y.data(), x.data(), w.data(), off.data(), G, inputs, outputs);
    double fwd = clock.seconds();
    evict();
    clock.reset();
    cpu::grouped_gemm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), off.data(), G, inputs, outputs);
    best = std::min(best, fwd + clock.seconds());
  }
  return 3.0 * 2.0 * double(M) * double(inputs) * double(outputs) / best;
}

// FLOP/s of one context-parallel rank's ring attention at `cp` ranks (balanced head-and-tail
// chunks of a row of T), forward + backward, through the engine's block kernels as
// parallel/context_parallel.cpp calls them: a block_forward per key block of the ring, then a
// block_backward per block, with the visible [query, key] ranges of a causal row. Counted as the
// planner counts that rank's attention core, 2·(T/cp)·T·(d_q + d_v) per head forward and 3× that
// for forward + backward, so it is directly the rate `time.compute` divides by under cp. Not
// timed: merging the blocks' outputs and D = dO·O (O(T·hd) per head, outside the kernels), and
// the ring's sends. Cold caches before each pass, as measure_attention.
double measure_ring_attention(int64_t B, int64_t T, int64_t H, int64_t hd, int cp, int samples) {
  const int64_t Tq = T / cp, S = 3 * H * hd, KS = 2 * H * hd;
  const kernels::AttentionKernels& K = kernels::table(atl::Device::cpu(), DType::f32).attention;
  std::vector<std::vector<int32_t>> pos(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r) pos[size_t(r)] = nn::span_positions(parallel::context_spans(T, cp, r, true));
  const int rank = cp - 1;
  const std::vector<int32_t>& pq = pos[size_t(rank)];
  auto lb = [](const std::vector<int32_t>& v, int32_t x) { return int32_t(std::lower_bound(v.begin(), v.end(), x) - v.begin()); };
  struct Ranges {
    std::vector<int32_t> k_lo, k_hi, q_lo, q_hi;
    bool any = false;
  };
  std::vector<Ranges> rg(static_cast<size_t>(cp));
  for (int s = 0; s < cp; ++s) {
    Ranges& r = rg[size_t(s)];
    const std::vector<int32_t>& pk = pos[size_t(s)];
    r.k_lo.assign(size_t(B * Tq), 0), r.k_hi.resize(size_t(B * Tq)), r.q_lo.resize(size_t(B * Tq)), r.q_hi.assign(size_t(B * Tq), int32_t(Tq));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tq; ++t) {
        r.k_hi[size_t(b * Tq + t)] = lb(pk, pq[size_t(t)] + 1);
        r.q_lo[size_t(b * Tq + t)] = lb(pq, pk[size_t(t)]);
        r.any = r.any || r.k_hi[size_t(b * Tq + t)] > 0;
      }
  }
  auto view = [](const Ranges& r) { return kernels::AttentionRanges{r.k_lo.data(), r.k_hi.data(), r.q_lo.data(), r.q_hi.data()}; };
  std::vector<float> qkv(size_t(B * Tq * S)), kv(size_t(B * Tq * KS)), dq(qkv.size(), 0.f), part(kv.size(), 0.f);
  std::vector<float> ob(size_t(B * Tq * H * hd)), dout(ob.size(), 0.01f), lbuf(size_t(B * H * Tq)), lse(lbuf.size()), D(lbuf.size(), 0.01f);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.01f * float(int(i % 17) - 8);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = 0.01f * float(int(i % 13) - 6);
  // The diagonal block (the rank's own keys) is visible to every query: its lse stands in for the
  // merged one the backward reads.
  K.block_forward(ob.data(), lse.data(), qkv.data(), S, kv.data(), view(rg[size_t(rank)]), B, Tq, Tq, H, H, hd);
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < samples; ++r) {
    evict_caches();
    clock.reset();
    for (int s = 0; s < cp; ++s)
      if (rg[size_t(s)].any) K.block_forward(ob.data(), lbuf.data(), qkv.data(), S, kv.data(), view(rg[size_t(s)]), B, Tq, Tq, H, H, hd);
    double fwd = clock.seconds();
    evict_caches();
    clock.reset();
    for (int s = 0; s < cp; ++s)
      if (rg[size_t(s)].any)
        K.block_backward(dq.data(), part.data(), dout.data(), D.data(), lse.data(), qkv.data(), S, kv.data(),
                         view(rg[size_t(s)]), B, Tq, Tq, H, H, hd);
    best = std::min(best, fwd + clock.seconds());
  }
  return 3.0 * B * H * 2.0 * Tq * T * (2.0 * hd) / best;
}

// Bytes per second at which pages given back with MADV_DONTNEED (as parallel/page_release.cpp
// does with a ZeRO-3 rank's non-owned values and gradients) fault back in on the next write,
// zero-filled by the kernel: the release, then one write per page, by CPU time of the process.
double measure_page_faults(int64_t bytes, int reps) {
  const long page = sysconf(_SC_PAGESIZE);
  void* mem = mmap(nullptr, size_t(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ATOLL_CHECK(mem != MAP_FAILED, "page-fault probe: mmap of {} bytes failed", bytes);
  char* p = static_cast<char*>(mem);
  std::memset(p, 1, size_t(bytes));
  double best = 1e30;
  KernelClock clock;
  for (int r = 0; r < reps; ++r) {
    clock.reset();
    madvise(p, size_t(bytes), MADV_DONTNEED);
    for (int64_t i = 0; i < bytes; i += page) p[i] = 1;
    best = std::min(best, clock.seconds());
  }
  munmap(mem, size_t(bytes));
  return double(bytes) / best;
}

// Parameters per second of the engine's AdamW update plus the global gradient norm that clipping
// takes first, on n parameters (a few times the last-level cache, as a model's states are). On a
// CPU the per-parameter division and square root can cost more than streaming its 28 bytes.
double measure_optimizer(int64_t n, int reps) {
  std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.f), v(n, 0.f);
  for (int64_t i = 0; i < n; ++i) g[size_t(i)] = 0.001f * float(int(i % 23) - 11);
  double best = 1e30, sink = 0;
  KernelClock clock;
  for (int r = 0; r < reps; ++r) {
    clock.reset();
    sink += cpu::sum_squares(g.data(), n);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.f, r + 1);
    best = std::min(best, clock.seconds());
  }
  ATOLL_CHECK(std::isfinite(sink) && std::isfinite(p[0]), "optimizer probe computed a non-finite value");
  return double(n) / best;
}

// The same bench's reduce-scatters and all-gathers: op → bytes → iterations, by the wall clock and
// by CPU time.
struct PhaseTimings {
  std::map<std::string, std::map<double, std::vector<double>>> wall, cpu;
};

// All-reduce timings between `nproc` local ranks, measured by `atoll bench comm` inside a job
// started by `atoll launch` (the same launcher and backend training uses): bytes → every timed
// iteration (`--samples`: at least `samples` per size, each timed alone), so that the fit can take
// medians (plan/comm_fit.h). A bench that prints no SAMPLE lines gives its RESULT means instead.
// cpu (when given): the same iterations in the rank's process CPU seconds (CPUTIME lines).
std::map<double, std::vector<double>> measure_all_reduce(int nproc, int64_t min_bytes, int64_t max_bytes,
                                                         double seconds, int samples,
                                                         std::map<double, std::vector<double>>* cpu = nullptr,
                                                         PhaseTimings* phases = nullptr) {
  char buf[4096] = {};
  ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(len > 0, "cannot find the atoll binary (/proc/self/exe) to time collectives");
  std::string self(buf, size_t(len));
  std::string cmd = fmt::format("'{}' launch --nproc-per-node {} -- '{}' bench comm --in-job --min-bytes {} "
                                "--max-bytes {} --seconds {} --samples {} 2>&1",
                                self, nproc, self, min_bytes, max_bytes, seconds, samples);
  FILE* p = popen(cmd.c_str(), "r");
  ATOLL_CHECK(p, "cannot run `{}`", cmd);
  std::map<double, std::vector<double>> each, means;
  std::string other;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    char backend[32], op[32];
    int n = 0;
    long long bytes = 0;
    double secs = 0;
    const char* r = std::strstr(line, "RESULT ");
    const char* q = std::strstr(line, "SAMPLE ");
    const char* u = std::strstr(line, "CPUTIME ");
    if (u && std::sscanf(u, "CPUTIME %31s %31s %d %lld %lf", backend, op, &n, &bytes, &secs) == 5) {
      if (cpu && !std::strcmp(op, "all_reduce") && secs > 0) (*cpu)[double(bytes)].push_back(secs);
      else if (phases && secs > 0) phases->cpu[op][double(bytes)].push_back(secs);
    } else if (q && std::sscanf(q, "SAMPLE %31s %31s %d %lld %lf", backend, op, &n, &bytes, &secs) == 5) {
      if (!std::strcmp(op, "all_reduce") && secs > 0) each[double(bytes)].push_back(secs);
      else if (phases && secs > 0) phases->wall[op][double(bytes)].push_back(secs);
    } else if (r && std::sscanf(r, "RESULT %31s %31s %d %lld %lf", backend, op, &n, &bytes, &secs) == 5) {
      if (!std::strcmp(op, "all_reduce") && secs > 0) means[double(bytes)].push_back(secs);
    } else {
      other += line;
    }
  }
  int rc = pclose(p);
  auto& pts = each.empty() ? means : each;
  ATOLL_CHECK(rc == 0 && pts.size() >= 2,
              "timing collectives failed (`{}` exited with status {}, {} all_reduce sizes):\n{}\nrerun with "
              "--no-collectives to keep the default link figures",
              cmd, rc, pts.size(), other);
  return pts;
}

// All-reduces of `bytes` between `nproc` local ranks with compute between them (`atoll bench comm
// --gap-us`): gap level (µs asked) → (compute CPU seconds, wait seconds) per iteration.
std::map<double, std::vector<std::pair<double, double>>> measure_gap_wait(int nproc, int64_t bytes,
                                                                          const std::vector<double>& gaps_us,
                                                                          int samples) {
  char buf[4096] = {};
  ssize_t len = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(len > 0, "cannot find the atoll binary (/proc/self/exe) to time collectives");
  std::string self(buf, size_t(len)), list;
  // A first block at the first level is run and dropped: the job's first collectives pay for its
  // start (connections, first touches, the scheduler placing the ranks), and charged to the
  // back-to-back level they made it up to 15x slower than the later levels' own baseline on a
  // quiet machine (session 13: base 1.52 ms against 0.10-0.17 ms), which clipped every wait to 0.
  list = fmt::format("{:g}", gaps_us.at(0));
  for (double g : gaps_us) list += " " + fmt::format("{:g}", g);
  std::string cmd = fmt::format("'{}' launch --nproc-per-node {} -- '{}' bench comm --in-job --min-bytes {} "
                                "--max-bytes {} --samples {} --gap-us {} 2>&1",
                                self, nproc, self, bytes, bytes, samples, list);
  FILE* p = popen(cmd.c_str(), "r");
  ATOLL_CHECK(p, "cannot run `{}`", cmd);
  // The lines come in the order of the levels, `samples` each.
  std::map<double, std::vector<std::pair<double, double>>> out;
  std::string other;
  char line[512];
  size_t i = 0;
  while (std::fgets(line, sizeof line, p)) {
    char backend[32], op[32];
    int n = 0;
    long long b = 0;
    double comp = 0, wait = 0;
    const char* q = std::strstr(line, "GAP ");
    if (q && std::sscanf(q, "GAP %31s %31s %d %lld %lf %lf", backend, op, &n, &b, &comp, &wait) == 6) {
      if (i >= size_t(samples))  // past the dropped warm-up block
        out[gaps_us[std::min(gaps_us.size() - 1, i / size_t(samples) - 1)]].push_back({comp, wait});
      ++i;
    } else {
      other += line;
    }
  }
  int rc = pclose(p);
  ATOLL_CHECK(rc == 0 && i == (gaps_us.size() + 1) * size_t(samples),
              "timing collectives with compute between failed (`{}` exited with status {}, {} of {} samples):\n{}\n"
              "rerun with --no-collectives to keep the default link figures", cmd, rc, i,
              (gaps_us.size() + 1) * size_t(samples), other);
  return out;
}

int run_calibrate(int argc, char** argv) {
  CLI::App app{"Measure this machine's GEMM curve, kernels, memory bandwidth and collectives for the cpu-local device"};
  std::string out = calibration_path();
  bool quick = false;
  double price = 0.05;
  app.add_option("--out", out, "calibration file the cpu-local device reads")->capture_default_str();
  app.add_flag("--quick", quick, "fewer sizes and repetitions (for tests)");
  app.add_option("--price", price, "price per hour of this machine, USD")->check(cli::finite_number(true))->capture_default_str();
  bool no_collectives = false;
  app.add_flag("--no-collectives", no_collectives,
               "skip timing all-reduce between 2 local ranks (keep default link figures)");
  CLI11_PARSE(app, argc, argv);
  // The same thread setup as `atoll train` (OMP_NUM_THREADS, else every core) for OpenMP and
  // OpenBLAS alike: OpenBLAS's own pool otherwise ignores OMP_NUM_THREADS and the curve would
  // describe a different machine than the one training runs on.
  set_num_threads(0);
  std::vector<int64_t> sizes = quick ? std::vector<int64_t>{32, 64, 128, 256}
                                     : std::vector<int64_t>{32, 64, 128, 256, 384, 512, 768, 1024, 1536};
  int reps = quick ? 3 : 5;
  double min_s = quick ? 0.01 : 0.05;
  std::vector<std::pair<double, double>> rate;  // (flops, flop/s)
  double peak = 0;
  for (int64_t n : sizes) {
    double flops = 2.0 * n * n * n;
    double fs = flops / time_gemm(n, reps, min_s);
    rate.push_back({flops, fs});
    peak = std::max(peak, fs);
    std::printf("  gemm %5lld³  %8.2f GFLOP/s\n", (long long)n, fs / 1e9);
  }
  double peak_bf16 = 0;
  if (cpu::has_avx512_bf16()) {
    for (int64_t n : {256, 512}) peak_bf16 = std::max(peak_bf16, 2.0 * n * n * n / time_gemm_bf16(n, reps, min_s));
    std::printf("  gemm bf16     %8.2f GFLOP/s\n", peak_bf16 / 1e9);
  }
  double bw = measure_bandwidth(quick ? (int64_t(1) << 22) : (int64_t(1) << 25), 2 * reps);
  std::printf("  memory bandwidth %.2f GB/s (triad)\n", bw / 1e9);
  double ew = measure_elementwise(2048, 256, reps, min_s);
  std::printf("  element-wise kernels %.2f GB/s (LayerNorm, GELU, add on 2048×256)\n", ew / 1e9);
  // One call covers every head of a micro-batch, so its working set grows with batch × heads; the
  // curve spans 16 to 256 (sequence, head) pairs of 128 tokens (16 sequences, 1 to 16 heads of 32).
  std::vector<std::pair<double, double>> attn_curve;  // (forward FLOPs of a call, FLOP/s)
  double attn = 0;
  for (int64_t heads : quick ? std::vector<int64_t>{2, 8} : std::vector<int64_t>{1, 2, 4, 8, 16}) {
    const int64_t B = 16, T = 128, hd = 32;
    // More samples than for GEMMs: its rate depends on the caches, which other processes
    // disturb; the best sample is the undisturbed one.
    double r = measure_attention(B, T, heads, hd, 3 * reps);
    attn_curve.push_back({double(B * heads) * 2.0 * T * T * (2.0 * hd), r});
    if (heads <= 4) attn = r;
    std::printf("  attention kernel %.2f GFLOP/s (causal, fwd+bwd, 16 × %lld heads, T=128, head dim 32)\n", r / 1e9,
                (long long)heads);
  }
  // Ring attention's block kernels at cp = 2 on the same calls (each rank: 16 sequences of 64
  // queries against the row's 128 keys).
  std::vector<std::pair<double, double>> ring_curve;
  for (int64_t heads : quick ? std::vector<int64_t>{2, 8} : std::vector<int64_t>{1, 2, 4, 8, 16}) {
    const int64_t B = 16, T = 128, hd = 32, cp = 2;
    double r = measure_ring_attention(B, T, heads, hd, int(cp), 3 * reps);
    ring_curve.push_back({double(B * heads) * 2.0 * (T / cp) * T * (2.0 * hd), r});
    std::printf("  ring attention blocks %.2f GFLOP/s (cp=2 rank, fwd+bwd, 16 × %lld heads, T=128, head dim 32)\n",
                r / 1e9, (long long)heads);
  }
  // The linear layers' GEMMs on token-major shapes (a grid: tokens × inputs × outputs), as a
  // layer's projections and MLP see them, whole or as tp shards.
  std::vector<std::array<double, 4>> linear_grid, linear_grid_l3;  // (tokens, inputs, outputs, FLOP/s)
  {
    // Tokens per micro-batch as a rank sees them: b·s, halved per cp rank.
    const std::vector<int64_t> toks = quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 4096};
    const std::vector<int64_t> widths = quick ? std::vector<int64_t>{64, 128, 256, 512}
                                              : std::vector<int64_t>{64, 128, 256, 512, 1024};
    // Every sample evicts the caches twice (a buffer of twice the L3, 960 MB on a VM that reports
    // 480 MB), which is most of the grid's time: --quick takes the best of 3, not 6.
    const int grid_samples = quick ? reps : 2 * reps;
    for (int64_t n : toks)
      for (int64_t c : widths)
        for (int64_t oc : widths) {
          linear_grid.push_back({double(n), double(c), double(oc), measure_linear(n, c, oc, grid_samples)});
          linear_grid_l3.push_back({double(n), double(c), double(oc), measure_linear(n, c, oc, grid_samples, false)});
        }
    double lo = 1e30, hi = 0;
    for (auto& g : linear_grid) lo = std::min(lo, g[3]), hi = std::max(hi, g[3]);
    std::printf("  linear layers %.2f-%.2f GFLOP/s (fwd+bwd, %zu token-major shapes, widths %lld-%lld)\n", lo / 1e9,
                hi / 1e9, linear_grid.size(), (long long)widths.front(), (long long)widths.back());
    lo = 1e30, hi = 0;
    for (auto& g : linear_grid_l3) lo = std::min(lo, g[3]), hi = std::max(hi, g[3]);
    std::printf("  linear layers, operands in the L3: %.2f-%.2f GFLOP/s\n", lo / 1e9, hi / 1e9);
  }
  // The grouped expert kernel on a grid of rows per expert × inputs × outputs (8 experts per call,
  // as a MoE layer's local experts on one or two ranks).
  std::vector<std::array<double, 4>> expert_grid, expert_grid_l3;  // (rows per expert, inputs, outputs, FLOP/s)
  {
    const std::vector<int64_t> rows = quick ? std::vector<int64_t>{32, 256} : std::vector<int64_t>{32, 128, 512};
    const std::vector<int64_t> widths = quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{64, 128, 256, 512};
    for (int64_t r : rows)
      for (int64_t c : widths)
        for (int64_t oc : widths) {
          expert_grid.push_back({double(r), double(c), double(oc), measure_grouped_experts(8, r, c, oc, reps)});
          expert_grid_l3.push_back({double(r), double(c), double(oc), measure_grouped_experts(8, r, c, oc, reps, false)});
        }
    double lo = 1e30, hi = 0;
    for (auto& g : expert_grid) lo = std::min(lo, g[3]), hi = std::max(hi, g[3]);
    std::printf("  grouped expert kernel %.2f-%.2f GFLOP/s (fwd+bwd, 8 experts, %zu shapes)\n", lo / 1e9, hi / 1e9,
                expert_grid.size());
    lo = 1e30, hi = 0;
    for (auto& g : expert_grid_l3) lo = std::min(lo, g[3]), hi = std::max(hi, g[3]);
    std::printf("  grouped expert kernel, operands in the L3: %.2f-%.2f GFLOP/s\n", lo / 1e9, hi / 1e9);
  }
  double fault_bw = measure_page_faults(int64_t(64) << 20, 2 * reps);
  std::printf("  released pages faulted back in %.2f GB/s (MADV_DONTNEED, then one write per page)\n", fault_bw / 1e9);
  double opt_rate = measure_optimizer(int64_t(1) << 22, 2 * reps);
  std::printf("  AdamW update + gradient norm %.1f M params/s\n", opt_rate / 1e6);
  double mem = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  // "Peak" is the best GEMM rate measured: the curve says how far smaller GEMMs fall below it.
  nlohmann::json j;
  j["device"] = "cpu-local";
  j["threads"] = omp_get_max_threads();
  j["peak_fp32_flops"] = peak;
  j["peak_bf16_flops"] = peak_bf16;
  j["memory_bytes"] = mem;
  j["memory_bandwidth"] = bw;
  j["price_per_hour"] = price;
  j["elementwise_bandwidth"] = ew;
  j["attention_flops"] = attn;
  j["attention_curve"] = nlohmann::json::array();
  for (auto [f, r] : attn_curve) j["attention_curve"].push_back({f, r});
  j["ring_attention_curve"] = nlohmann::json::array();
  for (auto [f, r] : ring_curve) j["ring_attention_curve"].push_back({f, r});
  j["optimizer_params_per_s"] = opt_rate;
  j["timing"] = KernelClock().cpu_time() ? "process CPU time (1 thread)" : "wall clock";
  // Between nodes: a 10 Gb/s network (one host cannot measure it). Inside the node: measured
  // all-reduce between 2 ranks through the engine's own launcher and backend, unless skipped.
  j["inter_node_bandwidth"] = 1.25e9;
  if (no_collectives) {
    j["intra_node_bandwidth"] = bw / 4;
    j["collectives_measured"] = false;
  } else {
    // 4 KB to 16 MB, quick or not: the small messages are all latency, the large ones pin down
    // the bandwidth. Every size is timed at least `samples` times, one iteration at a time, and
    // summarised by its median; the line through the medians is a Theil–Sen fit (plan/comm_fit.h),
    // so a few descheduled iterations or one bad size do not set the latency (a least-squares
    // line through 0.02 s means had fitted 5.3 ms per step where training sees ~2 ms).
    const int samples = quick ? 15 : 41;
    std::map<double, std::vector<double>> cpu_timings, timings;
    PhaseTimings phases;
    // A fit that fails (time not growing with size: the peer descheduled through the small
    // messages, as a parallel test run or a busy host does) is measured again, up to three times
    // in all, before the link is left unfitted: a retry is what the message would tell the user to do.
    for (int attempt = 1;; ++attempt) {
      cpu_timings.clear();
      phases = PhaseTimings{};
      timings = measure_all_reduce(2, 4096, int64_t(16) << 20, quick ? 0.02 : 0.1, samples, &cpu_timings, &phases);
      std::string why;
      try {
        plan::fit_all_reduce(timings, 2);
        if (cpu_timings.size() >= 2) plan::fit_all_reduce(cpu_timings, 2);
        for (const char* op : {"all_gather", "reduce_scatter"})
          for (auto* m : {&phases.cpu, &phases.wall})
            if ((*m)[op].size() >= 2) plan::fit_ring_phase((*m)[op], 2);
      } catch (const std::exception& e) {
        why = e.what();
      }
      if (why.empty() || attempt == 3) break;
      std::printf("  collectives: %s; measuring again (attempt %d of 3)\n", why.c_str(), attempt + 1);
    }
    plan::AlphaBetaFit wall = plan::fit_all_reduce(timings, 2);
    // With kernels timed by CPU time (one thread), the collectives are too, for the same reason:
    // on a loaded host the wall clock counts the peer's wait for a core (3 ms per step at load 15,
    // against 40 µs at load 20 a session earlier: the scheduler, not the link), CPU time what the
    // transfer costs the ranks (TCP copies, syscalls, the reduction), which is what a rank with
    // its own core waits for. The wall-clock fit is kept beside it.
    const bool by_cpu = KernelClock().cpu_time() && cpu_timings.size() >= 2;
    if (by_cpu) timings = cpu_timings;
    plan::AlphaBetaFit fit = by_cpu ? plan::fit_all_reduce(cpu_timings, 2) : wall;
    const double cbw = fit.bandwidth, lat = fit.latency;
    if (by_cpu)
      std::printf("  wall clock: bus bandwidth %.2f GB/s, latency %.1f us per step (not used: CPU time is)\n",
                  wall.bandwidth / 1e9, wall.latency * 1e6);
    for (auto [bytes, t] : fit.medians)
      std::printf("  all_reduce %9.0f B  median of %3zu: %9.1f us  busbw %6.2f GB/s  (fit %9.1f us)\n", bytes,
                  timings[bytes].size(), t * 1e6, bytes / t / 1e9, (2 * lat + bytes / cbw) * 1e6);
    std::printf("  intra-node all-reduce, 2 ranks: bus bandwidth %.2f GB/s, latency %.1f us per step (medians, "
                "Theil-Sen fit)\n", cbw / 1e9, lat * 1e6);
    j["intra_node_bandwidth"] = cbw;
    j["intra_node_latency"] = lat;
    j["collectives_measured"] = true;
    j["collective_fit"] = "median per size, Theil-Sen line";
    j["collective_timing"] = by_cpu ? "process CPU time of rank 0" : "wall clock";
    j["intra_node_wall_bandwidth"] = wall.bandwidth;
    j["intra_node_wall_latency"] = wall.latency;
    j["all_reduce_2_ranks"] = nlohmann::json::array();
    for (auto [bytes, t] : fit.medians) j["all_reduce_2_ranks"].push_back({bytes, t});
    // Sequence parallelism's all-gathers and reduce-scatters, from the same bench: each its own call
    // with its own per-call cost (plan/comm_fit.h fit_ring_phase), by the same clock as the links.
    for (const char* op : {"all_gather", "reduce_scatter"}) {
      auto& pc = by_cpu ? phases.cpu[op] : phases.wall[op];
      if (pc.size() < 2 || phases.wall[op].size() < 2) continue;
      try {
        plan::AlphaBetaFit f = plan::fit_ring_phase(pc, 2), fw = plan::fit_ring_phase(phases.wall[op], 2);
        std::printf("  intra-node %s, 2 ranks: bandwidth %.2f GB/s, latency %.1f us (wall clock %.2f GB/s + %.1f us)\n",
                    op, f.bandwidth / 1e9, f.latency * 1e6, fw.bandwidth / 1e9, fw.latency * 1e6);
        j[std::string("intra_node_") + op] = {{"bandwidth", f.bandwidth}, {"latency", f.latency},
                                              {"wall_bandwidth", by_cpu ? fw.bandwidth : 0.0},
                                              {"wall_latency", by_cpu ? fw.latency : 0.0}};
      } catch (const std::exception& e) {
        std::printf("  intra-node %s: not fitted (%s); sequence parallelism's pairs are priced as all-reduces\n", op,
                    e.what());
      }
    }
    // The same all-reduce with compute between (256 KB, a tp layer's activation at the sizes the
    // self-check trains): how much longer a rank sleeps in it than back to back, against the
    // compute before it (plan/comm_fit.h GapWaitFit; the planner's Prediction::gap_wait).
    if (by_cpu) {
      const std::vector<double> gaps{0, 250, 1000, 4000};
      plan::GapWaitFit gw = plan::fit_gap_wait(measure_gap_wait(2, 256 << 10, gaps, quick ? 21 : 41));
      for (auto [comp, w] : gw.medians)
        std::printf("  all_reduce 262144 B after %7.1f us of compute: waits %7.1f us more than back to back (%.1f)\n",
                    1e6 * comp, 1e6 * w, 1e6 * gw.base);
      std::printf("  wait from the compute between collectives: %.1f us + %.4f × the compute before each\n",
                  1e6 * gw.intercept, gw.slope);
      j["gap_wait"] = {{"intercept_s", gw.intercept}, {"slope", gw.slope}, {"base_s", gw.base}, {"bytes", 256 << 10},
                       {"points", nlohmann::json::array()}};
      for (auto [comp, w] : gw.medians) j["gap_wait"]["points"].push_back({comp, w});
    }
  }
  // Relative to the peak, like gemm_curve, so that a device that scales the peak scales these.
  j["linear_curve"] = nlohmann::json::array();
  for (auto& g : linear_grid) j["linear_curve"].push_back({g[0], g[1], g[2], g[3] / peak});
  j["expert_curve"] = nlohmann::json::array();
  for (auto& g : expert_grid) j["expert_curve"].push_back({g[0], g[1], g[2], g[3] / peak});
  j["linear_curve_l3"] = nlohmann::json::array();
  for (auto& g : linear_grid_l3) j["linear_curve_l3"].push_back({g[0], g[1], g[2], g[3] / peak});
  j["expert_curve_l3"] = nlohmann::json::array();
  for (auto& g : expert_grid_l3) j["expert_curve_l3"].push_back({g[0], g[1], g[2], g[3] / peak});
  j["page_fault_bandwidth"] = fault_bw;
  j["l3_bytes"] = double(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
  j["gemm_curve"] = nlohmann::json::array();
  for (auto [f, r] : rate) j["gemm_curve"].push_back({f, r / peak});
  auto dir = std::filesystem::path(out).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  write_file(out, j.dump(2) + "\n");
  plan::Device d = device_from_calibration(out);  // proves the file reads back
  std::printf("wrote %s (peak %.2f GFLOP/s on %d threads, %zu curve points)\n", out.c_str(), d.fp32 / 1e9,
              omp_get_max_threads(), d.gemm_curve.size());
  return 0;
}

atl::cli::Registrar plan_cmd({"plan", "predict memory, speed, cost and bottleneck of a training layout", run_plan});
atl::cli::Registrar plan_search_cmd({"plan search", "search layouts; best table and cost/time Pareto frontier", run_search});
atl::cli::Registrar plan_sweep_cmd({"plan sweep", "sweep island size/batch/bandwidth/islands; table and SVG", run_sweep_cmd});
atl::cli::Registrar plan_calibrate_cmd({"plan calibrate", "measure local GEMMs, kernels and collectives for the cpu-local device", run_calibrate});
atl::cli::Registrar plan_validate_cmd({"plan validate", "predicted vs published Megatron-LM measurements", run_validate});
atl::cli::Registrar plan_list_cmd({"plan list", "list model presets and the device catalog", run_list});

}  // namespace
