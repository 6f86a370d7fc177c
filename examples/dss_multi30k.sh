#!/usr/bin/env bash
# Differentiable scheduled sampling on Multi30k De-En (Goyal thesis Table 3.1,
# MT columns), CPU scale: the thesis's MT model shape (1-layer BiLSTM encoder and
# 1-layer LSTM decoder with attention, 256 units) on a joint 4k BPE vocabulary.
#
# Every run shares a teacher-forced warm-up of WARM_UPDATES updates (the
# schedule's warm-up, the thesis's first teacher-forced epoch), then trains
# FT_UPDATES more updates in its own mode: CE (the baseline: teacher forcing
# throughout), plain scheduled sampling (hard-argmax / hard-sample) and DSS
# (soft-argmax / soft-sample, alpha fixed or annealed), with eps = k / (k +
# exp(t / k)) per update (k = DECAY_K) after the warm-up. All runs use the
# differentiable_scheduled_sampling criterion (with eps = 1 it is exactly
# cross-entropy), so each resumes the warm-up's checkpoint with its optimizer
# state and update count (fairseq restores the update count only together with
# the optimizer state, and only for the same criterion class).
# Scores: sacreBLEU of greedy and beam-5 decodes of dev (val) and test2016.
#
# usage: examples/dss_multi30k.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), WARM_UPDATES (600), FT_UPDATES (200),
#      DECAY_K (50), SEEDS ("1"), JOBS (2), VOCAB (4000), ONLY (run names)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
WARM_UPDATES=${WARM_UPDATES:-600}
FT_UPDATES=${FT_UPDATES:-200}
DECAY_K=${DECAY_K:-50}
SEEDS=${SEEDS:-1}
JOBS=${JOBS:-2}
VOCAB=${VOCAB:-4000}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1
mkdir -p "$WORK"

[ -d "$WORK/data/bin" ] || bash scripts/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB" \
  > "$WORK/prepare.log" 2>&1
MODEL=(--user-dir fairseq_ext --arch lstm --encoder-layers 1 --decoder-layers 1 --encoder-bidirectional
  --encoder-embed-dim 256 --encoder-hidden-size 256 --decoder-embed-dim 256 --decoder-hidden-size 256
  --decoder-out-embed-dim 256 --dropout 0.2 --optimizer adam --lr 0.002 --clip-norm 1.0 --max-tokens 4000
  --num-workers 0 --no-epoch-checkpoints --log-format simple --log-interval 50
  --criterion differentiable_scheduled_sampling --dss-schedule inverse_sigmoid --dss-schedule-unit update)
DSS=(--dss-warmup "$WARM_UPDATES" --dss-decay-k "$DECAY_K")
declare -A RUNS=(
  [ce]="--dss-warmup 1e12"
  [ss_greedy]="${DSS[*]} --dss-mode hard-argmax"
  [ss_sample]="${DSS[*]} --dss-mode hard-sample"
  [soft_greedy_fixed]="${DSS[*]} --dss-mode soft-argmax --dss-alpha 1"
  [soft_greedy_annealed]="${DSS[*]} --dss-mode soft-argmax --dss-alpha 1 --dss-alpha-growth 1.01"
  [soft_sample_fixed]="${DSS[*]} --dss-mode soft-sample --dss-alpha 1"
  [soft_sample_annealed]="${DSS[*]} --dss-mode soft-sample --dss-alpha 1 --dss-alpha-growth 1.01"
)
ORDER="ce ss_greedy ss_sample soft_greedy_fixed soft_greedy_annealed soft_sample_fixed soft_sample_annealed"
ONLY=${ONLY:-$ORDER}

for seed in $SEEDS; do
  warm="$WORK/warm.s$seed"
  if ! finished "$warm.log"; then  # (an interrupted warm-up resumes from its checkpoint_last.pt)
    echo "==> teacher-forced warm-up, seed $seed: $WARM_UPDATES updates"
    fairseq-train "$WORK/data/bin" "${MODEL[@]}" --dss-warmup 1e12 --max-update "$WARM_UPDATES" \
      --seed "$seed" --save-dir "$warm" --disable-validation >> "$warm.log" 2>&1 || { tail "$warm.log"; exit 1; }
  fi
done

run() {  # name seed
  local name=$1 seed=$2 dir="$WORK/$1.s$2"
  if [ ! -e "$dir/done" ]; then
    mkdir -p "$dir"
    # start from the warm-up, unless an interrupted run left its own checkpoint: resume that
    if [ ! -e "$dir/checkpoint_last.pt" ]; then
      cp "$WORK/warm.s$seed/checkpoint_last.pt" "$dir/checkpoint_last.pt.tmp"
      mv "$dir/checkpoint_last.pt.tmp" "$dir/checkpoint_last.pt"
    fi
    # shellcheck disable=SC2086
    fairseq-train "$WORK/data/bin" "${MODEL[@]}" ${RUNS[$name]} --max-update $((WARM_UPDATES + FT_UPDATES)) \
      --seed "$seed" --save-dir "$dir" --disable-validation > "$dir.train.log" 2>&1
    for split in valid test; do
      for beam in 1 5; do
        fairseq-generate "$WORK/data/bin" --user-dir fairseq_ext --path "$dir/checkpoint_last.pt" --gen-subset $split \
          --beam $beam --batch-size 128 --required-batch-size-multiple 1 --post-process sentencepiece \
          --max-len-a 1.2 --max-len-b 10 \
          > "$dir/$split.beam$beam.gen" 2> "$dir/$split.beam$beam.gen.log"
        "$PYTHON" scripts/score.py "$dir/$split.beam$beam.gen" --json "$dir/$split.beam$beam.json" > /dev/null
      done
    done
    touch "$dir/done"
  fi
  echo "done: $name seed $seed"
}

for seed in $SEEDS; do
  for name in $ONLY; do
    throttle "$JOBS"
    run "$name" "$seed" &
  done
done
wait
for beam in 1 5; do
  echo "BLEU, beam $beam"
  "$PYTHON" examples/dss_table.py "$WORK" --metric bleu --suffix ".beam$beam" $ONLY
done
