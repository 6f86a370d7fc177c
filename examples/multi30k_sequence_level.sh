#!/usr/bin/env bash
# CPU-scale comparison on Multi30k De-En (MGS paper, Table 4 layout): an MLE
# transformer, then fine-tuning with MGS-sBLEU, MGS-edit, MRT and PG under the
# same update budget, against the control of continuing MLE for that budget
# (mle_cont); BLEU with beam 5, sentence BLEU and edit with greedy.
#
# A rerun skips finished trainings and resumes interrupted ones (fine-tunes start from
# the MLE model with --finetune-from-model, so only on their first launch, and save
# every 20 updates).
#
# usage: examples/multi30k_sequence_level.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), MLE_UPDATES (300), FT_UPDATES (60), VOCAB (2000)
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
MLE_UPDATES=${MLE_UPDATES:-300}
FT_UPDATES=${FT_UPDATES:-60}
VOCAB=${VOCAB:-2000}
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
log() { echo "==> $*"; }

[ -d "$WORK/data/bin" ] || bash scripts/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB"
MODEL=(--arch transformer --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128
  --encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings --dropout 0.1 --seed 1 --num-workers 0 --no-epoch-checkpoints --log-format simple)

if ! finished "$WORK/mle.log"; then
  log "MLE: $MLE_UPDATES updates"
  fairseq-train "$WORK/data/bin" --user-dir fairseq_ext "${MODEL[@]}" --optimizer adam --adam-betas '(0.9,0.98)' \
    --lr 0.003 --lr-scheduler inverse_sqrt --warmup-updates 100 --criterion label_smoothed_cross_entropy \
    --label-smoothing 0.1 --max-tokens 4096 --max-update "$MLE_UPDATES" --save-dir "$WORK/mle" >> "$WORK/mle.log" 2>&1
fi

finetune() {  # name, criterion args...
  local name=$1; shift
  finished "$WORK/$name.log" && return 0
  log "$name: $FT_UPDATES updates from the MLE model"
  fairseq-train "$WORK/data/bin" --user-dir fairseq_ext "${MODEL[@]}" --finetune-from-model "$WORK/mle/checkpoint_last.pt" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0003 --max-tokens 2048 --max-update "$FT_UPDATES" \
    --save-dir "$WORK/$name" --disable-validation --save-interval-updates 20 --keep-interval-updates 1 \
    --log-interval 10 "$@" >> "$WORK/$name.log" 2>&1
}
finetune mle_cont --criterion label_smoothed_cross_entropy --label-smoothing 0.1
finetune mgs_sbleu --criterion mgs --mgs-task-loss sbleu --mgs-alpha 100 --mgs-post-process sentencepiece
finetune mgs_edit --criterion mgs --mgs-task-loss edit --mgs-alpha 100
finetune mrt --criterion mrt --mrt-task-loss sbleu --mrt-candidates 4 --mrt-post-process sentencepiece
finetune pg --criterion pg --pg-task-loss sbleu --pg-samples 4 --pg-post-process sentencepiece

rows=()
for name in mle mle_cont mgs_sbleu mgs_edit mrt pg; do
  for beam in 1 5; do
    out="$WORK/gen_${name}_beam$beam.out"
    [ -s "$out" ] || fairseq-generate "$WORK/data/bin" --user-dir fairseq_ext --path "$WORK/$name/checkpoint_last.pt" \
      --gen-subset test --beam "$beam" --batch-size 128 --post-process sentencepiece --max-len-a 1.2 --max-len-b 10 \
      > "$out" 2> "$WORK/gen_${name}_beam$beam.log"
    "$PYTHON" scripts/score.py "$out" --json "$WORK/scores_${name}_beam$beam.json" > /dev/null 2>&1
    rows+=("$name/beam$beam=$WORK/scores_${name}_beam$beam.json")
  done
done
"$PYTHON" examples/print_table.py "${rows[@]}"
