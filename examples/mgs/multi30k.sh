#!/usr/bin/env bash
# CPU-scale Table 4 (MGS paper) on Multi30k De-En: an MLE transformer trained to
# convergence (best validation loss), then fine-tuning with MGS-sBLEU, MGS-edit, MRT
# and PG (each with the package's defaults) under the same update budget, against
# the control of continuing MLE for that budget (mle_cont); SEEDS fine-tuning seeds
# per method; the last checkpoint of every fine-tune is evaluated (same budget, same
# selection rule for all). Test: BLEU with beam 5, sentence BLEU / edit / length
# greedy; mean +- std over seeds and paired bootstrap against the control
# (scripts/score/compare_runs.py). Dev learning curves: greedy BLEU every EVAL_EVERY updates
# (fairseq's --eval-bleu), in each fine-tune's log; scripts/plot/plot_log.py draws them.
#
# The paper: IWSLT'14 De-En, a converged transformer, fine-tuned with MGS for about 2
# epochs; we keep its settings where they apply (K = 4 candidates, alpha 100, noise
# 1, the mixture proposal; examples/mgs/README.md lists the differences and also reports MGS rows
# at alpha 1 (MGS_ALPHA=1), where the candidate weights are uniform).
#
# A rerun skips finished trainings and resumes interrupted ones (fine-tunes start from
# the MLE model with --finetune-from-model, only on their first launch, and save every
# EVAL_EVERY updates); decoding and scoring skip finished outputs.
#
# usage: examples/mgs/multi30k.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), MLE_UPDATES (3000), FT_UPDATES (600), SEEDS ("1 2 3"),
#      EVAL_EVERY (100), METHODS ("mle_cont mgs_sbleu mgs_edit mrt pg"; also mrt_chrf, mrt_chrf_nomle:
#      MRT on chrF (beta 2) with and without the MLE term, the length-hacking check; mrt_chrf1,
#      mrt_chrf1_nomle: the same with chrF's beta 1, the guard), VOCAB (2000),
#      MGS_ALPHA (100: the paper's alpha for MT; 1 reproduces the uniform-weight rows)
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults MLE_UPDATES=3000 FT_UPDATES=600 SEEDS="1 2 3" EVAL_EVERY=100 \
  METHODS="mle_cont mgs_sbleu mgs_edit mrt pg" VOCAB=2000 MGS_ALPHA=100 PYTHON=python
mkdir -p "$WORK"
log() { echo "==> $(date +%H:%M:%S) $*"; }

[ -d "$WORK/data/bin" ] || bash scripts/prepare/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB"
MODEL=(--arch transformer --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
  --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings --dropout 0.1 --num-workers 0 --no-epoch-checkpoints --log-format json)
# greedy dev BLEU on detokenized text (sentencepiece removed), for the learning curves
DEV_BLEU=(--eval-bleu --eval-bleu-args '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}' --eval-bleu-detok space
  --eval-bleu-remove-bpe sentencepiece)

if ! finished "$WORK/mle.log"; then
  log "MLE: $MLE_UPDATES updates, validation every 250, checkpoint_best by validation loss"
  fairseq-train "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${MODEL[@]}" --seed 1 --optimizer adam \
    --adam-betas '(0.9,0.98)' --lr 0.003 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --max-update "$MLE_UPDATES" \
    --validate-interval-updates 250 --save-interval-updates 250 --keep-interval-updates 1 \
    --save-dir "$WORK/mle" >> "$WORK/mle.log" 2>&1
fi
BASE="$WORK/mle/checkpoint_best.pt"

criterion_args() {  # the criterion of a method: the package's defaults, and the paper's alpha for MGS
  case $1 in
    mle_cont) echo "--criterion label_smoothed_cross_entropy --label-smoothing 0.1" ;;
    mgs_sbleu) echo "--criterion mgs --mgs-task-loss sbleu --mgs-alpha $MGS_ALPHA" ;;  # 100: the paper's alpha for MT
    mgs_edit) echo "--criterion mgs --mgs-task-loss edit --mgs-alpha $MGS_ALPHA" ;;
    mrt) echo "--criterion mrt --mrt-task-loss sbleu" ;;
    pg) echo "--criterion pg --pg-task-loss sbleu" ;;
    mrt_chrf) echo "--criterion mrt --mrt-task-loss chrf" ;;  # chrF beta 2, recall-weighted (the control), with the MLE term
    mrt_chrf_nomle) echo "--criterion mrt --mrt-task-loss chrf --mrt-mle-weight 0" ;;  # chrF beta 2 without it: length hacking
    mrt_chrf1) echo "--criterion mrt --mrt-task-loss chrf(beta=1)" ;;  # chrF weighting recall as precision
    mrt_chrf1_nomle) echo "--criterion mrt --mrt-task-loss chrf(beta=1) --mrt-mle-weight 0" ;;
    *) echo "unknown method $1" >&2; return 1 ;;
  esac
}

for seed in $SEEDS; do
  for name in $METHODS; do
    run="$name.s$seed"
    finished "$WORK/$run.log" && continue
    log "$run: $FT_UPDATES updates from the MLE model"
    # shellcheck disable=SC2046
    fairseq-train "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${MODEL[@]}" --seed "$seed" --finetune-from-model "$BASE" \
      --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0003 --clip-norm 1.0 --max-tokens 2048 \
      --max-update "$FT_UPDATES" --save-dir "$WORK/$run" --validate-interval-updates "$EVAL_EVERY" \
      --save-interval-updates "$EVAL_EVERY" --keep-interval-updates 1 --log-interval 10 "${DEV_BLEU[@]}" \
      $(criterion_args "$name") >> "$WORK/$run.log" 2>&1
  done
done

decode() {  # checkpoint, beam, output
  [ -s "$3" ] || fairseq-generate "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" --path "$1" --gen-subset test \
    --beam "$2" --batch-size 128 --required-batch-size-multiple 1 --post-process sentencepiece --max-len-a 1.2 \
    --max-len-b 10 > "$3" 2> "$3.log"
}
mkdir -p "$WORK/gen"
for beam in 1 5; do
  decode "$BASE" "$beam" "$WORK/gen/mle.beam$beam.out"
  for seed in $SEEDS; do
    for name in $METHODS; do
      decode "$WORK/$name.s$seed/checkpoint_last.pt" "$beam" "$WORK/gen/$name.s$seed.beam$beam.out"
    done
  done
done

for beam in 1 5; do
  specs=()
  for name in $METHODS; do specs+=("$(seed_spec "$name" "$WORK/gen/$name.s@SEED@.beam$beam.out")"); done
  echo
  echo "test, beam $beam (MLE base model: see $WORK/gen/mle.beam$beam.out)"
  "$PYTHON" scripts/score/compare_runs.py --control mle_cont "${specs[@]}" --bleu-details \
    --json "$WORK/compare.beam$beam.json" \
    | tee "$WORK/compare.beam$beam.md"
  "$PYTHON" scripts/score/score.py "$WORK/gen/mle.beam$beam.out" --json "$WORK/gen/mle.beam$beam.json" > /dev/null
done
