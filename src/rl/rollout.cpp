#include "rl/rollout.h"

#include <algorithm>

#include "core/error.h"

namespace atl::rl {

int64_t RolloutBatch::tokens() const {
  int64_t n = 0;
  for (int64_t c : count) n += c;
  return n;
}

RolloutBatch pack_rollouts(std::vector<Sample> samples) {
  ATOLL_CHECK(!samples.empty(), "rl: no rollouts to pack");
  RolloutBatch b;
  b.B = int64_t(samples.size());
  for (const Sample& s : samples) {
    ATOLL_CHECK(!s.prompt.empty(), "rl: a rollout has an empty prompt");
    b.T = std::max<int64_t>(b.T, int64_t(s.prompt.size() + s.completion.size()) + (s.stopped ? 1 : 0) - 1);
  }
  b.T = std::max<int64_t>(b.T, 1);
  b.input = Tensor::zeros({b.B, b.T}, DType::i32);
  b.target = Tensor::empty({b.B, b.T}, DType::i32);
  std::fill(b.target.i32(), b.target.i32() + b.B * b.T, -1);
  for (int64_t r = 0; r < b.B; ++r) {
    const Sample& s = samples[size_t(r)];
    std::vector<int32_t> seq = s.prompt;
    seq.insert(seq.end(), s.completion.begin(), s.completion.end());
    if (s.stopped) seq.push_back(kEndMarker);
    int32_t* in = b.input.i32() + r * b.T;
    int32_t* tg = b.target.i32() + r * b.T;
    ATOLL_CHECK(s.env.empty() || s.env.size() == s.completion.size(), "rl: a rollout's environment mask has {} "
                "entries for {} completion tokens", s.env.size(), s.completion.size());
    int64_t own = 0;
    for (size_t t = 0; t + 1 < seq.size(); ++t) {
      in[t] = seq[t];
      if (t + 1 < s.prompt.size()) continue;
      const size_t c = t + 1 - s.prompt.size();  // the completion token it predicts (the end marker: past the end)
      if (c < s.env.size() && s.env[c]) continue;  // the environment's: context, not the model's action
      tg[t] = seq[t + 1];
      ++own;
    }
    b.first.push_back(int64_t(s.prompt.size()) - 1);
    b.count.push_back(int64_t(seq.size() - s.prompt.size()));
    b.own.push_back(own);
  }
  const int64_t N = b.B * b.T;
  b.old_logp = Tensor::zeros({N});
  b.ref_logp = Tensor::zeros({N});
  b.old_values = Tensor::zeros({N});
  b.advantages = Tensor::zeros({N});
  b.returns = Tensor::zeros({N});
  b.weights = Tensor::zeros({N});
  b.samples = std::move(samples);
  return b;
}

}  // namespace atl::rl
