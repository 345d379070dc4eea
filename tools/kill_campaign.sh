#!/usr/bin/env bash
# Issue 10's kill -9 campaign: random SIGKILLs of the trainer (and of `atoll launch`) while it
# checkpoints every step, on 1 or 2 ranks. After each kill the run is resumed with --resume; at
# the end its final checkpoint must equal, byte for byte (model and optimizer state), that of
# the same run trained without interruption, and no rank may outlive a killed launcher.
#
#   tools/kill_campaign.sh [--atoll build/atoll] [--ranks 1|2] [--kills 50] [--launcher-kills 0]
#                          [--steps 60] [--max-delay 1.2] [--seed 1] [--work DIR] [--keep]
#
# Prints one line per kill and a summary; exits 0 when every run was bit-exact and nothing
# survived, 1 otherwise. The unit suite runs a small version (tests/train/test_kill_campaign.cpp).
set -u
ATOLL=build/atoll RANKS=1 KILLS=50 LKILLS=0 STEPS=60 MAX_DELAY=1.2 SEED=1 WORK="" KEEP=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --atoll) ATOLL=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --kills) KILLS=$2; shift 2 ;;
    --launcher-kills) LKILLS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --max-delay) MAX_DELAY=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ $RANKS == 1 || $RANKS == 2 ]] || { echo "--ranks is 1 or 2" >&2; exit 2; }
[[ $RANKS == 2 || $LKILLS == 0 ]] || { echo "--launcher-kills needs --ranks 2" >&2; exit 2; }
ATOLL=$(realpath "$ATOLL")
[[ -n $WORK ]] || WORK=$(mktemp -d /tmp/atoll_kill_campaign.XXXXXX)
mkdir -p "$WORK"
RANDOM=$SEED

# A small corpus and the tiny model, checkpointing every step so that kills land in saves.
awk 'BEGIN { srand(7); split("the island trains a model across many ranks and hosts", w, " ");
             for (d = 0; d < 200; d++) { for (i = 0; i < 40; i++) printf "%s%s", w[int(rand() * 10) + 1], (i % 9 == 8 ? ".\n" : " "); printf "\n%%\n" } }' \
  > "$WORK/corpus.txt"
"$ATOLL" data prepare --input "$WORK/corpus.txt" --out "$WORK/data" --val-fraction 0.1 > "$WORK/prepare.log" 2>&1 \
  || { cat "$WORK/prepare.log"; exit 1; }
cat > "$WORK/tiny.toml" <<TOML
[data]
dir = "$WORK/data"
auto_prepare = false
[model]
preset = "gpt2-tiny"
[train]
steps = $STEPS
batch_size = 4
seq_len = 32
grad_accum = 2
warmup_steps = 2
threads = 1
[eval]
every = 0
[sample]
every = 0
[checkpoint]
every = 1
keep = 2
[log]
every = 1
[hardware]
peak_gflops = 100.0
TOML

train_cmd() {  # run dir, then extra arguments
  local run=$1; shift
  if [[ $RANKS == 1 ]]; then echo "$ATOLL" train "$WORK/tiny.toml" --run.dir="$run" "$@"
  else echo "$ATOLL" launch --nproc-per-node 2 --grace 1 -- "$ATOLL" train "$WORK/tiny.toml" --run.dir="$run" "$@"; fi
}
final_sum() {  # the final checkpoint's model and optimizer state
  cat "$1/checkpoints/step_$(printf %08d "$STEPS")/model.safetensors" \
      "$1/checkpoints/step_$(printf %08d "$STEPS")/optimizer.safetensors" 2>/dev/null | sha256sum | cut -c1-16
}
alive() {  # a live (not zombie) process
  [[ -r /proc/$1/stat ]] || return 1
  local st; st=$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1); [[ $st != Z ]]
}

t0=$(date +%s.%N)
$(train_cmd "$WORK/ref") > "$WORK/ref.log" 2>&1 || { echo "the reference run failed:"; tail -5 "$WORK/ref.log"; exit 1; }
# Kills land within the run's own duration (a faster build or machine must not let every run
# finish before its kill, which would loop for ever): at most MAX_DELAY, at most 90% of the
# quickest whole run seen (the reference's, or a later run's that finished before its kill).
REF_S=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
REF=$(final_sum "$WORK/ref")
echo "reference: $STEPS steps on $RANKS rank(s), final state $REF"

