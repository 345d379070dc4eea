#include "train/fault_campaign_hook.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "comm/network_partition.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "resilience/checkpoint_select.h"
#include "resilience/phase_guard.h"
#include "resilience/progress_record.h"
#include "resilience/step_signature.h"
#include "tensor/safetensors.h"

namespace atl {
namespace fs = std::filesystem;
using resilience::Localization;

namespace {

const std::set<std::string>& trainer_types() {
  static const std::set<std::string> t = {
      "tensor_corruption",     "stale_state",           "config_drift",       "delay",
      "hang",                  "timeout",               "exception",          "process_termination",
      "checkpoint_corruption", "checkpoint_truncation", "checkpoint_missing", "checkpoint_io_error",
      "payload_corruption",    "collective_desync",     "drop",               "duplicate",
      "reorder",               "resource_exhaustion",   "message_drop",       "network_partition"};
  return t;
}
const char* kTrainerTypes =
    "tensor_corruption, stale_state, config_drift, drop, duplicate, reorder, delay, hang, timeout, exception, "
    "resource_exhaustion, process_termination, checkpoint_corruption, checkpoint_truncation, checkpoint_missing, "
    "checkpoint_io_error, payload_corruption, collective_desync, message_drop, network_partition";
int64_t cpu_ns(clockid_t which) {
  timespec t{};
  ::clock_gettime(which, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}
// The boundary's own CPU time on the calling thread (its collectives' waits cost none).
struct CpuTimer {
  int64_t& acc;
  int64_t t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
  ~CpuTimer() { acc += cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0; }
};
int64_t position(const nlohmann::json& data_state) { return data_state.value("position", int64_t(-1)); }
bool storage(const std::string& t) { return t.rfind("checkpoint_", 0) == 0; }

// Above any boundary a healthy rank spends on a loaded 2-core machine (a parameter hash and, on
// rank 0, a scrub of a small checkpoint: milliseconds), below the injected delay.
constexpr int64_t kSlowMs = 1000;
constexpr int kDelayMs = 2500;
constexpr int kStaleSteps = 3;  // stale_state: the state of this many boundaries earlier
constexpr int64_t kMaxTimeoutMs = 60000;  // timeout: the collective timeout it outlasts, at most

// One line, one write(2) with O_APPEND: lines from several ranks never interleave.
void append_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ATOLL_CHECK(fd >= 0, "fault.campaign: cannot open {}: {}", path, std::strerror(errno));
  std::string l = line + "\n";
  ssize_t n = ::write(fd, l.data(), l.size());
  ::fsync(fd);
  ::close(fd);
  ATOLL_CHECK(n == ssize_t(l.size()), "fault.campaign: cannot write {}", path);
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(nlohmann::json::parse(l));
  return out;
}

std::string progress_path(const TrainOptions& o, int rank) {
  const char* env = std::getenv("ATOLL_PROGRESS_DIR");
  std::string dir = env && *env ? env : (fs::path(o.run_dir) / "progress").string();
  return (fs::path(dir) / ("rank" + std::to_string(rank) + ".progress")).string();
}

}  // namespace

CampaignHook::CampaignHook(const TrainOptions& o, comm::Communicator* comm, const std::string& strategy,
                           bool plain_dp, resilience::GradientChecksumComm* grad_check)
    : comm_(comm), grad_check_(grad_check), grad_clip_(o.grad_clip), steps_(o.steps), ckpt_every_(o.ckpt_every),
      grad_accum_(std::max<int64_t>(1, o.grad_accum)), run_dir_(o.run_dir) {
  ATOLL_CHECK(comm && comm->size() > 1 && plain_dp && strategy == "ddp",
              "fault.campaign runs in a distributed data-parallel job (`atoll launch`, parallel.strategy = \"ddp\", "
              "no tp/pp/cp/islands/quorum)");
  rank_ = comm->rank();
  world_ = comm->size();
  c_ = resilience::parse_campaign(read_file(o.fault_campaign), world_, o.fault_campaign);
  for (auto& f : c_.faults) {
    ATOLL_CHECK(trainer_types().count(f.type), "fault.campaign {}: fault {} ({}) is not fired inside atoll train; "
                "these are: {}", o.fault_campaign, f.index, f.type, kTrainerTypes);
    ATOLL_CHECK((f.type != "payload_corruption" && f.type != "message_drop") || grad_check_,
                "fault.campaign {}: fault {} ({}) needs the gradient payload check, which runs under plain DDP "
                "without a gradient codec", o.fault_campaign, f.index, f.type);
    ATOLL_CHECK(f.type != "checkpoint_io_error" || (o.ckpt_every > 0 && f.step % o.ckpt_every == 0),
                "fault.campaign {}: fault {} (checkpoint_io_error) is at step {}, not a checkpoint step (a multiple "
                "of checkpoint.every = {})", o.fault_campaign, f.index, f.step, o.ckpt_every);
    const char* pd = std::getenv("ATOLL_PROGRESS_DIR");
    ATOLL_CHECK(f.type != "hang" || (pd && *pd),
                "fault.campaign {}: fault {} (hang) stops its rank (SIGSTOP): it needs the watcher to name it and end "
                "the job (`atoll launch --watch --watch-hang-s S`)", o.fault_campaign, f.index);
    ATOLL_CHECK((f.type != "timeout" && f.type != "network_partition") || comm->timeout().count() <= kMaxTimeoutMs,
                "fault.campaign {}: fault {} ({}) is found by the collective timeout, now {} ms: give the job a "
                "short one (`atoll launch --timeout S`, S <= {})", o.fault_campaign, f.index, f.type,
                comm->timeout().count(), kMaxTimeoutMs / 1000);
    ATOLL_CHECK(!storage(f.type) || f.ranks == std::vector<int>{0},
                "fault.campaign {}: fault {} ({}) needs \"rank\": 0: in atoll train rank 0 alone writes checkpoints",
                o.fault_campaign, f.index, f.type);
    ATOLL_CHECK(f.step <= o.steps, "fault.campaign {}: fault {} ({}) is at step {}, past train.steps = {}",
                o.fault_campaign, f.index, f.type, f.step, o.steps);
  }
  ATOLL_CHECK(c_.checkpoint_every == o.ckpt_every,
              "fault.campaign {}: its checkpoint_every ({}) must equal checkpoint.every ({}): its storage faults go "
              "to checkpoint steps",
              o.fault_campaign, c_.checkpoint_every, o.ckpt_every);
  dir_ = (fs::path(o.run_dir) / "campaign").string();
  ckpt_dir_ = (fs::path(o.run_dir) / "checkpoints").string();
  if (rank_ == 0) fs::create_directories(dir_);
  comm_->barrier();
  for (auto& j : read_lines(dir_ + "/fired.jsonl")) fired_.push_back(j.at("index").get<int>());
  // How this rank's previous process ended, from its own progress record (before this run's
  // record replaces it): the step it was at and whether a collective of its failed.
  if (auto s = resilience::read_progress(progress_path(o, rank_)); s && s->phase != resilience::Phase::done) {
    old_step_ = s->step;
    old_failed_ = s->ops_failed;
    old_started_ = s->ops_started;
  }
  log::info("fault.campaign: {} faults over {} ranks (seed {}), {} fired before", c_.faults.size(), world_, c_.seed,
            fired_.size());
}

void CampaignHook::record(int64_t step, const std::string& detector, const Localization& where,
                          const std::string& detail, const std::string& recovery) {
  if (where.verdict == Localization::clean) return;
  nlohmann::json d = {{"step", step},
                      {"detector", detector},
                      {"verdict", resilience::verdict_name(where.verdict)},
                      {"ranks", where.ranks},
                      {"detail", detail},
                      {"recovery", recovery}};
  step_dets_.push_back(d);
  if (rank_ == 0) {
    append_line(dir_ + "/detections.jsonl", d.dump());
    std::string ranks;
    for (int r : where.ranks) {
      if (!ranks.empty()) ranks += ',';
      ranks += std::to_string(r);
    }
    log::warn("fault.campaign: step {}: {} {} rank(s) [{}]: {}; recovery: {}", step, detector,
              resilience::verdict_name(where.verdict), ranks, detail, recovery);
  }
}

void CampaignHook::fire(const resilience::ScheduledFault& f, nn::Model& model, parallel::DataParallel& dp, Task& task,
                        const TaskEnv& env) {
  append_line(dir_ + "/fired.jsonl", nlohmann::json{{"index", f.index}, {"type", f.type}, {"step", f.step},
                                                    {"rank", rank_}}.dump());
  log::warn("fault.campaign: rank {} fires {} before step {}", rank_, f.type, f.step);
  if (f.type == "tensor_corruption") {
    float* w = model.flat_values().f32();
    const int64_t i = int64_t((c_.seed * 2654435761u + uint64_t(f.index)) % uint64_t(model.flat_values().numel()));
    uint32_t bits;
    std::memcpy(&bits, w + i, 4);
    bits ^= 1u << 22;  // a mantissa bit: the value stays finite, so only a hash can tell
    std::memcpy(w + i, &bits, 4);
  } else if (f.type == "stale_state") {
    if (stale_from_ < 0) {  // the run resumed at the fault's step: no earlier state in memory
      log::warn("fault.campaign: stale_state before step {}: no earlier state in memory (the run resumed at its "
                "step); nothing put back", f.step);
      return;
    }
    TensorFile mf = safetensors_decode(stale_[0], "the stale weights"), of = safetensors_decode(stale_[1], "the stale optimizer state");
    dp.load_full_state(mf.tensors, of, fmt::format("the state before step {}", stale_from_));
    log::warn("fault.campaign: rank {} put back its weights and optimizer state from before step {}", rank_, stale_from_);
  } else if (f.type == "drop" || f.type == "duplicate" || f.type == "reorder") {
    // The loader skips a batch (drop), goes back to serve the previous one again (duplicate), or
    // serves the one after next first (reorder: batch k + 1, then k; the step sees k + 1).
    if (f.type == "drop") {
      (void)task.next_batch();
    } else {
      ATOLL_CHECK(batch_rows_ > 0 && position(task.data_state()) >= batch_rows_,
                  "fault.campaign: fault {} ({}) at step {}: the loader's batch size is not known yet (place it after "
                  "the run's first step)", f.index, f.type, f.step);
      nlohmann::json st = task.data_state();
      st["position"] = position(st) + (f.type == "duplicate" ? -batch_rows_ : batch_rows_);
      task.set_data_state(st, env);
    }
  } else if (f.type == "resource_exhaustion") {
    // The address space capped 256 MB above its size, then allocations until one fails: the
    // std::bad_alloc ends the process as real memory exhaustion would (nothing is touched: no RSS).
    long pages = 0;
    if (FILE* st = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(st, "%ld", &pages) != 1) pages = 0;
      std::fclose(st);
    }
    rlimit rl{};
    ::getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = rlim_t(pages) * rlim_t(::sysconf(_SC_PAGESIZE)) + (rlim_t(256) << 20);
    ATOLL_CHECK(::setrlimit(RLIMIT_AS, &rl) == 0, "fault.campaign: setrlimit(RLIMIT_AS): {}", std::strerror(errno));
    std::vector<std::unique_ptr<char[]>> hog;
    for (;;) hog.emplace_back(new char[size_t(32) << 20]);
  } else if (f.type == "config_drift") {
    lr_factor_ = 1.5f;  // as a re-read configuration with another learning rate would
  } else if (f.type == "hang") {
    ::raise(SIGSTOP);  // the watcher names it; the launcher's teardown sends SIGCONT with SIGTERM
  } else if (f.type == "timeout") {
    // Alive (its threads run, its progress record is readable) but not at the collective: past the
    // peers' timeout and the launcher's grace, until the teardown ends it.
    std::this_thread::sleep_for(2 * comm_->timeout() + std::chrono::seconds(20));
  } else if (f.type == "payload_corruption") {
    grad_check_->arm_corruption();
  } else if (f.type == "message_drop") {
    grad_check_->arm_drop();
  } else if (f.type == "network_partition") {
    // Its links go down: from here on nothing it sends arrives and nothing reaches it, the store
    // included (comm/network_partition.h); its peers and it time out in the boundary's all-gather.
    comm::partition_this_process();
  } else if (f.type == "delay") {
    std::this_thread::sleep_for(std::chrono::milliseconds(kDelayMs));
  } else if (f.type == "exception") {
    fail("fault.campaign: the injected exception of fault {} (step {})", f.index, f.step);
  } else if (f.type == "process_termination") {
    ::raise(SIGKILL);
  } else if (f.type == "collective_desync") {
    desync_ = true;
  } else if (storage(f.type)) {
    ATOLL_CHECK(!last_ckpt_.empty(), "fault.campaign: fault {} ({}) at step {}: no checkpoint written yet", f.index,
                f.type, f.step);
    const std::string file = last_ckpt_ + "/model.safetensors";
    if (f.type == "checkpoint_missing") {
      fs::remove_all(last_ckpt_);
    } else if (f.type == "checkpoint_truncation") {
      fs::resize_file(file, fs::file_size(file) / 2);
    } else {
      std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(std::streamoff(fs::file_size(file) - 1));
      char b = 0;
      io.read(&b, 1);
      b = char(b ^ 0x10);
      io.seekp(std::streamoff(fs::file_size(file) - 1));
      io.write(&b, 1);
    }
  }
}

