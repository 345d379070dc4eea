// Generated arithmetic: "12+34=" -> "46", "12*34=" -> "408", operands of exactly `digits` digits
// (1-digit operands include 0). The answer is the plain decimal result, then the end marker.
#include "core/error.h"
#include "rl/verifiable_task.h"

namespace atl::rl {
namespace {

class Arithmetic final : public VerifiableTask {
 public:
  Arithmetic(char op, int64_t digits) : op_(op), digits_(digits) {
    ATOLL_CHECK(digits >= 1 && digits <= 6, "rl.digits must be in [1, 6], got {}", digits);
    lo_ = digits == 1 ? 0 : pow10(digits - 1);
    hi_ = pow10(digits);  // exclusive
  }
  std::string name() const override { return op_ == '+' ? "add" : "mul"; }
  Problem draw(Rng& rng) const override {
    const int64_t a = lo_ + int64_t(rng.below(uint64_t(hi_ - lo_))), b = lo_ + int64_t(rng.below(uint64_t(hi_ - lo_)));
    const int64_t r = op_ == '+' ? a + b : a * b;
    return {std::to_string(a) + op_ + std::to_string(b) + "=", std::to_string(r)};
  }
  std::string alphabet() const override { return "0123456789"; }
  int64_t max_answer_len() const override { return op_ == '+' ? digits_ + 1 : 2 * digits_; }
  int64_t max_prompt_len() const override { return 2 * digits_ + 2; }
  // A tool's verdict on a wrong answer: "<=" the result is smaller, ">=" larger, "x=" not a number.
  std::string feedback(const Problem& p, const std::string& answer) const override {
    if (answer.empty() || answer.size() > 18 || answer.find_first_not_of("0123456789") != std::string::npos) return "x=";
    return std::stoll(p.answer) < std::stoll(answer) ? "<=" : ">=";
  }

 private:
  static int64_t pow10(int64_t n) {
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
  }
  char op_;
  int64_t digits_, lo_ = 0, hi_ = 10;
};

struct Reg {
  Reg() {
    verifiable_task_registry().add("add", [](const TaskSpec& s) { return std::make_unique<Arithmetic>('+', s.digits); });
    verifiable_task_registry().add("mul", [](const TaskSpec& s) { return std::make_unique<Arithmetic>('*', s.digits); });
  }
} reg;

}  // namespace
}  // namespace atl::rl
