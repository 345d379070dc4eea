// Every figure the planner reports, with the formula and inputs that produced it. Formulas are
// built lazily so that search (thousands of predictions) pays nothing for them.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace atl::plan {

struct Figure {
  std::string key;      // "memory.activations", "time.compute", ...
  double value = 0;
  std::string unit;     // "B", "s", "tokens/s", "", "USD"
  std::string formula;  // with its inputs substituted, empty unless explaining
};

class Recorder {
 public:
  explicit Recorder(bool explain = false) : explain_(explain) {}
  double add(const std::string& key, double value, const char* unit,
             const std::function<std::string()>& formula = {}) {
    if (explain_) figures_.push_back({key, value, unit, formula ? formula() : std::string()});
    return value;
  }
  bool explaining() const { return explain_; }
  const std::vector<Figure>& figures() const { return figures_; }

 private:
  bool explain_;
  std::vector<Figure> figures_;
};

}  // namespace atl::plan
