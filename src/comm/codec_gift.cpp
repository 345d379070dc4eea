// GIFT's per-matrix transform; see codec_gift.h. Registers the GIFT codecs (transform + wire format).
#include "comm/codec_gift.h"

#include <algorithm>
#include <cmath>

#include "comm/codec.h"

namespace atl::comm {

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Modified Gram-Schmidt on k columns of length n (column-major); a column that vanishes is
// replaced by a deterministic pseudo-random one and orthogonalized again.
void orthonormalize(std::vector<double>& q, int64_t n, int k, uint64_t salt) {
  for (int j = 0; j < k; ++j) {
    double* c = &q[size_t(j) * size_t(n)];
    for (int pass = 0; pass < 2; ++pass) {
      for (int i = 0; i < j; ++i) {
        const double* p = &q[size_t(i) * size_t(n)];
        double dot = 0;
        for (int64_t t = 0; t < n; ++t) dot += p[t] * c[t];
        for (int64_t t = 0; t < n; ++t) c[t] -= dot * p[t];
      }
      double nn = 0;
      for (int64_t t = 0; t < n; ++t) nn += c[t] * c[t];
      if (nn > 1e-300) {
        double inv = 1.0 / std::sqrt(nn);
        for (int64_t t = 0; t < n; ++t) c[t] *= inv;
        if (pass == 1) break;
      } else {
        for (int64_t t = 0; t < n; ++t) c[t] = double(mix(salt ^ (uint64_t(j) << 40) ^ uint64_t(t)) >> 11) / 9.007e15 - 0.5;
      }
    }
  }
}
}  // namespace

GiftTransform::GiftTransform(int64_t rows, int64_t cols, GiftOptions opt)
    : rows_(rows), cols_(cols), k_(int(std::min<int64_t>(std::min(opt.rank, 64), std::min(rows, cols)))), opt_(opt) {
  q_.assign(size_t(k_) * size_t(cols_), 0.0);
  for (size_t i = 0; i < q_.size(); ++i) q_[i] = double(mix(uint64_t(i) * 31 + uint64_t(rows * 7 + cols)) >> 11) / 9.007e15 - 0.5;
  orthonormalize(q_, cols_, k_, uint64_t(rows * 1000003 + cols));
  d_.assign(size_t(k_), 1.0);
}

double GiftTransform::max_ratio() const {
  double m = 1;
  for (double d : d_) m = std::max(m, 1.0 / d);
  return m;
}

void GiftTransform::apply(float* g, bool inverse) const {
  if (!active_) return;
  std::vector<double> coef(static_cast<size_t>(k_));
  for (int j = 0; j < k_; ++j) coef[size_t(j)] = inverse ? 1.0 / d_[size_t(j)] - 1.0 : d_[size_t(j)] - 1.0;
  const int64_t n = cols_;
  const int k = k_;
  const double* q = q_.data();
#pragma omp parallel for schedule(static) if (rows_ * cols_ > 65536)
  for (int64_t r = 0; r < rows_; ++r) {
    float* row = g + r * n;
    double z[64];
    for (int j = 0; j < k; ++j) {
      const double* c = q + size_t(j) * size_t(n);
      double s = 0;
      for (int64_t t = 0; t < n; ++t) s += double(row[t]) * c[t];
      z[j] = s * coef[size_t(j)];
    }
    for (int64_t t = 0; t < n; ++t) {
      double v = row[t];
      for (int j = 0; j < k; ++j) v += z[j] * q[size_t(j) * size_t(n) + size_t(t)];
      row[t] = float(v);
    }
  }
}

