#!/usr/bin/env bash
# MGS paper (Welleck & Cho, AAAI 2021, https://arxiv.org/abs/2006.03158) section 5.1, Tables 1 and 7 and
# Figure 1, at CPU scale on the demo's text-completion task (fairseq_ext/synthetic/completion.py):
# there an MLE model's greedy continuations fail to terminate in a regime like the
# paper's GPT-2 (about 0.26 of the test prefixes against 0.39; WikiText-2 at CPU scale
# gives 0.95, examples/mgs/README.md).
#
# Per seed (SEEDS): data and the MLE model of examples/mgs/demo.sh (600 updates, checkpoint
# with the best validation loss); then, from it, BUDGET updates of each fine-tune
#   mle_cont     continued MLE (the control)
#   mgs_lm       MGS-LM, mixture proposal (Table 1)
#   mgs_lm_zero  MGS-LM, zero-mean component only (Table 7)
#   mgs_lm_mle   MGS-LM, MLE component only (Table 7)
#   mgs_edit     MGS-edit (Table 1)
# each saving a checkpoint every SAVE_EVERY updates and at the end, trained for BUDGET
# updates and then on, as the paper stops (appendix A.4: validation every 100 batches,
# training ends when the lowest validation task loss has not changed for 10
# evaluations), until the lowest validation cost is PATIENCE evaluations old (or
# MAX_BUDGET updates). Selection as the
# paper's (appendix A.4: the lowest validation task loss): each saved checkpoint's
# validation cost under the run's own task loss (greedy; scripts/inspect/validate_criterion.py)
# is computed, LM cost (the MGS-LM task loss under the frozen MLE model) for mle_cont and
# the MGS-LM runs, edit for mgs_edit, and the checkpoint with the lowest is evaluated on
# the test prefixes (examples/mgs/demo_table.py's columns). The
# Figure 1: the training loss of the three
# proposals (scripts/plot/plot_log.py).
#
# Resumable: finished trainings, validations and evaluations are skipped on a rerun;
# an interrupted training resumes from its checkpoint_last.pt.
#
# usage: examples/mgs/completion_tables.sh WORK_DIR
# env: SEEDS ("1 2 3"), BUDGET (300), SAVE_EVERY (25), PATIENCE (10), MAX_BUDGET (1000), RUNS (the
#      fine-tunes above), PYTHON
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: examples/mgs/completion_tables.sh WORK_DIR}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
defaults SEEDS="1 2 3" BUDGET=300 PATIENCE=10 MAX_BUDGET=1000 SAVE_EVERY=25 \
  RUNS="mle_cont mgs_lm mgs_lm_zero mgs_lm_mle mgs_edit" PYTHON=python
MAX_LEN=40
TASK=(--task text_completion --completion-context-size 3)
log() { echo "==> $(date +%H:%M:%S) $*"; }
updates_done() {  # LOG: the updates a fairseq-train JSON log has reached (0: none)
  local n
  n=$(grep -o '"\(train_\)\{0,1\}num_updates": "[0-9]*"' "$1" 2>/dev/null | tail -1 | tr -dc '0-9' || true)
  echo "${n:-0}"
}

criterion() {  # the fine-tune's criterion options (MLE_CKPT: the scorer)
  local mgs=(--criterion mgs --mgs-alpha 1 --mgs-candidates 4 --mgs-score-model "$MLE_CKPT")
  case $1 in
    mle_cont) echo --criterion cross_entropy ;;
    mgs_lm) echo "${mgs[@]}" --mgs-task-loss lm ;;
    mgs_lm_zero) echo "${mgs[@]}" --mgs-task-loss lm --mgs-proposal zero ;;
    mgs_lm_mle) echo "${mgs[@]}" --mgs-task-loss lm --mgs-proposal mle ;;
    mgs_edit) echo "${mgs[@]}" --mgs-task-loss edit ;;
    *) echo "mgs_completion_tables.sh: unknown run '$1'" >&2; exit 1 ;;
  esac
}

task_cost() {  # CKPT SUBSET LOSS OUT.log: CKPT's task loss LOSS (lm or edit; and ppl) on SUBSET, greedy
  [ -s "$4" ] && grep -q "valid on" "$4" && return 0
  "$PYTHON" scripts/inspect/validate_criterion.py \
    "{'_name': 'mgs', 'mgs_task_loss': '$3', 'mgs_score_model': '$MLE_CKPT'}" "$W/bin" --user-dir "$(fairseq-ext-dir)" \
    "${TASK[@]}" --path "$1" --valid-subset "$2" --max-tokens 4096 --required-batch-size-multiple 1 > "$4" 2>&1
}

