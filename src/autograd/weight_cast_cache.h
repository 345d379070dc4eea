// bf16 copies of the weights, made once per training step. Mixed precision multiplies bf16 copies
// of fp32 master weights (precision.h); converting a weight on every use would convert it once
// per forward and again per gradient-accumulation micro-step. Inside a WeightCastScope a
// parameter's bf16 copy is made on first use and then shared by every forward and dX product of
// the step, across its micro-steps.
//
// Validity: a copy belongs to the scope's weight version. Opening or closing a scope starts a new
// version and invalidate_weight_casts() starts one inside a scope, so the rule is: weights must not
// change inside a scope except through invalidate_weight_casts(). The trainer opens one scope per
// step around the micro-steps and closes it before the optimizer step, so an update (optimizer,
// checkpoint load, outer step) always meets a new version. Only leaf parameters are cached, and
// each entry holds a weak reference to the weight's storage, so freed storage that happens to be
// reallocated at the same address can never hit a stale entry.
#pragma once
#include <cstdint>

#include "tensor/tensor.h"

namespace atl {

class WeightCastScope {
 public:
  WeightCastScope();
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;
};

// w (f32) in bf16 (contiguous): from the cache inside a scope when w is a leaf parameter, a fresh
// copy otherwise.
Tensor bf16_weight(const Tensor& w);
// Drops every cached copy and starts a new weight version (weights changed inside a scope).
void invalidate_weight_casts();
uint64_t weights_version();

struct WeightCastStats {
  int64_t conversions = 0;  // weights converted (cache misses and uncached calls)
  int64_t reuses = 0;       // cache hits
  int64_t cached_bytes = 0;  // bf16 bytes the cache holds now
};
WeightCastStats weight_cast_stats();

}  // namespace atl
