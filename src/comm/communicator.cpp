// Communicator base: checks, bf16 widening, the in-order worker thread and deadlines shared by
// every backend. The queue-per-communicator design follows NCCL's stream semantics (operations on
// one communicator complete in issue order), which is what lets DDP overlap bucket reductions
// with backward without any cross-rank reordering.
#include "comm/communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "comm/collective_observer.h"
#include "comm/network_partition.h"
#include "core/log.h"

namespace atl::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

Millis default_timeout() {
  if (const char* s = std::getenv("ATOLL_COMM_TIMEOUT")) {
    char* end = nullptr;
    double v = std::strtod(s, &end);
    ATOLL_CHECK(end != s && v > 0, "ATOLL_COMM_TIMEOUT='{}' is not a positive number of seconds", s);
    return Millis(int64_t(v * 1000));
  }
  return Millis(300000);
}

// ---------------------------------------------------------------------------------------------
// Work

void Work::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  // issue 14's watcher: a caller blocked here is "in a collective" (comm/collective_observer.h).
  struct Blocked {
    CollectiveObserver* o = nullptr;
    ~Blocked() {
      if (o) o->wait_end();
    }
  } blocked;
  if ((!done_ || (finish_ && !finished_)) && (blocked.o = collective_observer())) blocked.o->wait_begin(name_);
  // A long wait says so now and then (a stopped or unreachable peer used to mean minutes of
  // silence before the timeout's message).
  const Millis note_every = std::clamp(timeout_ / 4, Millis(1000), Millis(30000));
  int notes = 0;
  while (!done_) {
    cv_.wait_for(lk, Millis(200));
    if (!done_ && started_ && note_every < timeout_) {
      auto waited = std::chrono::steady_clock::now() - start_time_;
      if (waited >= note_every * (notes + 1)) {
        ++notes;
        log::warn("{}: still waiting after {:.0f} s (gives up after {:.0f} s): a peer is slow, stopped or unreachable",
                  name_, std::chrono::duration<double>(waited).count(), timeout_.count() / 1000.0);
      }
    }
    // The backend enforces the deadline; this only catches a backend call that ignores it.
    if (!done_ && started_ &&
        std::chrono::steady_clock::now() - start_time_ > timeout_ + Millis(10000))
      fail("{} did not finish within its timeout of {:.1f} s plus 10 s; the backend is stuck", name_,
           timeout_.count() / 1000.0);
  }
  if (!error_.empty()) throw Error(error_);
  if (finish_ && !finished_) {
    finished_ = true;
    auto f = std::move(finish_);
    lk.unlock();
    try {
      f();
    } catch (const Error& e) {
      std::lock_guard<std::mutex> g(mu_);
      error_ = e.what();
      throw;
    }
  }
}

bool Work::done() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_ && !finish_;
}

// ---------------------------------------------------------------------------------------------
// Communicator

Communicator::Communicator(int rank, int size, std::vector<int> world_ranks, Millis timeout)
    : rank_(rank), size_(size), world_ranks_(std::move(world_ranks)), timeout_(timeout) {
  if (world_ranks_.empty())
    for (int i = 0; i < size; ++i) world_ranks_.push_back(i);
  ATOLL_CHECK(int(world_ranks_.size()) == size_, "communicator: {} world ranks for size {}",
              world_ranks_.size(), size_);
}

Communicator::~Communicator() { stop_worker(); }

void Communicator::start_worker() { worker_ = std::thread([this] { worker_loop(); }); }

void Communicator::stop_worker() {
  {
    std::lock_guard<std::mutex> lk(qmu_);
    stopping_ = true;
  }
  qcv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

Millis Communicator::remaining() const {
  auto left = std::chrono::duration_cast<Millis>(op_deadline_ - std::chrono::steady_clock::now());
  return left < Millis(1) ? Millis(1) : left;
}

std::string Communicator::describe_failure(const std::string& op, const std::exception& e) {
  std::string diag;
  try {
    diag = diagnose();
  } catch (const std::exception& d) {
    diag = std::string("(diagnosis failed: ") + d.what() + ")";
  }
  return fmt::format("{} on {} rank {} (of {}) failed: {}{}{}", op, backend(), world_ranks_[rank_],
                     size_, diag, diag.empty() ? "" : "; ", e.what());
}

WorkPtr Communicator::enqueue(std::string op, std::vector<Tensor> keep,
                              std::function<void(Work&)> run) {
  auto w = std::make_shared<Work>();
  w->keep_ = std::move(keep);
  w->run_ = std::move(run);
  w->timeout_ = timeout_;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    w->seq_ = ++seq_;
    w->name_ = fmt::format("{} #{}", op, w->seq_);
    ATOLL_CHECK(!stopping_, "{} issued on a communicator that is shutting down", w->name_);
    queue_.push_back(w);
  }
  qcv_.notify_one();
  return w;
}

