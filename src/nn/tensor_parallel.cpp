#include "nn/tensor_parallel.h"

#include "core/error.h"

namespace atl::nn {

ShardRule shard_rule(const ParallelPlan& plan, const std::string& param, const Shape& full) {
  for (const auto& e : plan.entries) {
    bool whole = param == e.module, under = param.size() > e.module.size() &&
                                            param.compare(0, e.module.size(), e.module) == 0 &&
                                            param[e.module.size()] == '.';
    if (!whole && !under) continue;
    std::string leaf = whole ? "weight" : param.substr(e.module.size() + 1);
    ShardRule r;
    switch (e.style) {
      case ParallelStyle::colwise:
        r.dim = leaf == "bias" ? 0 : 1;
        break;
      case ParallelStyle::rowwise:
        if (leaf == "bias") return {};
        r.dim = 0;
        break;
      case ParallelStyle::vocab_rowwise:
        r.dim = 0;
        break;
      default:
        continue;  // shard units and the rest: not a tensor-parallel split
    }
    ATOLL_CHECK(r.dim < int(full.size()), "parallel plan: {} is split along dim {} but has shape {}", param, r.dim,
                shape_str(full));
    r.segments = e.segments.empty() ? std::vector<int64_t>{full[size_t(r.dim)]} : e.segments;
    int64_t total = 0;
    for (int64_t s : r.segments) total += s;
    ATOLL_CHECK(total == full[size_t(r.dim)], "parallel plan: {}'s segments sum to {}, its dim {} is {}", param, total,
                r.dim, full[size_t(r.dim)]);
    return r;
  }
  return {};
}

Shape shard_shape(const ShardRule& rule, const Shape& full, int64_t r, int64_t size) {
  if (!rule.sharded()) return full;
  Shape s = full;
  s[size_t(rule.dim)] = 0;
  for (int64_t seg : rule.segments) {
    auto [lo, hi] = shard_range(seg, r, size);
    s[size_t(rule.dim)] += hi - lo;
  }
  return s;
}

namespace {
// Calls f(full_offset, local_offset, length) for each segment's piece of rank r.
template <typename F>
void for_pieces(const ShardRule& rule, int64_t r, int64_t size, F&& f) {
  int64_t full_off = 0, local_off = 0;
  for (int64_t seg : rule.segments) {
    auto [lo, hi] = shard_range(seg, r, size);
    f(full_off + lo, local_off, hi - lo);
    full_off += seg;
    local_off += hi - lo;
  }
}
}  // namespace

Tensor take_shard(const Tensor& full, const ShardRule& rule, int64_t r, int64_t size) {
  if (!rule.sharded()) return full.contiguous();
  Tensor out = Tensor::empty(shard_shape(rule, full.shape(), r, size), full.dtype());
  for_pieces(rule, r, size, [&](int64_t fo, int64_t lo, int64_t n) {
    if (n > 0) out.slice(rule.dim, lo, lo + n).copy_from(full.slice(rule.dim, fo, fo + n));
  });
  return out;
}

void put_shard(Tensor& full, const Tensor& local, const ShardRule& rule, int64_t r, int64_t size) {
  if (!rule.sharded()) {
    full.copy_from(local);
    return;
  }
  ATOLL_CHECK(local.shape() == shard_shape(rule, full.shape(), r, size), "put_shard: piece {} of rank {} for {}",
              shape_str(local.shape()), r, shape_str(full.shape()));
  for_pieces(rule, r, size, [&](int64_t fo, int64_t lo, int64_t n) {
    if (n > 0) full.slice(rule.dim, fo, fo + n).copy_from(local.slice(rule.dim, lo, lo + n));
  });
}

}  // namespace atl::nn