// The state of `root` (weights and optimizer) on every rank, as one safetensors blob each.
void CampaignHook::repair_state(int root, nn::Model& model, parallel::DataParallel& dp) {
  std::string blob[2];
  if (rank_ == root) {
    std::vector<std::pair<std::string, Tensor>> m, opt;
    dp.full_state(m, opt);
    blob[0] = safetensors_encode(m, {});
    blob[1] = safetensors_encode(opt, {});
  }
  Tensor len = Tensor::zeros({2}, DType::i64);
  auto* l = static_cast<int64_t*>(len.raw());
  l[0] = int64_t(blob[0].size());
  l[1] = int64_t(blob[1].size());
  comm_->broadcast(len, root);
  Tensor bytes[2];
  for (int k = 0; k < 2; ++k) {
    bytes[k] = Tensor::zeros({(l[k] + 3) / 4}, DType::i32);
    if (rank_ == root) std::memcpy(bytes[k].raw(), blob[k].data(), blob[k].size());
    comm_->broadcast(bytes[k], root);
  }
  if (rank_ == root) return;
  TensorFile mf = safetensors_decode(std::string(static_cast<char*>(bytes[0].raw()), size_t(l[0])), "the repair's weights");
  TensorFile of = safetensors_decode(std::string(static_cast<char*>(bytes[1].raw()), size_t(l[1])), "the repair's optimizer state");
  dp.load_full_state(mf.tensors, of, fmt::format("rank {}'s state", root));
  (void)model;
}

