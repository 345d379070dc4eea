// A cluster: islands of nodes of devices. Each level has a per-device bandwidth and a latency;
// the inter-island level is a wide-area link whose bandwidth is shared by the whole island.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/hardware.h"

namespace atl {
class Config;
}

namespace atl::plan {

enum class Level { intra_node = 0, inter_node = 1, inter_island = 2 };
const char* level_name(Level l);

struct Link {
  double bw = 0;       // bytes/s; per device for node levels, per island for the WAN
  double latency = 0;  // seconds per message hop
};

struct Cluster {
  Device device;
  int64_t devices_per_node = 8;
  int64_t nodes_per_island = 1;
  int64_t islands = 1;
  Link intra, inter, wan;
  std::vector<std::string> island_names;
  std::vector<double> island_price;  // USD per device-hour, one per island

  int64_t devices_per_island() const { return devices_per_node * nodes_per_island; }
  int64_t world() const { return devices_per_island() * islands; }
  double price_per_hour() const;  // whole cluster, USD
  const Link& link(Level l) const { return l == Level::intra_node ? intra : l == Level::inter_node ? inter : wan; }
};

// A homogeneous cluster with the device's default links.
Cluster make_cluster(const Device& d, int64_t devices_per_node, int64_t nodes_per_island, int64_t islands);
// Reads the [cluster] section (see docs/plan.md).
Cluster load_cluster(Config& cfg, const std::string& section = "cluster");

}  // namespace atl::plan