void Communicator::worker_loop() {
  for (;;) {
    WorkPtr w;
    {
      std::unique_lock<std::mutex> lk(qmu_);
      qcv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything issued has run
      w = queue_.front();
      queue_.pop_front();
      running_ = w;
      if (!aborted_.empty() && failed_.empty()) failed_ = aborted_;
    }
    std::string err;
    if (!failed_.empty()) {
      err = fmt::format("{} not run: this communicator failed earlier: {}", w->name_, failed_);
    } else {
      {
        std::lock_guard<std::mutex> lk(w->mu_);
        w->started_ = true;
        w->start_time_ = std::chrono::steady_clock::now();
      }
      op_deadline_ = std::chrono::steady_clock::now() + w->timeout_;
      running_seq_ = w->seq_;
      CollectiveObserver* obs = collective_observer();  // issue 14's watcher
      if (obs) {
        int64_t bytes = 0;
        for (const auto& t : w->keep_) bytes += t.defined() ? int64_t(t.nbytes()) : 0;
        obs->op_started(w->name_, bytes);
      }
      try {
        on_op_start(w->name_, w->seq_);
        if (this_process_partitioned()) {  // nothing leaves or arrives: the op waits out its deadline
          std::this_thread::sleep_until(op_deadline_);
          fail("no answer from any peer within the timeout of {:.1f} s", double(w->timeout_.count()) / 1000.0);
        }
        w->run_(*w);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(qmu_);
        err = aborted_.empty() ? describe_failure(w->name_, e)
                               : fmt::format("{} aborted: {}", w->name_, aborted_);
        failed_ = err;
      }
      if (obs) obs->op_finished(w->name_, err.empty());
    }
    {
      std::lock_guard<std::mutex> lk(qmu_);
      running_.reset();
    }
    {
      std::lock_guard<std::mutex> lk(w->mu_);
      if (w->done_) continue;  // abort() already failed it
      w->done_ = true;
      w->error_ = err;
      w->run_ = nullptr;
      if (!err.empty()) w->finish_ = nullptr;
    }
    w->cv_.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------
// Argument checks and the public operations

static void check_tensor(const Tensor& t, const char* op, const char* what) {
  ATOLL_CHECK(t.defined(), "{}: {} tensor is undefined", op, what);
  ATOLL_CHECK(t.device().is_cpu(), "{}: {} tensor is on {}; this communicator handles CPU tensors", op,
              what, t.device().str());
  ATOLL_CHECK(t.is_contiguous(), "{}: {} tensor {} is not contiguous; call .contiguous() first", op,
              what, shape_str(t.shape()));
}

static void check_reduce(const Tensor& t, ReduceOp op, const char* name) {
  ATOLL_CHECK(op != ReduceOp::avg || t.dtype() == DType::f32 || t.dtype() == DType::bf16,
              "{}: avg needs a floating-point tensor, got {}", name, dtype_name(t.dtype()));
}

// avg becomes sum followed by a scale, in f32.
static void scale_f32(const Tensor& t, float s) {
  float* p = t.f32();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] *= s;
}

WorkPtr Communicator::all_reduce_async(const Tensor& t, ReduceOp op) {
  check_tensor(t, "all_reduce", "the");
  check_reduce(t, op, "all_reduce");
  return enqueue("all_reduce", {t}, [this, t, op](Work&) {
    ReduceOp bop = op == ReduceOp::avg ? ReduceOp::sum : op;
    if (t.dtype() == DType::bf16) {
      Tensor w = t.to(DType::f32);
      run_all_reduce(w, bop);
      if (op == ReduceOp::avg) scale_f32(w, 1.0f / float(size_));
      Tensor(t).copy_from(w);
    } else {
      run_all_reduce(t, bop);
      if (op == ReduceOp::avg) scale_f32(t, 1.0f / float(size_));
    }
  });
}

WorkPtr Communicator::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) {
  check_tensor(in, "reduce_scatter", "input");
  check_tensor(out, "reduce_scatter", "output");
  check_reduce(in, op, "reduce_scatter");
  ATOLL_CHECK(in.dtype() == out.dtype(), "reduce_scatter: input is {} but output is {}",
              dtype_name(in.dtype()), dtype_name(out.dtype()));
  ATOLL_CHECK(in.numel() == out.numel() * size_,
              "reduce_scatter: input has {} elements, expected size ({}) x output ({})", in.numel(),
              size_, out.numel());
  return enqueue("reduce_scatter", {in, out}, [this, in, out, op](Work&) {
    ReduceOp bop = op == ReduceOp::avg ? ReduceOp::sum : op;
    if (in.dtype() == DType::bf16) {
      Tensor wi = in.to(DType::f32), wo = Tensor::empty(out.shape(), DType::f32);
      run_reduce_scatter(wi, wo, bop);
      if (op == ReduceOp::avg) scale_f32(wo, 1.0f / float(size_));
      Tensor(out).copy_from(wo);
    } else {
      run_reduce_scatter(in, out, bop);
      if (op == ReduceOp::avg) scale_f32(out, 1.0f / float(size_));
    }
  });
}

