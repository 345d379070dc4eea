#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>
#include <thread>

#include "autograd/graph.h"
#include "comm/tcp_store.h"
#include "core/threads.h"
#include "optim/adams.h"
#include "optim/clip.h"
#include "parallel/data_parallel.h"
#include "tensor/safetensors.h"

namespace atl::parallel::test {

namespace {

constexpr int64_t kT = 12;
float kEps = std::getenv("ATOLL_TEST_EPS") ? float(std::atof(std::getenv("ATOLL_TEST_EPS"))) : 1e-5f;

// Rows [row0, row0 + rows) of global micro-batch (step, micro).
void fill_rows(int step, int micro, int row0, int rows, int64_t vocab, Tensor& x, Tensor& y) {
  x = Tensor::empty({rows, kT}, DType::i32);
  y = Tensor::empty({rows, kT}, DType::i32);
  for (int r = 0; r < rows; ++r) {
    // A learnable pattern (each token mostly follows from the previous) plus noise.
    int32_t prev = int32_t(mix(uint64_t(step) * 1000003 + uint64_t(micro) * 7919 + uint64_t(row0 + r)) % uint64_t(vocab));
    for (int64_t t = 0; t <= kT; ++t) {
      uint64_t h = mix((uint64_t(step) << 40) ^ (uint64_t(micro) << 32) ^ (uint64_t(row0 + r) << 12) ^ uint64_t(t));
      int32_t tok = (h % 4 == 0) ? int32_t(h % uint64_t(vocab)) : int32_t((prev * 5 + 3) % vocab);
      if (t < kT) x.i32()[r * kT + t] = tok;
      if (t > 0) y.i32()[r * kT + t - 1] = tok;
      prev = tok;
    }
  }
}

std::vector<float> flatten(const std::vector<std::pair<std::string, Tensor>>& sd) {
  std::vector<float> out;
  for (auto& [n, t] : sd) {
    Tensor c = t.contiguous();
    out.insert(out.end(), c.f32(), c.f32() + c.numel());
  }
  return out;
}

}  // namespace

nn::GPTConfig tiny_model() {
  nn::GPTConfig c = nn::GPTConfig::preset("gpt2-tiny");
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 2;
  c.n_kv_head = 2;
  return c;
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}


void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
  ATOLL_CHECK(f.good(), "cannot write {}", path);
}

std::vector<float> read_floats(const std::string& path) {
  std::string s = read_file(path);
  std::vector<float> v(s.size() / sizeof(float));
  std::memcpy(v.data(), s.data(), v.size() * sizeof(float));
  return v;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(double(b[i])), 1e-3));
  return m;
}

std::vector<std::string> Job::to_args() const {
  std::string ds;
  for (size_t i = 0; i < data_steps.size(); ++i) ds += (i ? "," : "") + std::to_string(data_steps[i]);
  return {"strategy=" + strategy, "steps=" + std::to_string(steps), "start_step=" + std::to_string(start_step),
          "batch=" + std::to_string(batch), "accum=" + std::to_string(accum), "bucket_mb=" + fmt::format("{}", bucket_mb),
          "hsdp_shard=" + std::to_string(hsdp_shard), "data_steps=" + ds, "load=" + load, "save=" + save,
          "out=" + out, "codec=" + codec, "error_feedback=" + std::to_string(int(error_feedback)), "optim=" + optim,
          "scape_sparsity=" + fmt::format("{}", scape_sparsity)};
}

