// Cluster topology for the planner: islands → nodes → devices, as in the ShardMeter model of
// sharded, multi-cluster and decentralized training.
#include "plan/cluster.h"

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

static constexpr double kLinkEfficiency = 0.8;

const char* level_name(Level l) {
  switch (l) {
    case Level::intra_node: return "intra-node";
    case Level::inter_node: return "inter-node";
    case Level::inter_island: return "inter-island";
  }
  return "?";
}

double Cluster::price_per_hour() const {
  double p = 0;
  for (double x : island_price) p += x * devices_per_island();
  return p;
}

Cluster make_cluster(const Device& d, int64_t dpn, int64_t npi, int64_t islands) {
  ATOLL_CHECK(dpn > 0 && npi > 0 && islands > 0, "cluster sizes must be positive (devices_per_node={}, "
              "nodes_per_island={}, islands={})", dpn, npi, islands);
  Cluster c;
  c.device = d;
  if (d.shared_by_node && dpn > 1) {
    double k = double(dpn);
    c.device.fp32 /= k, c.device.tf32 /= k, c.device.bf16 /= k, c.device.fp8 /= k;
    c.device.mem_bytes /= k, c.device.mem_bw /= k;
    c.device.elementwise_bw /= k, c.device.attention_flops /= k, c.device.optimizer_params_per_s /= k;
    for (auto& pt : c.device.attention_curve) pt.second /= k;
    for (auto& pt : c.device.ring_attention_curve) pt.second /= k;
  }
  c.devices_per_node = dpn, c.nodes_per_island = npi, c.islands = islands;
  // Collectives reach about 80% of a link's nominal bandwidth (NCCL's bus bandwidth on NVLink and
  // InfiniBand), so the default links are derated; a [cluster.*] bandwidth_gbs is taken as given.
  double eff = d.links_measured ? 1.0 : kLinkEfficiency;
  c.intra = {eff * d.intra_bw, d.intra_latency};
  c.inter = {eff * d.inter_bw, 10e-6};
  c.wan = {1.25e9, 20e-3};  // 10 Gb/s, 20 ms: a modest inter-datacentre link
  for (int64_t i = 0; i < islands; ++i) {
    c.island_names.push_back("island" + std::to_string(i));
    c.island_price.push_back(d.price_hour);
  }
  return c;
}

static void read_link(Config& cfg, const std::string& s, Link& l, double lat_scale, const char* lat_key) {
  l.bw = cfg.get_float(s + ".bandwidth_gbs", l.bw / 1e9, 1e-6, 1e9) * 1e9;
  l.latency = cfg.get_float(s + "." + lat_key, l.latency / lat_scale, 0, 1e9) * lat_scale;
}

Cluster load_cluster(Config& cfg, const std::string& s) {
  Device d = find_device(cfg.get_string(s + ".device", "a100-80gb"));
  apply_device_overrides(d, cfg, s + ".device_override");
  Cluster c = make_cluster(d, cfg.get_int(s + ".devices_per_node", 8, 1, 1 << 20),
                           cfg.get_int(s + ".nodes_per_island", 1, 1, 1 << 24),
                           cfg.get_int(s + ".islands", 1, 1, 1 << 20));
  read_link(cfg, s + ".intra_node", c.intra, 1e-6, "latency_us");
  read_link(cfg, s + ".inter_node", c.inter, 1e-6, "latency_us");
  read_link(cfg, s + ".inter_island", c.wan, 1e-3, "latency_ms");
  double price = cfg.get_float(s + ".price_per_device_hour", d.price_hour, 0, 1e9);
  for (auto& p : c.island_price) p = price;
  // Optional named islands, each with its own price: [cluster.islands_price] name = price.
  auto keys = cfg.keys_under(s + ".island_price");
  if (!keys.empty()) {
    ATOLL_CHECK(int64_t(keys.size()) == c.islands,
                "config {}: [{}.island_price] names {} islands but islands = {}", cfg.where(keys[0]), s,
                keys.size(), c.islands);
    c.island_names.clear(), c.island_price.clear();
    for (auto& k : keys) {
      c.island_names.push_back(k.substr(s.size() + 14));
      c.island_price.push_back(cfg.get_float(k, price, 0, 1e9));
    }
  }
  return c;
}

}  // namespace atl::plan
