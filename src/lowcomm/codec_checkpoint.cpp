// The gradient codec's error feedback in checkpoints; see codec_checkpoint.h.
#include "lowcomm/codec_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "comm/compressed_allreduce.h"
#include "core/log.h"

namespace atl::lowcomm {

namespace {
const char* kPrefix = "parallel.codec.";
bool starts(const std::string& a, const std::string& b) { return a.rfind(b, 0) == 0; }
bool ends(const std::string& a, const std::string& b) {
  return a.size() >= b.size() && a.compare(a.size() - b.size(), b.size(), b) == 0;
}
}  // namespace

void gather_rank_tensors(comm::Communicator* world, const NamedTensors& mine, const std::string& prefix,
                         NamedTensors& out) {
  const int W = world ? world->size() : 1, me = world ? world->rank() : 0;
  auto name = [&](int r, const std::string& n) { return fmt::format("{}rank{}.{}", prefix, r, n); };
  if (W == 1) {
    for (const auto& [n, t] : mine) out.emplace_back(name(0, n), t);
    return;
  }
  // Collectives keep every rank's operation count equal (no point-to-point to the writer), so
  // the counts are compared first: a rank with other names would pair the wrong tensors.
  Tensor count = Tensor::zeros({1}, DType::i64), counts = Tensor::zeros({int64_t(W)}, DType::i64);
  count.data<int64_t>()[0] = int64_t(mine.size());
  world->all_gather(count, counts);
  for (int r = 1; r < W; ++r)
    ATOLL_CHECK(counts.data<int64_t>()[r] == counts.data<int64_t>()[0],
                "checkpoint: rank {} holds {} tensors of {}*, rank 0 {}", r, counts.data<int64_t>()[r], prefix,
                counts.data<int64_t>()[0]);
  for (const auto& [n, t] : mine) {
    Tensor len = Tensor::zeros({1}, DType::i64), lens = Tensor::zeros({int64_t(W)}, DType::i64);
    len.data<int64_t>()[0] = t.numel();
    world->all_gather(len, lens);
    const int64_t* l = lens.data<int64_t>();
    const int64_t L = *std::max_element(l, l + W);
    Tensor padded = Tensor::zeros({L}, t.dtype()), all = Tensor::empty({int64_t(W) * L}, t.dtype());
    Tensor tc = t.contiguous();
    std::memcpy(padded.raw(), tc.raw(), tc.nbytes());
    world->all_gather(padded, all);
    if (me != 0) continue;
    for (int r = 0; r < W; ++r) out.emplace_back(name(r, n), all.slice(0, r * L, r * L + l[r]).clone());
  }
}

namespace {

// The job's data-parallel groups (one per island and tp coordinate, each reducing over its own
// ranks with its own codec): for every world rank its group's index — groups ordered by their
// lowest world rank, which is island-major then tp in the mesh's rank order, whatever the
// number of data-parallel ranks — and its rank inside the group. Collective over world.
void dp_groups(parallel::DataParallel& dp, comm::Communicator* world, std::vector<int>& group, std::vector<int>& rank) {
  const int W = world ? world->size() : 1, me = world ? world->rank() : 0;
  Tensor low = Tensor::full({1}, -float(me));
  if (dp.comm() && dp.comm()->size() > 1) dp.comm()->all_reduce(low, comm::ReduceOp::max);
  Tensor mine = Tensor::empty({2}), all = Tensor::empty({2 * int64_t(W)});
  mine.f32()[0] = -low.f32()[0];
  mine.f32()[1] = float(dp.rank());
  if (W > 1) world->all_gather(mine, all);
  else all.copy_from(mine);
  std::vector<int> lows;
  for (int r = 0; r < W; ++r) lows.push_back(int(all.f32()[2 * r]));
  std::vector<int> sorted = lows;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  group.assign(size_t(W), 0);
  rank.assign(size_t(W), 0);
  for (int r = 0; r < W; ++r) {
    group[size_t(r)] = int(std::lower_bound(sorted.begin(), sorted.end(), lows[size_t(r)]) - sorted.begin());
    rank[size_t(r)] = int(all.f32()[2 * r + 1]);
  }
}

}  // namespace

void save_gradient_codec(parallel::DataParallel& dp, comm::Communicator* world, NamedTensors& opt_sd,
                         nlohmann::json& state) {
  comm::CompressedAllReducer* c = dp.gradient_codec();
  if (!c) return;  // the same on every rank: a codec runs when the data-parallel group has ranks
  NamedTensors mine = c->state_tensors();
  gather_rank_tensors(world, mine, kPrefix, opt_sd);
  const int W = world ? world->size() : 1;
  std::vector<int> group, rank;
  dp_groups(dp, world, group, rank);
  state["gradient_codec"] = {{"spec", c->spec().describe()}, {"ranks", W}, {"dp", dp.world()},
                             {"dp_is_world", dp.world() == W}, {"group_of_rank", group}, {"dp_rank_of_rank", rank}};
}

namespace {

// The state of old rank r (names without "parallel.codec.rank<r>.").
NamedTensors of_rank(const NamedTensors& ours, int r) {
  const std::string p = fmt::format("{}rank{}.", kPrefix, r);
  NamedTensors sd;
  for (const auto& [n, t] : ours)
    if (starts(n, p)) sd.emplace_back(n.substr(p.size()), t);
  return sd;
}

const Tensor* find(const NamedTensors& sd, const std::string& n) {
  for (const auto& [k, t] : sd)
    if (k == n) return &t;
  return nullptr;
}

}  // namespace

NamedTensors remap_codec_state(const NamedTensors& ours, const std::vector<int>& old_ranks,
                               const std::vector<std::pair<std::string, int64_t>>& tensors, int me, int Wn,
                               const std::string& what) {
  const int W = int(old_ranks.size());
  ATOLL_CHECK(W > 0, "{}: no saved rank of this data-parallel group", what);
  std::vector<NamedTensors> old;
  for (int r : old_ranks) old.push_back(of_rank(ours, r));
  std::vector<std::string> bad;
  for (const auto& [key, n] : tensors) {
    const Tensor* meta = find(old[0], key + ".meta");
    if (!meta) continue;  // never reduced before the save: starts at zero either way
    const int64_t was = meta->contiguous().data<int64_t>()[0];
    if (was != n) bad.push_back(fmt::format("{}rank0.{}.meta ({} elements, here {})", kPrefix, key, was, n));
  }
  for (const auto& [n, t] : old[0])
    if (ends(n, ".meta")) {
      const std::string key = n.substr(0, n.size() - 5);
      if (std::none_of(tensors.begin(), tensors.end(), [&](const auto& e) { return e.first == key; }))
        bad.push_back(fmt::format("{}rank{}.{} (no such tensor here)", kPrefix, old_ranks[0], n));
    }
  ATOLL_CHECK(bad.empty(),
              "{}: the gradient codec's error feedback was saved by {} data-parallel ranks and does not fit this job's "
              "{}: {}. Resume with {} ranks, or with another parallel.codec setting (its error feedback then starts "
              "from zero)", what, W, Wn, fmt::join(bad, ", "), W);
  NamedTensors out;
  for (const auto& [key, n] : tensors) {
    const Tensor* meta = find(old[0], key + ".meta");
    if (!meta) continue;
    out.emplace_back(key + ".meta", meta->clone());
    if (const Tensor* g = find(old[0], key + ".gift")) out.emplace_back(key + ".gift", g->clone());  // equal on all
    if (find(old[0], key + ".residual")) {
      // Summed in rank order onto rank 0: what the next reduction adds back is the same total.
      std::vector<float> sum(size_t(n), 0.f);
      if (me == 0)
        for (int r = 0; r < W; ++r) {
          const Tensor* e = find(old[size_t(r)], key + ".residual");
          ATOLL_CHECK(e && e->numel() == n, "{}: {}rank{}.{}.residual is missing or not {} elements", what, kPrefix,
                      old_ranks[size_t(r)], key, n);
          Tensor ec = e->contiguous();
          for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += ec.f32()[i];
        }
      out.emplace_back(key + ".residual", Tensor::from_vector(sum, {n}));
    }
    if (find(old[0], key + ".residual2")) {
      // Old owner r's residual covers elements [r c, (r + 1) c) of the reduced tensor.
      std::vector<float> full;
      for (int r = 0; r < W; ++r) {
        const Tensor* e = find(old[size_t(r)], key + ".residual2");
        ATOLL_CHECK(e, "{}: {}rank{}.{}.residual2 is missing", what, kPrefix, old_ranks[size_t(r)], key);
        std::vector<float> v = e->contiguous().to_vector();
        full.insert(full.end(), v.begin(), v.end());
      }
      const int64_t c = (n + Wn - 1) / Wn;
      std::vector<float> mine(size_t(c), 0.f);
      for (int64_t i = 0; i < c; ++i)
        if (const int64_t at = int64_t(me) * c + i; at < n && at < int64_t(full.size())) mine[size_t(i)] = full[size_t(at)];
      out.emplace_back(key + ".residual2", Tensor::from_vector(mine, {c}));
    }
  }
  return out;
}

void load_gradient_codec(parallel::DataParallel& dp, comm::Communicator* world, NamedTensors& opt_sd,
                         const nlohmann::json& state, const std::string& what) {
  NamedTensors ours, rest;
  for (auto& e : opt_sd) (starts(e.first, kPrefix) ? ours : rest).push_back(std::move(e));
  opt_sd = std::move(rest);
  comm::CompressedAllReducer* c = dp.gradient_codec();
  const bool saved = state.contains("gradient_codec");
  ATOLL_CHECK(saved || ours.empty(), "{}: parallel.codec.* entries but no gradient_codec state", what);
  if (!c) {
    if (saved && !ours.empty())
      log::warn("{}: the gradient codec's error feedback ({}) is dropped: this job compresses no gradients", what,
                state["gradient_codec"].value("spec", std::string("?")));
    return;
  }
  if (!saved) {
    log::info("{}: no gradient codec state; the error feedback of parallel.codec starts at zero", what);
    return;
  }
  const nlohmann::json& st = state.at("gradient_codec");
  const std::string spec = st.at("spec").get<std::string>();
  if (spec != c->spec().describe()) {
    log::warn("{} was saved with gradient codec '{}', this job runs '{}': its error feedback starts at zero", what,
              spec, c->spec().describe());
    return;
  }
  const int W = world ? world->size() : 1, me = world ? world->rank() : 0;
  const int saved_world = st.at("ranks").get<int>(), saved_dp = st.at("dp").get<int>();
  if (saved_world == W && saved_dp == dp.world()) {  // the same layout: this rank's own, bit-exact
    c->load_state_tensors(of_rank(ours, me), what);
    return;
  }
  // Each data-parallel group's residuals go to the group in the same place of the new job (the
  // same island and tp coordinate): they are of that group's model (its tp shard's buckets), and
  // what one group left unsent belongs to no other's reduction. Checkpoints from before the
  // group layout was saved remap between plain data-parallel jobs only.
  std::vector<int> old_group, old_rank;
  if (st.contains("group_of_rank")) {
    old_group = st.at("group_of_rank").get<std::vector<int>>();
    old_rank = st.at("dp_rank_of_rank").get<std::vector<int>>();
  } else if (st.at("dp_is_world").get<bool>()) {
    for (int r = 0; r < saved_world; ++r) old_group.push_back(0), old_rank.push_back(r);
  }
  std::vector<int> group, rank;
  dp_groups(dp, world, group, rank);
  const int old_groups = old_group.empty() ? -1 : *std::max_element(old_group.begin(), old_group.end()) + 1;
  const int groups = *std::max_element(group.begin(), group.end()) + 1;
  ATOLL_CHECK(old_groups == groups && int(old_group.size()) == saved_world,
              "{}: the gradient codec's error feedback (parallel.codec.rank<r>.*) was saved by {} ranks in data-parallel "
              "groups of {} ({} groups: islands x tp); this job has {} in groups of {} ({} groups). Its residuals are "
              "remapped only between jobs with the same groups (the same islands and tp; any number of data-parallel "
              "ranks in each): resume with the saved layout, or with another parallel.codec setting (its error "
              "feedback then starts from zero)", what, saved_world, saved_dp, old_groups < 0 ? 0 : old_groups, W,
              dp.world(), groups);
  std::vector<std::pair<int, int>> mine;  // (old dp rank, old world rank) of this rank's group
  for (int r = 0; r < saved_world; ++r)
    if (old_group[size_t(r)] == group[size_t(me)]) mine.emplace_back(old_rank[size_t(r)], r);
  std::sort(mine.begin(), mine.end());
  std::vector<int> old_ranks;
  for (const auto& m : mine) old_ranks.push_back(m.second);
  c->load_state_tensors(remap_codec_state(ours, old_ranks, dp.gradient_codec_tensors(), dp.rank(), dp.world(), what),
                        what);
  log::warn("{}: the gradient codec's error feedback of {} ranks remapped to {} ({} data-parallel group{} of {} ranks "
            "to {}; totals kept; not bit-exact)", what, saved_world, W, groups, groups == 1 ? "" : "s", saved_dp,
            dp.world());
}

}  // namespace atl::lowcomm