void CampaignHook::at_boundary(int64_t step, int64_t start, nn::Model& model, parallel::DataParallel& dp, Task& task,
                               const TaskEnv& env) {
  entered_ = std::chrono::steady_clock::now();
  CpuTimer timer{cpu_ns_};
  ++boundaries_;
  if (proc_cpu0_ns_ == 0) proc_cpu0_ns_ = cpu_ns(CLOCK_PROCESS_CPUTIME_ID);
  step_ = step;
  step_dets_ = nlohmann::json::array();
  want_checkpoint_ = false;
  desync_ = false;
  auto mine = [&](const resilience::ScheduledFault& f) {
    return std::count(f.ranks.begin(), f.ranks.end(), rank_) && !std::count(fired_.begin(), fired_.end(), f.index);
  };
  // stale_state: this boundary's state kept, when it is the one the fault will put back.
  for (auto& f : c_.faults)
    if (f.type == "stale_state" && mine(f) && stale_from_ < 0 && step >= f.step - kStaleSteps && step < f.step) {
      std::vector<std::pair<std::string, Tensor>> m, opt;
      dp.full_state(m, opt);
      stale_[0] = safetensors_encode(m, {});
      stale_[1] = safetensors_encode(opt, {});
      stale_from_ = step;
    }
  for (auto& f : c_.faults)
    if (f.step == step && mine(f) && f.type != "checkpoint_io_error") {  // that one fires at the save
      fired_.push_back(f.index);
      fire(f, model, dp, task, env);
    }
  const int64_t bad = have_hash_ && resilience::buffer_hash(model.flat_values().raw(), model.flat_values().nbytes()) != param_hash_;
  std::string scrub;
  if (rank_ == 0 && !last_ckpt_.empty()) scrub = fs::exists(last_ckpt_) ? checkpoint_problem(last_ckpt_) : "it is missing";
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - entered_).count();
  const bool bad_data = !data_after_.is_null() && task.data_state() != data_after_;
  constexpr int kF = 8;
  Tensor mine_t = Tensor::zeros({kF}, DType::i64), all = Tensor::zeros({int64_t(kF) * world_}, DType::i64);
  auto* m = static_cast<int64_t*>(mine_t.raw());
  m[0] = ms;
  m[1] = bad;
  m[2] = !scrub.empty();
  m[3] = first_ ? old_step_ : -1;
  m[4] = old_failed_;
  m[5] = old_started_;
  const uint64_t ch = config_hash();
  std::memcpy(&m[6], &ch, 8);
  m[7] = bad_data;
  comm_->all_gather(mine_t, all);
  const auto* a = static_cast<const int64_t*>(all.raw());
  auto at = [&](int r, int k) { return a[size_t(r) * kF + size_t(k)]; };

  // Exit status: the previous job's end, once, on the run that resumed it.
  if (first_) {
    const char* ff = std::getenv("ATOLL_FAILURE_FILE");
    std::vector<nlohmann::json> ends;
    if (ff && *ff && fs::exists(ff)) {
      for (auto& j : read_lines(ff)) ends.push_back(j);
    }
    comm_->barrier();  // every rank has read it before rank 0 moves it aside
    if (!ends.empty()) {
      // The op a rank that failed in a collective failed in: the lowest such rank's last started.
      int64_t failed_op = -1;
      for (int r = 0; r < world_; ++r)
        if (at(r, 3) >= 0 && at(r, 4) > 0) failed_op = failed_op < 0 ? at(r, 5) : std::min(failed_op, at(r, 5));
      Localization l, behind, watched, accused;
      std::string adetail;
      int64_t awhen = -1;
      std::string detail, wdetail;
      int64_t when = -1, bwhen = -1, wwhen = -1, own_when = -1;
      bool any_own = false;
      for (auto& e : ends) {
        const int r = e.at("rank").get<int>();
        if (r < 0 || r >= world_) continue;
        if (e.value("detector", "") == "watcher") {  // `atoll watch` named it (a stopped or stuck rank)
          if (!std::count(watched.ranks.begin(), watched.ranks.end(), r)) watched.ranks.push_back(r);
          wdetail += fmt::format("{}{}", wdetail.empty() ? "" : "; ", e.value("status", "?"));
          wwhen = std::max(wwhen, e.value("step", int64_t(-1)));
          continue;
        }
        // Accusations: the ranks whose failed collectives blamed it in their reports to the
        // launcher (comm/launcher.cpp). A vote: named only when a strict majority of the ranks
        // blame it (at 2 ranks the one accuser may be the faulty one: inconclusive).
        if (auto by = e.value("blamed_by", nlohmann::json::array()); !by.empty()) {
          adetail += fmt::format("{}rank {} blamed by rank(s) {}", adetail.empty() ? "" : "; ", r, by.dump());
          if (2 * int(by.size()) > world_) accused.ranks.push_back(r);
          awhen = std::max(awhen, at(r, 3));
        }
        const bool torn = e.value("torn_down", false);
        const bool own_end = !torn && e.value("status", "") != "exited with code 0";
        any_own = any_own || own_end;
        if (own_end) own_when = std::max(own_when, at(r, 3));  // where the dead run was, named or not
        detail += fmt::format("{}rank {} {}{}{}", detail.empty() ? "" : "; ", r, e.value("status", "?"),
                              torn ? " (torn down by the launcher)" : "",
                              at(r, 4) > 0 ? fmt::format(" after {} failed collective(s)", at(r, 4)) : "");
        if (own_end && at(r, 4) == 0 && at(r, 3) >= 0) {
          l.ranks.push_back(r);
          when = std::max(when, at(r, 3));
        }
        // Who waits on whom: its peers failed waiting in collective #failed_op, which by its own
        // record it never entered.
        if (torn && failed_op >= 0 && at(r, 3) >= 0 && at(r, 4) == 0 && at(r, 5) < failed_op) {
          behind.ranks.push_back(r);
          bwhen = std::max(bwhen, at(r, 3));
        }
      }
      std::sort(l.ranks.begin(), l.ranks.end());
      std::sort(behind.ranks.begin(), behind.ranks.end());
      std::sort(watched.ranks.begin(), watched.ranks.end());
      l.verdict = l.ranks.empty() ? Localization::inconclusive : Localization::outlier;
      const std::string resumed = fmt::format("the job resumed from the checkpoint of step {}", start);
      if (!behind.ranks.empty()) {
        behind.verdict = Localization::outlier;
        record(bwhen, "who waits on whom", behind,
               fmt::format("the others failed waiting in collective #{}, which the named rank(s) had not entered; {}",
                           failed_op + 1, detail),
               resumed);
      }
      if (any_own && (!l.ranks.empty() || behind.ranks.empty()))
        record(when >= 0 ? when : own_when >= 0 ? own_when : step, "exit status", l, detail, resumed);
      if (!watched.ranks.empty()) {
        watched.verdict = Localization::outlier;
        record(wwhen < 0 ? step : wwhen, "watcher", watched, wdetail, resumed);
      }
      if (!adetail.empty()) {
        std::sort(accused.ranks.begin(), accused.ranks.end());
        accused.verdict = accused.ranks.empty() ? Localization::inconclusive : Localization::outlier;
        record(awhen < 0 ? step : awhen, "peers' reports", accused,
               fmt::format("the failed collectives' reports: {} (of {} ranks)", adetail, world_), resumed);
      }
      if (rank_ == 0) fs::rename(ff, std::string(ff) + ".seen." + std::to_string(start));
    }
  }
  first_ = false;

  // State self-check: evidence about each rank's own copy; repaired from the lowest healthy rank.
  Localization self;
  int root = -1;
  for (int r = 0; r < world_; ++r) {
    if (at(r, 1)) self.ranks.push_back(r);
    else if (root < 0) root = r;
  }
  if (!self.ranks.empty()) {
    self.verdict = Localization::outlier;
    ATOLL_CHECK(root >= 0, "fault.campaign: step {}: every rank's parameters changed outside the optimizer", step);
    repair_state(root, model, dp);
    record(step, "state self-check", self, "the parameters changed since the rank's own update",
           fmt::format("weights and optimizer state broadcast from rank {} before the step", root));
  }
  // Data position self-check: evidence about each rank's own loader; put back before the step reads.
  {
    Localization l;
    for (int r = 0; r < world_; ++r)
      if (at(r, 7)) l.ranks.push_back(r);
    if (!l.ranks.empty()) {
      l.verdict = Localization::outlier;
      const std::string was = bad_data ? fmt::format(" (this rank's loader at row {}, {} after its update)",
                                                     position(task.data_state()), position(data_after_))
                                       : std::string();
      if (bad_data) task.set_data_state(data_after_, env);
      record(step, "data position self-check", l, "the loader moved since the rank's own update" + was,
             "the loader put back to its state after the last update, before the step");
    }
  }
  // Config hash: a vote. Repaired either way by every rank returning to the launch configuration
  // (the one the pre-run gate compared), so no step runs with the drift.
  {
    std::map<uint64_t, std::vector<int>> by_hash;
    for (int r = 0; r < world_; ++r) {
      uint64_t h;
      std::memcpy(&h, &a[size_t(r) * kF + 6], 8);
      by_hash[h].push_back(r);
    }
    if (by_hash.size() > 1) {
      Localization l;
      const std::vector<int>* major = nullptr;
      for (auto& [h, rs] : by_hash)
        if (2 * int(rs.size()) > world_) major = &rs;
      l.verdict = major ? Localization::outlier : Localization::inconclusive;
      std::string groups;
      for (auto& [h, rs] : by_hash) {
        std::string rr;
        for (int r : rs) {
          rr += rr.empty() ? "" : ",";
          rr += std::to_string(r);
          if (major && !std::count(major->begin(), major->end(), r)) l.ranks.push_back(r);
        }
        groups += fmt::format("{}rank(s) {} hash {:016x}", groups.empty() ? "" : "; ", rr, h);
      }
      lr_factor_ = 1.f;
      record(step, "config hash", l, fmt::format("the ranks' hyperparameters for the step differ: {}", groups),
             "every rank back to the launch configuration before the step");
    }
  }
  // Boundary timing: a vote.
  {
    Localization slow;
    for (int r = 0; r < world_; ++r) {
      std::vector<int64_t> others;
      for (int q = 0; q < world_; ++q)
        if (q != r) others.push_back(at(q, 0));
      std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
      if (at(r, 0) > others[others.size() / 2] + kSlowMs) slow.ranks.push_back(r);
    }
    if (!slow.ranks.empty()) {
      const bool majority = 2 * (world_ - int(slow.ranks.size())) > world_;
      slow.verdict = majority ? Localization::outlier : Localization::inconclusive;
      std::string times;
      for (int r = 0; r < world_; ++r) times += fmt::format("{}{} ms", r ? ", " : "", at(r, 0));
      if (!majority) slow.ranks.clear();
      record(step, "boundary timing", slow, "time at the step boundary per rank: " + times, "none needed");
    }
  }
  // Phase fingerprints: a vote.
  {
    auto phases = resilience::gather_phases(*comm_, desync_ ? "eval" : "step", step);
    Localization l = resilience::localize_by_majority(phases);
    std::string where;
    for (int r = 0; r < world_; ++r) where += fmt::format("{}rank {} at {}", r ? "; " : "", r, phases[size_t(r)]);
    record(step, "phase fingerprints", l, where, "none needed: caught before any collective paired wrongly");
  }
  // Checkpoint scrub: evidence about the writer's checkpoint.
  if (at(0, 2)) {
    Localization l;
    l.verdict = Localization::outlier;
    l.ranks = {0};
    want_checkpoint_ = true;
    record(step, "checkpoint scrub", l, fmt::format("{}: {}", fs::path(last_ckpt_).filename().string(),
                                                   rank_ == 0 ? scrub : std::string("failed on rank 0")),
           fmt::format("a checkpoint written again at step {}", step));
  }
}

