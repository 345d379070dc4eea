#!/usr/bin/env bash
# GRPO on 2-digit addition with a small GPT (configs/rl_add.toml, n_embd 128: 0.42M parameters;
# --model.* overrides size it): SFT_STEPS of warm start on generated demonstrations, then RL_STEPS
# of GRPO, for each seed one after another (1 thread each, as the config says); prints the held-out
# accuracy (200 problems disjoint from every training prompt, greedy) after 25 SFT steps (the
# "before SFT" bound), at the SFT start of RL, during and after GRPO, and the RL step at which it
# first reached 0.9. No PyTorch peer: this measures learning, not speed (the loss and gradients are
# checked against PyTorch in tests/rl).
# usage: bench/rl_grpo_add.sh [SEEDS] [SFT_STEPS] [RL_STEPS] [extra atoll overrides...]
# The issue's benchmark (docs/rl.md): bench/rl_grpo_add.sh "1 2 3" 500 300 --rl.prompts=32
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-1 2 3} SFT=${2:-500} RL=${3:-300}
shift $(( $# < 3 ? $# : 3 )) || true
ATOLL=${BUILD:-build}/atoll
[ -x "$ATOLL" ] || { echo "build first: cmake --build build --target atoll"; exit 1; }
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
for s in $SEEDS; do
  "$ATOLL" train configs/rl_add.toml --model.n_embd=128 --train.seed=$s --rl.sft_steps=$SFT \
    --train.steps=$((SFT + RL)) --eval.every=25 --sample.every=0 --log.every=1000 --run.dir="$out/seed$s" \
    --hardware.peak_gflops=1 "$@" > "$out/seed$s.log" 2>&1
done
/usr/bin/python3 - "$out" "$SFT" "$SEEDS" <<'PY'
import json, sys
out, sft, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"CPU: {cpu} (shared, loaded)")
print("seed | after 25 SFT | SFT start | after GRPO | min over GRPO | first >= 0.9 (RL step) | reward first/last 20 | KL last 20")
for s in seeds:
    recs = [json.loads(l) for l in open(f"{out}/seed{s}/metrics.jsonl") if '"step"' in l]
    ev = {r["step"]: r["heldout_acc"] for r in recs if "heldout_acc" in r}
    rl_ev = [(st - sft, a) for st, a in sorted(ev.items()) if st > sft]
    first90 = next((st for st, a in rl_ev if a >= 0.9), None)
    rl = [r for r in recs if r.get("phase") == "rl"]
    rew = [r["reward"] for r in rl]
    kl = [r.get("kl", 0.0) for r in rl]
    print(f"{s} | {ev.get(25, float('nan')):.3f} | {ev.get(sft, float('nan')):.3f} | {rl_ev[-1][1]:.3f} (RL step {rl_ev[-1][0]}) | "
          f"{min(a for _, a in rl_ev):.3f} | {first90 if first90 is not None else 'never'} | "
          f"{sum(rew[:20]) / 20:.3f} / {sum(rew[-20:]) / 20:.3f} | {sum(kl[-20:]) / 20:.4f}")
    print("  curve: " + " ".join(f"{st}:{a:.2f}" for st, a in sorted(ev.items())))
PY
