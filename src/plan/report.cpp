// Renderings of the planner's results for people (aligned tables) and tools (JSON).
#include "plan/report.h"

#include <cmath>
#include <fmt/format.h>

namespace atl::plan {

std::string human_bytes(double b) {
  double a = std::fabs(b);
  if (a >= 1e12) return fmt::format("{:.2f} TB", b / 1e12);
  if (a >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (a >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.0f} kB", b / 1e3);
}
std::string human_seconds(double s) {
  if (s >= 86400 * 2) return fmt::format("{:.1f} days", s / 86400);
  if (s >= 7200) return fmt::format("{:.1f} h", s / 3600);
  if (s >= 120) return fmt::format("{:.1f} min", s / 60);
  if (s >= 1) return fmt::format("{:.3f} s", s);
  return fmt::format("{:.2f} ms", s * 1e3);
}
std::string human_count(double n) {
  if (n >= 1e12) return fmt::format("{:.2f}T", n / 1e12);
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

static std::string levels(const CommCost& c) {
  std::string s;
  for (int i = 0; i < 3; ++i)
    if (c.t[i] > 0) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", level_name(Level(i)), human_seconds(c.t[i]));
  return s.empty() ? "-" : s;
}

std::string format_prediction(const ModelSpec& m, const Cluster& c, const Layout& l, const Prediction& p) {
  std::string o;
  o += fmt::format("model    {}: {} parameters ({} active), {} layers, hidden {}, seq {}\n", m.name,
                   human_count(double(m.total_params())), human_count(double(m.active_params())), m.layers, m.hidden, m.seq);
  o += fmt::format("cluster  {} × {}: {} islands × {} nodes × {} devices = {}, {:.4g} USD/h\n", c.world(), c.device.name,
                   c.islands, c.nodes_per_island, c.devices_per_node, c.world(), p.price_per_hour);
  o += fmt::format("layout   {}\n\n", l.describe());
  const auto& mm = p.memory;
  o += "memory per device (worst pipeline stage)\n";
  o += fmt::format("  parameters   {:>12}\n  gradients    {:>12}\n  optimizer    {:>12}\n  activations  {:>12}\n"
                   "  buffers      {:>12}\n  total        {:>12} of {}  margin {}{}\n\n",
                   human_bytes(mm.params), human_bytes(mm.grads), human_bytes(mm.optimizer), human_bytes(mm.activations),
                   human_bytes(mm.buffers), human_bytes(mm.total), human_bytes(mm.capacity), human_bytes(mm.margin),
                   mm.oom ? "  ** OUT OF MEMORY **" : "");
  o += "step time\n";
  auto row = [&](const char* name, double t, const std::string& extra = "") {
    o += fmt::format("  {:<22} {:>11} {:>6.1f}%  {}\n", name, human_seconds(t), 100 * t / p.step, extra);
  };
  row("compute (GEMMs)", p.compute, p.recompute > 0 ? fmt::format("incl. recompute {}", human_seconds(p.recompute)) : "");
  row("memory-bound kernels", p.memory_bound);
  row("gradient buffers", p.grad_buffers);
  if (p.fsdp_copies > 0) row("FSDP copies/casts", p.fsdp_copies);
  if (p.page_faults > 0) row("ZeRO-3 page faults", p.page_faults);
  if (p.ep_copies > 0) row("EP pack/unpack copies", p.ep_copies);
  row("tensor-parallel comm", p.tp.total(), levels(p.tp));
  row("context-parallel comm", p.cp.total(), levels(p.cp));
  row("expert-parallel comm", p.ep.total(), levels(p.ep));
  row("pipeline p2p", p.pp_p2p.total(), levels(p.pp_p2p));
  row("pipeline bubble", p.bubble);
  row("data-parallel comm", p.dp.total(), levels(p.dp));
  if (p.control.total() > 0) row("step collectives", p.control.total(), levels(p.control));
  if (p.sync_wait > 0) row("waits in collectives", p.sync_wait, "wall clock only");
  row("optimizer step", p.optimizer);
  if (p.offload > 0) row("offload transfers", p.offload);
  if (p.outer.total() > 0) row("outer sync (amortized)", p.outer.total(), levels(p.outer));
  o += fmt::format("  {:<22} {:>11}\n\n", "step", human_seconds(p.step));
  o += fmt::format("throughput  {:.4g} tokens/s total, {:.4g} per island, {:.4g} per device\n", p.tokens_per_s,
                   p.tokens_per_s_island, p.tokens_per_s_device);
  o += fmt::format("utilisation MFU {:.1f}%  HFU {:.1f}%  ({:.4g} model TFLOP/s per device)\n", 100 * p.mfu, 100 * p.hfu,
                   p.achieved_flops_per_device / 1e12);
  o += fmt::format("training    {} tokens: {}, {:.4g} USD\n", human_count(p.train_tokens), human_seconds(p.train_seconds),
                   p.train_cost);
  if (p.fault_overhead > 0)
    o += fmt::format("failures    checkpoint every {}, {:.1f}% of wall time lost to checkpoints and redone work\n",
                     human_seconds(p.checkpoint_interval), 100 * p.fault_overhead);
  o += fmt::format("bottleneck  {}\n", p.bottleneck);
  return o;
}

std::string format_explain(const Prediction& p) {
  std::string o = "\nhow each figure was computed\n";
  for (auto& f : p.figures) {
    std::string v = f.unit == std::string("B") ? human_bytes(f.value)
                    : f.unit == std::string("s") ? human_seconds(f.value)
                    : fmt::format("{:.6g} {}", f.value, f.unit);
    o += fmt::format("  {:<32} = {:<14} {}\n", f.key, v, f.formula);
  }
  return o;
}

static nlohmann::json comm_json(const CommCost& c) {
  return {{"intra_node_s", c.t[0]}, {"inter_node_s", c.t[1]}, {"inter_island_s", c.t[2]}, {"total_s", c.total()}};
}

nlohmann::json prediction_json(const ModelSpec& m, const Cluster& c, const Layout& l, const Prediction& p) {
  nlohmann::json j;
  j["model"] = {{"name", m.name}, {"params", m.total_params()}, {"active_params", m.active_params()},
                {"layers", m.layers}, {"hidden", m.hidden}, {"seq", m.seq}};
  j["cluster"] = {{"device", c.device.name}, {"devices", c.world()}, {"islands", c.islands},
                  {"nodes_per_island", c.nodes_per_island}, {"devices_per_node", c.devices_per_node},
                  {"price_per_hour", p.price_per_hour}};
  j["layout"] = {{"dp", l.dp}, {"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"ep", l.ep}, {"zero", l.zero},
                 {"hsdp", l.hsdp}, {"sp", l.sp}, {"schedule", l.schedule}, {"virtual_stages", l.virtual_stages},
                 {"micro_batch", l.micro_batch}, {"global_batch", l.batch()}, {"recompute", l.recompute},
                 {"precision", l.precision}, {"optimizer", l.optimizer}, {"offload", l.offload},
                 {"diloco_h", l.diloco_h}, {"diloco_compression", l.diloco_compression},
                 {"gossip_peers", l.gossip_peers}, {"describe", l.describe()}};
  const auto& mm = p.memory;
  j["memory"] = {{"params_B", mm.params}, {"grads_B", mm.grads}, {"optimizer_B", mm.optimizer},
                 {"activations_B", mm.activations}, {"buffers_B", mm.buffers}, {"total_B", mm.total},
                 {"capacity_B", mm.capacity}, {"margin_B", mm.margin}, {"oom", mm.oom}};
  j["time"] = {{"step_s", p.step}, {"compute_s", p.compute}, {"memory_bound_s", p.memory_bound},
               {"grad_buffers_s", p.grad_buffers}, {"fsdp_copies_s", p.fsdp_copies}, {"page_faults_s", p.page_faults}, {"sync_wait_s", p.sync_wait}, {"gap_wait_s", p.gap_wait}, {"ep_copies_s", p.ep_copies},
               {"recompute_s", p.recompute}, {"bubble_s", p.bubble}, {"optimizer_s", p.optimizer},
               {"offload_s", p.offload}, {"tp", comm_json(p.tp)}, {"cp", comm_json(p.cp)}, {"ep", comm_json(p.ep)},
               {"pp_p2p", comm_json(p.pp_p2p)}, {"dp", comm_json(p.dp)}, {"outer_sync", comm_json(p.outer)},
               {"control", comm_json(p.control)}};
  j["throughput"] = {{"tokens_per_s", p.tokens_per_s}, {"tokens_per_s_island", p.tokens_per_s_island},
                     {"tokens_per_s_device", p.tokens_per_s_device}, {"tokens_per_step", p.tokens_per_step}};
  j["utilization"] = {{"mfu", p.mfu}, {"hfu", p.hfu}, {"model_flops_per_token", p.model_flops_per_token}};
  j["training"] = {{"tokens", p.train_tokens}, {"seconds", p.train_seconds}, {"cost_usd", p.train_cost},
                   {"fault_overhead", p.fault_overhead}, {"checkpoint_interval_s", p.checkpoint_interval}};
  j["bottleneck"] = p.bottleneck;
  if (!p.figures.empty()) {
    auto& e = j["explain"] = nlohmann::json::array();
    for (auto& f : p.figures) e.push_back({{"key", f.key}, {"value", f.value}, {"unit", f.unit}, {"formula", f.formula}});
  }
  return j;
}

std::string format_search(const SearchResult& r, size_t top) {
  std::string o = fmt::format("{} layouts evaluated ({} rejected by constraints), {} fit in memory\n\n", r.evaluated,
                              r.rejected, r.fits);
  o += fmt::format("{:>4} {:>7} {:>12} {:>9} {:>6} {:>11} {:>11} {:>10}  {}\n", "rank", "devices", "tokens/s", "step",
                   "MFU", "train time", "cost USD", "mem", "layout");
  for (size_t i = 0; i < std::min(top, r.ranked.size()); ++i) {
    auto& k = r.ranked[i];
    int64_t dev = k.layout.world();
    o += fmt::format("{:>4} {:>7} {:>12.5g} {:>9} {:>5.1f}% {:>11} {:>11.4g} {:>10}  {}\n", i + 1, dev, k.tokens_per_s,
                     human_seconds(k.step), 100 * k.mfu, human_seconds(k.train_seconds), k.train_cost,
                     human_bytes(k.mem_total), k.layout.describe());
  }
  if (!r.ranked.empty()) o += fmt::format("\nbest layout's bottleneck: {}\n", r.ranked.front().bottleneck);
  o += fmt::format("Pareto frontier (cost vs time): {} layouts\n", r.pareto.size());
  return o;
}

std::string pareto_csv(const std::vector<Candidate>& v) {
  std::string o = "devices,islands,nodes_per_island,train_hours,cost_usd,tokens_per_s,mfu,mem_total_gb,layout\n";
  for (auto& k : v)
    o += fmt::format("{},{},{},{:.6g},{:.6g},{:.6g},{:.4f},{:.3f},\"{}\"\n", k.layout.world(), k.islands,
                     k.nodes_per_island, k.train_seconds / 3600, k.train_cost, k.tokens_per_s, k.mfu, k.mem_total / 1e9,
                     k.layout.describe());
  return o;
}

Plot pareto_plot(const SearchResult& r, const std::string& title) {
  Plot p;
  p.title = title;
  p.xlabel = "time to train (hours)";
  p.ylabel = "cost (USD)";
  p.logx = p.logy = true;
  Series all{"fitting layouts", {}, {}, "#9aa0a6"};
  all.line = false, all.point_radius = 1.5;
  // Thin the cloud so the file stays small: at most ~1500 points.
  size_t stride = std::max<size_t>(1, r.ranked.size() / 1500);
  for (size_t i = 0; i < r.ranked.size(); i += stride) {
    all.x.push_back(r.ranked[i].train_seconds / 3600), all.y.push_back(r.ranked[i].train_cost);
  }
  Series front{"Pareto frontier", {}, {}, "#d62728"};
  for (auto& k : r.pareto) front.x.push_back(k.train_seconds / 3600), front.y.push_back(k.train_cost);
  p.series = {all, front};
  return p;
}

nlohmann::json search_json(const SearchResult& r, size_t top) {
  auto cand = [](const Candidate& k) {
    return nlohmann::json{{"layout", k.layout.describe()}, {"devices", k.layout.world()}, {"islands", k.islands},
                          {"nodes_per_island", k.nodes_per_island}, {"step_s", k.step},
                          {"tokens_per_s", k.tokens_per_s}, {"mfu", k.mfu}, {"train_seconds", k.train_seconds},
                          {"cost_usd", k.train_cost}, {"memory_B", k.mem_total}, {"bottleneck", k.bottleneck}};
  };
  nlohmann::json j;
  j["evaluated"] = r.evaluated, j["rejected"] = r.rejected, j["fits"] = r.fits;
  j["ranked"] = nlohmann::json::array();
  for (size_t i = 0; i < std::min(top, r.ranked.size()); ++i) j["ranked"].push_back(cand(r.ranked[i]));
  j["pareto"] = nlohmann::json::array();
  for (auto& k : r.pareto) j["pareto"].push_back(cand(k));
  return j;
}

std::string format_sweep(const std::vector<SweepPoint>& pts, const SweepOptions& o) {
  std::string o2 = fmt::format("{:>10} {:>7} {:>12} {:>12} {:>6} {:>6} {:>6} {:>6}  {:<40} {}\n", o.param, "devices",
                               "tokens/s", "tok/s/dev", "MFU", "comp%", "comm%", "bubl%", "regime", "layout");
  for (auto& pt : pts) {
    if (!pt.valid) {
      o2 += fmt::format("{:>10.4g} {:>7}  invalid: {}\n", pt.value, pt.devices, pt.error);
      continue;
    }
    o2 += fmt::format("{:>10.4g} {:>7} {:>12.5g} {:>12.5g} {:>5.1f}% {:>5.1f}% {:>5.1f}% {:>5.1f}%  {:<40} {}\n", pt.value,
                      pt.devices, pt.p.tokens_per_s, pt.p.tokens_per_s_device, 100 * pt.p.mfu, 100 * pt.compute_fraction,
                      100 * pt.comm_fraction, 100 * pt.bubble_fraction, pt.regime, pt.layout.describe());
  }
  return o2;
}

nlohmann::json sweep_json(const std::vector<SweepPoint>& pts, const SweepOptions& o) {
  nlohmann::json j = {{"param", o.param}, {"points", nlohmann::json::array()}};
  for (auto& pt : pts) {
    nlohmann::json e = {{"value", pt.value}, {"valid", pt.valid}, {"devices", pt.devices}};
    if (!pt.valid) e["error"] = pt.error;
    else
      e.update({{"tokens_per_s", pt.p.tokens_per_s}, {"tokens_per_s_device", pt.p.tokens_per_s_device},
                {"mfu", pt.p.mfu}, {"compute_fraction", pt.compute_fraction}, {"comm_fraction", pt.comm_fraction},
                {"bubble_fraction", pt.bubble_fraction}, {"regime", pt.regime}, {"layout", pt.layout.describe()}});
    j["points"].push_back(e);
  }
  return j;
}

std::string format_validation(const std::vector<ValidationRow>& rows) {
  std::string o = fmt::format("| {:<26} | {:<22} | {:>5} | {:>3} | {:>3} | {:>3} | {:>5} | {:<12} | {:<20} | {:>9} | {:>9} | {:>7} |\n",
                              "run", "source", "GPUs", "tp", "pp", "dp", "batch", "recompute", "metric", "published",
                              "predicted", "error");
  o += "|" + std::string(28, '-') + "|" + std::string(24, '-') + "|" + std::string(7, '-') + "|" + std::string(5, '-') + "|" +
       std::string(5, '-') + "|" + std::string(5, '-') + "|" + std::string(7, '-') + "|" + std::string(14, '-') + "|" +
       std::string(22, '-') + "|" + std::string(11, '-') + "|" + std::string(11, '-') + "|" + std::string(9, '-') + "|\n";
  for (auto& r : rows) {
    const auto& l = r.run.layout;
    o += fmt::format("| {:<26} | {:<22} | {:>5} | {:>3} | {:>3} | {:>3} | {:>5} | {:<12} | {:<20} | {:>9.4g} | {:>9.4g} | {:>+6.1f}% |\n",
                     r.run.id, r.run.source, r.run.cluster.world(), l.tp, l.pp, l.dp, l.batch(),
                     l.recompute + (l.sp ? "+sp" : ""), r.run.metric, r.run.published, r.predicted, 100 * r.rel_error);
  }
  return o;
}

}  // namespace atl::plan
