// `atoll bench comm`: all_reduce, reduce_scatter and all_gather bandwidth against message size,
// reported as nccl-tests does (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
//   algbw = size / time;  busbw = algbw * 2(n-1)/n for all_reduce, algbw * (n-1)/n for
//   reduce_scatter and all_gather, where size is the full buffer (all_reduce's tensor,
//   reduce_scatter's input, all_gather's output). busbw is comparable to the link's bandwidth.
// Inside a job (`atoll launch ... -- atoll bench comm`, `mpirun ... atoll bench comm`) it measures
// that job's backend. Run plainly, it starts one job per backend itself (Gloo through
// `atoll launch`, MPI through mpirun) and prints them side by side with the host's memcpy
// bandwidth, the ceiling for any transport between processes on one host.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <unistd.h>
#include <vector>

#include "cli/command.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"

namespace atl::cli {

namespace {

using clock_type = std::chrono::steady_clock;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}
const char* kOps[] = {"all_reduce", "reduce_scatter", "all_gather"};

double bus_factor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : double(n - 1) / n;
}

struct Opts {
  int64_t min_bytes = 1024, max_bytes = 16 << 20;
  int nproc = 2;
  double seconds = 0.2;  // time per size, spread over as many iterations as fit
  // --samples N: at least N iterations per size, each timed alone, printed as SAMPLE lines (rank
  // 0's time of that collective) so that a caller can take medians: one descheduled rank on a
  // loaded host adds milliseconds to one iteration, and a mean carries it into every size.
  int samples = 0;
  std::string backends = "gloo,mpi";
  bool in_job = false;
  // --gap-us: all-reduces with about this much compute on every rank before each one (see
  // run_gapped); empty: none.
  std::vector<double> gaps_us;
};

// backend -> op -> bytes -> seconds
using Results = std::map<std::string, std::map<std::string, std::map<int64_t, double>>>;
void print_table(const Results& res, int n);

// All-reduces as training issues them: each rank computes (GEMMs, the same count on every rank)
// for about `gap` µs of CPU time, then enters the collective. Back to back, both ranks arrive
// together and neither sleeps long; with compute between, the rank that finishes first sleeps
// until its peer has finished its own compute (their times differ: caches, the memory the two
// share, interrupts), and a rank that slept has to be woken. Each iteration prints a GAP line
// (rank 0): the compute's CPU seconds and the collective's wait (wall − process CPU seconds of
// the collective), both the mean over the ranks, since the step's wall clock is the same on every
// rank and its CPU time is counted per rank.
void run_gapped(const Opts& o, comm::Communicator& c) {
  const int n = c.size();
  // One thread per rank, as `atoll plan calibrate` and the self-check run them: the GEMM count is
  // decided from one GEMM's CPU time, which a team of threads spinning at its barriers inflates
  // (on a loaded host, past the whole gap: no compute at all).
  set_num_threads(1);
  constexpr int64_t kDim = 128;  // 4.2 MFLOP per GEMM: tens of µs, fine steps of compute
  std::vector<float> a(kDim * kDim, 0.5f), b(kDim * kDim, 0.25f), y(kDim * kDim, 0.f);
  auto gemm = [&] { cpu::gemm(false, false, kDim, kDim, kDim, 1.f, a.data(), kDim, b.data(), kDim, 0.f, y.data(), kDim); };
  // Rank 0 times one GEMM; every rank then runs the same count per gap.
  Tensor per = Tensor::full({1}, 0.0f);
  for (int i = 0; i < 3; ++i) gemm();
  {
    const double c0 = process_cpu_seconds();
    for (int i = 0; i < 20; ++i) gemm();
    per.data<float>()[0] = float((process_cpu_seconds() - c0) / 20);
  }
  c.broadcast(per, 0);
  const double gemm_s = std::max(1e-7, double(per.data<float>()[0]));
  const int64_t k = std::max(3, o.samples);
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    int64_t elems = std::max<int64_t>(n, bytes / 4 / n * n);
    Tensor big = Tensor::full({elems}, 1.0f);
    c.all_reduce(big);  // warm-up
    for (double gap_us : o.gaps_us) {
      const int64_t reps = int64_t(std::llround(1e-6 * gap_us / gemm_s));
      Tensor comp = Tensor::zeros({k}), wait = Tensor::zeros({k});
      c.barrier();
      for (int64_t i = 0; i < k; ++i) {
        const double c0 = process_cpu_seconds();
        for (int64_t r = 0; r < reps; ++r) gemm();
        const double c1 = process_cpu_seconds();
        const auto t1 = clock_type::now();
        c.all_reduce(big);
        const double wall = std::chrono::duration<double>(clock_type::now() - t1).count();
        comp.data<float>()[i] = float(c1 - c0);
        wait.data<float>()[i] = float(wall - (process_cpu_seconds() - c1));
      }
      c.all_reduce(comp);
      c.all_reduce(wait);
      if (c.rank() == 0)
        for (int64_t i = 0; i < k; ++i)
          std::printf("GAP %s all_reduce %d %lld %.9f %.9f\n", c.backend().c_str(), n, (long long)(elems * 4),
                      double(comp.data<float>()[i]) / n, double(wait.data<float>()[i]) / n);
      std::fflush(stdout);
    }
  }
}

