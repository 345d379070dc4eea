// Hardware catalog. Peak figures are vendor datasheet dense (no sparsity) numbers; memory
// bandwidths are datasheet HBM/GDDR figures, used at kHbmAchievable of their value; interconnect defaults are per-device unidirectional
// NVLink/xGMI/PCIe figures and one 200-400 Gb/s NIC per GPU for data-centre parts. Prices are
// round on-demand cloud list figures, meant to be overridden (price_per_device_hour).
#include "plan/hardware.h"

#include <set>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

static constexpr double T = 1e12, G = 1e9, GiB = 1073741824.0;

// GEMM efficiency curve of a GPU: eff(F) = e_max · F / (F + F½), F½ = 2.5e9 · (peak / 312 TFLOP/s).
// Where each constant comes from:
// * e_max is the device's measured "maximum achievable matmul FLOPS" over peak where one is
//   published: S. Bekman, Machine Learning Engineering, compute/accelerator, MAMF table
//   (mamf-finder.py, BF16, brute-force shape search): A100 SXM 267.9/312 = 0.859, A100 PCIe
//   256.4/312 = 0.822, H100 SXM 792.1/989 = 0.801, GH200 821.0/989 = 0.830, MI300X 781.9/1300 =
//   0.601. Other devices take kGpuEffMaxUnmeasured = 0.80 (judgment: the H100's figure; no
//   measurement of them is cited), marked in their note.
// * F½ = 2.5e9 FLOPs at the A100's peak is a judgment (a GEMM of ~1000³ reaches about half of the
//   best), not a measurement and not fitted per run. It landed in the repository in the same
//   commit as the Megatron comparison (dc9e442), so the history cannot show it was chosen before
//   that comparison; no run has its own value.
static constexpr double kGpuEffMaxUnmeasured = 0.80;
static constexpr double kGpuHalfFlopsA100 = 2.5e9;
// The share of a GPU's datasheet HBM bandwidth that kernels reach: the best kernel in NVIDIA's GTC
// measurements reached about 90% and a read benchmark on an A100 80GB SXM 1.80 of 2.04 TB/s (88%,
// confirmed by Nsight Compute) (NVIDIA developer forums, "Trouble to Reach Peak Bandwidth of
// A100", thread 339083). Like e_max for GEMMs, the best measured fraction is the roofline's
// memory ceiling: element-wise kernels, memory-bound GEMMs, gradient buffers, FSDP copies and the
// optimizer's bytes move at 0.9 × datasheet. One constant for every GPU, none fitted to a run.
static constexpr double kHbmAchievable = 0.90;
// FlashAttention-2's backward over forward ceiling: up to 63% vs 73% of an A100 (Dao 2023, §1).
static constexpr double kFlashBwdOverFwd = 0.63 / 0.73;

std::vector<std::pair<double, double>> default_gemm_curve(double peak_bf16, double e_max) {
  std::vector<std::pair<double, double>> c;
  double half = kGpuHalfFlopsA100 * peak_bf16 / (312 * T);
  for (double f = 1e6; f <= 1e16; f *= 10) c.push_back({f, e_max * f / (f + half)});
  return c;
}

double Device::peak(const std::string& p) const {
  if (p == "fp8" && fp8 > 0) return fp8;
  if (p == "fp8" || p == "bf16" || p == "fp16") return bf16 > 0 ? bf16 : (tf32 > 0 ? tf32 : fp32);
  if (p == "tf32") return tf32 > 0 ? tf32 : fp32;
  return fp32;
}

double Device::gemm_efficiency(double flops) const {
  if (gemm_curve.empty()) return 1.0;
  if (flops <= gemm_curve.front().first) return gemm_curve.front().second * flops / gemm_curve.front().first;
  if (flops >= gemm_curve.back().first) return gemm_curve.back().second;
  for (size_t i = 1; i < gemm_curve.size(); ++i) {
    if (flops <= gemm_curve[i].first) {
      auto [f0, e0] = gemm_curve[i - 1];
      auto [f1, e1] = gemm_curve[i];
      double t = (std::log(flops) - std::log(f0)) / (std::log(f1) - std::log(f0));
      return e0 + t * (e1 - e0);
    }
  }
  return gemm_curve.back().second;
}

double Device::gemm_efficiency(double flops, const std::string& precision) const {
  double e = gemm_efficiency(flops);
  if (precision == "fp8" && fp8 > 0 && fp8_eff_max > 0 && gemm_eff_max > 0) e *= fp8_eff_max / gemm_eff_max;
  return e;
}