Job Job::from_args(int argc, char** argv) {
  Job j;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    size_t eq = a.find('=');
    ATOLL_CHECK(eq != std::string::npos, "worker argument '{}' is not key=value", a);
    std::string k = a.substr(0, eq), v = a.substr(eq + 1);
    if (k == "strategy") j.strategy = v;
    else if (k == "steps") j.steps = std::stoi(v);
    else if (k == "start_step") j.start_step = std::stoi(v);
    else if (k == "batch") j.batch = std::stoi(v);
    else if (k == "accum") j.accum = std::stoi(v);
    else if (k == "bucket_mb") j.bucket_mb = std::stod(v);
    else if (k == "hsdp_shard") j.hsdp_shard = std::stoi(v);
    else if (k == "load") j.load = v;
    else if (k == "save") j.save = v;
    else if (k == "out") j.out = v;
    else if (k == "codec") j.codec = v;
    else if (k == "error_feedback") j.error_feedback = v == "1";
    else if (k == "optim") j.optim = v;
    else if (k == "scape_sparsity") j.scape_sparsity = std::stod(v);
    else if (k == "data_steps") {
      std::stringstream ss(v);
      std::string item;
      while (std::getline(ss, item, ',')) j.data_steps.push_back(std::stoi(item));
    } else fail("unknown worker argument '{}'", k);
  }
  return j;
}

std::vector<float> run_job(comm::Communicator* comm, const Job& job) {
  int W = comm ? comm->size() : 1, r = comm ? comm->rank() : 0;
  nn::GPTConfig mc = tiny_model();
  nn::GPT model(mc);
  model.init_weights(7);
  ParallelConfig pc;
  pc.strategy = job.strategy;
  pc.bucket_mb = job.bucket_mb;
  pc.hsdp_shard_size = job.hsdp_shard;
  pc.codec.codec = job.codec;
  pc.codec.error_feedback = job.error_feedback;
  pc.scape_sparsity = job.scape_sparsity;
  AdamWConfig ac{1e-2f, 0.9f, 0.95f, kEps, 0.1f};
  std::unique_ptr<Optimizer> opt;
  if (job.optim == "adams") opt = std::make_unique<AdamS>(model.param_refs(), AdamSConfig{1e-2f, 0.9f, 0.95f, kEps, 0.1f});
  auto dp = make_data_parallel(model, comm, pc, ac, std::move(opt));
  if (!job.load.empty()) {
    TensorFile f = load_safetensors(job.load);
    std::vector<std::pair<std::string, Tensor>> msd;
    TensorFile opt;
    for (auto& [n, t] : f.tensors) {
      if (n.rfind("opt.", 0) == 0) opt.tensors.emplace_back(n.substr(4), t);
      else msd.emplace_back(n, t);
    }
    dp->load_full_state(msd, opt, job.load);
  }
  bool uneven = !job.data_steps.empty();
  auto ranks_with_data = [&](int s) {
    int n = 0;
    for (int d : job.data_steps) n += (d < 0 || s < d) ? 1 : 0;
    return n;
  };
  for (int s = job.start_step; s < job.start_step + job.steps; ++s) {
    int rows = job.batch, row0 = r * job.batch;
    bool has = true;
    if (uneven && W == 1) {  // the reference: one rank sees every row the emulated ranks have
      rows = job.batch * ranks_with_data(s);
      if (rows == 0) break;
    } else if (uneven) {
      has = job.data_steps[size_t(r)] < 0 || s < job.data_steps[size_t(r)];
      if (dp->join(has) == 0) break;
    }
    dp->zero_grad();
    for (int m = 0; m < job.accum; ++m) {
      Tensor x, y;
      // A rank without data shadows the step on some batch with a zero seed (see data_parallel.h).
      fill_rows(s, m, row0, rows, mc.vocab_size, x, y);
      dp->set_sync(m + 1 == job.accum);
      Tensor loss = model.loss(x, y);
      backward(loss, has ? 1.f / float(job.accum) : 0.f);
    }
    dp->finish_backward();
    double norm = dp->grad_norm();
    dp->step({1.f, clip_coefficient(norm, 0.5f)});
  }
  if ((job.strategy == "zero3" || job.strategy == "hsdp") && W > 1) {
    // Between steps a ZeRO-3 rank holds only its shard of the weights and of the gradients; the
    // rest has been released (zeroed, pages returned).
    int shards = job.strategy == "hsdp" ? job.hsdp_shard : W;
    auto nonzero = [](const Tensor& t) {
      int64_t n = 0;
      for (int64_t i = 0; i < t.numel(); ++i) n += t.f32()[i] != 0.f;
      return double(n) / double(t.numel());
    };
    double v = nonzero(model.flat_values()), g = nonzero(model.flat_grads());
    ATOLL_CHECK(v <= 1.0 / shards + 0.02 && v > 0.5 / shards, "rank {}: {:.3f} of the weights are resident, expected ~1/{}",
                r, v, shards);
    ATOLL_CHECK(g <= 1.0 / shards + 0.02, "rank {}: {:.3f} of the gradients are resident, expected <= 1/{}", r, g, shards);
  }
  std::vector<std::pair<std::string, Tensor>> msd, osd;
  dp->full_state(msd, osd);
  if (!job.save.empty() && r == 0) {
    std::vector<std::pair<std::string, Tensor>> all = msd;
    for (auto& [n, t] : osd) all.emplace_back("opt." + n, t);
    save_safetensors(job.save, all);
  }
  std::vector<float> params = flatten(msd);
  if (!job.out.empty()) write_floats(job.out + "." + std::to_string(r), params);
  if (comm) comm->barrier();  // the checkpoint is complete before anyone exits
  return params;
}

