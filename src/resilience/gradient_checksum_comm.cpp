#include "resilience/gradient_checksum_comm.h"

#include <cmath>
#include <cstring>
#include <ctime>
#include <utility>

#include "core/checksum.h"
#include "core/error.h"

namespace atl::resilience {

namespace {

struct Sums {
  double sum = 0, abs = 0;
};
Sums sums(const float* x, int64_t n) {
  Sums s;
  for (int64_t i = 0; i < n; ++i) {
    s.sum += double(x[i]);
    s.abs += std::fabs(double(x[i]));
  }
  return s;
}

// The sign bit of the largest-magnitude element: a change of twice that element, the most a
// one-bit flip of a finite value can do without making it huge or non-finite.
void corrupt(float* x, int64_t n) {
  int64_t at = 0;
  for (int64_t i = 1; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(x[at])) at = i;
  uint32_t bits;
  std::memcpy(&bits, x + at, 4);
  bits ^= 0x80000000u;
  std::memcpy(x + at, &bits, 4);
}

int64_t thread_cpu_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

GradientChecksumComm::GradientChecksumComm(comm::Communicator* inner, const nn::Model& model)
    : Communicator(inner->rank(), inner->size(), inner->world_ranks(), inner->timeout()), inner_(inner), model_(model) {
  start_worker();
}

GradientChecksumComm::~GradientChecksumComm() { stop_worker(); }

void GradientChecksumComm::arm_corruption() {
  std::lock_guard<std::mutex> g(mu_);
  armed_ = true;
}

void GradientChecksumComm::arm_drop() {
  std::lock_guard<std::mutex> g(mu_);
  drop_ = true;
}

std::vector<PayloadFinding> GradientChecksumComm::take_findings() {
  std::lock_guard<std::mutex> g(mu_);
  return std::exchange(findings_, {});
}

bool GradientChecksumComm::is_gradient(const Tensor& t) const {
  return t.dtype() == DType::f32 && t.is_contiguous() && model_.flat_grads().defined() &&
         t.same_storage(model_.flat_grads());
}

void GradientChecksumComm::checked_all_reduce(const Tensor& t) {
  const int n = size();
  const int64_t N = t.numel();
  float* x = t.f32();
  const int64_t cpu0 = thread_cpu_ns();
  int64_t in_reduce = 0;  // the all-reduce's own CPU time, left out of the check's
  // 1. The contribution's checksums, and a copy of it.
  const Sums mine = sums(x, N);
  const uint32_t crc = crc32c(x, size_t(N) * 4);
  Tensor kept = t.clone();
  bool armed, dropped;
  {
    std::lock_guard<std::mutex> g(mu_);
    armed = armed_;
    dropped = drop_;
    armed_ = drop_ = false;
  }
  if (armed) corrupt(x, N);  // 2. the payload corrupted after its checksum
  // A message that never lands adds nothing to the sum: this rank's share of it is zero.
  if (dropped) std::memset(x, 0, size_t(N) * 4);
  {
    const int64_t r0 = thread_cpu_ns();
    inner_->all_reduce(t, comm::ReduceOp::sum);
    in_reduce = thread_cpu_ns() - r0;
  }
  // 3. Every rank's (S, A, CRC) and its result's (sum, absolute sum), so that every rank decides
  // the same (the same numbers, summed in the same order): a rank that alone saw a mismatch and
  // went on to localize would pair its collectives with the others' next ones.
  constexpr int kD = 5;
  Tensor all = Tensor::zeros({kD * int64_t(n)}, DType::i64);  // doubles, carried bit for bit
  auto gather = [&](const float* r) {
    Tensor desc = Tensor::zeros({kD}, DType::i64);
    auto* d = static_cast<double*>(desc.raw());
    const Sums got = sums(r, N);
    d[0] = mine.sum;
    d[1] = mine.abs;
    d[2] = double(crc);
    d[3] = got.sum;
    d[4] = got.abs;
    inner_->all_gather(desc, all);
  };
  auto worst = [&]() {
    const auto* a = static_cast<const double*>(all.raw());
    double want = 0, abs_in = 0;
    for (int q = 0; q < n; ++q) {
      want += a[kD * q];
      abs_in += a[kD * q + 1];
    }
    const double u = std::ldexp(1.0, -24), g = (n - 1) * u / (1 - (n - 1) * u);
    std::pair<double, double> out{0, 0};  // the largest excess over its bound, of any rank's result
    double excess = -HUGE_VAL;
    for (int q = 0; q < n; ++q) {
      // The float32 reduction's bound, plus the double sums' own (N terms each, n + 1 of them).
      const double bound =
          g * abs_in + double(N) * std::ldexp(1.0, -52) * (double(n + 1) * abs_in + a[kD * q + 4]);
      const double diff = std::fabs(a[kD * q + 3] - want);
      if (diff - bound > excess) {
        excess = diff - bound;
        out = {diff, bound};
      }
    }
    return out;
  };
  gather(x);
  ++checked_;
  auto [diff, bound] = worst();
  if (diff <= bound) {
    cpu_ns_ += thread_cpu_ns() - cpu0 - in_reduce;
    return;
  }
  const auto* a = static_cast<const double*>(all.raw());
  std::vector<uint32_t> crcs(static_cast<size_t>(n), 0u);
  for (int q = 0; q < n; ++q) crcs[size_t(q)] = uint32_t(a[kD * q + 2]);
  // 4. Localization: every kept contribution re-sent with its sender's CRC; this rank's armed
  // fault corrupts its copy again (the step's outgoing gradient messages).
  PayloadFinding f;
  f.bucket = fmt::format("bucket [{}, {})", t.offset() - model_.flat_grads().offset(),
                         t.offset() - model_.flat_grads().offset() + N);
  f.diff = diff;
  f.bound = bound;
  {
    Tensor out = kept.clone();
    if (armed) corrupt(out.f32(), N);
    if (dropped) std::memset(out.raw(), 0, size_t(N) * 4);  // its slot keeps the receivers' zeros
    Tensor every = Tensor::zeros({N * n});
    inner_->all_gather(out, every);
    for (int q = 0; q < n; ++q) {
      const float* got = every.f32() + int64_t(q) * N;
      if (crc32c(got, size_t(N) * 4) == crcs[size_t(q)]) continue;
      f.ranks.push_back(q);
      bool empty = true;  // nothing landed: a dropped message, not a corrupted one
      for (int64_t i = 0; i < N && empty; ++i) empty = got[i] == 0.f;
      if (empty) f.missing.push_back(q);
    }
  }
  // 5. Repair: the kept contributions reduced again, and checked again.
  std::memcpy(x, kept.raw(), size_t(N) * 4);
  inner_->all_reduce(t, comm::ReduceOp::sum);
  gather(x);
  auto [diff2, bound2] = worst();
  ATOLL_CHECK(diff2 <= bound2,
              "gradient payload check: {} is still corrupt after the repair (sum off by {:.3g}, bound {:.3g}): a "
              "persistent fault",
              f.bucket, diff2, bound2);
  std::lock_guard<std::mutex> g(mu_);
  findings_.push_back(std::move(f));
}

void GradientChecksumComm::run_all_reduce(const Tensor& t, comm::ReduceOp op) {
  if (op == comm::ReduceOp::sum && size() > 1 && is_gradient(t)) return checked_all_reduce(t);
  inner_->all_reduce(t, op);
}
void GradientChecksumComm::run_reduce_scatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) {
  inner_->reduce_scatter(in, out, op);
}
void GradientChecksumComm::run_all_gather(const Tensor& in, const Tensor& out) { inner_->all_gather(in, out); }
void GradientChecksumComm::run_broadcast(const Tensor& t, int root) { inner_->broadcast(t, root); }
void GradientChecksumComm::run_all_to_all(const Tensor& in, const Tensor& out) { inner_->all_to_all(in, out); }
void GradientChecksumComm::run_barrier() { inner_->barrier(); }
std::function<void()> GradientChecksumComm::post_send(const Tensor& t, int peer, int tag) {
  auto w = inner_->send_async(t, peer, tag);
  return [w] { w->wait(); };
}
std::function<void()> GradientChecksumComm::post_recv(const Tensor& t, int peer, int tag) {
  auto w = inner_->recv_async(t, peer, tag);
  return [w] { w->wait(); };
}
std::unique_ptr<comm::Communicator> GradientChecksumComm::run_split(const std::vector<int>&, int, int) {
  fail("the gradient payload check (fault.campaign) does not split its communicator");
}
void GradientChecksumComm::run_abort() { inner_->abort("the gradient payload check's communicator was aborted"); }

}  // namespace atl::resilience
