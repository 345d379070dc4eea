#include "nn/recompute.h"

#include <sstream>

namespace atl::nn {

std::vector<Recompute> recompute_from_config(Config& cfg, size_t blocks, const std::string& key) {
  const std::string v = cfg.get_string(key, "none");
  const std::string where = fmt::format("{} ({})", key, cfg.where(key));
  std::vector<std::string> items;
  std::stringstream ss(v);
  for (std::string it; std::getline(ss, it, ',');) {
    it.erase(0, it.find_first_not_of(" \t"));
    it.erase(it.find_last_not_of(" \t") + 1);
    items.push_back(it);
  }
  ATOLL_CHECK(!items.empty(), "{} is empty: use none, selective, full or one of them per block", where);
  ATOLL_CHECK(items.size() == 1 || items.size() == blocks,
              "{} = \"{}\" names {} blocks, but the model has {}: give one value for all, or one per block", where, v,
              items.size(), blocks);
  std::vector<Recompute> out;
  for (size_t b = 0; b < blocks; ++b) out.push_back(parse_recompute(items[items.size() == 1 ? 0 : b], where));
  return out;
}

void apply_recompute_config(Config& cfg, Model& model, const std::string& key) {
  if (!cfg.has(key)) return;
  model.set_recompute(recompute_from_config(cfg, model.blocks().size(), key));
}

}  // namespace atl::nn
