#!/usr/bin/env bash
# WikiText-103 at paper scale: MGS text completion (MGS paper section 5.1, Table 1)
# and the residual energy-based LM (Deng et al., Table 1's WikiText-103 column).
# Stages, in order:
#   download   wikitext-103-v1.zip (tokenized), or link WIKITEXT_RAW (its wikitext-103/ dir)
#   prepare    (prefix 10, continuation) pairs: lines of more than 10 tokens, vocabulary of
#              the VOCAB most frequent words (scripts/prepare/prepare_wikitext_completion.py; prints
#              the pair counts; the paper's GPT-2 BPE gives 874,556 / 1,896 / 2,162)
#   lm         MLE baseline, transformer_lm_gpt (GPT-2 small sized: 12 layers, 768) from
#              scratch, 1,024 tokens per batch, 400k updates, best valid perplexity
#              every 5k updates (MGS A.3)
#   mgs_lm     MGS fine-tuning from lm: 4 candidates, pi 0.5, alpha 1, greedy, length
#   mgs_edit   ratio 1.3, MLE gradient clipped to 1; validation every 100 updates,
#              stop after 10 without a better task loss (A.3); LM / edit task loss
#   score      greedy continuations of the test prefixes, max length 500: edit, repetition,
#              non-termination, length (score.py) and perplexity (fairseq-validate)
#   ebm_data   residual EBM data: every line, the same vocabulary, --only-source
#   ebm_lm     base LM P_LM as the paper's BASE LM (12 layers, 1024, ffn 4096, 16 heads),
#              512-token blocks, Adam with warm-up and cosine decay, fp16 on GPUs
#   negatives  NEGATIVES continuations of CONT tokens per PREFIX-token prefix from P_LM
#   ebm_unit   energies trained with residual NCE (section 4.1): UniT from the base LM,
#   ebm_bit    BiT-base (RoBERTa-base shape) from scratch (the paper's BIT-BASE, no *)
#   ebm_eval   perplexity range on the test prefixes (log Z bounds, Theorem 2) and joint
#              samples of the valid prefixes (Algorithm 1, untruncated)
#
# usage: examples/mgs/wikitext103.sh WORK_DIR [--stage NAME]... [--from NAME]
#                                               [--to NAME] [--force] [--dry-run] [--list]
# your own data and models: DATA (a binarized text_completion directory: prepare has nothing
#      to make), LM (a transformer_lm checkpoint on DATA: lm has nothing to make, MGS fine-tunes
#      it), EBM_DATA (a binarized language_modeling directory: ebm_data has nothing to make),
#      BASE_LM (a transformer_lm checkpoint on EBM_DATA: ebm_lm has nothing to make, negatives
#      and the energies use it); with DATA and EBM_DATA both given, download has nothing to make
# env: WIKITEXT_RAW (directory with wiki.{train,valid,test}.tokens: skips the download),
#      VOCAB (50000),
#      LM_UPDATES (400000), MAX_LEN (500), MODELS (scored; "lm mgs_lm mgs_edit"),
#      PREFIX (120), CONT (40), NEGATIVES (16), NUM_NEG (per positive, 8), EBM_UPDATES
#      (100000), EVAL_SAMPLES (1000; the paper 100,000), EVAL_PREFIXES (0: all), NGPU,
#      FP16 (1), WORKERS (CPU count), PYTHON (python); EXTRA_TRAIN (appended to every
#      fairseq-train), EXTRA_LM, EXTRA_EBM (to the LMs' / energies' training: smaller
#      models for smoke tests)
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
STAGES=(download prepare lm mgs_lm mgs_edit score ebm_data ebm_lm negatives ebm_unit ebm_bit ebm_eval)
PATH_VARS=(WIKITEXT_RAW DATA LM EBM_DATA BASE_LM)
recipe_args "$@"
URL=${WIKITEXT_URL:-https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip}
defaults VOCAB=50000 LM_UPDATES=400000 MAX_LEN=500 PREFIX=120 CONT=40 NEGATIVES=16 NUM_NEG=8 \
  EBM_UPDATES=100000 EVAL_SAMPLES=1000 EVAL_PREFIXES=0
