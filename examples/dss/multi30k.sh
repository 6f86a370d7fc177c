#!/usr/bin/env bash
# Differentiable scheduled sampling on Multi30k De-En under the thesis's protocol
# (Goyal thesis section 3.3.3, Table 3.1 MT columns), CPU scale: the thesis's MT model
# shape (1-layer BiLSTM encoder and 1-layer LSTM decoder with attention, 256 units) on
# a joint sentencepiece vocabulary of VOCAB pieces, Adam 0.002, 4000 tokens a batch.
#
# Every run is trained from scratch: the first epoch teacher-forced (shared by all
# systems of a seed: WORK/warm.sSEED, which each run resumes with its optimizer state;
# all systems use the differentiable_scheduled_sampling criterion, CE as eps = 1
# throughout, so fairseq restores that state), then eps = k / (k + exp(t / k)) per
# epoch, until greedy dev BLEU (fairseq's --eval-bleu, detokenized) has not improved
# for PATIENCE epochs (at most MAX_EPOCH); checkpoint_best is decoded greedily and with
# beam 5 on dev (val) and test (test2016) and scored with sacreBLEU
# (scripts/score/score.py). The stages (tune, restarts, table) and CONFIG names are
# examples/lib.sh's dss_protocol; selection by greedy dev BLEU. Then
# scripts/score/compare_runs.py: each system's selected config, all restarts, against CE
# (sacreBLEU's paired bootstrap per seed pair and pooled; WORK/compare.beamB.md), and
# each system's best-on-dev restart against CE's (the thesis's reported runs;
# WORK/compare_best.beamB.md), greedy (B = 1) and beam 5.
#
# A rerun skips finished runs and resumes interrupted ones (checkpoint_last.pt).
#
# usage: examples/dss/multi30k.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), SEEDS ("1 2 3"; the first tunes), KS ("1 10 100"),
#      FIXED_ALPHAS ("1"), GROWTHS ("2"), PATIENCE (3), MAX_EPOCH (15), JOBS (2),
#      VOCAB (4000), ONLY (systems; default all), STAGES ("tune restarts table")
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults SEEDS="1 2 3" KS="1 10 100" FIXED_ALPHAS=1 GROWTHS=2 PATIENCE=3 MAX_EPOCH=15 JOBS=2 VOCAB=4000 \
  STAGES="tune restarts table" ONLY="$DSS_SYSTEMS" PYTHON=python
export OMP_NUM_THREADS=1 DSS_CE_AS_DSS=1
# every run resumes its seed's epoch-1 warm-up checkpoint, so the plugin's exact resume (on by
# default) would cut its batches otherwise than the published runs, made without it
# (docs/dss.md); FAIRSEQ_EXT_EXACT_RESUME=1 in the environment opts in
export FAIRSEQ_EXT_EXACT_RESUME=${FAIRSEQ_EXT_EXACT_RESUME:-0}
mkdir -p "$WORK"

# the table stage alone reads only the runs' scores and test outputs (e.g. a WORK holding a copy of
# examples/dss/results/multi30k): it prepares and trains nothing
TRAINS=0
[[ " $STAGES " == *" tune "* || " $STAGES " == *" restarts "* ]] && TRAINS=1
if [ "$TRAINS" = 1 ] && [ ! -d "$WORK/data/bin" ]; then
  bash scripts/prepare/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB" > "$WORK/prepare.log" 2>&1
fi
BIN=$WORK/data/bin
MODEL=(--user-dir "$(fairseq-ext-dir)" --arch lstm --encoder-layers 1 --decoder-layers 1 --encoder-bidirectional
  --encoder-embed-dim 256 --encoder-hidden-size 256 --decoder-embed-dim 256 --decoder-hidden-size 256
  --decoder-out-embed-dim 256 --dropout 0.2 --optimizer adam --lr 0.002 --clip-norm 1.0 --max-tokens 4000
  --num-workers 0 --no-epoch-checkpoints --log-format simple --log-interval 50)
DEV_BLEU=(--eval-bleu --eval-bleu-args '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok space
  --eval-bleu-remove-bpe sentencepiece --best-checkpoint-metric bleu --maximize-best-checkpoint-metric)

# claim DIR [wait]: hold DIR's lock (flock on DIR.lock) until this (sub)shell ends, so that two
# instances of the recipe on one WORK (e.g. one per core) never train the same run at once: the
# second skips it (or, with "wait", waits for it). A lock dies with its process: nothing stale.
# Without flock (e.g. macOS) every claim succeeds: run one instance per WORK there.
claim() {
  command -v flock > /dev/null || return 0
  exec {lock_fd}> "$1.lock"
  if [ "${2:-}" = wait ]; then flock "$lock_fd"; else flock -n "$lock_fd"; fi
}