void CampaignHook::after_update(const nn::Model& model, const Task& task) {
  CpuTimer timer{cpu_ns_};
  param_hash_ = resilience::buffer_hash(model.flat_values().raw(), model.flat_values().nbytes());
  have_hash_ = true;
  nlohmann::json now = task.data_state();
  if (!data_after_.is_null() && position(now) > position(data_after_))
    batch_rows_ = (position(now) - position(data_after_)) / grad_accum_;
  data_after_ = std::move(now);
  if (!grad_check_) return;
  for (auto& f : grad_check_->take_findings()) {  // the same on every rank: each checked the same sums
    Localization l;
    l.ranks = f.ranks;
    l.verdict = f.ranks.empty() ? Localization::inconclusive : Localization::outlier;
    record(step_, "gradient checksum", l,
           fmt::format("{}: the reduced sum is off by {:.3g} (bound {:.3g}); {}", f.bucket, f.diff, f.bound,
                       f.ranks.empty() ? "every re-sent contribution matched its sender's CRC (transient)"
                       : f.missing.size() == f.ranks.size()
                           ? "the named sender's re-sent contribution never arrived (its slot stayed empty): a "
                             "dropped message"
                           : "the named sender's re-sent contribution failed its CRC"),
           "the bucket reduced again from the kept contributions, checked");
  }
}