// A measured rate at call size f: log-interpolated between the curve's points, clamped at its ends.
static double rate_on_curve(const std::vector<std::pair<double, double>>& curve, double f) {
  if (f <= curve.front().first) return curve.front().second;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (f <= curve[i].first) {
      auto [f0, r0] = curve[i - 1];
      auto [f1, r1] = curve[i];
      double t = (std::log(f) - std::log(f0)) / (std::log(f1) - std::log(f0));
      return r0 + t * (r1 - r0);
    }
  }
  return curve.back().second;
}

// Position of x among sorted axis values: the bracketing index i (x between axis[i] and
// axis[i+1]) and the fraction in log x, clamped at the ends.
static std::pair<size_t, double> bracket(const std::vector<double>& axis, double x) {
  if (axis.size() == 1 || x <= axis.front()) return {0, 0.0};
  if (x >= axis.back()) return {axis.size() - 2, 1.0};
  size_t i = size_t(std::upper_bound(axis.begin(), axis.end(), x) - axis.begin()) - 1;
  return {i, (std::log(x) - std::log(axis[i])) / (std::log(axis[i + 1]) - std::log(axis[i]))};
}

// Trilinear in the logs of the three sizes on a complete grid, clamped at its edges.
static double on_grid(const std::vector<std::array<double, 4>>& grid, double tokens, double inputs, double outputs) {
  std::vector<double> ax[3];
  for (auto& p : grid)
    for (int a = 0; a < 3; ++a) ax[a].push_back(p[a]);
  for (auto& v : ax) std::sort(v.begin(), v.end()), v.erase(std::unique(v.begin(), v.end()), v.end());
  auto at = [&](size_t i, size_t j, size_t k) {
    for (auto& p : grid)
      if (p[0] == ax[0][i] && p[1] == ax[1][j] && p[2] == ax[2][k]) return p[3];
    return 0.0;  // not reached: device_from_calibration checks the grid is complete
  };
  const double x[3] = {tokens, inputs, outputs};
  std::pair<size_t, double> b[3];
  for (int a = 0; a < 3; ++a) b[a] = bracket(ax[a], x[a]);
  double e = 0;
  for (int corner = 0; corner < 8; ++corner) {
    double w = 1;
    size_t idx[3];
    for (int a = 0; a < 3; ++a) {
      const bool up = corner >> a & 1;
      if (ax[a].size() == 1 && up) w = 0;
      idx[a] = std::min(b[a].first + (up ? 1 : 0), ax[a].size() - 1);
      w *= up ? b[a].second : 1.0 - b[a].second;
    }
    if (w > 0) e += w * at(idx[0], idx[1], idx[2]);
  }
  return e;
}

// A fraction `in_l3` of the work at the cache-resident grid's efficiency, the rest at the cold one's.
static double mixed(const std::vector<std::array<double, 4>>& cold, const std::vector<std::array<double, 4>>& warm,
                    double in_l3, double a, double b, double c) {
  const double e = on_grid(cold, a, b, c);
  if (warm.empty() || in_l3 <= 0) return e;
  const double f = std::min(1.0, in_l3);
  return 1.0 / (f / on_grid(warm, a, b, c) + (1.0 - f) / e);
}

double Device::linear_efficiency(double tokens, double inputs, double outputs, double in_l3) const {
  if (linear_curve.empty()) return gemm_efficiency(2 * tokens * inputs * outputs);
  return mixed(linear_curve, linear_curve_l3, in_l3, tokens, inputs, outputs);
}

double Device::expert_efficiency(double rows, double inputs, double outputs, double in_l3) const {
  if (expert_curve.empty()) return gemm_efficiency(2 * rows * inputs * outputs);
  return mixed(expert_curve, expert_curve_l3, in_l3, rows, inputs, outputs);
}

double Device::attention_rate(double f) const {
  if (attention_curve.empty()) return attention_flops;
  return rate_on_curve(attention_curve, f);
}

double Device::ring_attention_rate(double f) const {
  return ring_attention_curve.empty() ? attention_rate(f) : rate_on_curve(ring_attention_curve, f);
}

double Device::attention_backward_efficiency() const {
  return attention_bwd_eff_max > 0 ? attention_bwd_eff_max : attention_eff_max * kFlashBwdOverFwd;
}