warm() (  # SEED: the teacher-forced first epoch, shared by every system of the seed
  local dir="$WORK/warm.s$1"
  claim "$dir" wait
  # a finished log without its checkpoint (e.g. a log copied from results/, which holds no
  # checkpoints): train again
  finished "$dir.log" && [ -e "$dir/checkpoint_last.pt" ] && return 0
  rm -f "$dir.log"
  # shellcheck disable=SC2046
  fairseq-train "$BIN" "${MODEL[@]}" $(dss_criterion ce base) --max-epoch 1 --seed "$1" --save-dir "$dir" \
    --disable-validation >> "$dir.log" 2>&1 || { tail "$dir.log" >&2; return 1; }
)

run() (  # SYSTEM CONFIG SEED
  local dir="$WORK/$1.$2.s$3" split beam
  mkdir -p "$dir"
  if ! claim "$dir"; then echo "$(date +%H:%M:%S) busy (another instance has it): $1 $2 seed $3"; return 0; fi
  if [ ! -s "$dir/test.beam5.json" ]; then
    # a finished log without checkpoint_best.pt (e.g. copied from results/): train again
    if finished "$dir.train.log" && [ ! -e "$dir/checkpoint_best.pt" ]; then rm -f "$dir.train.log"; fi
    if ! finished "$dir.train.log"; then
      if [ ! -e "$dir/checkpoint_last.pt" ]; then  # start from the warm-up (an interrupted run resumes its own)
        rm -f "$dir.train.log"  # the run starts over: a fresh log
        cp "$WORK/warm.s$3/checkpoint_last.pt" "$dir/checkpoint_last.pt.tmp"
        mv "$dir/checkpoint_last.pt.tmp" "$dir/checkpoint_last.pt"
      fi
      # shellcheck disable=SC2046
      fairseq-train "$BIN" "${MODEL[@]}" $(dss_criterion "$1" "$2") "${DEV_BLEU[@]}" --max-epoch "$MAX_EPOCH" \
        --patience "$PATIENCE" --seed "$3" --save-dir "$dir" >> "$dir.train.log" 2>&1
    fi
    for split in valid test; do
      for beam in 1 5; do
        fairseq-generate "$BIN" --user-dir "$(fairseq-ext-dir)" --path "$dir/checkpoint_best.pt" --gen-subset $split \
          --beam $beam --batch-size 128 --required-batch-size-multiple 1 --post-process sentencepiece \
          --max-len-a 1.2 --max-len-b 10 > "$dir/$split.beam$beam.gen" 2> "$dir/$split.beam$beam.gen.log"
        "$PYTHON" scripts/score/score.py "$dir/$split.beam$beam.gen" --json "$dir/$split.beam$beam.json" > /dev/null
      done
    done
    rm -f "$dir/checkpoint_last.pt"
  fi
  echo "$(date +%H:%M:%S) done: $1 $2 seed $3"
)

if [ "$TRAINS" = 1 ]; then for seed in $SEEDS; do warm "$seed"; done; fi
dss_protocol "$WORK" run --metric bleu --suffix .beam1

if [[ " $STAGES " == *" table "* ]]; then
  read -r tune_seed _ <<< "$SEEDS"
  picks=()  # per system: "SYSTEM CONFIG SEED", its selected config and its best-on-dev restart
  for sys in $ONLY; do
    picks+=("$sys $("$PYTHON" examples/dss/table.py "$WORK" --metric bleu --suffix .beam1 --best "$sys" \
      --tune-seed "$tune_seed")")
  done
  for beam in 1 5; do
    specs=() best=()
    for pick in "${picks[@]}"; do
      read -r sys cfg seed <<< "$pick"
      specs+=("$(seed_spec "$sys" "$WORK/$sys.$cfg.s@SEED@/test.beam$beam.gen")")
      best+=("$sys=$WORK/$sys.$cfg.s$seed/test.beam$beam.gen")
    done
    echo
    echo "test, beam $beam: every restart of each system's selected config against CE"
    "$PYTHON" scripts/score/compare_runs.py --control ce "${specs[@]}" --json "$WORK/compare.beam$beam.json" \
      | tee "$WORK/compare.beam$beam.md"
    echo
    echo "test, beam $beam: each system's best-on-dev restart (the run the thesis reports) against CE's"
    "$PYTHON" scripts/score/compare_runs.py --control ce "${best[@]}" --json "$WORK/compare_best.beam$beam.json" \
      | tee "$WORK/compare_best.beam$beam.md"
  done
fi
