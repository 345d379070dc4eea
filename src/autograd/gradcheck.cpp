#include "autograd/gradcheck.h"

#include <cmath>

#include "autograd/ops.h"
#include "tensor/rng.h"

namespace atl {

GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          float eps, int max_elems, uint64_t seed) {
  Rng rng(seed, 7);
  // A random projection makes the scalar depend on every output element with distinct weights.
  Tensor probe_out;
  {
    NoGradGuard ng;
    probe_out = f(inputs);
  }
  Tensor c = Tensor::empty(probe_out.shape());
  rng.fill_uniform(c, -1.f, 1.f);
  auto scalar = [&](const std::vector<Tensor>& in) {
    NoGradGuard ng;
    Tensor o = f(in);
    const float *p = o.f32(), *q = c.f32();
    double s = 0;
    for (int64_t i = 0; i < o.numel(); ++i) s += double(p[i]) * q[i];
    return s;
  };
  for (auto& t : inputs)
    if (requires_grad(t)) t.autograd()->grad = Tensor();
  Tensor loss = ops::dot_const(f(inputs), c);
  backward(loss);

  GradCheckResult res;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& t = inputs[k];
    if (!requires_grad(t)) continue;
    Tensor g = grad_of(t);
    ATOLL_CHECK(g.defined(), "gradcheck: input {} received no gradient", k);
    int64_t n = t.numel();
    std::vector<int64_t> idx;
    if (n <= max_elems) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    } else {
      for (int i = 0; i < max_elems; ++i) idx.push_back(int64_t(rng.below(uint64_t(n))));
    }
    double num = 0, den = 0;
    float* p = t.f32();
    for (int64_t i : idx) {
      float orig = p[i];
      p[i] = orig + eps;
      double up = scalar(inputs);
      p[i] = orig - eps;
      double dn = scalar(inputs);
      p[i] = orig;
      double numeric = (up - dn) / (2.0 * eps);
      double analytic = g.f32()[i];
      num += (numeric - analytic) * (numeric - analytic);
      den += numeric * numeric;
    }
    double rel = std::sqrt(num) / std::max(std::sqrt(den), 1e-6);
    if (rel > res.max_rel_error) {
      res.max_rel_error = rel;
      res.worst_input = k;
    }
  }
  return res;
}

}  // namespace atl
