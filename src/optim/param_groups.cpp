// Parameter groups and the optimizer factory; see param_groups.h.
#include "optim/param_groups.h"

#include <algorithm>
#include <map>

#include "core/config.h"
#include "core/log.h"
#include "optim/adams.h"
#include "optim/adamw.h"
#include "optim/dion3.h"
#include "optim/ember.h"
#include "optim/lion.h"
#include "optim/muon.h"
#include "optim/periodic_row_muon.h"
#include "optim/soap.h"

namespace atl {

const char* param_class_name(ParamClass c) {
  switch (c) {
    case ParamClass::hidden: return "hidden";
    case ParamClass::embedding: return "embed";
    case ParamClass::head: return "head";
    case ParamClass::vector: return "vector";
  }
  return "?";
}

ParamClass classify_param(const ParamRef& p) {
  // Name rules first: a [vocab, dim] table is not a hidden matrix even though it is 2-D.
  if (p.name.find("lm_head") != std::string::npos) return ParamClass::head;
  if (p.name.find("wte") != std::string::npos || p.name.find("wpe") != std::string::npos)
    return ParamClass::embedding;
  if (p.value.dim() < 2) return ParamClass::vector;
  return ParamClass::hidden;
}

GroupedOptimizer::GroupedOptimizer(std::vector<Group> groups) : groups_(std::move(groups)) {}

std::string GroupedOptimizer::name() const {
  std::string s;
  for (const auto& g : groups_) s += (s.empty() ? "" : "+") + g.name;
  return s;
}

void GroupedOptimizer::step(const StepContext& ctx) {
  ++steps_;
  for (auto& g : groups_) g.opt->step(ctx);
}

void GroupedOptimizer::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", [&] {
    Tensor t = Tensor::empty({1}, DType::i64);
    *t.data<int64_t>() = steps_;
    return t;
  }());
  for (const auto& g : groups_) g.opt->save_state(out, prefix + g.name + ".");
}

void GroupedOptimizer::load_state(const TensorFile& f, const std::string& prefix) {
  const Tensor& st = f.get(prefix + "step");
  ATOLL_CHECK(st.dtype() == DType::i64 && st.numel() == 1, "optimizer state {}step must be one i64", prefix);
  steps_ = *st.data<int64_t>();
  for (auto& g : groups_) g.opt->load_state(f, prefix + g.name + ".");
}

const GroupedOptimizer::Group* GroupedOptimizer::group_of(const std::string& param) const {
  for (const auto& g : groups_)
    if (std::find(g.params.begin(), g.params.end(), param) != g.params.end()) return &g;
  return nullptr;
}

namespace {

float getf(Config& c, const std::string& key, double def, double lo = 0.0, double hi = 1e30) {
  return float(c.get_float(key, def, lo, hi));
}

}  // namespace

MuonConfig muon_config_from(Config& cfg, const std::string& s, float default_lr) {
  MuonConfig m;
  m.lr = getf(cfg, s + ".lr", default_lr);
  m.momentum = getf(cfg, s + ".momentum", m.momentum, 0.0, 1.0);
  m.nesterov = cfg.get_bool(s + ".nesterov", m.nesterov);
  m.weight_decay = getf(cfg, s + ".weight_decay", m.weight_decay);
  m.scale = optim::parse_update_scale(cfg.get_string(s + ".update_scale", "keller", {"keller", "spectral", "rms", "none"}));
  m.layout = optim::parse_layout(cfg.get_string(s + ".layout", "in_out", {"in_out", "out_in"}));
  m.ns = optim::ns_options_from_config(cfg, s);
  return m;
}

PeriodicRowMuonConfig prmuon_config_from(Config& cfg, const std::string& s) {
  PeriodicRowMuonConfig c;
  c.muon = muon_config_from(cfg, s, 0.02f);
  c.period = int(cfg.get_int(s + ".period", 4, 1, 1 << 20));
  // "neurons": one slice per output neuron, the paper's rows of a torch [out, in] weight (atoll's
  // [in, out] storage makes them columns).
  const std::string axis = cfg.get_string(s + ".axis", "rows", {"rows", "cols", "neurons"});
  c.normalize_rows = axis == "rows" || (axis == "neurons" && c.muon.layout == optim::Layout::out_in);
  c.fit_scale = cfg.get_string(s + ".row_scale", "fit", {"fit", "frobenius"}) == "fit";
  return c;
}

Dion3Config dion3_config_from(Config& cfg, const std::string& s) {
  Dion3Config c;
  c.lr = getf(cfg, s + ".lr", 0.02);
  c.fraction = getf(cfg, s + ".fraction", 0.25, 1e-6, 1.0);
  c.mu = getf(cfg, s + ".mu", 0.95, 0, 1);
  c.beta2 = getf(cfg, s + ".beta2", 0.95, 0, 1);
  c.weight_decay = getf(cfg, s + ".weight_decay", 0.0);
  c.select = cfg.get_string(s + ".select", "neurons", {"neurons", "rows", "cols", "shorter"});
  c.scale = optim::parse_update_scale(cfg.get_string(s + ".update_scale", "spectral", {"keller", "spectral", "rms", "none"}));
  c.layout = optim::parse_layout(cfg.get_string(s + ".layout", "in_out", {"in_out", "out_in"}));
  c.ns = optim::ns_options_from_config(cfg, s);
  return c;
}