// One measurement per (op, size): the slowest rank's mean time per iteration. With --in-job
// rank 0 prints machine-readable RESULT lines for the driver, otherwise the table.
void run_in_job(const Opts& o) {
  Results res;
  auto c = comm::make_communicator("auto");
  const int n = c->size();
  if (!o.gaps_us.empty()) return run_gapped(o, *c);
  for (const char* op : kOps) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
      int64_t elems = std::max<int64_t>(n, bytes / 4 / n * n);  // f32, divisible by n
      Tensor big = Tensor::full({elems}, 1.0f), part = Tensor::full({elems / n}, 1.0f);
      auto once = [&] {
        if (!std::strcmp(op, "all_reduce")) c->all_reduce(big);
        else if (!std::strcmp(op, "reduce_scatter")) c->reduce_scatter(big, part);
        else c->all_gather(part, big);
      };
      once();  // warm-up: connections, page faults
      // Every rank must run the same iteration count: rank 0 decides from its warm-up time.
      c->barrier();
      auto t0 = clock_type::now();
      once();
      Tensor iters = Tensor::empty({1}, DType::i64);
      double one = std::chrono::duration<double>(clock_type::now() - t0).count();
      iters.data<int64_t>()[0] =
          std::max<int64_t>(o.samples, std::clamp<int64_t>(int64_t(o.seconds / std::max(one, 1e-6)), 3, 1000));
      c->broadcast(iters, 0);
      int64_t k = iters.data<int64_t>()[0];
      std::vector<double> each, each_cpu;
      c->barrier();
      t0 = clock_type::now();
      for (int64_t i = 0; i < k; ++i) {
        auto ti = clock_type::now();
        const double ci = process_cpu_seconds();
        once();
        if (o.samples > 0) {
          each.push_back(std::chrono::duration<double>(clock_type::now() - ti).count());
          each_cpu.push_back(process_cpu_seconds() - ci);
        }
      }
      Tensor t = Tensor::full({1}, float(std::chrono::duration<double>(clock_type::now() - t0).count() / k));
      if (c->rank() == 0 && o.in_job)
        for (double x : each)
          std::printf("SAMPLE %s %s %d %lld %.9f\n", c->backend().c_str(), op, n, (long long)(elems * 4), x);
      // The same iterations in CPU seconds of this rank's process (its backend's threads included):
      // what the collective costs while the rank has its core, beside the wall clock's wait for a
      // peer the scheduler has not run yet (`atoll plan calibrate` on a loaded host).
      if (c->rank() == 0 && o.in_job)
        for (double x : each_cpu)
          std::printf("CPUTIME %s %s %d %lld %.9f\n", c->backend().c_str(), op, n, (long long)(elems * 4), x);
      c->all_reduce(t, comm::ReduceOp::max);
      res[c->backend()][op][elems * 4] = double(t.f32()[0]);
      if (c->rank() == 0 && o.in_job) {
        std::printf("RESULT %s %s %d %lld %.9f\n", c->backend().c_str(), op, n,
                    (long long)(elems * 4), double(t.f32()[0]));
        std::fflush(stdout);
      }
    }
  }
  if (c->rank() == 0 && !o.in_job) print_table(res, n);
}

double memcpy_gbps(int64_t bytes) {
  std::vector<char> a(size_t(bytes), 1), b(size_t(bytes), 0);
  std::memcpy(b.data(), a.data(), a.size());
  int k = 0;
  auto t0 = clock_type::now();
  double el = 0;
  while (el < 0.2 || k < 3) {
    std::memcpy(k % 2 ? a.data() : b.data(), k % 2 ? b.data() : a.data(), a.size());
    ++k;
    el = std::chrono::duration<double>(clock_type::now() - t0).count();
  }
  return double(bytes) * k / el / 1e9;
}

