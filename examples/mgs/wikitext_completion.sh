#!/usr/bin/env bash
# CPU-scale text completion on WikiText-2 (MGS paper, Table 1 layout): a small
# transformer_lm trained with MLE on the continuations, then fine-tuned with
# MGS-LM (task loss: negative log-probability under the frozen starting model)
# and MGS-edit under the same update budget; greedy continuations of the test
# prefixes (k = 10, max length 500) scored with score.py: edit,
# non-termination, repetition, average length; perplexity from fairseq-validate.
#
# With PROPOSALS set (e.g. "mixture zero mle"), the proposal ablation (Table 7)
# replaces MGS-LM and MGS-edit: one MGS-LM run per --mgs-proposal, named
# mgs_lm_<proposal>, and every model's perplexity comes with its greedy LM cost
# (task_loss: NLL of the greedy continuation under the MLE model, decoding up to
# 1.3 x the longest reference; scripts/inspect/validate_criterion.py).
#
# A rerun skips finished trainings and resumes interrupted ones (fine-tunes start from
# the MLE model with --finetune-from-model, so only on their first launch, save every
# 10 updates and score the lm cost with the MLE checkpoint itself, --mgs-score-model).
#
# usage: examples/mgs/wikitext_completion.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), MLE_UPDATES (600), FT_UPDATES (30), MAX_LEN (500), PROPOSALS (unset),
#      MGS_EXTRA (extra fine-tuning arguments, word-split, e.g. "--seed 2")
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults MLE_UPDATES=600 FT_UPDATES=30 MAX_LEN=500 PYTHON=python
mkdir -p "$WORK"
log() { echo "==> $*"; }

[ -d "$WORK/data/bin" ] || "$PYTHON" scripts/prepare/prepare_wikitext_completion.py "$FAIRSEQ_EXT_DATA/wikitext-2" "$WORK/data" \
  --vocab-size 10000 --max-tokens-per-line 300
TASK=(--task text_completion --completion-context-size 10)
MODEL=(--arch transformer_lm --decoder-layers 2 --decoder-embed-dim 128 --decoder-ffn-embed-dim 512
  --decoder-attention-heads 4 --share-decoder-input-output-embed --dropout 0.1 --seed 1 --num-workers 0
  --no-epoch-checkpoints --log-format simple)

if ! finished "$WORK/mle.log"; then
  log "MLE: $MLE_UPDATES updates"
  fairseq-train "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" "${MODEL[@]}" --optimizer adam --lr 0.002 \
    --lr-scheduler inverse_sqrt --warmup-updates 100 --max-tokens 4096 --max-update "$MLE_UPDATES" \
    --save-dir "$WORK/mle" >> "$WORK/mle.log" 2>&1
fi

finetune() {  # name, criterion args...
  local name=$1; shift
  finished "$WORK/$name.log" && return 0
  log "$name: $FT_UPDATES updates from the MLE model"
  fairseq-train "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" "${MODEL[@]}" \
    --finetune-from-model "$WORK/mle/checkpoint_best.pt" --optimizer adam --lr 0.0005 --max-tokens 1024 \
    --max-update "$FT_UPDATES" --save-dir "$WORK/$name" --disable-validation --save-interval-updates 10 \
    --keep-interval-updates 1 --log-interval 5 "$@" ${MGS_EXTRA:-} >> "$WORK/$name.log" 2>&1
}
names=(mle)
VALIDATE=(fairseq-validate)
LM_COST=(--mgs-task-loss lm --mgs-score-model "$WORK/mle/checkpoint_best.pt")
if [ -z "${PROPOSALS:-}" ]; then
  finetune mgs_lm --criterion mgs "${LM_COST[@]}" --mgs-alpha 1
  finetune mgs_edit --criterion mgs --mgs-task-loss edit --mgs-alpha 1
  names+=(mgs_lm mgs_edit)
else
  for proposal in $PROPOSALS; do
    finetune "mgs_lm_$proposal" --criterion mgs "${LM_COST[@]}" --mgs-alpha 1 --mgs-proposal "$proposal"
    names+=("mgs_lm_$proposal")
  done
  VALIDATE=("$PYTHON" scripts/inspect/validate_criterion.py
    "{'_name': 'mgs', 'mgs_task_loss': 'lm', 'mgs_score_model': '$WORK/mle/checkpoint_best.pt'}")
fi

rows=()
for name in "${names[@]}"; do
  ckpt="$WORK/$name/checkpoint_$([ "$name" = mle ] && echo best || echo last).pt"
  out="$WORK/gen_$name.out"
  [ -s "$out" ] || fairseq-generate "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" --path "$ckpt" \
    --gen-subset valid --beam 1 --batch-size 64 --max-len-b $((MAX_LEN + 10)) > "$out" 2> "$WORK/gen_$name.log"
  "$PYTHON" scripts/score/score.py "$out" --max-len "$MAX_LEN" --json "$WORK/scores_$name.json" > /dev/null 2>&1
  "${VALIDATE[@]}" "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" --path "$ckpt" --valid-subset valid \
    --max-tokens 4096 2>&1 | grep -E "valid on" | sed "s/^/$name: /" || true
  rows+=("$name=$WORK/scores_$name.json")
done
"$PYTHON" scripts/score/print_table.py "${rows[@]}"
