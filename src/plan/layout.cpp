// Layout validation: each rule names the constraint it enforces, so an impossible plan tells the
// user what to change (Megatron-LM's divisibility rules, Narayanan et al. 2021 §2-3).
#include "plan/layout.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

std::string Layout::describe() const {
  std::string s = fmt::format("dp={} tp={} pp={}", dp, tp, pp);
  if (cp > 1) s += fmt::format(" cp={}", cp);
  if (ep > 1) s += fmt::format(" ep={}", ep);
  if (zero) s += fmt::format(" zero={}", zero);
  if (hsdp) s += fmt::format(" hsdp={}", hsdp);
  if (sp) s += " sp";
  if (pp > 1) s += " " + schedule + (schedule == "interleaved" ? fmt::format("(v={})", virtual_stages) : "");
  s += fmt::format(" mb={} gb={} rc={} {}", micro_batch, batch(), recompute, precision);
  if (optimizer != "adam") s += " " + optimizer;
  if (reduce_dtype != "grad") s += " reduce=" + reduce_dtype;
  if (offload != "none") s += " offload";
  if (diloco_h) s += fmt::format(" diloco(H={},c={:g})", diloco_h, diloco_compression);
  if (gossip_peers) s += fmt::format(" gossip({})", gossip_peers);
  return s;
}

void validate_layout(const Layout& l, const ModelSpec& m, const Cluster& c) {
  ATOLL_CHECK(l.dp > 0 && l.tp > 0 && l.pp > 0 && l.cp > 0 && l.ep > 0 && l.micro_batch > 0,
              "layout: all degrees and micro_batch must be positive");
  ATOLL_CHECK(l.world() == c.world(),
              "layout: world size dp×tp×pp×cp = {}×{}×{}×{} = {} must equal the cluster's devices "
              "({} islands × {} nodes × {} devices = {})",
              l.dp, l.tp, l.pp, l.cp, l.world(), c.islands, c.nodes_per_island, c.devices_per_node, c.world());
  ATOLL_CHECK(m.heads % l.tp == 0, "layout: tp ({}) must divide the attention heads ({})", l.tp, m.heads);
  ATOLL_CHECK(m.is_mla() || m.kv_heads % l.tp == 0 || l.tp % m.kv_heads == 0,
              "layout: tp ({}) must divide kv_heads ({}) or be a multiple of it", l.tp, m.kv_heads);
  ATOLL_CHECK((m.is_moe() ? m.expert_ffn : m.ffn) % l.tp == 0 || l.ep > 1,
              "layout: tp ({}) must divide the FFN size ({})", l.tp, m.is_moe() ? m.expert_ffn : m.ffn);
  ATOLL_CHECK(l.pp <= m.layers, "layout: pp ({}) must not exceed the number of layers ({})", l.pp, m.layers);
  ATOLL_CHECK(m.seq % l.cp == 0, "layout: cp ({}) must divide the sequence length ({})", l.cp, m.seq);
  if (l.sp) ATOLL_CHECK(m.seq % (l.tp * l.cp) == 0, "layout: sp needs tp×cp ({}) to divide seq ({})",
                        l.tp * l.cp, m.seq);
  ATOLL_CHECK(l.batch() % (l.dp * l.micro_batch) == 0,
              "layout: global_batch ({}) must be a multiple of dp × micro_batch ({} × {})", l.batch(), l.dp,
              l.micro_batch);
  ATOLL_CHECK(l.zero >= 0 && l.zero <= 3, "layout: zero stage ({}) must be 0, 1, 2 or 3", l.zero);
  if (l.hsdp) {
    ATOLL_CHECK(l.zero > 0, "layout: hsdp ({}) needs a ZeRO stage > 0 to shard within groups", l.hsdp);
    ATOLL_CHECK(l.dp % l.hsdp == 0, "layout: hsdp shard group ({}) must divide dp ({})", l.hsdp, l.dp);
  }
  if (l.ep > 1) {
    ATOLL_CHECK(m.is_moe(), "layout: ep ({}) needs a mixture-of-experts model", l.ep);
    ATOLL_CHECK(m.experts % l.ep == 0, "layout: ep ({}) must divide the experts ({})", l.ep, m.experts);
    ATOLL_CHECK((l.dp * l.cp) % l.ep == 0, "layout: ep ({}) must divide dp×cp ({})", l.ep, l.dp * l.cp);
  }
  if (l.schedule == "interleaved") {
    ATOLL_CHECK(l.pp > 1, "layout: the interleaved schedule needs pp > 1");
    // Uneven stages are allowed (Llama 3 runs 126 layers on 16 stages): every model chunk needs at
    // least one layer, except that the first chunk may hold only the embedding and the last only
    // the output head (Llama 3, Dubey et al. 2024 §3.3.2: "the first model chunk on the first stage
    // has only the embedding, and the last model chunk on the last stage has only output
    // projection and loss calculation"); the heaviest chunk sets the pace (layers_per_stage).
    ATOLL_CHECK(l.pp * l.virtual_stages <= m.layers + 2,
                "layout: interleaved needs at least one layer per model chunk (the first may hold only the "
                "embedding, the last only the head): pp×virtual_stages ({}×{}) must not exceed the layers ({}) + 2",
                l.pp, l.virtual_stages, m.layers);
    ATOLL_CHECK(l.micro_batches() % l.pp == 0,
                "layout: interleaved needs the micro-batches per pipeline ({}) to be a multiple of pp ({})",
                l.micro_batches(), l.pp);
  } else {
    ATOLL_CHECK(l.virtual_stages == 1, "layout: virtual_stages > 1 needs schedule = \"interleaved\"");
  }
  if (l.schedule == "zb-h1" && l.pp > 1) {
    // ZB-H1's bubble of (p−1)/3 slots needs a steady state: with fewer micro-batches than stages
    // the weight-gradient passes are too few to fill the warm-up and cool-down, and the planner
    // has no formula for what is left.
    ATOLL_CHECK(l.micro_batches() >= l.pp,
                "layout: the planner cannot model schedule \"zb-h1\" with fewer micro-batches per pipeline ({}) than "
                "stages (pp = {}): its (p−1)/3 bubble assumes m ≥ p; raise global_batch or use \"1f1b\"",
                l.micro_batches(), l.pp);
  }
  if (l.diloco_h > 0 || l.gossip_peers > 0) {
    ATOLL_CHECK(c.islands > 1, "layout: DiLoCo/gossip synchronise islands and need islands > 1");
    ATOLL_CHECK(l.dp % c.islands == 0, "layout: DiLoCo/gossip need dp ({}) to be a multiple of islands ({})",
                l.dp, c.islands);
    ATOLL_CHECK(l.tp * l.pp * l.cp * (l.dp / c.islands) == c.devices_per_island(),
                "layout: DiLoCo/gossip need each model replica group to stay inside one island");
  }
  if (l.gossip_peers > 0)
    ATOLL_CHECK(l.gossip_peers < c.islands, "layout: gossip_peers ({}) must be below islands ({})",
                l.gossip_peers, c.islands);
  ATOLL_CHECK(l.diloco_compression > 0 && l.diloco_compression <= 1,
              "layout: diloco_compression ({}) must be in (0, 1]", l.diloco_compression);
}

