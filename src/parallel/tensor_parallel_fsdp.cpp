// Tensor parallelism under ZeRO-3 / HSDP over the data-parallel axis (FSDP inside each tp
// coordinate, as torchtitan composes FSDP2 with TP; Zhao et al., "PyTorch FSDP", VLDB 2023;
// Shoeybi et al., "Megatron-LM", 2019).
//
// Each tp rank's shard is an ordinary model whose flat buffers Zero stage 3 cuts into units (its
// blocks and root) and shards over the rank's data-parallel group: the dp ranks with the same tp
// coordinate hold the same tp shard, so a unit is all-gathered over dp before its forward and
// backward and its gradients reduce-scattered over dp, while the tp collectives inside the unit
// run over the tp group as without ZeRO.
//
// The one thing that has to change is where tp's partial gradients are summed. Under sequence
// parallelism a replicated parameter (a norm, a row-parallel bias, positions) gets on each tp rank
// only the part of its gradient from that rank's tokens. Without ZeRO-3 the sum over tp runs after
// backward on whole gradients (tensor_parallel.h); under ZeRO-3 a unit's gradients outside this
// rank's chunk are given back as soon as its reduce-scatter completes, and the tp ranks' chunk
// boundaries differ when the tp split is uneven (the vocabulary, say). So the sum runs per unit,
// just before its reduce-scatter (Zero::set_before_reduce): a unit's gradients are final at the
// same point of backward on every tp rank (the same graph), and the unit holds the same
// replicated parameters, with the same shapes, on each. The reduce-scatter then sums over dp
// gradients that are already whole over tp.
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"

namespace atl::parallel {

void TensorParallel::attach(DataParallel& dp) {
  auto* z = dynamic_cast<Zero*>(&dp);
  if (!comm_ || !z || z->stage() != 3 || dp.world() == 1) return;
  per_unit_ = true;
  z->set_before_reduce([this](const std::vector<nn::Parameter*>& unit) { sum_partial(unit); });
}

void TensorParallel::sum_partial(const std::vector<nn::Parameter*>& unit) {
  std::vector<nn::Parameter*> ps;
  int64_t n = 0;
  for (nn::Parameter* p : unit)
    for (auto& pi : params_)
      if (pi.p == p && pi.partial && p->grad.defined()) {
        ps.push_back(p);
        n += p->grad.numel();
      }
  if (n == 0) return;
  Tensor buf = Tensor::empty({n});
  int64_t o = 0;
  for (nn::Parameter* p : ps) {
    buf.slice(0, o, o + p->grad.numel()).copy_from(p->grad.contiguous().flatten());
    o += p->grad.numel();
  }
  comm_->all_reduce(buf);
  o = 0;
  for (nn::Parameter* p : ps) {
    p->grad.copy_from(buf.slice(0, o, o + p->grad.numel()).view(p->grad.shape()));
    o += p->grad.numel();
  }
}

}  // namespace atl::parallel
