// Validation against published Megatron-LM measurements (Narayanan et al. 2021 Table 1,
// Korthikanti et al. 2022 Table 5): every run is predicted from its published configuration
// with the catalog's A100 and nothing tuned per run.
#include "plan/validation.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "plan/plan_input.h"

namespace atl::plan {

std::vector<PublishedRun> load_published(const std::string& path) {
  Config cfg = Config::load(path);
  std::string dev = cfg.get_string("defaults.device", "a100-80gb");
  int64_t vocab = cfg.get_int("defaults.vocab", 51200, 1);
  int64_t seq = cfg.get_int("defaults.seq", 2048, 1);
  int64_t mb = cfg.get_int("defaults.micro_batch", 1, 1);
  std::set<std::string> ids;
  for (auto& k : cfg.keys_under("runs")) {
    auto rest = k.substr(5);
    ids.insert(rest.substr(0, rest.find('.')));
  }
  Device device = find_device(dev);
  std::vector<PublishedRun> out;
  for (auto& id : ids) {
    std::string s = "runs." + id;
    PublishedRun r;
    r.id = id;
    r.source = cfg.get_string(s + ".source", "");
    r.metric = cfg.get_string(s + ".metric", "", {"tflops_per_gpu", "iteration_s"});
    r.published = cfg.get_float(s + ".published", 0, 1e-9);
    // GPT-3-style models as Megatron-LM builds them.
    ModelSpec& m = r.model;
    m = model_preset("gpt2-124m");
    m.name = id;
    m.heads = m.kv_heads = cfg.get_int(s + ".heads", 1, 1);
    m.hidden = cfg.get_int(s + ".hidden", 1, 1);
    m.layers = cfg.get_int(s + ".layers", 1, 1);
    m.ffn = 4 * m.hidden;
    m.vocab = vocab, m.seq = seq;
    m.attention = "standard", m.dropout = true;
    Layout& l = r.layout;
    l.tp = cfg.get_int(s + ".tp", 1, 1);
    l.pp = cfg.get_int(s + ".pp", 1, 1);
    int64_t gpus = cfg.get_int(s + ".gpus", 1, 1);
    l.dp = gpus / (l.tp * l.pp);
    l.global_batch = cfg.get_int(s + ".batch", 1, 1);
    l.micro_batch = mb;
    l.recompute = cfg.get_string(s + ".recompute", "full", {"none", "selective", "full"});
    l.sp = cfg.get_bool(s + ".sp", false);
    l.precision = "fp16";
    l.overlap_dp = false;  // Megatron-LM of 2021-22 all-reduced gradients after the backward pass
    ATOLL_CHECK(gpus % 8 == 0, "published run '{}': gpus ({}) must fill 8-GPU nodes", id, gpus);
    r.cluster = make_cluster(device, 8, gpus / 8, 1);
    out.push_back(r);
  }
  cfg.finish();
  std::stable_sort(out.begin(), out.end(), [](const PublishedRun& a, const PublishedRun& b) {
    if (a.source != b.source) return a.source > b.source;  // Narayanan first
    if (a.cluster.world() != b.cluster.world()) return a.cluster.world() < b.cluster.world();
    return a.layout.recompute < b.layout.recompute;
  });
  return out;
}

std::vector<PublishedRun> load_extended(const std::string& path) {
  Config cfg = Config::load(path);
  std::vector<std::string> ids;
  for (auto& k : cfg.keys_under("runs")) {
    auto rest = k.substr(5);
    auto id = rest.substr(0, rest.find('.'));
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  std::vector<PublishedRun> out;
  for (auto& id : ids) {
    const std::string s = "runs." + id;
    PublishedRun r;
    r.id = id;
    r.source = cfg.get_string(s + ".source", "");
    ATOLL_CHECK(!r.source.empty(), "published run '{}' ({}): every figure needs its source", id, path);
    r.metric = cfg.get_string(s + ".metric", "", {"tflops_per_gpu", "iteration_s", "mfu", "tokens_per_s_per_gpu"});
    r.published = cfg.get_float(s + ".published", 0, 1e-9);
    r.assumed = cfg.get_string(s + ".assumed", "");
    r.model = load_model(cfg, s + ".model");
    r.cluster = load_cluster(cfg, s + ".cluster");
    const bool dp_given = cfg.has(s + ".plan.dp");
    r.layout = load_layout(cfg, s + ".plan");
    if (!dp_given) r.layout.dp = r.cluster.world() / (r.layout.tp * r.layout.pp * r.layout.cp);
    out.push_back(r);
  }
  cfg.finish();
  return out;
}

std::vector<ValidationRow> validate_published(const std::vector<PublishedRun>& runs) {
  std::vector<ValidationRow> rows;
  for (auto& r : runs) {
    Prediction p = predict(r.model, r.cluster, r.layout);
    ValidationRow row{r, 0, 0};
    if (r.metric == "tflops_per_gpu")
      row.predicted = p.hardware_flops_per_token * p.tokens_per_s_device / 1e12;  // eq. 3 counts recompute
    else if (r.metric == "mfu")
      row.predicted = p.mfu;
    else if (r.metric == "tokens_per_s_per_gpu")
      row.predicted = p.tokens_per_s_device;
    else
      row.predicted = p.step;
    row.rel_error = (row.predicted - r.published) / r.published;
    rows.push_back(row);
  }
  return rows;
}

double median_abs_error(const std::vector<ValidationRow>& rows) {
  std::vector<double> e;
  for (auto& r : rows) e.push_back(std::fabs(r.rel_error));
  if (e.empty()) return 0;
  std::sort(e.begin(), e.end());
  size_t n = e.size();
  return n % 2 ? e[n / 2] : 0.5 * (e[n / 2 - 1] + e[n / 2]);
}

double max_abs_error(const std::vector<ValidationRow>& rows) {
  double m = 0;
  for (auto& r : rows) m = std::max(m, std::fabs(r.rel_error));
  return m;
}

}  // namespace atl::plan