double Device::gemm_time(double m, double n, double k, const std::string& precision, double eb) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  double flops = 2 * m * n * k;
  double compute = flops / (peak(precision) * gemm_efficiency(flops, precision));
  double memory = eb * (m * k + k * n + m * n) / mem_bw;
  return gemm_overlaps_memory ? std::max(compute, memory) : compute + memory;
}

static Device gpu(const char* name, double fp32, double tf32, double bf16, double fp8, double mem_gb,
                  double bw_gbs, double intra_gbs, double inter_gbs, double host_gbs, double price,
                  const char* note, double e_max = kGpuEffMaxUnmeasured) {
  Device d;
  d.name = name, d.note = note;
  d.fp32 = fp32 * T, d.tf32 = tf32 * T, d.bf16 = bf16 * T, d.fp8 = fp8 * T;
  d.mem_bytes = mem_gb * G, d.mem_bw_efficiency = kHbmAchievable, d.mem_bw = bw_gbs * G * kHbmAchievable;
  d.intra_bw = intra_gbs * G, d.inter_bw = inter_gbs * G, d.host_bw = host_gbs * G;
  d.price_hour = price;
  d.reserved_bytes = 1.0 * GiB;  // CUDA/ROCm context, allocator fragmentation, NCCL buffers
  d.gemm_curve = default_gemm_curve(d.bf16, e_max);
  d.gemm_eff_max = e_max;
  return d;
}

const std::vector<Device>& device_catalog() {
  static const std::vector<Device> c = [] {
    std::vector<Device> v = {
      gpu("a100-40gb", 19.5, 156, 312, 0, 40, 1555, 300, 25, 32, 1.3, "NVIDIA A100 SXM4 40GB datasheet; e_max: MAMF A100 SXM", 0.859),
      gpu("a100-80gb", 19.5, 156, 312, 0, 80, 2039, 300, 25, 32, 1.8, "NVIDIA A100 SXM4 80GB datasheet; e_max: MAMF A100 SXM", 0.859),
      gpu("h100-sxm", 67, 494.7, 989.4, 1978.9, 80, 3350, 450, 50, 64, 2.9, "NVIDIA H100 SXM5 datasheet; e_max: MAMF H100 SXM", 0.801),
      gpu("h100-pcie", 51, 378, 756, 1513, 80, 2000, 64, 50, 64, 2.2, "NVIDIA H100 PCIe datasheet; e_max unmeasured (0.80)"),
      // H800: the H100 SXM with NVLink cut to 160 GB/s and 8×400 Gb/s InfiniBand (50 GB/s) per node
      // as DeepSeek-AI 2024 (DeepSeek-V3 technical report, §3.2.2) states them.
      gpu("h800", 67, 494.7, 989.4, 1978.9, 80, 3350, 160, 50, 64, 2.0,
          "NVIDIA H800 SXM (H100 compute; links from DeepSeek-V3 report §3.2.2); e_max: MAMF H100 SXM", 0.801),
      gpu("h200", 67, 494.7, 989.4, 1978.9, 141, 4800, 450, 50, 64, 3.5, "NVIDIA H200 SXM datasheet; e_max: MAMF H100 SXM (same GPU die)", 0.801),
      gpu("b200", 80, 1100, 2250, 4500, 180, 8000, 900, 50, 64, 5.0, "NVIDIA DGX B200 per-GPU figures"),
      gpu("b300", 75, 1100, 2250, 4500, 288, 8000, 900, 100, 64, 6.5, "NVIDIA Blackwell Ultra (approx.)"),
      gpu("gb10", 31, 62, 125, 250, 128, 273, 25, 25, 600, 0.3,
          "NVIDIA GB10 / DGX Spark (approx.; unified LPDDR5x memory, 200 Gb/s ConnectX-7)"),
      gpu("rtx6000-ada", 91.1, 182, 364, 728, 48, 960, 32, 12.5, 32, 1.0, "NVIDIA RTX 6000 Ada datasheet"),
      gpu("rtx4090", 82.6, 82.6, 165, 330, 24, 1008, 32, 12.5, 32, 0.4,
          "NVIDIA RTX 4090 (fp32-accumulate tensor rate)"),
      gpu("rtx3090", 35.6, 35.6, 71, 0, 24, 936, 32, 12.5, 32, 0.25,
          "NVIDIA RTX 3090 (fp32-accumulate tensor rate)"),
      gpu("mi300x", 163.4, 653.7, 1307.4, 2614.9, 192, 5300, 448, 50, 64, 2.5, "AMD Instinct MI300X datasheet; e_max: MAMF MI300X (ROCm 6.2)", 0.601),
      // Huawei Ascend 910B-class NPU (approx.: ~320 TFLOP/s FP16/BF16 cube units, 64 GB HBM2e at
      // ~1.6 TB/s, HCCS ~56 GB/s per NPU inside an 8-NPU server, 200 Gb/s RoCE per NPU). No fp8.
      gpu("ascend-910b", 40, 40, 320, 0, 64, 1600, 56, 25, 32, 1.2,
          "Huawei Ascend 910B-class NPU (approx.; vendor and press figures, not a datasheet); e_max unmeasured (0.80)"),
      gpu("l40s", 91.6, 183, 362, 733, 48, 864, 32, 25, 32, 1.0, "NVIDIA L40S datasheet"),
    };
    for (auto& d : v)
      if (d.name == "h100-sxm" || d.name == "h100-pcie" || d.name == "h800" || d.name == "h200")
        d.fp8_eff_max = 0.682, d.attention_eff_max = 0.35;
    return v;
  }();
  return c;
}

