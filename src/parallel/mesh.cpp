#include "parallel/mesh.h"

#include <fmt/format.h>

#include <algorithm>

namespace atl::parallel {

const std::array<const char*, MeshShape::kAxes>& MeshShape::axis_names() {
  static const std::array<const char*, kAxes> n = {"island", "pp", "dp_replicate", "dp_shard", "cp", "tp", "ep"};
  return n;
}

int64_t& MeshShape::at(const std::string& a) {
  if (a == "island") return island;
  if (a == "pp") return pp;
  if (a == "dp_replicate") return dp_replicate;
  if (a == "dp_shard") return dp_shard;
  if (a == "cp") return cp;
  if (a == "tp") return tp;
  if (a == "ep") return ep;
  fail("unknown mesh axis '{}' (island, pp, dp_replicate, dp_shard, cp, tp, ep)", a);
}

int64_t MeshShape::at(const std::string& a) const { return const_cast<MeshShape*>(this)->at(a); }

std::string MeshShape::describe() const {
  std::string s = fmt::format("dp={}", dp());
  if (dp_replicate > 1 && dp_shard > 1) s += fmt::format(" (replicate {} x shard {})", dp_replicate, dp_shard);
  else if (dp_shard > 1) s += " (shard)";
  s += fmt::format(" tp={} pp={}", tp, pp);
  if (cp > 1) s += fmt::format(" cp={}", cp);
  if (ep > 1) s += fmt::format(" ep={}", ep);
  if (island > 1) s += fmt::format(" islands={}", island);
  return s;
}

std::string MeshShape::strategy(int zero_stage) const {
  if (dp_shard > 1 && dp_replicate > 1) return "hsdp";
  if (dp_shard > 1) return "zero" + std::to_string(zero_stage);
  return "ddp";
}

namespace {
// The config key of an axis ("islands" for the island axis, as `atoll plan` counts them).
std::string key_of(const std::string& axis) { return "parallel." + std::string(axis == "island" ? "islands" : axis); }
}  // namespace

MeshShape MeshShape::resolve(Config& cfg, int64_t world, const std::string& strategy, int64_t hsdp_shard_size,
                             int64_t local_world) {
  MeshShape m;
  std::vector<std::string> set;  // axes the config names
  for (const char* a : axis_names()) {
    std::string k = key_of(a);
    if (!cfg.has(k)) {
      cfg.accept(k);
      continue;
    }
    m.at(a) = cfg.get_int(k, 1, 1, 1 << 20);
    set.push_back(a);
  }
  auto is_set = [&](const char* a) { return std::find(set.begin(), set.end(), a) != set.end(); };
  bool rep = is_set("dp_replicate"), shard = is_set("dp_shard");
  auto product = [&](const MeshShape& s) {
    std::string terms;
    for (const char* a : axis_names())
      if (std::string(a) != "ep") terms += (terms.empty() ? "" : " x ") + fmt::format("{} {}", a, s.at(a));
    return terms;
  };
  std::string where;
  for (const auto& a : set) where += fmt::format("{}{} = {}{}", where.empty() ? "" : ", ", key_of(a), m.at(a),
                                                 cfg.where(key_of(a)).empty() ? "" : " (" + cfg.where(key_of(a)) + ")");
  // The axis the strategy names takes the ranks the others leave.
  if (!rep || !shard) {
    int64_t fixed = m.world() / (rep ? 1 : m.dp_replicate) / (shard ? 1 : m.dp_shard);
    if (!rep && !shard && strategy == "hsdp") {
      m.dp_shard = hsdp_shard_size > 0 ? hsdp_shard_size : local_world;
      fixed *= m.dp_shard;
      shard = true;
    }
    ATOLL_CHECK(world % fixed == 0,
                "parallel: {} = {} ranks does not divide WORLD_SIZE = {} (the data-parallel axis takes the "
                "rest){}", product(m), fixed, world, where.empty() ? "" : "; set: " + where);
    int64_t rest = world / fixed;
    bool to_shard = rep || (!shard && !strategy.empty() && strategy != "ddp" && strategy != "hsdp" && strategy != "scape" &&
                    strategy != "coded");
    (to_shard ? m.dp_shard : m.dp_replicate) = rest;
  }
  ATOLL_CHECK(m.world() == world, "parallel: {} = {} ranks, but WORLD_SIZE = {}{}", product(m), m.world(), world,
              where.empty() ? "" : "; set: " + where);
  ATOLL_CHECK((m.dp_shard * m.cp) % m.ep == 0, "parallel.ep = {} must divide dp_shard x cp = {} x {}", m.ep, m.dp_shard,
              m.cp);
  if (strategy == "ddp")
    ATOLL_CHECK(m.dp_shard == 1, "parallel.strategy = 'ddp' replicates the model, but dp_shard = {}: use 'zero3' "
                "(or 'hsdp' with dp_replicate > 1)", m.dp_shard);
  if (strategy.rfind("zero", 0) == 0)
    ATOLL_CHECK(m.dp_replicate == 1, "parallel.strategy = '{}' shards over all data-parallel ranks, but dp_replicate = "
                "{}: use 'hsdp'", strategy, m.dp_replicate);
  return m;
}

Mesh::Mesh(comm::Communicator* world, MeshShape shape) : world_(world), shape_(shape) {
  int64_t w = world ? world->size() : 1;
  ATOLL_CHECK(shape_.world() == w, "mesh {} needs {} ranks, the communicator has {}", shape_.describe(), shape_.world(),
              w);
  axes_.resize(MeshShape::kAxes);
}

Mesh::~Mesh() = default;

namespace {
// Stride of an axis in the rank order (tp innermost).
int64_t stride_of(const MeshShape& m, const std::string& axis) {
  int64_t s = 1;
  for (int i = MeshShape::kAxes - 2; i >= 0; --i) {  // ep is not a factor
    std::string a = MeshShape::axis_names()[size_t(i)];
    if (a == axis) return s;
    s *= m.at(a);
  }
  fail("no stride for mesh axis '{}'", axis);
}
}  // namespace

int64_t Mesh::coord(const std::string& axis) const {
  int64_t r = world_ ? world_->rank() : 0;
  if (axis == "ep") {
    int64_t f = coord("dp_shard") * shape_.cp + coord("cp");
    return f % shape_.ep;
  }
  return (r / stride_of(shape_, axis)) % shape_.at(axis);
}

comm::Communicator* Mesh::axis(const std::string& axis) {
  if (!world_) return nullptr;
  size_t i = 0;
  while (i < MeshShape::kAxes && MeshShape::axis_names()[i] != axis) ++i;
  ATOLL_CHECK(i < MeshShape::kAxes, "unknown mesh axis '{}'", axis);
  if (!axes_[i]) {
    int64_t r = world_->rank(), c = coord(axis);
    int64_t stride = axis == "ep" ? shape_.tp : stride_of(shape_, axis);
    axes_[i] = world_->split(int(r - c * stride), int(c));
  }
  return axes_[i].get();
}

comm::Communicator* Mesh::group(const std::vector<std::string>& axes) {
  if (!world_) return nullptr;
  for (auto& [a, c] : groups_)
    if (a == axes) return c.get();
  int64_t color = world_->rank();
  for (const std::string& a : axes) color -= coord(a) * stride_of(shape_, a);  // (ep has no stride: refused)
  groups_.emplace_back(axes, world_->split(int(color), world_->rank()));
  return groups_.back().second.get();
}

}  // namespace atl::parallel
