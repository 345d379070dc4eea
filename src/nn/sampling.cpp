#include "nn/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace atl::nn {

void SamplingConfig::validate(const std::string& px) const {
  ATOLL_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
              "{}temperature must be 0 (greedy) or positive, got {}", px, temperature);
  ATOLL_CHECK(top_k >= 0, "{}top-k must be 0 (no limit) or positive, got {}", px, top_k);
  ATOLL_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "{}top-p must be in (0, 1], got {}", px, top_p);
  for (int32_t t : stop_tokens) ATOLL_CHECK(t >= 0, "{}stop token ids must be 0 or more, got {}", px, t);
}

bool SamplingConfig::is_stop(int32_t t) const {
  return std::find(stop_tokens.begin(), stop_tokens.end(), t) != stop_tokens.end();
}

int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& s, Rng& rng) {
  ATOLL_CHECK(V > 0, "sampling: empty vocabulary");
  if (s.temperature == 0.0f) return int32_t(std::max_element(logits, logits + V) - logits);  // first maximum
  if (s.top_k == 0 && s.top_p >= 1.0f) {  // the whole distribution: no order needed, draw in id order
    float mx = *std::max_element(logits, logits + V);
    std::vector<double> p(static_cast<size_t>(V));
    double z = 0;
    for (int64_t v = 0; v < V; ++v) z += p[size_t(v)] = std::exp(double(logits[v] - mx) / double(s.temperature));
    const double u = double(rng.uniform()) * z;
    double acc = 0;
    for (int64_t v = 0; v < V; ++v)
      if ((acc += p[size_t(v)]) > u) return int32_t(v);
    return int32_t(V - 1);
  }
  // Candidates by decreasing logit, ties by id: the order (and so the pick) is fully determined.
  std::vector<std::pair<float, int32_t>> cand(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) cand[size_t(v)] = {logits[v] / s.temperature, int32_t(v)};
  auto before = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  int64_t k = s.top_k > 0 ? std::min(s.top_k, V) : V;
  if (k < V) std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), before);
  else std::sort(cand.begin(), cand.end(), before);
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = cand[0].first;
  double z = 0;
  for (int64_t i = 0; i < k; ++i) z += p[size_t(i)] = std::exp(double(cand[size_t(i)].first) - mx);
  if (s.top_p < 1.0f) {  // the smallest prefix whose probability reaches top_p (at least one token)
    double acc = 0, want = double(s.top_p) * z;
    int64_t n = 0;
    while (n < k && acc < want) acc += p[size_t(n++)];
    k = std::max<int64_t>(n, 1);
    z = acc > 0 ? acc : p[0];
  }
  const double u = double(rng.uniform()) * z;
  double acc = 0;
  for (int64_t i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (acc > u) return cand[size_t(i)].second;
  }
  return cand[size_t(k - 1)].second;
}

}  // namespace atl::nn
