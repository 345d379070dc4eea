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
#include "optim/sgd.h"
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
  // By the role the model declared: a [vocab, dim] table is not a hidden matrix though it is 2-D.
  switch (resolve_role(p.role, p.value.shape())) {
    case ParamRole::head: return ParamClass::head;
    case ParamRole::embedding: return ParamClass::embedding;
    case ParamRole::vector: return ParamClass::vector;
    case ParamRole::automatic:
    case ParamRole::matrix:
    case ParamRole::expert: break;
  }
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

AdamWConfig adamw_config_from(Config& cfg, const std::string& s) {
  AdamWConfig c;
  c.lr = getf(cfg, s + ".lr", 6e-4, 0.0, 10.0);
  c.beta1 = getf(cfg, s + ".beta1", 0.9, 0, 1);
  c.beta2 = getf(cfg, s + ".beta2", 0.95, 0, 1);
  c.eps = getf(cfg, s + ".eps", 1e-8, 0.0, 1.0);
  c.weight_decay = getf(cfg, s + ".weight_decay", 0.1, 0.0, 10.0);
  return c;
}

// Every optimizer atoll has, its name given once: which parameter classes it may take and how
// it is built from its [optim.<name>] section.
Registry<OptimizerEntry>& optimizer_registry() {
  static Registry<OptimizerEntry> r = [] {
    using C = ParamClass;
    const std::vector<ParamClass> all = {C::hidden, C::embedding, C::head, C::vector};
    Registry<OptimizerEntry> g("optimizer");
    g.add("adamw", {all, true, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            return std::make_unique<AdamW>(std::move(ps), adamw_config_from(cfg, s));
          }});
    g.add("muon", {{C::hidden}, false, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            return std::make_unique<Muon>(std::move(ps), muon_config_from(cfg, s, 0.02f));
          }});
    g.add("prmuon", {{C::hidden}, false, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            return std::make_unique<PeriodicRowMuon>(std::move(ps), prmuon_config_from(cfg, s));
          }});
    g.add("dion3", {{C::hidden}, false, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            return std::make_unique<Dion3>(std::move(ps), dion3_config_from(cfg, s));
          }});
    g.add("soap", {{C::hidden}, false, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
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
            return std::make_unique<Soap>(std::move(ps), c);
          }});
    g.add("ember", {{C::embedding, C::head}, false,
                    [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
                      EmberConfig c;
                      c.lr = getf(cfg, s + ".lr", 1e-3);
                      c.beta2 = getf(cfg, s + ".beta2", 0.999, 0, 1);
                      c.eps = getf(cfg, s + ".eps", 1e-8);
                      c.weight_decay = getf(cfg, s + ".weight_decay", 0.0);
                      c.col_over_active = cfg.get_string(s + ".col_mean", "all", {"all", "active"}) == "active";
                      return std::make_unique<Ember>(std::move(ps), c);
                    }});
    g.add("adams", {all, true, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            AdamSConfig c;
            c.lr = getf(cfg, s + ".lr", 6e-4);
            c.beta1 = getf(cfg, s + ".beta1", 0.9, 0, 1);
            c.beta2 = getf(cfg, s + ".beta2", 0.95, 0, 1);
            c.eps = getf(cfg, s + ".eps", 1e-8);
            c.weight_decay = getf(cfg, s + ".weight_decay", 0.1);
            return std::make_unique<AdamS>(std::move(ps), c);
          }});
    g.add("lion", {all, true, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            LionConfig c;
            c.lr = getf(cfg, s + ".lr", 1e-4);
            c.beta1 = getf(cfg, s + ".beta1", 0.9, 0, 1);
            c.beta2 = getf(cfg, s + ".beta2", 0.99, 0, 1);
            c.weight_decay = getf(cfg, s + ".weight_decay", 0.1);
            return std::make_unique<Lion>(std::move(ps), c);
          }});
    g.add("sgd", {all, true, [](Config& cfg, const std::string& s, std::vector<ParamRef> ps) -> std::unique_ptr<Optimizer> {
            SgdConfig c;
            c.lr = getf(cfg, s + ".lr", 0.1);
            c.momentum = getf(cfg, s + ".momentum", 0.0, 0, 1);
            c.weight_decay = getf(cfg, s + ".weight_decay", 0.0);
            return std::make_unique<Sgd>(std::move(ps), c);
          }});
    return g;
  }();
  return r;
}

std::vector<std::string> optimizers_for(ParamClass c) {
  std::vector<std::string> out;
  for (const auto& n : optimizer_registry().names()) {
    const auto& t = optimizer_registry().get(n).takes;
    if (std::find(t.begin(), t.end(), c) != t.end()) out.push_back(n);
  }
  return out;
}

std::unique_ptr<Optimizer> make_single_optimizer(Config& cfg, const std::string& type, std::vector<ParamRef> params) {
  return optimizer_registry().get(type).make(cfg, "optim." + type, std::move(params));
}

OptimizerRoute optimizer_route(Config& cfg) {
  OptimizerRoute r;
  r.hidden = cfg.get_string("optim.type", "adamw", optimizers_for(ParamClass::hidden));
  // Element-wise optimizers default to handling everything; matrix ones hand the rest to AdamW.
  std::string rest = optimizer_registry().get(r.hidden).elementwise ? r.hidden : "adamw";
  r.embed = cfg.get_string("optim.embed", rest, optimizers_for(ParamClass::embedding));
  r.head = cfg.get_string("optim.head", rest, optimizers_for(ParamClass::head));
  r.vector = cfg.get_string("optim.vector", rest, optimizers_for(ParamClass::vector));
  return r;
}

const std::string& OptimizerRoute::of(ParamClass c) const {
  switch (c) {
    case ParamClass::hidden: return hidden;
    case ParamClass::embedding: return embed;
    case ParamClass::head: return head;
    case ParamClass::vector: break;
  }
  return vector;
}

std::unique_ptr<Optimizer> make_optimizer(Config& cfg, std::vector<ParamRef> params,
                                          const OptimizerOverride& override_type) {
  OptimizerRoute route = optimizer_route(cfg);
  // Groups in order of first appearance; one optimizer instance per type.
  std::vector<std::string> order;
  std::map<std::string, std::vector<ParamRef>> by_type;
  for (auto& p : params) {
    const std::string& t = route.of(classify_param(p));
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
