#!/usr/bin/env bash
# What MGS is for, on embedded data (fairseq_ext/synthetic/completion.py, no download):
# lines that always end, whose greedy continuation by an MLE model often does not.
# A tiny transformer_lm is trained with MLE on the lines (checkpoint with the best
# validation loss), then fine-tuned for the same number of updates two ways:
# continued MLE (the control) and --criterion mgs --mgs-task-loss lm (MGS-LM: the
# continuation's negative log-probability under the frozen MLE model; paper section
# 5.1). Both fine-tunes keep their last checkpoint. The greedy continuations of the
# 200 test prefixes (3 words) are scored: non-termination (no '.' within 40 tokens),
# rep-4, length, LM cost (the task loss) and test perplexity. Deterministic from SEED.
#
# A rerun resumes: a finished training is skipped (its log ends with fairseq's "done
# training"), an interrupted one continues from its checkpoint_last.pt (the fine-tunes
# start from the MLE model only on their first launch, --finetune-from-model, and save
# every 20 updates). Data, decoding and scoring run again. Remove WORK_DIR to start over.
#
# usage: examples/mgs/demo.sh [WORK_DIR]      (make demo runs it in ./demo_work)
# env: SEED (data and training seed, default 1), MLE_UPDATES (600), FT_UPDATES (updates of each
#      fine-tune, 60), N_TRAIN (training lines, 4000), N_TEST (test prefixes, 200), EVAL (0: stop after
#      the trainings), MODELS (the rows to evaluate, default "mle mle_continued mgs"), PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:-demo_work}
defaults SEED=1 MLE_UPDATES=600 FT_UPDATES=60 N_TRAIN=4000 N_TEST=200
MAX_LEN=40
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
log() { echo "==> $*"; }

log "[1/5] text-completion toy data (seed $SEED) -> $WORK/raw, binarized -> $WORK/bin"
"$PYTHON" -m fairseq_ext.synthetic.completion "$WORK/raw" --train "$N_TRAIN" --valid 200 --test "$N_TEST" --seed "$SEED"
rm -rf "$WORK/bin"
fairseq-preprocess --only-source --workers 1 --trainpref "$WORK/raw/train.txt" --validpref "$WORK/raw/valid.txt" \
  --testpref "$WORK/raw/test.txt" --destdir "$WORK/bin" > "$WORK/preprocess.log" 2>&1

TASK=(--task text_completion --completion-context-size 3)
MODEL=(--arch transformer_lm --decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 128
  --decoder-attention-heads 4 --share-decoder-input-output-embed --dropout 0.1 --seed "$SEED" --num-workers 0
  --no-epoch-checkpoints --log-format simple)
MLE_CKPT="$WORK/ckpt_mle/checkpoint_best.pt"
if finished "$WORK/train_mle.log"; then
  log "[2/5] MLE: finished, skipped (log: $WORK/train_mle.log)"
else
  log "[2/5] fairseq-train: tiny transformer_lm, MLE, $MLE_UPDATES updates (log: $WORK/train_mle.log)"
  fairseq-train "$WORK/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" "${MODEL[@]}" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.003 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --max-tokens 2048 --max-update "$MLE_UPDATES" --save-dir "$WORK/ckpt_mle" --log-interval 100 >> "$WORK/train_mle.log" 2>&1
fi
test -s "$MLE_CKPT" || { echo "demo: MLE training failed, see $WORK/train_mle.log" >&2; exit 1; }

finetune() {  # NAME STEP CRITERION-ARGS...: FT_UPDATES updates from the MLE model, last checkpoint kept
  local name=$1 step=$2; shift 2
  if finished "$WORK/train_$name.log"; then
    log "[$step/5] $name: finished, skipped (log: $WORK/train_$name.log)"
    return 0
  fi
  log "[$step/5] fairseq-train $*: $FT_UPDATES updates from the MLE model (log: $WORK/train_$name.log)"
  fairseq-train "$WORK/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" "${MODEL[@]}" --finetune-from-model "$MLE_CKPT" \
    --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0003 --max-tokens 1024 --max-update "$FT_UPDATES" \
    --save-dir "$WORK/ckpt_$name" --disable-validation --save-interval-updates 20 --keep-interval-updates 1 \
    --log-interval 10 "$@" >> "$WORK/train_$name.log" 2>&1
  test -s "$WORK/ckpt_$name/checkpoint_last.pt" || { echo "demo: $name failed, see $WORK/train_$name.log" >&2; exit 1; }
}
finetune mle_continued 3 --criterion cross_entropy
# its JSON log draws the MGS diagnostics: python scripts/plot/plot_log.py WORK/train_mgs.log --mgs --out mgs.png
finetune mgs 4 --criterion mgs --mgs-task-loss lm --mgs-score-model "$MLE_CKPT" --mgs-alpha 1 --mgs-candidates 4 \
  --log-format json --log-interval 1
[ "${EVAL:-1}" != 0 ] || exit 0

log "[5/5] greedy continuations of the $N_TEST test prefixes (at most $MAX_LEN tokens), scoring"
rows=()
for name in ${MODELS:-mle mle_continued mgs}; do
  ckpt="$WORK/ckpt_$name/checkpoint_last.pt"
  [ "$name" != mle ] || ckpt=$MLE_CKPT
  # greedy continuations, scores, LM cost and perplexity: WORK/eval_NAME.{gen,scores.json,test.log}
  completion_eval "$WORK/bin" "$ckpt" "$MLE_CKPT" "$MAX_LEN" "$WORK/eval_$name" "${TASK[@]}"
  rows+=("$name=$WORK/eval_$name.scores.json,$WORK/eval_$name.test.log")
done
"$PYTHON" examples/mgs/demo_table.py --refs "$WORK/raw/test.txt" --context-size 3 --json "$WORK/table.json" "${rows[@]}" | tee "$WORK/table.txt"
