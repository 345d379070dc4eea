#include "resilience/gradient_coding.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace atl::resilience {

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Solves the square system A x = b (k x k, row-major) by Gaussian elimination with partial
// pivoting; false when it is (numerically) singular.
bool solve(std::vector<double> A, std::vector<double> b, int k, std::vector<double>& x) {
  for (int c = 0; c < k; ++c) {
    int p = c;
    for (int r = c + 1; r < k; ++r)
      if (std::fabs(A[size_t(r * k + c)]) > std::fabs(A[size_t(p * k + c)])) p = r;
    if (std::fabs(A[size_t(p * k + c)]) < 1e-12) return false;
    if (p != c) {
      for (int j = 0; j < k; ++j) std::swap(A[size_t(c * k + j)], A[size_t(p * k + j)]);
      std::swap(b[size_t(c)], b[size_t(p)]);
    }
    for (int r = c + 1; r < k; ++r) {
      double f = A[size_t(r * k + c)] / A[size_t(c * k + c)];
      for (int j = c; j < k; ++j) A[size_t(r * k + j)] -= f * A[size_t(c * k + j)];
      b[size_t(r)] -= f * b[size_t(c)];
    }
  }
  x.assign(size_t(k), 0.0);
  for (int r = k - 1; r >= 0; --r) {
    double v = b[size_t(r)];
    for (int j = r + 1; j < k; ++j) v -= A[size_t(r * k + j)] * x[size_t(j)];
    x[size_t(r)] = v / A[size_t(r * k + r)];
  }
  return true;
}

}  // namespace

GradientCode GradientCode::fractional(int n, int s) {
  ATOLL_CHECK(n >= 1 && s >= 0 && s < n, "gradient coding: need 0 <= s < n (n={}, s={})", n, s);
  ATOLL_CHECK(n % (s + 1) == 0, "fractional repetition needs s + 1 ({}) to divide n ({}); use cyclic", s + 1, n);
  GradientCode g(n, s);
  g.fractional_ = true;
  // Group k = workers [k(s+1), (k+1)(s+1)) all hold partitions [k(s+1), (k+1)(s+1)).
  for (int w = 0; w < n; ++w) {
    int first = w / (s + 1) * (s + 1);
    for (int j = first; j < first + s + 1; ++j) g.B_[size_t(w * n + j)] = 1.0;
  }
  return g;
}

GradientCode GradientCode::cyclic(int n, int s, uint64_t seed) {
  ATOLL_CHECK(n >= 1 && s >= 0 && s < n, "gradient coding: need 0 <= s < n (n={}, s={})", n, s);
  // Random codes differ in conditioning: the decoded gradient carries about amplification() x the
  // messages' f32 rounding. Among a few candidates keep the best (the search is O(C(n, s)) decodes).
  GradientCode best(n, s);
  double best_amp = -1;
  for (uint64_t attempt = 0; attempt < 48; ++attempt) {
    GradientCode g(n, s);
    // H: s x n with entries in (-1, 1) and rows summing to zero (H 1 = 0).
    std::vector<double> H(size_t(s) * size_t(n));
    for (int r = 0; r < s; ++r) {
      double sum = 0;
      for (int c = 0; c + 1 < n; ++c) {
        double v = double(mix(seed * 1000003 + attempt * 7919 + uint64_t(r * n + c)) >> 11) / double(1ull << 53) * 2 - 1;
        H[size_t(r * n + c)] = v;
        sum += v;
      }
      H[size_t(r * n + n - 1)] = -sum;
    }
    bool ok = true;
    for (int w = 0; w < n && ok; ++w) {
      // Row w: B[w][w] = 1, the other s entries of its support solve H[:, rest] x = -H[:, w].
      g.B_[size_t(w * n + w)] = 1.0;
      if (s == 0) continue;
      std::vector<double> A(size_t(s) * size_t(s)), b(static_cast<size_t>(s)), x;
      for (int r = 0; r < s; ++r) {
        b[size_t(r)] = -H[size_t(r * n + w)];
        for (int k = 1; k <= s; ++k) A[size_t(r * s + k - 1)] = H[size_t(r * n + (w + k) % n)];
      }
      ok = solve(A, b, s, x);
      for (int k = 1; ok && k <= s; ++k) g.B_[size_t(w * n + (w + k) % n)] = x[size_t(k - 1)];
    }
    if (!ok) continue;
    double amp = 0;
    try {
      amp = g.amplification();
    } catch (const Error&) {
      continue;  // some n - s rows are singular
    }
    if (best_amp < 0 || amp < best_amp) {
      best = g;
      best_amp = amp;
    }
  }
  ATOLL_CHECK(best_amp >= 0, "gradient coding: no usable cyclic code for n={}, s={}", n, s);
  return best;
}