void GiftTransform::observe(const float* g) {
  const int64_t n = cols_;
  // Y = G^T G Q (one subspace iteration); sigma_i^2 ~ q_i^T G^T G q_i (Rayleigh quotients).
  std::vector<double> y(q_.size(), 0.0), z(static_cast<size_t>(k_));
  double fro = 0;
  for (int64_t r = 0; r < rows_; ++r) {
    const float* row = g + r * n;
    for (int j = 0; j < k_; ++j) {
      const double* c = &q_[size_t(j) * size_t(n)];
      double s = 0;
      for (int64_t t = 0; t < n; ++t) s += double(row[t]) * c[t];
      z[size_t(j)] = s;
    }
    for (int64_t t = 0; t < n; ++t) {
      double v = row[t];
      fro += v * v;
      for (int j = 0; j < k_; ++j) y[size_t(j) * size_t(n) + size_t(t)] += v * z[size_t(j)];
    }
  }
  std::vector<double> sig2(static_cast<size_t>(k_));
  double top = 0;
  for (int j = 0; j < k_; ++j) {
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += q_[size_t(j) * size_t(n) + size_t(t)] * y[size_t(j) * size_t(n) + size_t(t)];
    sig2[size_t(j)] = std::max(s, 0.0);
    top += sig2[size_t(j)];
  }
  q_ = std::move(y);
  orthonormalize(q_, n, k_, uint64_t(rows_ * 1000003 + cols_));
  const int64_t rest = std::min(rows_, cols_) - k_;
  double ref2_now = rest > 0 ? std::max(fro - top, 0.0) / double(rest) : 0.0;
  const double b = seen_ ? opt_.beta : 0.0;
  seen_ = true;
  if (sig2_.empty()) sig2_.assign(size_t(k_), 0.0);
  for (int j = 0; j < k_; ++j) sig2_[size_t(j)] = b * sig2_[size_t(j)] + (1 - b) * sig2[size_t(j)];
  ref2_ = b * ref2_ + (1 - b) * ref2_now;
  sig2 = sig2_;
  const double ref2 = ref2_;
  double smax = 0;
  for (double s : sig2) smax = std::max(smax, s);
  anisotropy_ = ref2 > 0 ? std::sqrt(smax / ref2) : (smax > 0 ? INFINITY : 1.0);
  active_ = rows_ * cols_ >= opt_.min_numel && std::min(rows_, cols_) > 2 * k_ && anisotropy_ >= opt_.min_anisotropy &&
            ref2 > 0;
  for (int j = 0; j < k_; ++j)
    d_[size_t(j)] = active_ && sig2[size_t(j)] > 0
                        ? std::clamp(std::sqrt(ref2 / sig2[size_t(j)]), 1.0 / opt_.max_shrink, 1.0)
                        : 1.0;
}

std::vector<double> GiftTransform::save() const {
  std::vector<double> v = {double(rows_), double(cols_), double(k_), seen_ ? 1.0 : 0.0, active_ ? 1.0 : 0.0,
                           anisotropy_, ref2_};
  v.insert(v.end(), d_.begin(), d_.end());
  std::vector<double> s2 = sig2_;
  s2.resize(size_t(k_), 0.0);
  v.insert(v.end(), s2.begin(), s2.end());
  v.insert(v.end(), q_.begin(), q_.end());
  return v;
}

void GiftTransform::load(const std::vector<double>& v, const std::string& what) {
  const size_t k = size_t(k_), want = 7 + 2 * k + q_.size();
  ATOLL_CHECK(v.size() == want && v[0] == double(rows_) && v[1] == double(cols_) && v[2] == double(k_),
              "{}: GIFT geometry for a {} x {} matrix of rank {} expected ({} values), got {} values", what, rows_,
              cols_, k_, want, v.size());
  seen_ = v[3] != 0;
  active_ = v[4] != 0;
  anisotropy_ = v[5];
  ref2_ = v[6];
  d_.assign(v.begin() + 7, v.begin() + 7 + long(k));
  sig2_.assign(v.begin() + 7 + long(k), v.begin() + 7 + 2 * long(k));
  if (!seen_) sig2_.clear();
  q_.assign(v.begin() + 7 + 2 * long(k), v.end());
}

namespace {
CodecRegistrar r1("gift_fp8", {nullptr, "gift", "fp8_e4m3"});
CodecRegistrar r2("gift_e5m2", {nullptr, "gift", "fp8_e5m2"});
CodecRegistrar r3("gift_int8", {nullptr, "gift", "int8"});
CodecRegistrar r4("gift_nvfp4", {nullptr, "gift", "nvfp4"});
}  // namespace

}  // namespace atl::comm
