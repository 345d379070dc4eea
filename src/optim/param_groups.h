// Parameter groups: parameters routed by rule to different optimizers, each with its own
// hyperparameters, the usual Muon set-up being hidden matrices to Muon and the rest to AdamW (or
// Ember for the embedding and head tables).
//
// Config ([optim] section):
//   type   = "muon"    optimizer of the hidden matrices: adamw, muon, prmuon, dion3, soap, adams, lion
//   embed  = "adamw"   embeddings (ParamRole::embedding): adamw, ember, adams, lion
//   head   = "adamw"   the output head (ParamRole::head): adamw, ember, adams, lion
//   vector = "adamw"   gains and biases (ParamRole::vector): adamw, adams, lion
// A parameter's class is the role its model declared (nn/module.h), never its name.
// and one section per optimizer in use for its hyperparameters, e.g. [optim.muon] lr = 0.02,
// [optim.adamw] lr = 6e-4. Groups routed to the same optimizer share one instance.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/registry.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"

namespace atl {

class Config;

enum class ParamClass { hidden, embedding, head, vector };
const char* param_class_name(ParamClass c);
ParamClass classify_param(const ParamRef& p);

// One optimizer per group, stepped in order; state is saved under prefix + group name + ".".
class GroupedOptimizer : public Optimizer {
 public:
  struct Group {
    std::string name;  // the optimizer type, e.g. "muon"
    std::vector<std::string> params;
    std::unique_ptr<Optimizer> opt;
  };
  explicit GroupedOptimizer(std::vector<Group> groups);
  std::string name() const override;  // "muon+adamw"
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  const std::vector<Group>& groups() const { return groups_; }
  // The group that holds a parameter, or nullptr.
  const Group* group_of(const std::string& param) const;

 private:
  std::vector<Group> groups_;
};

// An optimizer type: the parameter classes it may be routed, whether it takes every class by
// default when it is [optim] type (element-wise ones do; matrix ones leave the rest to AdamW), and
// how to build it over params from its section ("optim.<name>").
struct OptimizerEntry {
  std::vector<ParamClass> takes;
  bool elementwise = false;
  std::function<std::unique_ptr<Optimizer>(Config& cfg, const std::string& section, std::vector<ParamRef> params)> make;
};
Registry<OptimizerEntry>& optimizer_registry();
// The registered optimizers that may take class c (sorted).
std::vector<std::string> optimizers_for(ParamClass c);

// Which optimizer type each class goes to ([optim] type, embed, head, vector).
struct OptimizerRoute {
  std::string hidden, embed, head, vector;
  const std::string& of(ParamClass c) const;
};
OptimizerRoute optimizer_route(Config& cfg);

// [optim.adamw] (or another section) as AdamWConfig: the one place AdamW's keys are read.
AdamWConfig adamw_config_from(Config& cfg, const std::string& section = "optim.adamw");

// Builds one optimizer of `type` over params from the [optim.<type>] section.
std::unique_ptr<Optimizer> make_single_optimizer(Config& cfg, const std::string& type, std::vector<ParamRef> params);

// Lets a higher layer substitute its own implementation of an optimizer type (the distributed
// Muon of src/parallel, say); it returns null to keep the single-rank one.
using OptimizerOverride =
    std::function<std::unique_ptr<Optimizer>(Config& cfg, const std::string& type, std::vector<ParamRef>& params)>;

// The composite optimizer the config asks for.
std::unique_ptr<Optimizer> make_optimizer(Config& cfg, std::vector<ParamRef> params,
                                          const OptimizerOverride& override_type = {});

struct MuonConfig;
struct PeriodicRowMuonConfig;
struct Dion3Config;
// Hyperparameters from a config section ("optim.muon", ...), as make_optimizer reads them (the
// distributed variants in src/parallel read the same keys through these).
MuonConfig muon_config_from(Config& cfg, const std::string& section, float default_lr = 0.02f);
PeriodicRowMuonConfig prmuon_config_from(Config& cfg, const std::string& section);
Dion3Config dion3_config_from(Config& cfg, const std::string& section);

}  // namespace atl
