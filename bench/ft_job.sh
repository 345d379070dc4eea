# Sourced by the fault-tolerance benchmarks (ft_vs_ddp.sh, deadpool.sh): writes the small job they
# time into $W — a 400-document synthetic corpus, its prepared data and cfg.toml (a 2-layer
# gpt2-tiny, $STEPS steps, 1 thread, no eval or sampling). Needs A (the atoll binary), W and STEPS;
# $1 is [checkpoint] every (0: none).
ft_job_write() {
  local ckpt_every=$1
  python3 - "$W/corpus.txt" <<'PY'
import random, sys
random.seed(777)
words = "the island trains a model across many ranks and hosts".split()
with open(sys.argv[1], "w") as f:
    for d in range(400):
        f.write(" ".join(random.choice(words) for _ in range(60)) + "\n%\n")
PY
  "$A" data prepare --input "$W/corpus.txt" --out "$W/data" --val-fraction 0.1 > "$W/prep.log"
  cat > "$W/cfg.toml" <<CFG
[data]
dir = "$W/data"
auto_prepare = false
[model]
preset = "gpt2-tiny"
n_layer = 2
[train]
steps = $STEPS
batch_size = 8
seq_len = 64
warmup_steps = 2
threads = 1
[optim.adamw]
lr = 1e-3
[eval]
every = 0
[sample]
every = 0
[checkpoint]
every = $ckpt_every
[log]
every = 50
[hardware]
peak_gflops = 100.0
CFG
}