int worker_main(int argc, char** argv) {
  try {
    set_num_threads(1);
    Job job = Job::from_args(argc, argv);
    auto comm = comm::make_communicator("gloo");
    run_job(comm.get(), job);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker failed: %s\n", e.what());
    return 1;
  }
}

std::string self_exe() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(n > 0, "readlink /proc/self/exe failed");
  return std::string(buf, size_t(n));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ATOLL_CHECK(f.good(), "cannot read {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

namespace {
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  std::vector<char*> av, ev;
  std::vector<std::string> args = argv;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  std::vector<std::string> ordered = env;  // ours, then the inherited ones we do not override
  for (char** e = environ; *e; ++e) {
    std::string s = *e, key = s.substr(0, s.find('='));
    bool overridden = false;
    for (auto& o : env)
      if (o.compare(0, key.size() + 1, key + "=") == 0) overridden = true;
    if (!overridden) ordered.push_back(s);
  }
  for (auto& e : ordered) ev.push_back(e.data());
  ev.push_back(nullptr);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ATOLL_CHECK(fd >= 0, "cannot open {}", log);
  pid_t pid = fork();
  ATOLL_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(av[0], av.data(), ev.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

// Waits for every pid until the deadline; kills the rest after it. Returns exit codes (-1: killed).
std::vector<int> wait_all(const std::vector<pid_t>& pids, double timeout_s) {
  auto t0 = std::chrono::steady_clock::now();
  std::vector<int> codes(pids.size(), -2);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -2) continue;
      int st;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        --left;
      }
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -2) {
          kill(-pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return codes;
}
}  // namespace

// A port is picked before rank 0 listens on it, and another job on the machine can take it in
// between (comm::pick_free_port says how rarely). That is no fault of the code under test, so a
// run whose rank 0 could not listen on its store port is started again on another port, and
// nothing else is retried: every other failure is the test's to report.
static bool lost_store_port(const std::vector<int>& codes, const std::string& tag) {
  if (codes.empty() || codes[0] == 0) return false;
  std::string log0 = read_file(tag + ".log0");
  if (log0.find("tcp store: cannot listen on") == std::string::npos ||
      log0.find("Address already in use") == std::string::npos)
    return false;
  std::fprintf(stderr, "harness: rank 0 lost its store port to another process; starting the ranks again\n");
  for (size_t r = 0; r < codes.size(); ++r) std::remove((tag + ".log" + std::to_string(r)).c_str());
  return true;
}

int run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log,
                double timeout_s) {
  return wait_all({spawn(argv, env, log)}, timeout_s)[0];
}

