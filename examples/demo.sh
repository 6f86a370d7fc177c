#!/usr/bin/env bash
# The main job on the embedded toy data set (fairseq_ext/toy.py): generate the
# data, binarize, train a tiny transformer with MLE, fine-tune it with
# --criterion mgs (sentence-BLEU task loss), decode the test set greedily and with
# beam 4, score, print MLE vs MGS. Deterministic (seeded); no download.
#
# A rerun resumes: a finished training is skipped (its log ends with fairseq's
# "done training"), an interrupted one (Ctrl-C) continues from its
# checkpoint_last.pt; the MGS fine-tune starts from the MLE model only on its first
# launch (--finetune-from-model) and saves every epoch. Data, decoding and scoring
# run again. Remove WORK_DIR to start over.
#
# usage: examples/demo.sh [WORK_DIR]      (make demo runs it in ./demo_work)
# env: MAX_UPDATE (MLE updates, default 600), MGS_UPDATES (default 100), BEAMS (beam sizes
#      to decode with, default "1 4"), PYTHON
set -euo pipefail
cd "$(dirname "$0")/.."
. examples/lib.sh
WORK=${1:-demo_work}
MAX_UPDATE=${MAX_UPDATE:-600}
MGS_UPDATES=${MGS_UPDATES:-100}
BEAMS=${BEAMS:-1 4}
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
log() { echo "==> $*"; }

log "[1/6] toy data -> $WORK/raw"
"$PYTHON" -m fairseq_ext.toy "$WORK/raw" --train 2000 --valid 200 --test 200 --seed 1

log "[2/6] fairseq-preprocess -> $WORK/bin"
rm -rf "$WORK/bin"
fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary --workers 1 \
  --trainpref "$WORK/raw/train" --validpref "$WORK/raw/valid" --testpref "$WORK/raw/test" \
  --destdir "$WORK/bin" > "$WORK/preprocess.log" 2>&1

MODEL=(--arch transformer --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64
  --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4
  --share-all-embeddings --dropout 0.1)
if finished "$WORK/train_mle.log"; then
  log "[3/6] MLE: finished, skipped (log: $WORK/train_mle.log)"
else
  log "[3/6] fairseq-train: tiny transformer, MLE, $MAX_UPDATE updates (log: $WORK/train_mle.log)"
  fairseq-train "$WORK/bin" --user-dir fairseq_ext --seed 1 "${MODEL[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.003 \
    --lr-scheduler inverse_sqrt --warmup-updates 200 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 1024 --max-update "$MAX_UPDATE" --validate-interval 5 --save-interval 5 --save-dir "$WORK/ckpt_mle" \
    --no-epoch-checkpoints --log-format simple --log-interval 200 --num-workers 0 2>&1 \
    | tee -a "$WORK/train_mle.log" | grep -E "\| valid \|" || true
fi
test -s "$WORK/ckpt_mle/checkpoint_best.pt" || { echo "demo: training failed, see $WORK/train_mle.log" >&2; exit 1; }

# --save-interval 1: a checkpoint every epoch (about 20 updates), validation still every 5
if finished "$WORK/train_mgs.log"; then
  log "[4/6] MGS: finished, skipped (log: $WORK/train_mgs.log)"
else
  log "[4/6] fairseq-train --criterion mgs: fine-tune for $MGS_UPDATES updates, task loss sBLEU (log: $WORK/train_mgs.log)"
  fairseq-train "$WORK/bin" --user-dir fairseq_ext --seed 1 "${MODEL[@]}" \
    --finetune-from-model "$WORK/ckpt_mle/checkpoint_best.pt" \
    --criterion mgs --mgs-task-loss sbleu --mgs-alpha 100 --mgs-candidates 4 \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0003 --max-tokens 1024 --max-update "$MGS_UPDATES" \
    --save-dir "$WORK/ckpt_mgs" --no-epoch-checkpoints --validate-interval 5 --save-interval 1 \
    --best-checkpoint-metric task_loss --log-format simple --log-interval 25 --num-workers 0 2>&1 \
    | tee -a "$WORK/train_mgs.log" | grep -E "\| valid \|" || true
fi
test -s "$WORK/ckpt_mgs/checkpoint_last.pt" || { echo "demo: MGS fine-tuning failed, see $WORK/train_mgs.log" >&2; exit 1; }

log "[5/6] fairseq-generate on the test set (beam sizes: $BEAMS)"
for model in mle mgs; do
  ckpt="$WORK/ckpt_$model/checkpoint_best.pt"
  for beam in $BEAMS; do
    fairseq-generate "$WORK/bin" --user-dir fairseq_ext --path "$ckpt" \
      --gen-subset test --beam "$beam" --batch-size 100 --max-len-a 1.5 --max-len-b 5 \
      > "$WORK/gen_${model}_beam$beam.out" 2> "$WORK/gen_${model}_beam$beam.log"
  done
done

log "[6/6] scoring"
rows=()
for model in mle mgs; do
  for beam in $BEAMS; do
    "$PYTHON" scripts/score.py "$WORK/gen_${model}_beam$beam.out" --json "$WORK/scores_${model}_beam$beam.json" \
      > "$WORK/score_${model}_beam$beam.log" 2>&1
    rows+=("${model^^}/beam$beam=$WORK/scores_${model}_beam$beam.json")
  done
done
"$PYTHON" examples/print_table.py "${rows[@]}"
