#include "resilience/progress_record.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "comm/collective_observer.h"
#include "core/error.h"

namespace atl::resilience {

namespace {

constexpr uint64_t kMagic = 0x31474f5250544c41ull;  // "ALTPROG1"
constexpr size_t kFileBytes = 4096;

// The file's layout. Plain fields, written under the seqlock `seq` (odd while a write is under
// way); the reader copies them and keeps the copy only if `seq` was even and unchanged around it.
struct Shared {
  uint64_t magic;
  int32_t pid, rank, world, pad0;
  std::atomic<uint64_t> seq;
  int64_t step;
  int32_t base_phase, phase, waiting, inflight;
  int64_t events, last_event_ns, since_ns;
  int64_t phase_ns[kPhases];
  int64_t ops_started, ops_finished, ops_failed, bytes;
  char last_op[64], wait_op[64];
};
static_assert(sizeof(Shared) <= kFileBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

void copy_name(char (&dst)[64], const std::string& s) {
  size_t n = std::min(s.size(), sizeof(dst) - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = 0;
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::startup: return "startup";
    case Phase::compute: return "compute";
    case Phase::collective: return "collective";
    case Phase::data: return "data";
    case Phase::checkpoint: return "checkpoint";
    case Phase::eval: return "eval";
    case Phase::idle: return "idle";
    case Phase::done: return "done";
  }
  return "?";
}

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ProgressPublisher::Impl final : comm::CollectiveObserver {
  mutable std::mutex mu;
  Shared* s = nullptr;

  template <class F>
  void update(F&& f) noexcept {
    std::lock_guard<std::mutex> lk(mu);
    if (!s) return;
    s->seq.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    f(*s, monotonic_ns());
    std::atomic_thread_fence(std::memory_order_release);
    s->seq.fetch_add(1, std::memory_order_release);
  }
  static void event(Shared& r, int64_t now) {
    ++r.events;
    r.last_event_ns = now;
  }
  // The effective phase: a wait in a collective wins over what the trainer says it is doing.
  static void settle(Shared& r, int64_t now) {
    int p = r.waiting > 0 ? int(Phase::collective) : r.base_phase;
    if (p == r.phase) return;
    r.phase_ns[r.phase] += now - r.since_ns;
    r.since_ns = now;
    r.phase = p;
    event(r, now);
  }
  void op_started(const std::string& name, int64_t bytes) noexcept override {
    update([&](Shared& r, int64_t now) {
      ++r.inflight;
      ++r.ops_started;
      r.bytes += bytes;
      copy_name(r.last_op, name);
      event(r, now);
    });
  }
  void op_finished(const std::string&, bool ok) noexcept override {
    update([&](Shared& r, int64_t now) {
      r.inflight = std::max(0, r.inflight - 1);
      ++r.ops_finished;
      if (!ok) ++r.ops_failed;
      event(r, now);
    });
  }
  void wait_begin(const std::string& name) noexcept override {
    update([&](Shared& r, int64_t now) {
      ++r.waiting;
      copy_name(r.wait_op, name);
      settle(r, now);
    });
  }
  void wait_end() noexcept override {
    update([&](Shared& r, int64_t now) {
      r.waiting = std::max(0, r.waiting - 1);
      settle(r, now);
    });
  }
};

ProgressPublisher& ProgressPublisher::instance() {
  // Never destroyed: a communicator thread may still report while the process exits.
  static ProgressPublisher* p = [] {
    auto* q = new ProgressPublisher;
    q->impl_ = new Impl;
    return q;
  }();
  return *p;
}

void ProgressPublisher::open(const std::string& path, int rank, int world) {
  close(false);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // A fresh file each run (a watcher must never read the previous run's counters as this one's).
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ATOLL_CHECK(fd >= 0, "progress record: cannot create {}: {}", tmp, std::strerror(errno));
  if (::ftruncate(fd, off_t(kFileBytes)) != 0) {
    int e = errno;
    ::close(fd);
    fail("progress record: cannot size {}: {}", tmp, std::strerror(e));
  }
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ATOLL_CHECK(m != MAP_FAILED, "progress record: cannot map {}: {}", tmp, std::strerror(errno));
  auto* s = new (m) Shared{};
  s->pid = int32_t(::getpid());
  s->rank = rank;
  s->world = world;
  s->since_ns = s->last_event_ns = monotonic_ns();
  s->magic = kMagic;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    ::munmap(m, kFileBytes);
    fail("progress record: cannot publish {}: {}", path, ec.message());
  }
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->s = s;
  }
  comm::set_collective_observer(impl_);
}

void ProgressPublisher::close(bool finished) {
  if (!active()) return;
  if (finished) set_phase(Phase::done);
  comm::set_collective_observer(nullptr);
  std::lock_guard<std::mutex> lk(impl_->mu);
  ::munmap(impl_->s, kFileBytes);
  impl_->s = nullptr;
}

bool ProgressPublisher::active() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->s != nullptr;
}