WorkPtr Communicator::all_gather_async(const Tensor& in, const Tensor& out) {
  check_tensor(in, "all_gather", "input");
  check_tensor(out, "all_gather", "output");
  ATOLL_CHECK(in.dtype() == out.dtype(), "all_gather: input is {} but output is {}",
              dtype_name(in.dtype()), dtype_name(out.dtype()));
  ATOLL_CHECK(out.numel() == in.numel() * size_,
              "all_gather: output has {} elements, expected size ({}) x input ({})", out.numel(),
              size_, in.numel());
  return enqueue("all_gather", {in, out}, [this, in, out](Work&) { run_all_gather(in, out); });
}

WorkPtr Communicator::broadcast_async(const Tensor& t, int root) {
  check_tensor(t, "broadcast", "the");
  ATOLL_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group of {}", root,
              size_);
  return enqueue("broadcast", {t}, [this, t, root](Work&) { run_broadcast(t, root); });
}

WorkPtr Communicator::all_to_all_async(const Tensor& in, const Tensor& out) {
  check_tensor(in, "all_to_all", "input");
  check_tensor(out, "all_to_all", "output");
  ATOLL_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(),
              "all_to_all: input ({} x {}) and output ({} x {}) must match", dtype_name(in.dtype()),
              in.numel(), dtype_name(out.dtype()), out.numel());
  ATOLL_CHECK(in.numel() % size_ == 0, "all_to_all: {} elements do not split into {} equal chunks",
              in.numel(), size_);
  return enqueue("all_to_all", {in, out}, [this, in, out](Work&) { run_all_to_all(in, out); });
}

WorkPtr Communicator::post_p2p(const char* op, const Tensor& t, int peer, int tag) {
  check_tensor(t, op, "the");
  ATOLL_CHECK(peer >= 0 && peer < size_ && peer != rank_, "{}: peer {} is not another rank of 0..{}", op, peer,
              size_ - 1);
  ATOLL_CHECK(tag >= 0 && tag < (1 << 20), "{}: tag {} is outside 0..2^20", op, tag);
  const bool is_send = std::string(op) == "send";
  // Posted in issue order on the worker; completed in wait(), so an isend/irecv pair cannot deadlock.
  return enqueue(fmt::format("{} {} {}", op, is_send ? "to" : "from", peer), {t}, [this, t, peer, tag, is_send](Work& w) {
    auto fin = is_send ? post_send(t, peer, tag) : post_recv(t, peer, tag);
    std::string name = w.name_;
    w.finish_ = [this, fin, name] {
      try {
        fin();
      } catch (const std::exception& e) {
        throw Error(describe_failure(name, e));
      }
    };
  });
}

WorkPtr Communicator::send_async(const Tensor& t, int peer, int tag) { return post_p2p("send", t, peer, tag); }
WorkPtr Communicator::recv_async(const Tensor& t, int peer, int tag) { return post_p2p("recv", t, peer, tag); }

WorkPtr Communicator::barrier_async() {
  return enqueue("barrier", {}, [this](Work&) { run_barrier(); });
}

WorkPtr Communicator::run_async(const std::string& what, std::function<void()> fn) {
  return enqueue(what, {}, [fn = std::move(fn)](Work&) { fn(); });
}

void Communicator::abort(const std::string& why) {
  std::vector<WorkPtr> fail_now;
  {
    std::lock_guard<std::mutex> lk(qmu_);
    if (!aborted_.empty()) return;
    aborted_ = why.empty() ? std::string("aborted") : why;
    if (running_) fail_now.push_back(running_);
    fail_now.insert(fail_now.end(), queue_.begin(), queue_.end());
  }
  for (auto& w : fail_now) {
    {
      std::lock_guard<std::mutex> lk(w->mu_);
      if (w->done_) continue;
      w->done_ = true;
      w->error_ = fmt::format("{} aborted: {}", w->name_, why);
      w->finish_ = nullptr;
    }
    w->cv_.notify_all();
  }
  run_abort();
}

bool Communicator::aborted() const {
  std::lock_guard<std::mutex> lk(const_cast<std::mutex&>(qmu_));
  return !aborted_.empty();
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  Tensor mine = Tensor::empty({2}, DType::i64);
  mine.data<int64_t>()[0] = color;
  mine.data<int64_t>()[1] = key;
  Tensor all = Tensor::empty({2 * int64_t(size_)}, DType::i64);
  all_gather(mine, all);
  std::vector<std::pair<int64_t, int>> order;  // (key, rank) of my color
  for (int r = 0; r < size_; ++r)
    if (all.data<int64_t>()[2 * r] == color) order.push_back({all.data<int64_t>()[2 * r + 1], r});
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  int new_rank = -1;
  for (auto& [k, r] : order) {
    if (r == rank_) new_rank = int(members.size());
    members.push_back(r);
  }
  std::unique_ptr<Communicator> result;
  // Every rank runs the split step, so backends that need a collective (MPI_Comm_split) get one.
  enqueue("split", {}, [&](Work&) {
    result = run_split(color < 0 ? std::vector<int>{} : members, color < 0 ? -1 : new_rank, color);
  })->wait();
  return result;
}

}  // namespace atl::comm
