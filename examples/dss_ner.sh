#!/usr/bin/env bash
# Differentiable scheduled sampling on CoNLL-2003 NER (Goyal thesis Table 3.1
# layout, and the decay-strength sweep of Table 3.2), CPU scale.
#
# Every run: the thesis's NER model (tagging_lstm_ner), EPOCHS epochs, teacher
# forcing in epoch 1, then eps = k / (k + exp(t / k)) per epoch; the checkpoint
# with the best greedy dev F1 (--eval-tagging); greedy decoding of dev and test,
# scored with conlleval semantics. Prints mean, min and max over SEEDS.
#
# usage: examples/dss_ner.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), SEEDS ("1 2"), EPOCHS (10), JOBS (2: runs in
#      parallel, one thread each), ONLY (space-separated run names; default all)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
SEEDS=${SEEDS:-1 2}
EPOCHS=${EPOCHS:-10}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python}
export OMP_NUM_THREADS=1
D=$FAIRSEQ_EXT_DATA/conll2003
mkdir -p "$WORK"
TASK=(--user-dir fairseq_ext --task sequence_tagging --tag-column ner --cache-dir "$WORK/cache")
DSS=(--criterion differentiable_scheduled_sampling --dss-schedule inverse_sigmoid --dss-schedule-unit epoch
  --dss-warmup 1)

declare -A RUNS=(
  [ce]="--criterion cross_entropy"
  [ss_greedy]="${DSS[*]} --dss-mode hard-argmax --dss-decay-k 10"
  [ss_sample]="${DSS[*]} --dss-mode hard-sample --dss-decay-k 10"
  [soft_greedy_fixed]="${DSS[*]} --dss-mode soft-argmax --dss-decay-k 10 --dss-alpha 1"
  [soft_greedy_annealed]="${DSS[*]} --dss-mode soft-argmax --dss-decay-k 10 --dss-alpha 1 --dss-alpha-growth 2"
  [soft_sample_fixed]="${DSS[*]} --dss-mode soft-sample --dss-decay-k 10 --dss-alpha 1"
  [soft_sample_annealed]="${DSS[*]} --dss-mode soft-sample --dss-decay-k 10 --dss-alpha 1 --dss-alpha-growth 2"
  [soft_greedy_annealed_k100]="${DSS[*]} --dss-mode soft-argmax --dss-decay-k 100 --dss-alpha 1 --dss-alpha-growth 2"
  [soft_greedy_annealed_k1]="${DSS[*]} --dss-mode soft-argmax --dss-decay-k 1 --dss-alpha 1 --dss-alpha-growth 2"
  [soft_greedy_annealed_always]="--criterion differentiable_scheduled_sampling --dss-schedule always --dss-warmup 1
    --dss-mode soft-argmax --dss-alpha 1 --dss-alpha-growth 2"
)
ORDER="ce ss_greedy ss_sample soft_greedy_fixed soft_greedy_annealed soft_sample_fixed soft_sample_annealed
  soft_greedy_annealed_k100 soft_greedy_annealed_k1 soft_greedy_annealed_always"
ONLY=${ONLY:-$ORDER}

# binarize once, before the parallel runs share the cache
fairseq-train "$D" "${TASK[@]}" --arch tagging_lstm_ner --criterion cross_entropy --optimizer adam --lr 0.005 \
  --max-tokens 1000 --max-update 1 --no-save --disable-validation --num-workers 0 > "$WORK/prepare.log" 2>&1

run() {  # name seed
  local name=$1 seed=$2 dir="$WORK/$1.s$2"
  if [ ! -s "$dir/test.json" ]; then
    # shellcheck disable=SC2086
    fairseq-train "$D" "${TASK[@]}" --arch tagging_lstm_ner ${RUNS[$name]} --optimizer adam --lr 0.005 \
      --max-tokens 1000 --max-epoch "$EPOCHS" --save-dir "$dir" --no-epoch-checkpoints --no-save-optimizer-state \
      --num-workers 0 --seed "$seed" --eval-tagging --best-checkpoint-metric f1 --maximize-best-checkpoint-metric \
      --log-format simple > "$dir.train.log" 2>&1
    for split in valid test; do
      fairseq-generate "$D" "${TASK[@]}" --path "$dir/checkpoint_best.pt" --gen-subset $split --beam 1 \
        --batch-size 256 > "$dir/$split.gen" 2> "$dir/$split.gen.log"
      "$PYTHON" scripts/score_tagging.py "$dir/$split.gen" --json "$dir/$split.json" > /dev/null
    done
    rm -f "$dir"/checkpoint_last.pt
  fi
  echo "done: $name seed $seed"
}

for seed in $SEEDS; do
  for name in $ONLY; do
    mkdir -p "$WORK/$name.s$seed"
    throttle "$JOBS"
    run "$name" "$seed" &
  done
done
wait
"$PYTHON" examples/dss_table.py "$WORK" $ONLY