void ProgressPublisher::set_step(int64_t step) {
  impl_->update([&](Shared& r, int64_t now) {
    r.step = step;
    Impl::event(r, now);
  });
}

void ProgressPublisher::set_phase(Phase p) {
  impl_->update([&](Shared& r, int64_t now) {
    r.base_phase = int(p);
    Impl::settle(r, now);
  });
}

Phase ProgressPublisher::phase() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->s ? Phase(impl_->s->base_phase) : Phase::startup;
}

PhaseScope::PhaseScope(Phase p) : prev_(Phase::startup), on_(ProgressPublisher::instance().active()) {
  if (!on_) return;
  prev_ = ProgressPublisher::instance().phase();
  ProgressPublisher::instance().set_phase(p);
}

PhaseScope::~PhaseScope() {
  if (on_) ProgressPublisher::instance().set_phase(prev_);
}

std::optional<ProgressSample> read_progress(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return std::nullopt;
  void* m = ::mmap(nullptr, kFileBytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return std::nullopt;
  const auto* s = static_cast<const Shared*>(m);
  alignas(Shared) unsigned char buf[sizeof(Shared)];
  bool ok = false;
  // A writer stopped mid-update (SIGSTOP inside the few stores) leaves `seq` odd for good: after a
  // few tries take the record as it is, a half-updated record of a stopped rank is still its story.
  for (int tries = 0; tries < 200 && !ok; ++tries) {
    uint64_t a = s->seq.load(std::memory_order_acquire);
    std::memcpy(buf, static_cast<const void*>(s), sizeof(Shared));
    std::atomic_thread_fence(std::memory_order_acquire);
    uint64_t b = s->seq.load(std::memory_order_relaxed);
    ok = a == b && (a & 1) == 0;
  }
  int64_t now = monotonic_ns();
  ::munmap(m, kFileBytes);
  const auto& r = *reinterpret_cast<const Shared*>(buf);
  if (r.magic != kMagic || r.phase < 0 || r.phase >= kPhases || r.base_phase < 0 || r.base_phase >= kPhases)
    return std::nullopt;
  ProgressSample out;
  out.pid = r.pid;
  out.rank = r.rank;
  out.world = r.world;
  out.step = r.step;
  out.phase = Phase(r.phase);
  out.base_phase = Phase(r.base_phase);
  out.events = r.events;
  out.last_event_ns = r.last_event_ns;
  for (int p = 0; p < kPhases; ++p) out.phase_ns[size_t(p)] = r.phase_ns[p];
  out.phase_ns[size_t(r.phase)] += std::max<int64_t>(0, now - r.since_ns);
  out.ops_started = r.ops_started;
  out.ops_finished = r.ops_finished;
  out.ops_failed = r.ops_failed;
  out.bytes = r.bytes;
  out.inflight = r.inflight;
  out.waiting = r.waiting;
  out.last_op = std::string(r.last_op, strnlen(r.last_op, sizeof(r.last_op)));
  out.wait_op = std::string(r.wait_op, strnlen(r.wait_op, sizeof(r.wait_op)));
  out.now_ns = now;
  return out;
}

}  // namespace atl::resilience
