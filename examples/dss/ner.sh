#!/usr/bin/env bash
# Differentiable scheduled sampling on CoNLL-2003 NER under the thesis's protocol
# (Goyal thesis section 3.3.3, Tables 3.1 and 3.2), CPU scale.
#
# Every run: the thesis's NER model (tagging_lstm_ner), trained from scratch with
# teacher forcing in epoch 1, then eps = k / (k + exp(t / k)) per epoch (t = epochs
# after the first), until greedy dev F1 has not improved for PATIENCE epochs (at most
# MAX_EPOCH); the checkpoint with the best greedy dev F1 (--tagging-eval) is decoded
# greedily on dev and test and scored with conlleval semantics.
#
# Stages: examples/lib.sh's dss_protocol (tune: the first seed of every system x
# config, k in KS, alpha fixed in FIXED_ALPHAS or annealed from 1 by x G per epoch
# for G in GROWTHS; restarts: the other SEEDS of each system's best-on-dev config,
# and of the best alpha at every k for Table 3.2; table: the best-on-dev restart
# and the mean +- std of all restarts). Each skips finished runs, so a rerun
# resumes; an interrupted training resumes from its checkpoint_last.pt. Run
# directories: WORK/SYSTEM.CONFIG.sSEED.
#
# usage: examples/dss/ner.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), SEEDS ("1 2 3"; the first is the tuning seed),
#      KS ("1 10 100"), FIXED_ALPHAS ("1 10"), GROWTHS ("2"), PATIENCE (4),
#      MAX_EPOCH (30), JOBS (2: runs in parallel, one thread each), ONLY (systems;
#      default all), STAGES ("tune restarts table")
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults SEEDS="1 2 3" KS="1 10 100" FIXED_ALPHAS="1 10" GROWTHS=2 PATIENCE=4 MAX_EPOCH=30 JOBS=2 \
  STAGES="tune restarts table" PYTHON=python
export OMP_NUM_THREADS=1
D=$FAIRSEQ_EXT_DATA/conll2003
mkdir -p "$WORK"
TASK=(--user-dir "$(fairseq-ext-dir)" --task sequence_tagging --tagging-column ner --tagging-cache-dir "$WORK/cache")
ONLY=${ONLY:-$DSS_SYSTEMS}

# binarize once, before the parallel runs share the cache
[ -s "$WORK/prepare.log" ] || fairseq-train "$D" "${TASK[@]}" --arch tagging_lstm_ner --criterion cross_entropy \
  --optimizer adam --lr 0.005 --max-tokens 1000 --max-update 1 --no-save --disable-validation --num-workers 0 \
  > "$WORK/prepare.log" 2>&1

run() {  # SYSTEM CONFIG SEED
  local dir="$WORK/$1.$2.s$3"
  if [ ! -s "$dir/test.json" ]; then
    mkdir -p "$dir"
    # shellcheck disable=SC2046
    finished "$dir.train.log" || fairseq-train "$D" "${TASK[@]}" --arch tagging_lstm_ner $(dss_criterion "$1" "$2") \
      --optimizer adam --lr 0.005 --max-tokens 1000 --max-epoch "$MAX_EPOCH" --patience "$PATIENCE" \
      --save-dir "$dir" --no-epoch-checkpoints --num-workers 0 --seed "$3" --tagging-eval \
      --best-checkpoint-metric f1 --maximize-best-checkpoint-metric --log-format simple >> "$dir.train.log" 2>&1
    for split in valid test; do
      fairseq-generate "$D" "${TASK[@]}" --path "$dir/checkpoint_best.pt" --gen-subset $split --beam 1 \
        --search-algorithm fairseq --batch-size 256 > "$dir/$split.gen" 2> "$dir/$split.gen.log"
      "$PYTHON" scripts/score/score_tagging.py "$dir/$split.gen" --json "$dir/$split.json" > /dev/null
    done
    rm -f "$dir"/checkpoint_last.pt
  fi
  echo "$(date +%H:%M:%S) done: $1 $2 seed $3"
}

dss_protocol "$WORK" run