kills=0 lkills=0 in_save=0 resumes=0 regress=0 skipped=0 survivors=0 runs=0 exact=0 failures=0
total=$((KILLS + LKILLS))
while (( kills + lkills < total )); do
  runs=$((runs + 1))
  if (( runs > 10 * total + 10 )); then  # bounded: a campaign that cannot land its kills says so
    echo "gave up: $runs runs for $((kills + lkills)) of $total kills (runs finish before the kill lands)"
    failures=$((failures + 1)); runs=$((runs - 1)); break
  fi
  run="$WORK/run$runs"
  attempt=0
  while :; do
    attempt=$((attempt + 1))
    log="$run.attempt$attempt.log"
    started=$(date +%s.%N)
    $(train_cmd "$run" --resume) > "$log" 2>&1 &
    pid=$!
    if (( kills + lkills < total )); then
      delay=$(awk -v r=$RANDOM -v m="$MAX_DELAY" -v t="$REF_S" \
        'BEGIN { if (0.9 * t < m) m = 0.9 * t; lo = 0.15 < m / 3 ? 0.15 : m / 3; printf "%.3f", lo + (m - lo) * r / 32767 }')
      sleep "$delay"
    fi
    if (( kills + lkills < total )) && kill -0 "$pid" 2>/dev/null; then
      # Which process: the trainer (1 rank), a random rank, or the launcher itself.
      victim=$pid what=trainer
      ranks=()
      if [[ $RANKS == 2 ]]; then
        for i in $(seq 1 40); do  # the launcher may not have started its ranks yet
          mapfile -t ranks < <(pgrep -P "$pid")
          (( ${#ranks[@]} == 2 )) && break; sleep 0.05
        done
        if (( lkills < LKILLS && (kills >= KILLS || RANDOM % 2 == 0) )); then what=launcher
        elif (( ${#ranks[@]} > 0 )); then victim=${ranks[$((RANDOM % ${#ranks[@]}))]} what=rank
        else what="launcher (before its ranks started)"; fi
      fi
      busy=$(ls -d "$run"/checkpoints/*.tmp "$run"/checkpoints/latest.tmp 2>/dev/null | wc -l)
      kill -9 "$victim" 2>/dev/null
      wait "$pid" 2>/dev/null
      (( busy > 0 )) && in_save=$((in_save + 1))
      if [[ $RANKS == 2 && $victim == "$pid" ]]; then
        if [[ $what == launcher ]]; then lkills=$((lkills + 1)); else kills=$((kills + 1)); fi
        left=0
        for i in $(seq 1 100); do  # bounded: 10 s
          left=0; for r in "${ranks[@]}"; do alive "$r" && left=$((left + 1)); done
          (( left == 0 )) && break; sleep 0.1
        done
        survivors=$((survivors + left))
        for r in "${ranks[@]}"; do alive "$r" && kill -9 "$r"; done
      else
        kills=$((kills + 1))
      fi
      echo "kill $((kills + lkills))/$total: $what after ${delay}s (save in progress: $([[ $busy -gt 0 ]] && echo yes || echo no))"
      continue
    fi
    wait "$pid"; rc=$?
    if [[ $rc != 0 ]]; then echo "run $runs attempt $attempt failed (rc $rc):"; tail -5 "$log"; failures=$((failures + 1)); break; fi
    if (( attempt == 1 )); then
      # A whole run finished before its kill: runs are quicker than the reference was (its start
      # can be cold: page cache, a loaded machine), so the kills' window shrinks to this run.
      took=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
      REF_S=$(awk -v r="$REF_S" -v t="$took" 'BEGIN { printf "%.3f", t < r ? t : r }')
    fi
    break
  done
  # Every resume of this run: from a complete checkpoint (verified before loading), never behind
  # the previous one, never skipping a bad one.
  prev=0
  for i in $(seq 1 "$attempt"); do
    l="$run.attempt$i.log"
    s=$(grep -o 'resumed from [^ ]* at step [0-9]*' "$l" | grep -o '[0-9]*$' | head -1)
    if [[ -n $s ]]; then resumes=$((resumes + 1)); (( s < prev )) && regress=$((regress + 1)); prev=$s; fi
    skipped=$((skipped + $(grep -c -- '--resume: skipping' "$l")))
  done
  if [[ -z $(grep -l "done: step $STEPS" "$run".attempt*.log 2>/dev/null) ]]; then
    # Killed on its last stretch: finish it uninterrupted.
    $(train_cmd "$run" --resume) > "$run.final.log" 2>&1 || { echo "run $runs: the final resume failed"; tail -5 "$run.final.log"; failures=$((failures + 1)); }
  fi
  got=$(final_sum "$run")
  if [[ $got == "$REF" ]]; then exact=$((exact + 1)); else echo "run $runs: final state $got differs from $REF"; failures=$((failures + 1)); fi
done

echo "summary: $RANKS rank(s), $kills trainer kills, $lkills launcher kills ($in_save during a save) over $runs runs;" \
     "$resumes resumes, $regress went backwards, $skipped skipped a bad checkpoint; bit-exact runs: $exact/$runs;" \
     "ranks that outlived their launcher: $survivors"
(( KEEP )) || rm -rf "$WORK"
(( failures == 0 && regress == 0 && skipped == 0 && survivors == 0 && exact == runs ))
