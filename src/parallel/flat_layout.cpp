#include "parallel/flat_layout.h"

#include <algorithm>
#include <string>

namespace atl::parallel {

namespace {
FlatLayout base_layout(nn::Model& model) {
  FlatLayout L;
  L.params = model.parameters();
  const float* base = model.flat_values().f32();
  for (nn::Parameter* p : L.params) {
    int64_t lo = p->value.f32() - base;
    L.spans.push_back({lo, lo + p->value.numel()});
  }
  L.numel = model.flat_values().numel();
  for (size_t i = 1; i < L.spans.size(); ++i)
    ATOLL_CHECK(L.spans[i].lo == L.spans[i - 1].hi, "parameters are not laid out contiguously in declaration order");
  L.buckets_of_param.resize(L.params.size());
  return L;
}

void add_bucket(FlatLayout& L, Span r, int shards, int shard_rank) {
  if (r.size() <= 0) return;
  BucketLayout b;
  b.range = r;
  b.shards = shards;
  b.chunk = (r.size() + shards - 1) / shards;
  b.own.lo = std::min(r.hi, r.lo + shard_rank * b.chunk);
  b.own.hi = std::min(r.hi, r.lo + (shard_rank + 1) * b.chunk);
  int idx = int(L.buckets.size());
  for (size_t i = 0; i < L.spans.size(); ++i)
    if (L.spans[i].lo < r.hi && L.spans[i].hi > r.lo && L.spans[i].size() > 0) {
      b.params.push_back(int(i));
      L.buckets_of_param[i].push_back(idx);
    }
  L.buckets.push_back(std::move(b));
}
}  // namespace

FlatLayout size_buckets(nn::Model& model, int64_t cap_elems, int shards, int shard_rank) {
  FlatLayout L = base_layout(model);
  cap_elems = std::max<int64_t>(cap_elems, 1);
  // Cut points from the bottom up: whole modules (a weight and its bias become final together, so
  // a cut between them would make the bucket above wait as long as the one below) until the cap is
  // reached. The bucket at offset 0 is reduced last, after backward's final computation, so its
  // all-reduce cannot be hidden: grouping from the bottom keeps it to what becomes final last
  // (the lowest block's first layer and the embeddings) and leaves the remainder to the top
  // bucket, which is reduced first, and a small first bucket starts communication early (PyTorch
  // DDP makes its first bucket 1 MB for that reason).
  auto module_of = [&](size_t i) {
    const std::string& n = L.params[i]->name;
    return n.substr(0, n.rfind('.'));
  };
  std::vector<int64_t> cuts{0};
  for (size_t i = 0; i < L.spans.size(); ++i) {
    bool module_ends = i + 1 == L.spans.size() || module_of(i + 1) != module_of(i);
    if (module_ends && L.spans[i].hi - cuts.back() >= cap_elems) cuts.push_back(L.spans[i].hi);
  }
  if (cuts.back() != L.numel) cuts.push_back(L.numel);
  // Then from the top down, each bucket rounded up to a multiple of the shard count, so only the
  // bucket at offset 0 may need padding; a parameter cut there is in both buckets.
  int64_t hi = L.numel;
  size_t c = cuts.size() - 1;
  while (hi > 0) {
    while (c > 0 && cuts[c] >= hi) --c;
    int64_t size = hi - cuts[c];
    if (shards > 1) size = (size + shards - 1) / shards * shards;
    int64_t lo = std::max<int64_t>(0, hi - size);
    add_bucket(L, {lo, hi}, shards, shard_rank);
    hi = lo;
  }
  return L;
}

FlatLayout unit_buckets(nn::Model& model, int shards, int shard_rank, std::vector<int>& block_bucket,
                        std::vector<int>& root_buckets) {
  FlatLayout L = base_layout(model);
  std::vector<Span> blocks;
  for (nn::Module* b : model.blocks()) {
    auto ps = b->parameters();
    const float* base = model.flat_values().f32();
    int64_t lo = ps.front()->value.f32() - base, hi = ps.back()->value.f32() - base + ps.back()->value.numel();
    blocks.push_back({lo, hi});
  }
  block_bucket.assign(blocks.size(), -1);
  root_buckets.clear();
  int64_t first = blocks.empty() ? L.numel : blocks.front().lo, last = blocks.empty() ? L.numel : blocks.back().hi;
  // Reverse order, as gradients become ready: upper root, blocks top down, lower root.
  auto add_root = [&](Span s) {
    if (s.size() <= 0) return;
    root_buckets.push_back(int(L.buckets.size()));
    add_bucket(L, s, shards, shard_rank);
  };
  add_root({last, L.numel});
  for (size_t k = blocks.size(); k-- > 0;) {
    block_bucket[k] = int(L.buckets.size());
    add_bucket(L, blocks[k], shards, shard_rank);
  }
  add_root({0, first});
  return L;
}

}  // namespace atl::parallel
