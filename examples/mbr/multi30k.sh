#!/usr/bin/env bash
# Minimum Bayes risk decoding against beam search on Multi30k De-En (test2016, 1,000
# sentences), under the protocol of the MBR literature (Freitag et al., 2023; Eikema &
# Aziz, 2020): N epsilon samples (epsilon 0.02) as both candidates and pseudo-references,
# the utility chrF or sBLEU, against beam 5 of the same model; SEEDS sampling seeds; test
# BLEU and chrF with a paired bootstrap against beam 5 (scripts/score/compare_runs.py,
# beam 5's one output paired with every seed's), and the seconds per sentence (each run's
# .log); each run's candidates, their counts and risks in gen/mbr.*.jsonl (--mbr-output-file).
#
# Models (one core each): the MLE transformer of examples/mgs/multi30k.sh and the same
# model after 600 updates of MRT on sBLEU (mrt) and on chrF (mrt_chrf), both with the MLE
# term; the recipe trains what is missing with that script (METHODS="mrt mrt_chrf mle_cont",
# one fine-tuning seed) into the same WORK_DIR, so a WORK_DIR of examples/mgs/multi30k.sh
# is reused as it is. A rerun skips finished outputs.
#
# usage: examples/mbr/multi30k.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), MODELS ("mle mrt mrt_chrf"), COSTS ("chrf sbleu"),
#      SEEDS ("1 2 3"), N (32), PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults MODELS="mle mrt mrt_chrf" COSTS="chrf sbleu" SEEDS="1 2 3" N=32 PYTHON=python
log() { echo "==> $(date +%H:%M:%S) $*"; }

checkpoint() {  # model name -> its checkpoint
  case $1 in
    mle) echo "$WORK/mle/checkpoint_best.pt" ;;
    mrt | mrt_chrf) echo "$WORK/$1.s1/checkpoint_last.pt" ;;
    *) echo "unknown model $1 (mle, mrt, mrt_chrf)" >&2; return 1 ;;
  esac
}
missing=0
for model in $MODELS; do [ -s "$(checkpoint "$model")" ] || missing=1; done
if [ "$missing" = 1 ]; then
  log "training the models: examples/mgs/multi30k.sh"
  METHODS="mrt mrt_chrf mle_cont" SEEDS=1 PYTHON=$PYTHON bash examples/mgs/multi30k.sh "$WORK"
fi

GEN=(--gen-subset test --batch-size 64 --required-batch-size-multiple 1 --post-process sentencepiece --max-len-a 1.2
  --max-len-b 10)
mkdir -p "$WORK/gen"
for model in $MODELS; do
  out="$WORK/gen/$([ "$model" = mle ] && echo mle || echo "$model.s1").beam5.out"
  [ -s "$out" ] || fairseq-generate "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" --path "$(checkpoint "$model")" \
    --beam 5 "${GEN[@]}" > "$out" 2> "$out.log"
  for cost in $COSTS; do
    for seed in $SEEDS; do
      out="$WORK/gen/mbr.$model.$cost.n$N.s$seed.out"
      [ -s "$out" ] && continue
      log "MBR: $model, $cost, N $N, seed $seed"
      fairseq-generate "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" --path "$(checkpoint "$model")" \
        --task translation_mbr --mbr-num-candidates "$N" --mbr-task-loss "$cost" --seed "$seed" "${GEN[@]}" \
        --mbr-output-file "${out%.out}.jsonl" > "$out.part" 2> "$out.log"
      mv "$out.part" "$out"
    done
  done
done

for model in $MODELS; do
  beam="$WORK/gen/$([ "$model" = mle ] && echo mle || echo "$model.s1").beam5.out"
  specs=("$(seed_spec beam5 "$beam")")
  for cost in $COSTS; do specs+=("$(seed_spec "mbr_$cost" "$WORK/gen/mbr.$model.$cost.n$N.s@SEED@.out")"); done
  echo
  echo "test, $model: beam 5 against MBR (N $N, epsilon 0.02; seconds per sentence in $WORK/gen/*.log)"
  "$PYTHON" scripts/score/compare_runs.py --control beam5 "${specs[@]}" --metrics bleu,chrf,sentence_bleu,avg_hyp_len \
    --json "$WORK/compare.$model.n$N.json" | tee "$WORK/compare.$model.n$N.md"
done