uint64_t CampaignHook::config_hash() const {
  const std::string s = fmt::format("lr_factor={:a};grad_clip={:a};steps={};checkpoint_every={}", double(lr_factor_),
                                    grad_clip_, steps_, ckpt_every_);
  return resilience::buffer_hash(s.data(), s.size());
}

void CampaignHook::before_checkpoint(int64_t step) {
  for (auto& f : c_.faults)
    if (f.type == "checkpoint_io_error" && f.step == step && std::count(f.ranks.begin(), f.ranks.end(), rank_) &&
        !std::count(fired_.begin(), fired_.end(), f.index)) {
      fired_.push_back(f.index);
      append_line(dir_ + "/fired.jsonl", nlohmann::json{{"index", f.index}, {"type", f.type}, {"step", f.step},
                                                        {"rank", rank_}}.dump());
      log::warn("fault.campaign: rank {} fires checkpoint_io_error at the checkpoint of step {}", rank_, step);
      // Files may not grow past 16 bytes: the save's first write fails with EFBIG (SIGXFSZ ignored).
      rlimit rl{};
      ::getrlimit(RLIMIT_FSIZE, &rl);
      fsize_soft_ = rl.rlim_cur;
      rl.rlim_cur = 16;
      ::signal(SIGXFSZ, SIG_IGN);
      ATOLL_CHECK(::setrlimit(RLIMIT_FSIZE, &rl) == 0, "fault.campaign: setrlimit: {}", std::strerror(errno));
      fsize_armed_ = true;
    }
}

