// Gradient coding (Tandon, Lei, Dimakis & Karampatziakis, "Gradient Coding: Avoiding Stragglers in
// Distributed Learning", ICML 2017): the data is cut into n partitions and worker i computes the
// gradients of s + 1 of them, sending one combination c_i = sum_j B[i][j] g_j; the full gradient
// sum_j g_j is then decoded from the messages of ANY n - s workers, so s stragglers (or dead
// ranks) cost nothing.
//
//  - fractional repetition (needs (s + 1) | n): groups of s + 1 workers hold the same s + 1
//    partitions and send their plain sum; any n - s workers include one of each group;
//  - cyclic repetition (any s < n): worker i holds partitions i .. i + s (mod n). B is built
//    (the paper's Algorithm 2) so that every row lies in the null space of a random s x n matrix H
//    with H 1 = 0; that space has dimension n - s and contains the all-ones vector, and any n - s
//    rows of B span it (generically), so 1 is a combination a of them: a^T B_F = 1^T.
//
// In a data-parallel loop, pipelined (one partition per worker per step) and with stragglers:
// coded_data_parallel.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace atl::resilience {

class GradientCode {
 public:
  static GradientCode fractional(int n, int s);
  static GradientCode cyclic(int n, int s, uint64_t seed = 1);

  int workers() const { return n_; }
  int stragglers() const { return s_; }
  // The partitions worker w computes (B's support in row w).
  std::vector<int> partitions(int w) const;
  double coefficient(int w, int partition) const { return B_[size_t(w) * size_t(n_) + size_t(partition)]; }
  // c_w = sum over w's partitions of B[w][j] * grads[j] (grads[j]: partition j's gradient, len values;
  // only w's partitions are read). Accumulated in double.
  void encode(int w, const std::vector<const float*>& grads, int64_t len, float* out) const;
  // Decoding weights a (length n, zero off `alive`) with sum_w a_w c_w = the full gradient; throws
  // atl::Error when fewer than n - s workers are alive.
  std::vector<double> decode_weights(const std::vector<int>& alive) const;
  // Over every set of s missing workers, the largest sum_w |a_w| sum_j |B[w][j]| / n: how many
  // times the messages' rounding error (relative to the gradient's scale) the decoded sum can carry.
  double amplification() const;

 private:
  GradientCode(int n, int s) : n_(n), s_(s), B_(size_t(n) * size_t(n), 0.0) {}
  int n_, s_;
  bool fractional_ = false;
  std::vector<double> B_;  // n x n, row-major
};

}  // namespace atl::resilience
