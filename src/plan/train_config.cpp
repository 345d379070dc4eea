// Writes a planned layout as an atoll train config (see train_config.h). The mesh keys are those
// the engine's round-2 [parallel] table reads; the legacy keys are those of
// parallel::ParallelConfig::from_config today (strategy, hsdp_shard_size, bucket_mb) and of
// TrainOptions (train.batch_size per rank, train.seq_len, train.grad_accum, train.dtype).
#include "plan/train_config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace atl::plan {

MeshDegrees mesh_degrees(const Layout& l) {
  MeshDegrees d;
  d.tp = l.tp, d.pp = l.pp, d.cp = l.cp, d.ep = l.ep;
  if (l.hsdp > 0) {
    d.dp_shard = l.hsdp, d.dp_replicate = l.dp / l.hsdp, d.strategy = "hsdp";
  } else if (l.zero > 0) {
    d.dp_shard = l.dp, d.dp_replicate = 1, d.strategy = fmt::format("zero{}", l.zero);
  } else {
    d.dp_shard = 1, d.dp_replicate = l.dp, d.strategy = "ddp";
  }
  return d;
}

std::string train_config_toml(const ModelSpec& m, const Cluster& c, const Layout& l, const std::string& keys) {
  ATOLL_CHECK(keys == "mesh" || keys == "legacy" || keys == "both",
              "--train-config-keys must be mesh, legacy or both (got '{}')", keys);
  validate_layout(l, m, c);
  MeshDegrees d = mesh_degrees(l);
  if (keys == "legacy") {
    for (auto [name, v] : {std::pair<const char*, int64_t>{"tp", d.tp}, {"pp", d.pp}, {"cp", d.cp}, {"ep", d.ep}})
      ATOLL_CHECK(v == 1,
                  "--train-config-keys legacy: today's trainer runs data parallelism only, and this layout has {} = {}; "
                  "emit the mesh keys (the engine round-2 [parallel] table) instead",
                  name, v);
  }
  std::string s;
  s += fmt::format("# Written by `atoll plan --emit-train-config` for {} on {} × {}.\n", m.name, c.world(),
                   c.device.name);
  s += fmt::format("# Layout: {}\n", l.describe());
  s += "# Mesh: world = dp_replicate × dp_shard × tp × pp × cp; ep is carved out of dp × cp.\n";
  s += "[parallel]\n";
  if (keys != "legacy") {
    s += fmt::format("dp_replicate = {}\n", d.dp_replicate);
    s += fmt::format("dp_shard = {}\n", d.dp_shard);
    s += fmt::format("tp = {}\n", d.tp);
    s += fmt::format("pp = {}\n", d.pp);
    s += fmt::format("cp = {}\n", d.cp);
    s += fmt::format("ep = {}\n", d.ep);
  }
  if (keys != "mesh") {
    s += fmt::format("strategy = \"{}\"\n", d.strategy);
    if (d.strategy == "hsdp") s += fmt::format("hsdp_shard_size = {}\n", d.dp_shard);
  } else if (d.strategy == "zero1" || d.strategy == "zero2") {
    s += fmt::format("# ZeRO stage {} over dp_shard: the mesh has no axis for it; today's trainer spells it "
                     "strategy = \"{}\".\n", l.zero, d.strategy);
  }
  if (l.pp > 1)
    s += fmt::format("# pipeline: schedule = \"{}\", virtual_stages = {} (planner keys; no trainer key yet)\n", l.schedule,
                     l.virtual_stages);
  if (l.sp) s += "# sequence parallelism over tp (planner key sp = true; no trainer key yet)\n";
  if (l.decentralized())
    s += fmt::format("# islands = {} with DiLoCo H = {}, compression {:g} (planner keys; no trainer key yet)\n",
                     c.islands, l.diloco_h, l.diloco_compression);
  s += "\n[train]\n";
  s += fmt::format("batch_size = {}  # sequences per rank and micro-step\n", l.micro_batch);
  s += fmt::format("seq_len = {}\n", m.seq);
  s += fmt::format("grad_accum = {}  # micro-batches per step ({} sequences per step)\n", l.micro_batches(), l.batch());
  const bool wide = l.precision == "fp32" || l.precision == "tf32";
  s += fmt::format("dtype = \"{}\"  # planner precision {}\n", wide ? "f32" : "bf16", l.precision);
  s += "\n[optim]\n";
  s += fmt::format("type = \"{}\"\n", l.optimizer == "muon" ? "muon" : "adamw");
  return s;
}

}  // namespace atl::plan
