#include "resilience/coded_data_parallel.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace atl::resilience {

CodingScheme parse_coding_scheme(const std::string& s) {
  if (s == "pipelined") return CodingScheme::pipelined;
  if (s == "plain") return CodingScheme::plain;
  if (s == "ignore") return CodingScheme::ignore;
  if (s == "uncoded") return CodingScheme::uncoded;
  fail("gradient coding scheme '{}': expected pipelined, plain, ignore or uncoded", s);
}

const char* coding_scheme_name(CodingScheme s) {
  switch (s) {
    case CodingScheme::pipelined: return "pipelined";
    case CodingScheme::plain: return "plain";
    case CodingScheme::ignore: return "ignore";
    case CodingScheme::uncoded: return "uncoded";
  }
  return "?";
}

CodedDataParallel::CodedDataParallel(CodedExchange& ex, GradientCode code, CodingScheme scheme, int64_t len,
                                     StragglerInjector straggler, std::chrono::milliseconds timeout)
    : ex_(ex), code_(std::move(code)), scheme_(scheme), len_(len), inj_(std::move(straggler)), timeout_(timeout),
      n_(code_.workers()), s_(code_.stragglers()), w_(ex.rank()) {
  ATOLL_CHECK(ex.size() == n_, "gradient coding: a code for {} workers on {} ranks", n_, ex.size());
  ATOLL_CHECK(scheme_ != CodingScheme::pipelined || n_ % (s_ + 1) == 0,
              "pipelined gradient coding needs s + 1 ({}) to divide n ({}): a worker's s + 1 partitions must be "
              "computed at distinct steps of each cycle", s_ + 1, n_);
  mine_ = code_.partitions(w_);
  if (scheme_ == CodingScheme::pipelined) {
    slot_.assign(mine_.size(), std::vector<float>(static_cast<size_t>(len_), 0.f));
    stamp_.assign(mine_.size(), -1);
  }
}

std::vector<int> CodedDataParallel::computes_at(int64_t t) const {
  switch (scheme_) {
    case CodingScheme::plain: return mine_;
    case CodingScheme::ignore:
    case CodingScheme::uncoded: return {w_};
    case CodingScheme::pipelined:
      for (int j : mine_)
        if (j % (s_ + 1) == int(t % (s_ + 1))) return {j};
  }
  return {};
}

int64_t CodedDataParallel::source_step(int partition, int64_t t) const {
  const int64_t r = partition % (s_ + 1), c = s_ + 1;
  int64_t tau = t - (((t - r) % c) + c) % c;
  return tau < 0 ? -1 : tau;
}

bool CodedDataParallel::pipelined_valid(int64_t t) const {
  for (size_t k = 0; k < mine_.size(); ++k)
    if (stamp_[k] != source_step(mine_[k], t)) return false;
  return true;
}

CodedStepInfo CodedDataParallel::step(int64_t t, const PartitionGrad& grad, float* full) {
  CodedStepInfo info;
  const int need = scheme_ == CodingScheme::uncoded ? n_ : n_ - s_;
  // Behind the others? When they are past the NEXT step too (a rank that is only late by some
  // scheduling jitter must not skip: in the pipelined scheme a skip leaves it unable to send for
  // s + 1 steps), decode this step from their messages without computing.
  auto early = ex_.peek(t);
  early.erase(w_);
  bool behind = false;
  if (inj_.catch_up && scheme_ != CodingScheme::uncoded && int(early.size()) >= need) {
    auto next = ex_.peek(t + 1);
    next.erase(w_);
    behind = int(next.size()) >= need;
  }
  if (!behind) {
    if (inj_.rank == w_ && inj_.stop_at > 0 && t == inj_.stop_at) ::raise(SIGSTOP);
    if (inj_.rank == w_ && inj_.delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(int64_t(inj_.delay_ms * 1000)));
    info.computed = true;
    std::vector<float> msg(static_cast<size_t>(len_), 0.f), g(static_cast<size_t>(len_));
    auto parts = computes_at(t);
    if (scheme_ == CodingScheme::pipelined) {
      for (int j : parts) {
        size_t k = size_t(std::find(mine_.begin(), mine_.end(), j) - mine_.begin());
        grad(j, slot_[k].data());
        stamp_[k] = t;
      }
    }
    bool valid = scheme_ != CodingScheme::pipelined || pipelined_valid(t);
    if (scheme_ == CodingScheme::pipelined || scheme_ == CodingScheme::plain) {
      std::vector<std::vector<float>> fresh;
      std::vector<const float*> ptr(size_t(n_), nullptr);
      if (scheme_ == CodingScheme::plain) {
        fresh.assign(mine_.size(), std::vector<float>(static_cast<size_t>(len_)));
        for (size_t k = 0; k < mine_.size(); ++k) {
          grad(mine_[k], fresh[k].data());
          ptr[size_t(mine_[k])] = fresh[k].data();
        }
      } else {
        for (size_t k = 0; k < mine_.size(); ++k) ptr[size_t(mine_[k])] = slot_[k].data();
      }
      code_.encode(w_, ptr, len_, msg.data());
    } else {
      grad(w_, msg.data());
    }
    const bool withheld = inj_.withhold && inj_.withhold(w_, t);
    if (valid && !withheld) {
      ex_.post(t, std::move(msg));
      info.sent = true;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  auto got = behind ? early : ex_.collect(t, need, timeout_);
  info.wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The lowest ranks in: every rank that received the same fast set decodes the same subset.
  std::vector<int> alive;
  for (auto& [r, v] : got) alive.push_back(r);
  std::sort(alive.begin(), alive.end());
  std::fill(full, full + len_, 0.f);
  if (scheme_ == CodingScheme::ignore || scheme_ == CodingScheme::uncoded) {
    const double scale = double(n_) / double(alive.size());
    for (int64_t i = 0; i < len_; ++i) {
      double v = 0;
      for (int r : alive) v += double(got[r][size_t(i)]);
      full[i] = float(v * scale);
    }
    info.decoded = alive;
  } else {
    auto a = code_.decode_weights(alive);
    for (int r : alive)
      if (a[size_t(r)] != 0.0) info.decoded.push_back(r);
    for (int64_t i = 0; i < len_; ++i) {
      double v = 0;
      for (int r : info.decoded) v += a[size_t(r)] * double(got[r][size_t(i)]);
      full[i] = float(v);
    }
  }
  ex_.forget_before(t + 1);  // later steps stay: a rank catching up reads them
  return info;
}

}  // namespace atl::resilience