Layout load_layout(Config& cfg, const std::string& s) {
  Layout l;
  const int64_t big = int64_t(1) << 30;
  l.dp = cfg.get_int(s + ".dp", 1, 1, big);
  l.tp = cfg.get_int(s + ".tp", 1, 1, big);
  l.pp = cfg.get_int(s + ".pp", 1, 1, big);
  l.cp = cfg.get_int(s + ".cp", 1, 1, big);
  l.ep = cfg.get_int(s + ".ep", 1, 1, big);
  l.zero = int(cfg.get_int(s + ".zero", 0, 0, 3));
  if (cfg.get_bool(s + ".fsdp", false)) l.zero = 3;
  l.hsdp = cfg.get_int(s + ".hsdp", 0, 0, big);
  l.sp = cfg.get_bool(s + ".sp", false);
  l.schedule = cfg.get_string(s + ".schedule", "1f1b", {"gpipe", "1f1b", "interleaved", "zb-h1"});
  l.virtual_stages = cfg.get_int(s + ".virtual_stages", 1, 1, 1024);
  l.micro_batch = cfg.get_int(s + ".micro_batch", 1, 1, big);
  l.global_batch = cfg.get_int(s + ".global_batch", 0, 0, int64_t(1) << 40);
  l.recompute = cfg.get_string(s + ".recompute", "none", {"none", "selective", "full"});
  l.precision = cfg.get_string(s + ".precision", "bf16", {"fp32", "tf32", "bf16", "fp16", "fp8"});
  l.optimizer = cfg.get_string(s + ".optimizer", "adam", {"adam", "muon"});
  l.offload = cfg.get_string(s + ".offload", "none", {"none", "optimizer"});
  l.reduce_dtype = cfg.get_string(s + ".reduce_dtype", "grad", {"grad", "fp32"});
  if (cfg.has(s + ".fsdp_grad_copy")) l.fsdp_grad_copy = cfg.get_bool(s + ".fsdp_grad_copy", true) ? 1 : 0;
  l.overlap_dp = cfg.get_bool(s + ".overlap_dp", true);
  l.overlap_tp = cfg.get_bool(s + ".overlap_tp", false);
  l.overlap_ep = cfg.get_bool(s + ".overlap_ep", false);
  l.overlap_pp = cfg.get_bool(s + ".overlap_pp", false);
  l.diloco_h = cfg.get_int(s + ".diloco_h", 0, 0, big);
  l.diloco_compression = cfg.get_float(s + ".diloco_compression", 1.0, 1e-6, 1.0);
  l.gossip_peers = cfg.get_int(s + ".gossip_peers", 0, 0, big);
  return l;
}

}  // namespace atl::plan