std::vector<std::string> known_devices() {
  std::vector<std::string> v;
  for (auto& d : device_catalog()) v.push_back(d.name);
  v.push_back("cpu-local");
  return v;
}

std::string calibration_path() {
  if (const char* e = std::getenv("ATOLL_PLAN_CALIBRATION")) return e;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.atoll/plan_calibration.json";
}

Device device_from_calibration(const std::string& path) {
  std::ifstream in(path);
  ATOLL_CHECK(in.good(),
              "device 'cpu-local' needs a calibration file, and '{}' cannot be opened; run `atoll plan "
              "calibrate` first (or set ATOLL_PLAN_CALIBRATION)",
              path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail("calibration file '{}' is not valid JSON: {}", path, e.what());
  }
  auto need = [&](const char* k) -> const nlohmann::json& {
    ATOLL_CHECK(j.contains(k), "calibration file '{}' lacks the key '{}'", path, k);
    return j[k];
  };
  Device d;
  d.name = "cpu-local";
  d.note = "calibrated from " + path;
  d.fp32 = need("peak_fp32_flops").get<double>();
  d.tf32 = d.fp32;
  d.bf16 = j.value("peak_bf16_flops", 0.0);
  d.mem_bytes = need("memory_bytes").get<double>();
  d.mem_bw = need("memory_bandwidth").get<double>();
  d.intra_bw = j.value("intra_node_bandwidth", d.mem_bw / 4);
  d.inter_bw = j.value("inter_node_bandwidth", 1.25e9);
  // Written by calibrate when it timed all-reduces between local ranks (absent in older files).
  d.links_measured = j.value("collectives_measured", false);
  d.intra_latency = j.value("intra_node_latency", 3e-6);
  d.elementwise_bw = j.value("elementwise_bandwidth", 0.0);
  d.attention_flops = j.value("attention_flops", 0.0);
  if (j.contains("attention_curve"))
    for (auto& p : j["attention_curve"]) d.attention_curve.push_back({p.at(0).get<double>(), p.at(1).get<double>()});
  std::sort(d.attention_curve.begin(), d.attention_curve.end());
  if (j.contains("ring_attention_curve"))
    for (auto& p : j["ring_attention_curve"])
      d.ring_attention_curve.push_back({p.at(0).get<double>(), p.at(1).get<double>()});
  std::sort(d.ring_attention_curve.begin(), d.ring_attention_curve.end());
  for (auto& [f, r] : d.ring_attention_curve)
    ATOLL_CHECK(f > 0 && r > 0, "calibration file '{}': ring_attention_curve points must be positive (rerun `atoll "
                "plan calibrate`)", path);
  for (auto& [f, r] : d.attention_curve)
    ATOLL_CHECK(f > 0 && r > 0, "calibration file '{}': attention_curve points must be positive (rerun `atoll plan "
                "calibrate`)", path);
  d.optimizer_params_per_s = j.value("optimizer_params_per_s", 0.0);
  ATOLL_CHECK(d.intra_bw > 0 && d.intra_latency >= 0,
              "calibration file '{}': intra_node_bandwidth must be positive and intra_node_latency "
              "non-negative (rerun `atoll plan calibrate`)", path);
  d.host_bw = d.mem_bw;
  d.price_hour = j.value("price_per_hour", 0.05);
  d.reserved_bytes = 0;
  d.shared_by_node = true;
  d.gemm_overlaps_memory = false;  // OpenBLAS packs operands in passes of their own
  // A complete (size, size, size, efficiency) grid of a measured kernel, checked as it is read.
  auto read_grid = [&](const char* key, const char* first, std::vector<std::array<double, 4>>& out) {
    if (!j.contains(key)) return;
    for (auto& p : j[key]) {
      std::array<double, 4> g{p.at(0).get<double>(), p.at(1).get<double>(), p.at(2).get<double>(), p.at(3).get<double>()};
      ATOLL_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[3] > 0 && g[3] <= 4,
                  "calibration file '{}': {} points are [{}, inputs, outputs, efficiency] with sizes ≥ 1 "
                  "and 0 < efficiency ≤ 4 (rerun `atoll plan calibrate`)", path, key, first);
      out.push_back(g);
    }
    std::set<double> ax[3];
    std::set<std::array<double, 3>> seen;
    for (auto& g : out) {
      for (int a = 0; a < 3; ++a) ax[a].insert(g[a]);
      ATOLL_CHECK(seen.insert({g[0], g[1], g[2]}).second, "calibration file '{}': {} has the shape {}×{}→{} "
                  "twice (rerun `atoll plan calibrate`)", path, key, g[0], g[1], g[2]);
    }
    ATOLL_CHECK(seen.size() == ax[0].size() * ax[1].size() * ax[2].size(),
                "calibration file '{}': {} must hold every combination of its {}, inputs and outputs "
                "({} of {}; rerun `atoll plan calibrate`)", path, key, first, seen.size(),
                ax[0].size() * ax[1].size() * ax[2].size());
  };
  read_grid("linear_curve", "tokens", d.linear_curve);
  read_grid("expert_curve", "rows per expert", d.expert_curve);
  read_grid("linear_curve_l3", "tokens", d.linear_curve_l3);
  read_grid("expert_curve_l3", "rows per expert", d.expert_curve_l3);
  ATOLL_CHECK(d.linear_curve_l3.empty() || !d.linear_curve.empty(),
              "calibration file '{}': linear_curve_l3 without linear_curve (rerun `atoll plan calibrate`)", path);
  ATOLL_CHECK(d.expert_curve_l3.empty() || !d.expert_curve.empty(),
              "calibration file '{}': expert_curve_l3 without expert_curve (rerun `atoll plan calibrate`)", path);
  d.page_fault_bw = j.value("page_fault_bandwidth", 0.0);
  ATOLL_CHECK(std::isfinite(d.page_fault_bw) && d.page_fault_bw >= 0,
              "calibration file '{}': page_fault_bandwidth must be ≥ 0", path);
  d.l3_bytes = j.value("l3_bytes", 0.0);
  ATOLL_CHECK(d.l3_bytes >= 0, "calibration file '{}': l3_bytes must be ≥ 0", path);
  // A ring phase's fit: {bandwidth, latency[, wall_bandwidth, wall_latency]} (plan/comm_fit.h).
  auto read_phase = [&](const char* key, double& bw, double& lat, double& wbw, double& wlat) {
    if (!j.contains(key)) return;
    const nlohmann::json& g = j[key];
    ATOLL_CHECK(g.is_object() && g.contains("bandwidth") && g.contains("latency"),
                "calibration file '{}': {} needs bandwidth and latency (rerun `atoll plan calibrate`)", path, key);
    bw = g["bandwidth"].get<double>(), lat = g["latency"].get<double>();
    wbw = g.value("wall_bandwidth", 0.0), wlat = g.value("wall_latency", 0.0);
    ATOLL_CHECK(std::isfinite(bw) && bw > 0 && std::isfinite(lat) && lat >= 0 && std::isfinite(wbw) && wbw >= 0 &&
                    std::isfinite(wlat) && wlat >= 0,
                "calibration file '{}': {}.bandwidth must be positive, its latency and wall_* figures ≥ 0 (got {}, {}, "
                "{}, {}; rerun `atoll plan calibrate`)", path, key, bw, lat, wbw, wlat);
  };
  read_phase("intra_node_all_gather", d.ag_bw, d.ag_latency, d.ag_wall_bw, d.ag_wall_latency);
  read_phase("intra_node_reduce_scatter", d.rs_bw, d.rs_latency, d.rs_wall_bw, d.rs_wall_latency);
  if (j.value("collective_timing", std::string()) == "process CPU time of rank 0" && j.contains("intra_node_wall_bandwidth")) {
    d.intra_wall_bw = j["intra_node_wall_bandwidth"].get<double>();
    d.intra_wall_latency = j.value("intra_node_wall_latency", 0.0);
    ATOLL_CHECK(d.intra_wall_bw > 0 && d.intra_wall_latency >= 0, "calibration file '{}': intra_node_wall_bandwidth "
                "must be positive and intra_node_wall_latency non-negative (rerun `atoll plan calibrate`)", path);
    if (j.contains("gap_wait")) {
      const nlohmann::json& g = j["gap_wait"];
      ATOLL_CHECK(g.is_object() && g.contains("intercept_s") && g.contains("slope"),
                  "calibration file '{}': gap_wait needs intercept_s and slope (rerun `atoll plan calibrate`)", path);
      d.gap_wait_intercept = g["intercept_s"].get<double>();
      d.gap_wait_slope = g["slope"].get<double>();
      // Quiet, the slope is the spread of two ranks' compute (a few %); under load it also counts
      // the peer's compute stretched by the scheduler, which may exceed the compute itself.
      ATOLL_CHECK(std::isfinite(d.gap_wait_intercept) && std::isfinite(d.gap_wait_slope) && d.gap_wait_intercept >= 0 &&
                      d.gap_wait_slope >= 0,
                  "calibration file '{}': gap_wait.intercept_s and gap_wait.slope must be finite and ≥ 0 (got {}, {}; "
                  "rerun `atoll plan calibrate`)", path, d.gap_wait_intercept, d.gap_wait_slope);
    }
  }
  for (auto& p : need("gemm_curve")) d.gemm_curve.push_back({p.at(0).get<double>(), p.at(1).get<double>()});
  ATOLL_CHECK(!d.gemm_curve.empty(), "calibration file '{}' has an empty gemm_curve", path);
  std::sort(d.gemm_curve.begin(), d.gemm_curve.end());
  return d;
}

