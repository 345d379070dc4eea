// "sandbox_add": 2-digit addition as an agentic task (rl/sandbox.h). The prompt is the "add"
// task's ("12+34="); the completion is an action script, e.g. "write answer.txt 46;check", run in
// a fresh sandbox directory; exact = the checker's reward, format = the script ended with a check.
// Problem::answer is the reference script (the SFT warm start imitates it); the checker's number
// is the one in it.
#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "rl/sandbox.h"

namespace atl::rl {
namespace {

const std::string kWrite = "write answer.txt ", kCheck = ";check";

class SandboxAdd final : public VerifiableTask {
 public:
  explicit SandboxAdd(const TaskSpec& s) : add_(make_verifiable_task({"add", s.digits})), digits_(s.digits) {}
  std::string name() const override { return "sandbox_add"; }
  Problem draw(Rng& rng) const override {
    Problem p = add_->draw(rng);
    p.answer = kWrite + p.answer + kCheck;
    return p;
  }
  std::string alphabet() const override { return "abcdefghijklmnopqrstuvwxyz0123456789 ._;"; }
  int64_t max_answer_len() const override { return 24 + digits_ + 1; }  // "write answer.txt N;check"
  int64_t max_prompt_len() const override { return add_->max_prompt_len(); }
  Reward score(const Problem& p, const std::string& c, bool stopped, double format_weight) const override {
    char tmpl[] = "/tmp/atoll_sbxtask_XXXXXX";
    Reward r;
    if (::mkdtemp(tmpl) == nullptr) return r;
    {
      const std::string& a = p.answer;
      const bool ref = a.starts_with(kWrite) && a.ends_with(kCheck) && a.size() > kWrite.size() + kCheck.size();
      ATOLL_CHECK(ref, "sandbox_add: reference answer '{}' is not a write-then-check script", a);
      SandboxEpisode ep(std::string(tmpl) + "/ep",
                        {p.prompt, a.substr(kWrite.size(), a.size() - kWrite.size() - kCheck.size())});
      std::vector<int32_t> toks;
      for (unsigned char ch : c) toks.push_back(int32_t(ch));
      ep.feed(toks);
      if (stopped) ep.feed({kEndMarker});
      r.exact = ep.reward();
      r.format = ep.done() && !ep.log().empty() && ep.log().back().action == "check" ? 1 : 0;
    }
    std::error_code ec;
    std::filesystem::remove_all(tmpl, ec);
    r.total = r.exact + format_weight * r.format;
    return r;
  }

 private:
  std::unique_ptr<VerifiableTask> add_;
  int64_t digits_;
};

struct Reg {
  Reg() {
    verifiable_task_registry().add("sandbox_add", [](const TaskSpec& s) { return std::make_unique<SandboxAdd>(s); });
  }
} reg;

}  // namespace
}  // namespace atl::rl