RAW=$WORK/raw
defaults DATA="$WORK/data/bin" LM="$WORK/lm/checkpoint_best.pt" EBM_DATA="$WORK/ebm_data/bin" \
  BASE_LM="$WORK/ebm_lm/checkpoint_best.pt"
TASK=(--task text_completion --completion-context-size 10 --skip-invalid-size-inputs-valid-test)
GPT=(--arch transformer_lm_gpt --share-decoder-input-output-embed --optimizer adam --adam-betas '(0.9, 0.999)'
  --clip-norm 1.0)


if stage download; then
  if ! given DATA EBM_DATA; then
    run mkdir -p "$RAW"
    src=${WIKITEXT_RAW:-$WORK/orig/wikitext-103}
    if [ -z "${WIKITEXT_RAW:-}" ]; then
      run mkdir -p "$WORK/orig"
      run wget -nv -O "$WORK/orig/wikitext-103-v1.zip" "$URL"
      run unzip -o -q "$WORK/orig/wikitext-103-v1.zip" -d "$WORK/orig"
    fi
    for split in train valid test; do run ln -sfn "$src/wiki.$split.tokens" "$RAW/$split.txt"; done
  fi
  stage_done download
fi

stage_unless_given prepare DATA run "$PYTHON" scripts/prepare/prepare_wikitext_completion.py "$RAW" "$WORK/data" \
  --context-size 10 --vocab-size "$VOCAB" --workers "$WORKERS"

# from scratch (the paper fine-tunes GPT-2: see examples/README.md for converted weights)
# shellcheck disable=SC2086
stage_unless_given lm LM train lm "$DATA" "${TASK[@]}" "${GPT[@]}" --lr 5e-4 --lr-scheduler inverse_sqrt \
  --warmup-updates 4000 --max-tokens 1024 --update-freq "$(update_freq 1)" --max-update "$LM_UPDATES" \
  --validate-interval-updates 5000 --save-interval-updates 5000 --keep-interval-updates 1 ${EXTRA_LM:-}

# MGS A.3: the MLE hyper-parameters, 4 candidates, pi = 0.5, greedy decoding up to 1.3 x the longest
# reference, MLE gradient clipped to 1, noise per weight tensor; validation every 100 updates,
# stop when the best validation task loss has not changed for 10 validations
finetune() {  # STAGE task-loss options...
  local name=$1; shift
  # shellcheck disable=SC2086
  train "$name" "$DATA" "${TASK[@]}" "${GPT[@]}" --finetune-from-model "$LM" --lr 5e-5 --max-tokens 1024 \
    --criterion mgs --mgs-candidates 4 --mgs-mixture 0.5 --mgs-alpha 1.0 --mgs-noise 1.0 \
    --mgs-noise-scale per_tensor --mgs-decoder greedy --mgs-max-len-ratio 1.3 --mgs-mle-clip 1.0 \
    --validate-interval-updates 100 --save-interval-updates 100 --keep-interval-updates 1 --patience 10 \
    --best-checkpoint-metric task_loss "$@" ${EXTRA_LM:-}
}
if stage mgs_lm; then finetune mgs_lm --mgs-task-loss lm --mgs-score-model "$LM"; stage_done mgs_lm; fi
if stage mgs_edit; then finetune mgs_edit --mgs-task-loss edit; stage_done mgs_edit; fi