bool CampaignHook::checkpoint_failed(int64_t step, const std::string& why) {
  if (!fsize_armed_) return false;
  rlimit rl{};
  ::getrlimit(RLIMIT_FSIZE, &rl);
  rl.rlim_cur = rlim_t(fsize_soft_);
  ::setrlimit(RLIMIT_FSIZE, &rl);
  fsize_armed_ = false;
  Localization l;
  l.verdict = Localization::outlier;
  l.ranks = {rank_};
  record(step, "checkpoint write", l, why, fmt::format("the checkpoint of step {} written again", step));
  return true;
}

void CampaignHook::checkpoint_written(int64_t step, const std::string& dir) {
  last_ckpt_ = (fs::path(dir) / fmt::format("step_{:08d}", step)).string();
}

nlohmann::json CampaignHook::step_record() {
  return step_dets_.empty() ? nlohmann::json() : step_dets_;
}

nlohmann::json CampaignHook::summary() {
  std::vector<resilience::Detection> dets;
  std::vector<nlohmann::json> lines = read_lines(dir_ + "/detections.jsonl");
  for (auto& j : lines) {
    resilience::Detection d;
    d.step = j.at("step").get<int64_t>();
    d.detector = j.at("detector").get<std::string>();
    const std::string v = j.at("verdict").get<std::string>();
    d.where.verdict = v == "outlier" ? Localization::outlier : v == "inconclusive" ? Localization::inconclusive
                                                                                   : Localization::clean;
    d.where.ranks = j.at("ranks").get<std::vector<int>>();
    d.detail = j.at("recovery").get<std::string>();  // the scorer carries it; the table prints it
    dets.push_back(d);
  }
  // The scorer's window (2 steps) holds every detector here: each runs at the fault's own
  // boundary, and the exit status is dated by the dead rank's progress record.
  auto s = resilience::score_campaign(c_, dets, 2);
  // Fired by any rank, in this run or one before it (each rank appends to fired.jsonl first).
  std::set<int> fired(fired_.begin(), fired_.end());
  for (auto& j : read_lines(dir_ + "/fired.jsonl")) fired.insert(j.at("index").get<int>());
  nlohmann::json faults = nlohmann::json::array();
  for (auto& f : s.faults) {
    nlohmann::json by = nlohmann::json::array(), rec = nlohmann::json::array();
    for (auto& d : f.detections) {
      by.push_back(d.detector);
      rec.push_back(d.detail);
    }
    faults.push_back({{"index", f.fault.index},
                      {"type", f.fault.type},
                      {"family", resilience::fault_type(f.fault.type).family},
                      {"step", f.fault.step},
                      {"ranks", f.fault.ranks},
                      {"fired", bool(fired.count(f.fault.index))},
                      {"detected", !f.detections.empty()},
                      {"detected_by", by},
                      {"outcome", f.outcome},
                      {"recovery", rec}});
  }
  nlohmann::json fp = nlohmann::json::array();
  for (auto& d : s.false_positives)
    fp.push_back({{"step", d.step}, {"detector", d.detector}, {"ranks", d.where.ranks}});
  // The campaign's own cost on rank 0, in CPU time (wall time means little on a shared machine):
  // the boundary checks (hashes, scrub, small all-gathers, repairs) and the gradient checksums,
  // against the process's whole CPU time over the same steps.
  const double per = double(std::max<int64_t>(1, boundaries_));
  const double proc_ms = double(cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - proc_cpu0_ns_) / 1e6 / per;
  nlohmann::json cost = {{"boundaries", boundaries_},
                         {"boundary_cpu_ms_per_step", double(cpu_ns_) / 1e6 / per},
                         {"checksum_cpu_ms_per_step", grad_check_ ? double(grad_check_->check_cpu_ns()) / 1e6 / per : 0.0},
                         {"process_cpu_ms_per_step", proc_ms}};
  nlohmann::json out = {{"seed", c_.seed},        {"cost", cost},        {"world", world_},           {"exact", s.exact},
                        {"inconclusive", s.inconclusive}, {"wrong", s.wrong}, {"missed", s.missed},
                        {"false_positives", fp},  {"faults", faults}};
  std::ofstream(dir_ + "/score.json") << out.dump(1) << "\n";
  log::info("{}", resilience::format_score(c_, s));
  return out;
}

}  // namespace atl
