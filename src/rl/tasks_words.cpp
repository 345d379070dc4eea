// Word puzzles over the Debian word list (package wamerican, /usr/share/dict/words): "rev:cat="
// -> "tac" (reverse the letters), "sort:cat=" -> "act" (the letters in alphabetical order). Only
// lowercase a-z words of word_min..word_max letters are used; the list is read once, sorted and
// deduplicated, so a seed draws the same words on every machine with the same list.
#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "rl/verifiable_task.h"

namespace atl::rl {
namespace {

class WordTask final : public VerifiableTask {
 public:
  WordTask(std::string kind, const TaskSpec& s) : kind_(std::move(kind)), max_(s.word_max) {
    ATOLL_CHECK(s.word_min >= 1 && s.word_min <= s.word_max && s.word_max <= 16,
                "rl.word_min/rl.word_max must satisfy 1 <= min <= max <= 16, got {} and {}", s.word_min, s.word_max);
    std::ifstream f(s.words_file);
    ATOLL_CHECK(f, "rl task '{}': cannot read the word list {} (Debian package wamerican; rl.words_file)", kind_,
                s.words_file);
    for (std::string w; std::getline(f, w);) {
      const bool lower = std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
      if (lower && int64_t(w.size()) >= s.word_min && int64_t(w.size()) <= s.word_max) words_.push_back(w);
    }
    std::sort(words_.begin(), words_.end());
    words_.erase(std::unique(words_.begin(), words_.end()), words_.end());
    ATOLL_CHECK(words_.size() >= 20, "rl task '{}': only {} usable words of {}..{} letters in {}", kind_, words_.size(),
                s.word_min, s.word_max, s.words_file);
  }
  std::string name() const override { return kind_; }
  Problem draw(Rng& rng) const override {
    const std::string& w = words_[size_t(rng.below(words_.size()))];
    std::string a = w;
    if (kind_ == "reverse") std::reverse(a.begin(), a.end());
    else std::sort(a.begin(), a.end());
    return {(kind_ == "reverse" ? "rev:" : "sort:") + w + "=", a};
  }
  std::string alphabet() const override { return "abcdefghijklmnopqrstuvwxyz"; }
  int64_t max_answer_len() const override { return max_; }
  int64_t max_prompt_len() const override { return max_ + 6; }
  size_t size() const { return words_.size(); }

 private:
  std::string kind_;
  int64_t max_;
  std::vector<std::string> words_;
};

struct Reg {
  Reg() {
    for (const char* k : {"reverse", "sort"})
      verifiable_task_registry().add(k, [k](const TaskSpec& s) { return std::make_unique<WordTask>(k, s); });
  }
} reg;

}  // namespace
}  // namespace atl::rl