if stage score; then
  rows=()
  for m in ${MODELS:-lm mgs_lm mgs_edit}; do
    ckpt=$WORK/$m/checkpoint_best.pt; [ "$m" != lm ] || ckpt=$LM
    out=$WORK/gen/$m.test
    run_log "$out.txt" fairseq-generate "$DATA" --user-dir "$(fairseq-ext-dir)" "${GEN_DEVICE[@]}" "${TASK[@]}" --path "$ckpt" \
      --gen-subset test --beam 1 --batch-size 32 --required-batch-size-multiple 1 --max-len-b $((MAX_LEN + 10))
    run_log "$out.score" "$PYTHON" scripts/score/score.py "$out.txt" --max-len "$MAX_LEN" --json "$out.json"
    run_log "$out.ppl" fairseq-validate "$DATA" --user-dir "$(fairseq-ext-dir)" "${GEN_DEVICE[@]}" "${TASK[@]}" --path "$ckpt" \
      --valid-subset test --max-tokens 4096
    rows+=("$m=$out.json")
  done
  run "$PYTHON" scripts/score/print_table.py "${rows[@]}"
  [ "$DRY_RUN" = 1 ] || grep -H "valid on" "$WORK"/gen/*.ppl | sed "s|$WORK/gen/||" || true
  stage_done score
fi

# Residual EBM (Deng et al., section 4.1): prefix 120, continuation 40 tokens
T=(--user-dir "$(fairseq-ext-dir)" --task residual_lm --residual-base-lm "$BASE_LM" --residual-prefix-len "$PREFIX"
  --residual-continuation-len "$CONT" --residual-negatives-dir "$WORK/negatives" --residual-num-negatives "$NUM_NEG")
stage_unless_given ebm_data EBM_DATA run "$PYTHON" scripts/prepare/prepare_wikitext_completion.py "$RAW" \
  "$WORK/ebm_data" --context-size 1 --vocab-size "$VOCAB" --workers "$WORKERS"
# shellcheck disable=SC2086
stage_unless_given ebm_lm BASE_LM train ebm_lm "$EBM_DATA" --task language_modeling --arch transformer_lm \
  --decoder-layers 12 --decoder-embed-dim 1024 --decoder-ffn-embed-dim 4096 --decoder-attention-heads 16 \
  --share-decoder-input-output-embed --dropout 0.1 "${FP16_ARGS[@]}" --tokens-per-sample 512 --optimizer adam \
  --adam-betas '(0.9, 0.98)' --clip-norm 1.0 --lr 5e-4 --lr-scheduler cosine --warmup-updates 4000 \
  --max-tokens 8192 --update-freq "$(update_freq 8)" --max-update "$LM_UPDATES" ${EXTRA_LM:-}
if stage negatives; then
  run_log "$WORK/logs/negatives.log" "$PYTHON" scripts/prepare/sample_negatives.py "$EBM_DATA" "${T[@]}" "${GEN_DEVICE[@]}" \
    --splits train,valid --num-samples "$NEGATIVES" --sample-batch-size 64 --seed 1
  stage_done negatives
fi
# checkpoints by NCE accuracy: on WikiText-2 the valid loss rose after 3-5 epochs while the
# accuracy still picked the better energy (examples/residual_ebm/README.md)
ebm() {  # variant model options...
  local v=$1; shift
  # shellcheck disable=SC2086
  train "ebm_$v" "$EBM_DATA" "${T[@]}" "${FP16_ARGS[@]}" --arch residual_energy --energy-variant "$v" "$@" \
    --criterion residual_nce --optimizer adam --adam-betas '(0.9, 0.98)' --lr 1e-4 \
    --lr-scheduler cosine --warmup-updates 2000 --clip-norm 1.0 --batch-size 32 \
    --update-freq "$(update_freq 8)" --max-update "$EBM_UPDATES" --find-unused-parameters \
    --best-checkpoint-metric acc --maximize-best-checkpoint-metric \
    ${EXTRA_EBM:-}
}
if stage ebm_unit; then ebm unit; stage_done ebm_unit; fi
if stage ebm_bit; then
  ebm bit --encoder-layers 12 --encoder-embed-dim 768 --encoder-ffn-embed-dim 3072 --encoder-attention-heads 12 \
    --dropout 0.1
  stage_done ebm_bit
fi
if stage ebm_eval; then
  for v in unit bit; do
    run_log "$WORK/gen/ebm_$v.eval" "$PYTHON" scripts/score/eval_residual.py "$EBM_DATA" "${T[@]}" "${GEN_DEVICE[@]}" \
      --path "$WORK/ebm_$v/checkpoint_best.pt" --gen-subset test --num-samples "$EVAL_SAMPLES" --batch-size 8 \
      --max-prefixes "$EVAL_PREFIXES" --seed 1 --json "$WORK/gen/ebm_$v.json"
    run_log "$WORK/gen/ebm_$v.samples" fairseq-generate "$EBM_DATA" "${T[@]}" "${GEN_DEVICE[@]}" \
      --path "$WORK/ebm_$v/checkpoint_best.pt" --gen-subset valid --residual-joint-samples 16 --nbest 1 \
      --batch-size 8 --seed 1
  done
  [ "$DRY_RUN" = 1 ] || tail -n 3 "$WORK"/gen/ebm_*.eval
  stage_done ebm_eval
fi
