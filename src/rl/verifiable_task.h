// Verifiable tasks for RL post-training: problems generated from a seed whose answer a program
// checks exactly (arithmetic, word puzzles from the Debian word list), as in the RL-from-
// verifiable-rewards setups of DeepSeekMath (Shao et al. 2024, GRPO) and Tulu 3 (Lambert et al.
// 2024). Prompts and answers are plain ASCII; a completion ends with the end marker.
//
// The held-out split is a property of the prompt (a hash), so the evaluation set is disjoint from
// every training prompt by construction, however many are drawn and on whichever rank.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/registry.h"
#include "tensor/rng.h"

namespace atl::rl {

struct Problem {
  std::string prompt, answer;
};

// exact: the completion is the answer and ended with the end marker; format: it is well formed
// (answer alphabet only, non-empty, not too long, ended). total = exact + format_weight·format.
struct Reward {
  double exact = 0, format = 0, total = 0;
};

class VerifiableTask {
 public:
  virtual ~VerifiableTask() = default;
  virtual std::string name() const = 0;
  // Any problem (held-out or not), uniformly over the task's space.
  virtual Problem draw(Rng& rng) const = 0;
  // The characters an answer is made of (the format reward checks a completion against them).
  virtual std::string alphabet() const = 0;
  // The longest answer, in characters: bounds generation and the format check.
  virtual int64_t max_answer_len() const = 0;
  // The longest prompt, in characters.
  virtual int64_t max_prompt_len() const = 0;

  // Held-out prompts are those whose hash falls in the first `percent` of 100 buckets.
  bool held_out(const std::string& prompt) const;
  // A training problem: drawn until it is not held out.
  Problem draw_train(Rng& rng) const;
  // Up to n distinct held-out problems, the same for a given seed on every rank.
  std::vector<Problem> eval_set(int64_t n, uint64_t seed) const;
  // Virtual: an environment task ("sandbox_add", rl/sandbox.h) scores by running the completion.
  virtual Reward score(const Problem& p, const std::string& completion, bool stopped, double format_weight) const;
  // Multi-turn episodes (rl.turns > 1, rl/multi_turn.h): what the environment replies to a wrong
  // answer, appended to the model's context before its next turn. It ends with '=' (the model
  // answers after it, as after the prompt) and is at most max_feedback_len() characters. The
  // default says only "wrong, try again" ("x="); arithmetic says which way the answer is off.
  virtual std::string feedback(const Problem& p, const std::string& answer) const;
  virtual int64_t max_feedback_len() const { return 2; }

  int heldout_percent = 10;
};

// "add" / "mul" (operands of `digits` digits), "reverse" / "sort" (a word's letters).
struct TaskSpec {
  std::string name = "add";
  int64_t digits = 2;
  int64_t word_min = 3, word_max = 6;
  std::string words_file = "/usr/share/dict/words";
};
using VerifiableTaskFactory = std::function<std::unique_ptr<VerifiableTask>(const TaskSpec&)>;
Registry<VerifiableTaskFactory>& verifiable_task_registry();
std::unique_ptr<VerifiableTask> make_verifiable_task(const TaskSpec& s);

// The char vocabulary of the RL tasks: printable ASCII keeps its byte value, the end marker is
// '\n' (10) and 0 pads. 128 ids.
constexpr int32_t kEndMarker = 10;
constexpr int64_t kVocab = 128;
std::vector<int32_t> encode(const std::string& s);
// Ids outside printable ASCII decode as '?'.
std::string decode(const std::vector<int32_t>& ids);

}  // namespace atl::rl
