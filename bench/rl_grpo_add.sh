#!/usr/bin/env bash
# GRPO on 2-digit addition with a small GPT (configs/rl_add.toml, n_embd 128: 0.42M parameters;
# --model.* overrides size it): SFT_STEPS of warm start on generated demonstrations, then RL_STEPS
# of GRPO, for each seed; prints the held-out accuracy (200 problems disjoint from every training
# prompt, greedy) after SFT and after RL, and the steps. No PyTorch peer: this measures learning,
# not speed (the loss and gradients are checked against PyTorch in tests/rl).
# usage: bench/rl_grpo_add.sh [SEEDS] [SFT_STEPS] [RL_STEPS] [extra atoll overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-1 2 3} SFT=${2:-200} RL=${3:-300}
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
for s in seeds:
    recs = [json.loads(l) for l in open(f"{out}/seed{s}/metrics.jsonl") if '"step"' in l]
    ev = [(r["step"], r["heldout_acc"]) for r in recs if "heldout_acc" in r]
    at_sft = max((a for st, a in ev if st <= sft), default=None)
    last = ev[-1] if ev else None
    best = max(ev[len([e for e in ev if e[0] <= sft]):], key=lambda e: e[1], default=None)
    rew = [r["reward"] for r in recs if r.get("phase") == "rl"]
    print(f"seed {s}: held-out accuracy after {sft} SFT steps {ev[[e[0] for e in ev].index(sft)][1] if sft in [e[0] for e in ev] else at_sft:.3f}; "
          f"after {last[0] - sft} GRPO steps {last[1]:.3f} (best {best[1]:.3f} at RL step {best[0] - sft}); "
          f"mean reward first/last 20 RL steps {sum(rew[:20]) / 20:.3f} / {sum(rew[-20:]) / 20:.3f}")
    print("  curve: " + " ".join(f"{st}:{a:.2f}" for st, a in ev))
PY
