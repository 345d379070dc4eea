# Sourced by bench/coded_train.sh and bench/campaign_cost.sh: writes the small job they time into
# $W — a 200-document synthetic corpus (a fixed LCG over ten words, so every machine gets the same
# bytes), its prepared data and cfg.toml (a 2-layer gpt2-tiny, batch 4 × 64 tokens, $STEPS steps,
# 1 thread, no eval or sampling). Needs A (the atoll binary), W and STEPS; $1 is [checkpoint] every
# (0: none).
tiny_job_write() {
  local ckpt_every=$1
  python3 - "$W/corpus.txt" <<'PY'
import sys
words = "the island trains a model across many ranks and hosts".split()
s = 777
with open(sys.argv[1], "w") as f:
    for doc in range(200):
        for w in range(40):
            s = (s * 1664525 + 1013904223) % 2**32
            f.write(words[(s >> 16) % 10] + (".\n" if w % 9 == 8 else " "))
        f.write("\n%\n")
PY
  "$A" data prepare --input "$W/corpus.txt" --out "$W/data" --val-fraction 0.1 > "$W/prepare.log" 2>&1
  cat > "$W/cfg.toml" <<TOML
[data]
dir = "$W/data"
auto_prepare = false
[model]
preset = "gpt2-tiny"
n_layer = 2
[train]
steps = $STEPS
batch_size = 4
seq_len = 64
threads = 1
[eval]
every = 0
[sample]
every = 0
[checkpoint]
every = $ckpt_every
[log]
every = 1000
[hardware]
peak_gflops = 100.0
TOML
}