std::vector<float> run_ranks(int world, const Job& job_in, double timeout_s) {
  Job job = job_in;
  std::string tag = fmt::format("/tmp/atoll_par_{}_{}", getpid(), mix(uint64_t(std::chrono::steady_clock::now().time_since_epoch().count())) % 100000);
  job.out = tag + ".params";
  std::vector<int> codes;
  for (int attempt = 0;; ++attempt) {
    int port = comm::pick_free_port();
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> argv = {self_exe(), "--worker"};
      for (auto& a : job.to_args()) argv.push_back(a);
      pids.push_back(spawn(argv,
                           {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                            "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                            "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port), "ATOLL_COMM_TIMEOUT=30",
                            "OMP_NUM_THREADS=1"},
                           tag + ".log" + std::to_string(r)));
    }
    codes = wait_all(pids, timeout_s);
    if (attempt < 2 && lost_store_port(codes, tag)) continue;
    break;
  }
  std::vector<float> p0;
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    std::string log = read_file(tag + ".log" + std::to_string(r));
    std::remove((tag + ".log" + std::to_string(r)).c_str());
    if (codes[size_t(r)] != 0) {
      ok = false;
      ADD_FAILURE() << "rank " << r << (codes[size_t(r)] == -1 ? " timed out" : " exited with " + std::to_string(codes[size_t(r)]))
                    << "; its output:\n" << log;
    }
  }
  if (!ok) return {};
  for (int r = 0; r < world; ++r) {
    std::string f = job.out + "." + std::to_string(r);
    std::vector<float> p = read_floats(f);
    std::remove(f.c_str());
    if (r == 0) p0 = p;
    else EXPECT_EQ(rel_diff(p, p0), 0.0) << "rank " << r << " ended with different parameters than rank 0";
  }
  return p0;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

std::vector<int> run_rank_programs(int world, const std::string& gtest_filter, const std::vector<std::string>& env,
                                   const std::string& tag, double timeout_s) {
  for (int attempt = 0;; ++attempt) {
    int port = comm::pick_free_port();
    std::vector<int> codes(static_cast<size_t>(world), -2);
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        std::vector<std::string> e = {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                                      "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                      "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                      "ATOLL_COMM_TIMEOUT=30", "OMP_NUM_THREADS=1", "GTEST_OUTPUT="};
        e.insert(e.end(), env.begin(), env.end());
        codes[size_t(r)] = run_command({self_exe(), "--gtest_filter=" + gtest_filter}, e,
                                       tag + ".log" + std::to_string(r), timeout_s);
      });
    for (auto& t : th) t.join();
    if (attempt < 2 && lost_store_port(codes, tag)) continue;
    return codes;
  }
}

std::map<std::string, std::vector<float>> collect_kinds(const std::string& tag, const std::vector<int>& codes,
                                                        const std::vector<std::string>& kinds,
                                                        const std::string& what) {
  const int world = int(codes.size());
  std::map<std::string, std::vector<float>> res;
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    std::string log = tag + ".log" + std::to_string(r);
    if (codes[size_t(r)] != 0) {
      ok = false;
      ADD_FAILURE() << what << ": rank " << r << " of " << world
                    << (codes[size_t(r)] == -1 ? " timed out" : " failed") << "; its output:\n" << read_file(log);
    }
    std::remove(log.c_str());
  }
  if (!ok) return res;
  for (auto& kind : kinds)
    for (int r = 0; r < world; ++r) {
      std::string f = tag + "." + kind + "." + std::to_string(r);
      std::vector<float> p = read_floats(f);
      std::remove(f.c_str());
      if (r == 0) res[kind] = p;
      else EXPECT_EQ(rel_diff(p, res[kind]), 0.0) << what << ", " << kind << ": rank " << r << " differs from rank 0";
    }
  return res;
}

}  // namespace atl::parallel::test