double GradientCode::amplification() const {
  double worst = 0;
  std::vector<int> missing(static_cast<size_t>(s_));
  std::function<void(int, int)> rec = [&](int from, int k) {
    if (k == s_) {
      std::vector<int> alive;
      for (int w = 0; w < n_; ++w)
        if (std::find(missing.begin(), missing.end(), w) == missing.end()) alive.push_back(w);
      auto a = decode_weights(alive);
      double amp = 0;
      for (int w : alive) {
        double row = 0;
        for (int j = 0; j < n_; ++j) row += std::fabs(B_[size_t(w * n_ + j)]);
        amp += std::fabs(a[size_t(w)]) * row;
      }
      worst = std::max(worst, amp / double(n_));
      return;
    }
    for (int w = from; w < n_; ++w) {
      missing[size_t(k)] = w;
      rec(w + 1, k + 1);
    }
  };
  rec(0, 0);
  return worst;
}

std::vector<int> GradientCode::partitions(int w) const {
  std::vector<int> p;
  for (int j = 0; j < n_; ++j)
    if (B_[size_t(w * n_ + j)] != 0.0) p.push_back(j);
  return p;
}

void GradientCode::encode(int w, const std::vector<const float*>& grads, int64_t len, float* out) const {
  auto parts = partitions(w);
  for (int64_t i = 0; i < len; ++i) {
    double v = 0;
    for (int j : parts) v += coefficient(w, j) * double(grads[size_t(j)][i]);
    out[i] = float(v);
  }
}

std::vector<double> GradientCode::decode_weights(const std::vector<int>& alive_in) const {
  std::vector<int> alive = alive_in;
  std::sort(alive.begin(), alive.end());
  alive.erase(std::unique(alive.begin(), alive.end()), alive.end());
  ATOLL_CHECK(int(alive.size()) >= n_ - s_,
              "gradient coding: {} workers answered, the code needs n - s = {} of them", alive.size(), n_ - s_);
  std::vector<double> out(size_t(n_), 0.0);
  if (fractional_) {  // the first answering worker of each group, weight 1
    for (int first = 0; first < n_; first += s_ + 1) {
      auto it = std::find_if(alive.begin(), alive.end(), [&](int w) { return w >= first && w < first + s_ + 1; });
      ATOLL_CHECK(it != alive.end(), "gradient coding: no worker of group {} answered", first / (s_ + 1));
      out[size_t(*it)] = 1.0;
    }
    return out;
  }
  // Use exactly n - s of them: a^T B_F = 1^T has n equations in n - s unknowns, consistent by
  // construction; the normal equations (B_F B_F^T) a = B_F 1 give the solution.
  alive.resize(size_t(n_ - s_));
  const int k = int(alive.size());
  std::vector<double> M(size_t(k) * size_t(k)), rhs(static_cast<size_t>(k)), a;
  for (int p = 0; p < k; ++p) {
    for (int q = 0; q < k; ++q) {
      double d = 0;
      for (int j = 0; j < n_; ++j) d += B_[size_t(alive[size_t(p)] * n_ + j)] * B_[size_t(alive[size_t(q)] * n_ + j)];
      M[size_t(p * k + q)] = d;
    }
    double r = 0;
    for (int j = 0; j < n_; ++j) r += B_[size_t(alive[size_t(p)] * n_ + j)];
    rhs[size_t(p)] = r;
  }
  ATOLL_CHECK(solve(M, rhs, k, a), "gradient coding: the answering workers' rows are singular (n={}, s={})", n_, s_);
  for (int p = 0; p < k; ++p) out[size_t(alive[size_t(p)])] = a[size_t(p)];
  return out;
}

}  // namespace atl::resilience