for seed in $SEEDS; do
  W=$WORK/s$seed
  log "seed $seed: data and MLE model (examples/mgs/demo.sh, $W)"
  EVAL=0 SEED=$seed PYTHON=$PYTHON bash examples/mgs/demo.sh "$W" > "$W.demo.log" 2>&1 \
    || { echo "demo.sh failed: $W.demo.log" >&2; exit 1; }
  MLE_CKPT=$W/ckpt_mle/checkpoint_best.pt
  MODEL=(--arch transformer_lm --decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 128
    --decoder-attention-heads 4 --share-decoder-input-output-embed --dropout 0.1 --seed "$seed" --num-workers 0
    --no-epoch-checkpoints)
  mkdir -p "$W/sel" "$W/eval"
  rows=()
  for run in $RUNS; do
    save=$W/t_$run
    loss=lm budget=$BUDGET
    [ "$run" != mgs_edit ] || loss=edit
    while :; do
      trained=$(updates_done "$W/t_$run.log")
      if [ "$trained" -lt "$budget" ]; then
        log "seed $seed $run: updates $trained -> $budget ($W/t_$run.log)"
        # shellcheck disable=SC2046
        fairseq-train "$W/bin" --user-dir "$(fairseq-ext-dir)" "${TASK[@]}" "${MODEL[@]}" --finetune-from-model "$MLE_CKPT" \
          --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.0003 --max-tokens 1024 --max-update "$budget" \
          --save-dir "$save" --disable-validation --save-interval-updates "$SAVE_EVERY" --keep-interval-updates -1 \
          --log-format json --log-interval 5 $(criterion "$run") >> "$W/t_$run.log" 2>&1
        trained=$(updates_done "$W/t_$run.log")
        [ "$trained" -ge "$budget" ] \
          || { echo "$run stopped at update $trained of $budget: $W/t_$run.log" >&2; exit 1; }
      fi
      # every SAVE_EVERY updates (fairseq skips the interval checkpoint that falls on an epoch's end) and the last
      best="" best_cost="" best_u=0
      for ckpt in "$save"/checkpoint_*_*.pt "$save/checkpoint_last.pt"; do
        [ -e "$ckpt" ] || continue
        u=${ckpt##*_}; u=${u%.pt}; [ "$u" != last ] || u=$trained
        task_cost "$ckpt" valid $loss "$W/sel/$run.$loss.$u.log"
        cost=$(grep "valid on" "$W/sel/$run.$loss.$u.log" | tail -1 | sed -E 's/.*\| task_loss ([-0-9.e]+).*/\1/')
        if [ -z "$best" ] || awk -v a="$cost" -v b="$best_cost" 'BEGIN { exit !(a < b) }' \
           || { [ "$cost" = "$best_cost" ] && [ "$u" -lt "$best_u" ]; }; then
          best=$ckpt best_cost=$cost best_u=$u
        fi
      done
      # the paper's stopping rule: the lowest validation cost unchanged for PATIENCE evaluations
      [ $((best_u + PATIENCE * SAVE_EVERY)) -gt "$trained" ] && [ "$trained" -lt "$MAX_BUDGET" ] || break
      budget=$((best_u + PATIENCE * SAVE_EVERY))
      [ "$budget" -le "$MAX_BUDGET" ] || budget=$MAX_BUDGET
    done
    log "seed $seed $run: trained $trained updates; selected $(basename "$best"), update $best_u" \
      "(validation $loss cost $best_cost)"
    out=$W/eval/$run
    if [ ! -s "$out.scores.json" ] || [ "$(cat "$out.ckpt" 2>/dev/null)" != "$best $best_u" ]; then
      completion_eval "$W/bin" "$best" "$MLE_CKPT" "$MAX_LEN" "$out" "${TASK[@]}"
      echo "$best $best_u" > "$out.ckpt"  # the evaluated checkpoint and its update
    fi
    rows+=("$run=$out.scores.json,$out.test.log")
  done
  # the MLE model itself (row 1 of Table 1)
  out=$W/eval/mle
  [ -s "$out.scores.json" ] || completion_eval "$W/bin" "$MLE_CKPT" "$MLE_CKPT" "$MAX_LEN" "$out" "${TASK[@]}"
  mkdir -p "$W/table"
  "$PYTHON" examples/mgs/demo_table.py --refs "$W/raw/test.txt" --context-size 3 --json "$W/table/table.json" \
    "mle=$out.scores.json,$out.test.log" "${rows[@]}" | tee "$W/table/table.txt"
done

log "mean ± std over seeds"
dirs=()
for seed in $SEEDS; do dirs+=("$WORK/s$seed/table"); done
"$PYTHON" examples/mgs/demo_table.py --seeds "${dirs[@]}" | tee "$WORK/table.txt"
# paired bootstrap of each fine-tune against the control, per seed and pooled (scripts/score/compare_runs.py)
if [[ " $RUNS " == *" mle_cont "* ]]; then
  specs=()
  for run in $RUNS; do specs+=("$(seed_spec "$run" "$WORK/s@SEED@/eval/$run.gen")"); done
  "$PYTHON" scripts/score/compare_runs.py --control mle_cont --max-len "$MAX_LEN" --metrics nonterm,rep4,edit,avg_hyp_len \
    "${specs[@]}" --json "$WORK/compare.json" 2> "$WORK/compare.log" | tee "$WORK/compare.md"
fi
first=$WORK/s${SEEDS%% *}
mgs_logs=() labels=()
for run in mgs_lm mgs_lm_zero mgs_lm_mle; do
  [ -s "$first/t_$run.log" ] && mgs_logs+=("$first/t_$run.log") && labels+=("$run")
done
if [ ${#mgs_logs[@]} -gt 0 ]; then
  labels_csv=$(IFS=,; echo "${labels[*]}")
  "$PYTHON" scripts/plot/plot_log.py "${mgs_logs[@]}" --labels "$labels_csv" --metric loss mgs_cand_best \
    --out "$WORK/figure1.png" --json "$WORK/figure1.json" && log "Figure 1: $WORK/figure1.png"
fi
