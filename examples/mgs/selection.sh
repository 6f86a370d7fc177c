#!/usr/bin/env bash
# Fine-tuning selected on validation BLEU, Multi30k De-En: from the converged MLE transformer of
# examples/mgs/multi30k.sh (best validation loss), `python -m fairseq_ext.finetune --cpu` with each
# method and learning rate (the start validated first, then every VALIDATE_EVERY updates, beam 5, detokenized
# BLEU; checkpoint_best.pt is the best validation or the start). Test: beam 5 of each run's
# checkpoint_best.pt against continued MLE (`--method mle` at its default learning rate, the same
# selection rule), paired bootstrap (scripts/score/compare_runs.py, the raw references).
#
# A rerun skips finished runs and decodings. The kept record: RESULTS (default
# examples/mgs/results/selection) receives every run's selection.json, the comparison table and JSON,
# and the commands.
#
# usage: examples/mgs/selection.sh WORK_DIR   (WORK_DIR: examples/mgs/multi30k.sh's, with its MLE model)
# env: FAIRSEQ_EXT_DATA (required), RUNS ("mle:3e-4 mrt:3e-4 mrt:1e-4 mrt:3e-5 pg:3e-4 pg:1e-4":
#      METHOD:LR pairs; the control mle:3e-4 is always run), SEEDS ("1"), UPDATES (300), VALIDATE_EVERY (30: a
#      tenth, finer than finetune's default fifth, to see the curve), JOBS (2: runs at
#      once, one thread each), RESULTS, PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults RUNS="mle:3e-4 mrt:3e-4 mrt:1e-4 mrt:3e-5 pg:3e-4 pg:1e-4" SEEDS="1" UPDATES=300 VALIDATE_EVERY=30 JOBS=2 \
  RESULTS=examples/mgs/results/selection PYTHON=python
export OMP_NUM_THREADS=1
log() { echo "==> $(date +%H:%M:%S) $*"; }

BASE="$WORK/mle/checkpoint_best.pt"
[ -f "$BASE" ] || { echo "$0: no $BASE: run examples/mgs/multi30k.sh $WORK first (its first stage trains the MLE" \
  "model; METHODS=mle_cont SEEDS=1 keeps the rest short)" >&2; exit 2; }
case " $RUNS " in *" mle:3e-4 "*) ;; *) RUNS="mle:3e-4 $RUNS" ;; esac
mkdir -p "$WORK/sel" "$RESULTS"

for seed in $SEEDS; do
  for run in $RUNS; do
    method=${run%%:*} lr=${run#*:} name="${run/:/_lr}.s$seed"
    [ -f "$WORK/sel/$name/selection.json" ] && grep -qs '"selected"' "$WORK/sel/$name/selection.json" && continue
    throttle "$JOBS"
    log "$name"
    "$PYTHON" -m fairseq_ext.finetune --cpu --mle "$BASE" --data "$WORK/data/bin" --method "$method" --lr "$lr" \
      --max-update "$UPDATES" --validate-every "$VALIDATE_EVERY" --seed "$seed" --save-dir "$WORK/sel/$name" -- --num-workers 0 --log-interval 20 \
      > "$WORK/sel/$name.log" 2>&1 &
  done
done
wait

decode() {  # checkpoint, output
  [ -s "$2" ] || fairseq-generate "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" --path "$1" --gen-subset test \
    --beam 5 --batch-size 128 --required-batch-size-multiple 1 --post-process sentencepiece --max-len-a 1.2 \
    --max-len-b 10 > "$2" 2> "$2.log"
}
specs=()
names=""
for run in $RUNS; do
  label=${run/:/_lr}
  for seed in $SEEDS; do decode "$WORK/sel/$label.s$seed/checkpoint_best.pt" "$WORK/sel/$label.s$seed.test.out"; done
  specs+=("$(seed_spec "$label" "$WORK/sel/$label.s@SEED@.test.out")")
  names+=" $label"
done
decode "$BASE" "$WORK/sel/start.test.out"
specs+=("start=$(for seed in $SEEDS; do printf '%s,' "$WORK/sel/start.test.out"; done | sed 's/,$//')")

"$PYTHON" scripts/score/compare_runs.py --control mle_lr3e-4 "${specs[@]}" --ref "$FAIRSEQ_EXT_DATA/multi30k/test.en" \
  --json "$RESULTS/compare.test.json" | tee "$RESULTS/compare.test.md"
for seed in $SEEDS; do
  for label in $names; do  # the work directory's path becomes WORK, as in command.txt
    sed "s|$(cd "$WORK" && pwd)/|WORK/|g" "$WORK/sel/$label.s$seed/selection.json" > "$RESULTS/$label.s$seed.selection.json"
  done
done
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d), $(nproc --all) cores," \
    "OMP_NUM_THREADS=1, JOBS=$JOBS"
  echo "RUNS=\"$RUNS\" SEEDS=\"$SEEDS\" UPDATES=$UPDATES VALIDATE_EVERY=$VALIDATE_EVERY RESULTS=$RESULTS" \
    "bash examples/mgs/selection.sh WORK"
} > "$RESULTS/command.txt"
"$PYTHON" scripts/report/selection_table.py "$RESULTS" | tee "$RESULTS/selection.md"
