#include "rl/verifiable_task.h"

#include <set>

#include "core/error.h"

namespace atl::rl {

Registry<VerifiableTaskFactory>& verifiable_task_registry() {
  static Registry<VerifiableTaskFactory> r("rl task");
  return r;
}

std::unique_ptr<VerifiableTask> make_verifiable_task(const TaskSpec& s) {
  return verifiable_task_registry().get(s.name, "rl.task")(s);
}

static uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool VerifiableTask::held_out(const std::string& prompt) const {
  return int(fnv1a(prompt) % 100) < heldout_percent;
}

Problem VerifiableTask::draw_train(Rng& rng) const {
  for (int i = 0; i < 100000; ++i) {
    Problem p = draw(rng);
    if (!held_out(p.prompt)) return p;
  }
  fail("rl task '{}': no training problem in 100000 draws (heldout_percent {})", name(), heldout_percent);
}

std::vector<Problem> VerifiableTask::eval_set(int64_t n, uint64_t seed) const {
  Rng rng(seed, 77);
  std::vector<Problem> out;
  std::set<std::string> seen;
  // Bounded: a small problem space (1-digit sums) simply gives a smaller set.
  for (int64_t i = 0; i < 200 * n && int64_t(out.size()) < n; ++i) {
    Problem p = draw(rng);
    if (held_out(p.prompt) && seen.insert(p.prompt).second) out.push_back(p);
  }
  ATOLL_CHECK(!out.empty(), "rl task '{}': no held-out problem found (heldout_percent {})", name(), heldout_percent);
  return out;
}

Reward VerifiableTask::score(const Problem& p, const std::string& c, bool stopped, double format_weight) const {
  Reward r;
  const std::string al = alphabet();
  bool ok = stopped && !c.empty() && int64_t(c.size()) <= max_answer_len();
  for (char ch : c) ok = ok && al.find(ch) != std::string::npos;
  r.format = ok ? 1 : 0;
  r.exact = stopped && c == p.answer ? 1 : 0;
  r.total = r.exact + format_weight * r.format;
  return r;
}

std::vector<int32_t> encode(const std::string& s) {
  std::vector<int32_t> out;
  for (unsigned char c : s) {
    ATOLL_CHECK(c >= 32 && c < 127, "rl: character {} is outside printable ASCII", int(c));
    out.push_back(int32_t(c));
  }
  return out;
}

std::string decode(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) s += (t >= 32 && t < 127) ? char(t) : '?';
  return s;
}

std::string VerifiableTask::feedback(const Problem&, const std::string&) const { return "x="; }

}  // namespace atl::rl
