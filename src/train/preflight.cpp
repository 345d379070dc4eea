#include "train/preflight.h"

#include <fstream>
#include <sstream>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "optim/param_groups.h"
#include "plan/memory_model.h"
#include "plan/model_spec.h"

namespace atl {

std::string format_bytes(double b) {
  if (b >= 1024.0 * 1024 * 1024) return fmt::format("{:.1f} GiB", b / (1024.0 * 1024 * 1024));
  return fmt::format("{:.0f} MiB", b / (1024.0 * 1024));
}

MemoryEstimate estimate_training_memory(nn::Model& model, const TrainShape& s) {
  MemoryEstimate e;
  int stage = s.strategy == "zero1" ? 1 : s.strategy == "zero2" ? 2 : (s.strategy == "zero3" || s.strategy == "hsdp") ? 3 : 0;
  // A pipeline stage under ZeRO-2 keeps its whole gradient for the micro-batches to accumulate
  // into (parallel/pipeline.h): only the optimizer state is sharded, as under ZeRO-1. Under
  // ZeRO-3 it also holds its gathered parameters through the step: at the peak, ZeRO-1 again.
  if (s.pp > 1 && (stage == 2 || stage == 3)) stage = 1;
  std::string opt = s.optimizer == "adamw" ? "adam" : s.optimizer;
  plan::StateBytes sb = plan::state_bytes("fp32", opt);
  std::optional<nn::TransformerShape> t = model.transformer_shape();
  double params = double(model.num_params());
  if (t) {
    plan::ModelSpec m;
    m.layers = t->layers;
    m.hidden = t->hidden;
    m.heads = t->heads;
    m.kv_heads = t->kv_heads;
    m.ffn = t->ffn;
    m.ffn_type = t->swiglu ? "swiglu" : "gelu";
    m.vocab = t->vocab;
    m.seq = s.seq_len;
    const int64_t seq = s.seq_len / std::max<int64_t>(1, s.cp);  // this rank's tokens of a row (the planner's s_local)
    m.tied_head = t->tied_head;
    m.bias = t->bias;
    m.norm = t->rms_norm ? "rmsnorm" : "layernorm";
    m.position = t->rope ? "rope" : "learned";
    m.attention = "flash";  // the CPU attention keeps a log-sum-exp per row, not the [T, T] scores
    // The worst pipeline stage's parameters: ceil(layers / pp) blocks with the embeddings (the
    // first) or with the final norm and the head (the last; a tied head keeps its copy of the
    // table there when pp > 1); each split over tp (norms are replicated, a small overcount).
    const int64_t pp = std::max<int64_t>(1, s.pp), per_stage = (m.layers + pp - 1) / pp;
    double blocks = 0;
    for (int64_t l = 0; l < per_stage; ++l) blocks += double(m.layer_params(l));
    const double head = m.tied_head ? (pp > 1 ? double(t->vocab) * double(t->hidden) : 0.0) : double(m.head_params());
    const double first = double(m.embedding_params()) + blocks, last = blocks + double(m.norm_params()) + head;
    params = pp > 1 ? std::max(first, last) : double(m.total_params());
    params /= double(std::max<int64_t>(1, s.tp));
    plan::ActivationOptions ao;
    ao.act_bytes = 4;
    ao.t = std::max<int64_t>(1, s.tp);
    ao.sp = s.sequence_parallel && s.tp > 1;
    const double inflight = pp == 1 ? 1.0 : s.pp_schedule == "gpipe" ? double(s.micro_batches)
                                          : double(std::min<int64_t>(pp, std::max<int64_t>(1, s.micro_batches)));
    e.activations = double(per_stage) * plan::layer_activation_bytes(m, s.batch_size, seq, ao) * inflight;
    e.logits = 3.0 * 4.0 * double(s.batch_size) * double(seq) * double(t->vocab) / double(ao.t);
  } else if (s.pp > 1) {
    params /= double(s.pp);  // (under tp the model is already this rank's shard)
  }
  const int64_t data_ranks = std::max<int64_t>(1, int64_t(std::max(1, s.world)) / std::max<int64_t>(1, s.tp * s.pp));
  e.model_states = plan::zero_model_state_bytes(params, stage, data_ranks, sb);
  // Under tp a whole-matrix optimizer holds its state of the split matrices whole, with whole
  // copies of their weight and gradient (parallel/optim/tp_whole_matrix.h): tp - 1 more shards of
  // state, tp more of weight and gradient (over every parameter: an overcount by the AdamW rest).
  // Under ZeRO/HSDP without pp the Muon family keeps its pieces of the tp block's momentum
  // (parallel/optim/sharded_muon.h): only one matrix's update is whole at a time, on its owner.
  const bool zero_tp_form = s.pp == 1 && s.strategy != "ddp";
  if (s.tp > 1 && !zero_tp_form && s.optimizer != "adamw" && optimizer_registry().has(s.optimizer) &&
      !optimizer_registry().get(s.optimizer).elementwise)
    e.model_states += params * (double(s.tp - 1) * sb.optim + double(s.tp) * (sb.weight + sb.grad));
  if (s.dtype == "bf16") e.model_states += 2.0 * params;  // the bf16 weight copies
  return e;
}

namespace {

double read_number_file(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return -1;
  try {
    return std::stod(s);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

double available_memory_bytes(std::string* source) {
  double avail = -1;
  {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    double kb;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024.0;
        break;
      }
    }
  }
  if (source) *source = "MemAvailable in /proc/meminfo";
  // cgroup v2, then v1 (a v1 "no limit" is a huge number, which the min below ignores).
  double limit = read_number_file("/sys/fs/cgroup/memory.max"), used = read_number_file("/sys/fs/cgroup/memory.current");
  if (limit < 0) {
    limit = read_number_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = read_number_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (limit > 0 && used >= 0 && (avail < 0 || limit - used < avail)) {
    avail = std::max(0.0, limit - used);
    if (source) *source = fmt::format("the cgroup's memory limit {} less its usage", format_bytes(limit));
  }
  return avail;
}

void check_memory_before_start(Config& cfg, nn::Model& model, const TrainShape& s) {
  bool force = cfg.get_bool("train.force", false);
  MemoryEstimate e = estimate_training_memory(model, s);
  std::string source;
  double avail = available_memory_bytes(&source);
  double need = e.total() * double(std::max(1, s.local_world));
  log::debug("memory estimate {} per rank (states {}, activations {}, logits {}); available {}", format_bytes(e.total()),
             format_bytes(e.model_states), format_bytes(e.activations), format_bytes(e.logits), format_bytes(avail));
  if (avail < 0 || need <= avail) return;
  std::string per_rank = s.local_world > 1 ? fmt::format(" per rank, {} for this node's {} ranks", format_bytes(need),
                                                         s.local_world)
                                           : "";
  std::string msg = fmt::format(
      "training needs about {}{} (model states {}, activations {}, logits {}), but only {} is available ({}); "
      "reduce train.batch_size (now {}; train.grad_accum keeps the tokens per step) or train.seq_len (now {}) or "
      "the model, or pass --train.force=true to try anyway",
      format_bytes(e.total()), per_rank, format_bytes(e.model_states), format_bytes(e.activations),
      format_bytes(e.logits), format_bytes(avail), source, s.batch_size, s.seq_len);
  if (force) {
    log::warn("{} (going on: train.force = true)", msg.substr(0, msg.find("; reduce")));
    return;
  }
  fail("{}", msg);
}

}  // namespace atl