Device find_device(const std::string& name) {
  if (name == "cpu-local") return device_from_calibration(calibration_path());
  for (auto& d : device_catalog())
    if (d.name == name) return d;
  std::string list;
  for (auto& k : known_devices()) list += (list.empty() ? "" : ", ") + k;
  fail("unknown device '{}'; known devices: {} (did you mean '{}'?)", name, list, nearest(name, known_devices()));
}

void apply_device_overrides(Device& d, Config& cfg, const std::string& s) {
  d.fp32 = cfg.get_float(s + ".peak_fp32_tflops", d.fp32 / T, 0, 1e9) * T;
  d.tf32 = cfg.get_float(s + ".peak_tf32_tflops", d.tf32 / T, 0, 1e9) * T;
  d.bf16 = cfg.get_float(s + ".peak_bf16_tflops", d.bf16 / T, 0, 1e9) * T;
  d.fp8 = cfg.get_float(s + ".peak_fp8_tflops", d.fp8 / T, 0, 1e9) * T;
  d.mem_bytes = cfg.get_float(s + ".memory_gb", d.mem_bytes / G, 0.001, 1e9) * G;
  // A datasheet figure, derated like the catalog's (mem_bw_efficiency).
  d.mem_bw = cfg.get_float(s + ".memory_bandwidth_gbs", d.mem_bw / d.mem_bw_efficiency / G, 0.001, 1e9) * G *
             d.mem_bw_efficiency;
  d.reserved_bytes = cfg.get_float(s + ".reserved_gb", d.reserved_bytes / G, 0, 1e6) * G;
  d.attention_eff_max = cfg.get_float(s + ".attention_efficiency", d.attention_eff_max, 0.001, 1.0);
  if (cfg.has(s + ".attention_backward_efficiency"))
    d.attention_bwd_eff_max = cfg.get_float(s + ".attention_backward_efficiency", 0.5, 0.001, 1.0);
  if (cfg.has(s + ".gemm_efficiency")) {
    // A flat efficiency replaces the curve (useful to test what-ifs).
    double e = cfg.get_float(s + ".gemm_efficiency", 0.8, 0.001, 1.0);
    d.gemm_curve = {{1.0, e}, {1e20, e}};
  }
}

}  // namespace atl::plan
