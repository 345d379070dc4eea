#include "data/varlen_corpus.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "data/shards.h"
#include "tensor/rng.h"

namespace atl {
namespace fs = std::filesystem;

VarlenCorpus VarlenCorpus::from_shards(const std::string& dir, const std::string& split, int32_t eot,
                                       const VarlenOptions& opt) {
  std::vector<std::string> files;
  if (fs::is_directory(dir))
    for (auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(split + "_", 0) == 0 && e.path().extension() == ".bin") files.push_back(e.path().string());
    }
  std::sort(files.begin(), files.end());
  ATOLL_CHECK(!files.empty(), "variable-length corpus: no {}_*.bin shards in '{}' (run `atoll data prepare`)", split,
              dir);
  std::vector<int32_t> stream;
  for (const std::string& f : files) {
    ShardReader r(f);
    const size_t at = stream.size();
    stream.resize(at + r.size());
    r.read(0, r.size(), stream.data() + at);
  }
  return VarlenCorpus(std::move(stream), eot, opt);
}

VarlenCorpus::VarlenCorpus(std::vector<int32_t> stream, int32_t eot, const VarlenOptions& opt)
    : stream_(std::move(stream)), opt_(opt) {
  ATOLL_CHECK(opt.batch_tokens >= 1 && opt.max_len >= 1, "variable-length corpus: batch_tokens {} and max_len {} "
              "must be positive", opt.batch_tokens, opt.max_len);
  const int64_t n = int64_t(stream_.size());
  if (opt.lengths == "corpus") {
    // A document runs from an end-of-text id to the next one (the shards hold one before each).
    int64_t s = 0;
    while (s < n) {
      int64_t e = s + 1;
      while (e < n && stream_[size_t(e)] != eot) ++e;
      // Pieces of at most max_len targets; consecutive pieces share one token (the last target
      // of one is the first input of the next), so every token is a target exactly once.
      for (int64_t p = s; p + 1 < e; p += opt.max_len) spans_.push_back({p, std::min(e, p + opt.max_len + 1)});
      s = e;
    }
  } else if (opt.lengths == "pareto") {
    ATOLL_CHECK(opt.alpha > 0 && opt.min_len >= 1 && opt.min_len <= opt.max_len,
                "variable-length corpus: Pareto alpha {} must be positive and min_len {} within [1, max_len {}]",
                opt.alpha, opt.min_len, opt.max_len);
    Rng rng(opt.seed, 71);
    for (int64_t p = 0;;) {
      // Inverse CDF of Pareto(min_len, alpha): min_len / U^(1/alpha), U in (0, 1].
      const double u = 1.0 - double(rng.uniform());
      const double len = std::min(double(opt.max_len), double(opt.min_len) / std::pow(u, 1.0 / opt.alpha));
      const int64_t t = std::max<int64_t>(1, int64_t(len));
      if (p + t + 1 > n) break;
      spans_.push_back({p, p + t + 1});
      p += t + 1;
    }
  } else {
    fail("variable-length corpus: lengths '{}' is not one of corpus, pareto", opt.lengths);
  }
  int64_t total = 0;
  for (auto [b, e] : spans_) total += e - b - 1;
  ATOLL_CHECK(total >= opt.batch_tokens, "variable-length corpus: {} documents hold {} targets, fewer than one batch "
              "of {} (lower data.varlen_tokens or add text)", spans_.size(), total, opt.batch_tokens);
  start_epoch(0);
}

void VarlenCorpus::start_epoch(int64_t e) {
  if (e == epoch_) return;
  epoch_ = e;
  order_.resize(spans_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = int64_t(i);
  Rng rng(opt_.seed ^ 0x5eed0fda7aULL, uint64_t(e) + 1);
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[size_t(rng.below(i))]);
  // Whole documents until a batch holds batch_tokens targets; the epoch's remainder is dropped.
  epoch_batches_.assign(1, 0);
  int64_t have = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    const auto [b, en] = spans_[size_t(order_[i])];
    have += en - b - 1;
    if (have >= opt_.batch_tokens) {
      epoch_batches_.push_back(int64_t(i) + 1);
      have = 0;
    }
  }
}

std::vector<VarlenDocument> VarlenCorpus::batch(int64_t k) {
  ATOLL_CHECK(k >= 0, "variable-length corpus: batch {}", k);
  // Epochs differ in their number of batches (their orders group documents differently).
  int64_t e = 0;
  for (;; ++e) {
    if (size_t(e) >= epoch_counts_.size()) {
      start_epoch(e);
      epoch_counts_.push_back(batches_per_epoch());
    }
    if (k < epoch_counts_[size_t(e)]) break;
    k -= epoch_counts_[size_t(e)];
  }
  start_epoch(e);
  std::vector<VarlenDocument> out;
  for (int64_t i = epoch_batches_[size_t(k)]; i < epoch_batches_[size_t(k) + 1]; ++i) {
    const auto [b, en] = spans_[size_t(order_[size_t(i)])];
    out.push_back({std::vector<int32_t>(stream_.begin() + b, stream_.begin() + en)});
  }
  return out;
}

std::vector<int64_t> VarlenCorpus::lengths() const {
  std::vector<int64_t> v;
  for (auto [b, e] : spans_) v.push_back(e - b - 1);
  return v;
}

int32_t VarlenCorpus::max_token() const {
  int32_t m = 0;
  for (int32_t t : stream_) m = std::max(m, t);
  return m;
}

}  // namespace atl