std::unique_ptr<Optimizer> make_single_optimizer(Config& cfg, const std::string& type, std::vector<ParamRef> params) {
  const std::string s = "optim." + type;
  if (type == "adamw") {
    return make_adamw(std::move(params), getf(cfg, s + ".lr", 6e-4), getf(cfg, s + ".beta1", 0.9, 0, 1),
                      getf(cfg, s + ".beta2", 0.95, 0, 1), getf(cfg, s + ".eps", 1e-8), getf(cfg, s + ".weight_decay", 0.1));
  }
  if (type == "muon") return std::make_unique<Muon>(std::move(params), muon_config_from(cfg, s, 0.02f));
  if (type == "prmuon") return std::make_unique<PeriodicRowMuon>(std::move(params), prmuon_config_from(cfg, s));
  if (type == "dion3") return std::make_unique<Dion3>(std::move(params), dion3_config_from(cfg, s));
  if (type == "soap") {
    SoapConfig c;
    c.lr = getf(cfg, s + ".lr", 3e-3);
    c.beta1 = getf(cfg, s + ".beta1", 0.95, 0, 1);
    c.beta2 = getf(cfg, s + ".beta2", 0.95, 0, 1);
    c.eps = getf(cfg, s + ".eps", 1e-8);
    c.weight_decay = getf(cfg, s + ".weight_decay", 0.0);
    c.shampoo_beta = float(cfg.get_float(s + ".shampoo_beta", -1.0, -1.0, 1.0));
    c.precondition_frequency = int(cfg.get_int(s + ".precondition_frequency", 10, 1, 1 << 20));
    c.max_precond_dim = cfg.get_int(s + ".max_precond_dim", 4096, 1);
    c.kl_factors = cfg.get_string(s + ".factor_update", "ema", {"ema", "kl"}) == "kl";
    c.correct_shampoo_bias = cfg.get_bool(s + ".correct_shampoo_bias", false);
    c.update_rms = getf(cfg, s + ".update_rms", 0.0);
    return std::make_unique<Soap>(std::move(params), c);
  }
  if (type == "ember") {
    EmberConfig c;
    c.lr = getf(cfg, s + ".lr", 1e-3);
    c.beta2 = getf(cfg, s + ".beta2", 0.999, 0, 1);
    c.eps = getf(cfg, s + ".eps", 1e-8);
    c.weight_decay = getf(cfg, s + ".weight_decay", 0.0);
    c.col_over_active = cfg.get_string(s + ".col_mean", "all", {"all", "active"}) == "active";
    return std::make_unique<Ember>(std::move(params), c);
  }
  if (type == "adams") {
    AdamSConfig c;
    c.lr = getf(cfg, s + ".lr", 6e-4);
    c.beta1 = getf(cfg, s + ".beta1", 0.9, 0, 1);
    c.beta2 = getf(cfg, s + ".beta2", 0.95, 0, 1);
    c.eps = getf(cfg, s + ".eps", 1e-8);
    c.weight_decay = getf(cfg, s + ".weight_decay", 0.1);
    return std::make_unique<AdamS>(std::move(params), c);
  }
  if (type == "lion") {
    LionConfig c;
    c.lr = getf(cfg, s + ".lr", 1e-4);
    c.beta1 = getf(cfg, s + ".beta1", 0.9, 0, 1);
    c.beta2 = getf(cfg, s + ".beta2", 0.99, 0, 1);
    c.weight_decay = getf(cfg, s + ".weight_decay", 0.1);
    return std::make_unique<Lion>(std::move(params), c);
  }
  fail("unknown optimizer '{}': use adamw, muon, prmuon, dion3, soap, ember, adams or lion", type);
}

std::unique_ptr<Optimizer> make_optimizer(Config& cfg, std::vector<ParamRef> params,
                                          const OptimizerOverride& override_type) {
  const std::vector<std::string> matrix_types = {"adamw", "muon", "prmuon", "dion3", "soap", "adams", "lion"};
  const std::vector<std::string> table_types = {"adamw", "ember", "adams", "lion"};
  const std::vector<std::string> vector_types = {"adamw", "adams", "lion"};
  std::string hidden = cfg.get_string("optim.type", "adamw", matrix_types);
  // Element-wise optimizers default to handling everything; matrix ones hand the rest to AdamW.
  bool elementwise = hidden == "adamw" || hidden == "adams" || hidden == "lion";
  std::string rest = elementwise ? hidden : "adamw";
  std::map<ParamClass, std::string> route = {
      {ParamClass::hidden, hidden},
      {ParamClass::embedding, cfg.get_string("optim.embed", rest, table_types)},
      {ParamClass::head, cfg.get_string("optim.head", rest, table_types)},
      {ParamClass::vector, cfg.get_string("optim.vector", rest, vector_types)},
  };
  // Groups in order of first appearance; one optimizer instance per type.
  std::vector<std::string> order;
  std::map<std::string, std::vector<ParamRef>> by_type;
  for (auto& p : params) {
    ParamClass c = classify_param(p);
    const std::string& t = route[c];
    if (c == ParamClass::hidden && p.value.dim() > 2 && t == "ember")
      fail("parameter {} (shape {}) cannot go to ember", p.name, shape_str(p.value.shape()));
    if (!by_type.count(t)) order.push_back(t);
    by_type[t].push_back(p);
  }
  std::vector<GroupedOptimizer::Group> groups;
  for (const auto& t : order) {
    GroupedOptimizer::Group g;
    g.name = t;
    for (const auto& p : by_type[t]) g.params.push_back(p.name);
    log::debug("optim: {} takes {} parameters", t, g.params.size());
    if (override_type) g.opt = override_type(cfg, t, by_type[t]);
    if (!g.opt) g.opt = make_single_optimizer(cfg, t, std::move(by_type[t]));
    groups.push_back(std::move(g));
  }
  return std::make_unique<GroupedOptimizer>(std::move(groups));
}

}  // namespace atl