std::string self_path() {
  char buf[4096] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(n > 0, "cannot find the atoll binary (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

void collect(const std::string& cmd, Results& res, int& ranks) {
  FILE* p = popen(cmd.c_str(), "r");
  ATOLL_CHECK(p, "cannot run: {}", cmd);
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    const char* r = std::strstr(line, "RESULT ");
    if (!r) {
      std::fputs(line, stderr);
      continue;
    }
    char backend[32], op[32];
    int n;
    long long bytes;
    double secs;
    if (std::sscanf(r, "RESULT %31s %31s %d %lld %lf", backend, op, &n, &bytes, &secs) == 5) {
      res[backend][op][bytes] = secs;
      ranks = n;
    }
  }
  int rc = pclose(p);
  if (rc != 0) std::fprintf(stderr, "bench comm: `%s` failed (status %d)\n", cmd.c_str(), rc);
}

void print_table(const Results& res, int n) {
  std::vector<std::string> bks;
  for (auto& [b, _] : res) bks.push_back(b);
  for (const char* op : kOps) {
    std::printf("\n%s, %d ranks, f32 (GB/s; time in us)\n%12s", op, n, "size(B)");
    for (auto& b : bks) std::printf(" | %8s %9s %9s", (b + ":us").c_str(), "algbw", "busbw");
    std::printf("\n");
    std::map<int64_t, int> sizes;
    for (auto& b : bks)
      if (res.at(b).count(op))
        for (auto& [s, _] : res.at(b).at(op)) sizes[s] = 1;
    for (auto& [s, _] : sizes) {
      std::printf("%12lld", (long long)s);
      for (auto& b : bks) {
        auto& m = res.at(b);
        auto it = m.find(op);
        if (it == m.end() || !it->second.count(s)) {
          std::printf(" | %8s %9s %9s", "-", "-", "-");
          continue;
        }
        double t = it->second.at(s), alg = double(s) / t / 1e9;
        std::printf(" | %8.1f %9.3f %9.3f", t * 1e6, alg, alg * bus_factor(op, n));
      }
      std::printf("\n");
    }
  }
}

int run_bench_comm(int argc, char** argv) {
  Opts o;
  CLI::App app{"Collective bandwidth (algbw, busbw as nccl-tests), Gloo and MPI side by side"};
  app.add_option("--nproc", o.nproc, "ranks per job when this command starts the jobs itself")
      ->check(CLI::Range(2, 64));
  app.add_option("--min-bytes", o.min_bytes, "smallest message")->check(CLI::Range(int64_t(4), int64_t(1) << 34));
  app.add_option("--max-bytes", o.max_bytes, "largest message")->check(CLI::Range(int64_t(4), int64_t(1) << 34));
  app.add_option("--seconds", o.seconds, "time spent per message size");
  app.add_option("--samples", o.samples, "with --in-job: at least this many iterations per size, each printed as a "
                                         "SAMPLE line")
      ->check(CLI::Range(0, 100000));
  app.add_option("--gap-us", o.gaps_us, "with --in-job: instead of the tables, all-reduces with this many µs of "
                                       "compute on every rank before each one (a list), --samples of each, printed as "
                                       "GAP lines: compute CPU seconds, then the collective's wall − CPU seconds")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--backends", o.backends, "comma-separated, when this command starts the jobs: gloo,mpi");
  app.add_flag("--in-job", o.in_job, "measure the current job's backend (implied under a launcher)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto env = comm::DistEnv::from_environment();
  ATOLL_CHECK(o.gaps_us.empty() || o.in_job || env.world_size > 1,
              "--gap-us measures inside a job: run `atoll launch --nproc-per-node N -- atoll bench comm --in-job "
              "--gap-us ...`");
  if (o.in_job || env.world_size > 1) {
    run_in_job(o);
    return 0;
  }
  std::string self = self_path();
  std::string args = fmt::format("bench comm --in-job --min-bytes {} --max-bytes {} --seconds {}",
                                 o.min_bytes, o.max_bytes, o.seconds);
  Results res;
  int n = o.nproc;
  if (o.backends.find("gloo") != std::string::npos)
    collect(fmt::format("'{}' launch --nproc-per-node {} -- '{}' {}", self, o.nproc, self, args), res, n);
  if (o.backends.find("mpi") != std::string::npos) {
    if (comm::mpi_available())
      collect(fmt::format("OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 mpirun --allow-run-as-root "
                          "--oversubscribe -np {} '{}' {}",
                          o.nproc, self, args),
              res, n);
    else
      std::printf("MPI: atoll was built without MPI; skipped\n");
  }
  ATOLL_CHECK(!res.empty(), "no backend produced results");
  print_table(res, n);
  std::printf("\nhost memcpy bandwidth (the ceiling for busbw between processes on one host): %.2f GB/s "
              "for %lld-byte copies\n",
              memcpy_gbps(o.max_bytes), (long long)o.max_bytes);
  return 0;
}

Registrar reg({"bench comm", "collective bandwidth (algbw/busbw), Gloo vs MPI, vs memcpy", run_bench_comm});

}  // namespace

}  // namespace atl::cli
