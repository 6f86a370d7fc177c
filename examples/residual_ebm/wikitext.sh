#!/usr/bin/env bash
# Residual EBM on WikiText-2 as Deng et al. (2020) train it, at CPU scale (Table 1 layout,
# Figures 2-3): a base transformer_lm trained until its valid loss stops improving,
# NEG negatives per prefix sampled once from it (untruncated: the noise of NCE is P_LM),
# energies (bit from scratch, unit from the base LM) trained by residual_nce on NUM_NEG of
# them per positive, drawn anew every epoch, until the valid NCE accuracy has not improved
# for EBM_PATIENCE epochs (checkpoint: best valid accuracy), one energy per seed; then, per
# energy, the perplexity range from the log-Z estimates on test prefixes (Theorem 2, with
# the range against n: Figure 2 left), joint samples (Algorithm 1) with their n-gram
# repetition (Figure 2 right) and log-likelihood histograms (Figure 3), and the table over
# seeds (WORK/table.md: joint - base-LM log-likelihood of the real test continuations,
# paired over prefixes); and fairseq-generate's joint samples of the first valid prefixes
# (WORK/generate.txt).
#
# The paper: p = 120, L = 40, 16 (CC-News) / 128 (Books) stored samples per prefix,
# 12-layer models, 90k-180k updates. Defaults here: p = 48, L = 24, 16 stored, 4 per
# positive, 2-layer models of width 128 (examples/residual_ebm/README.md says why).
#
# A rerun skips finished stages and resumes interrupted trainings (checkpoint_last.pt).
#
# usage: examples/residual_ebm/wikitext.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), SEEDS ("1 2 3": energy seeds; the base LM and the negatives
#      use seed 1), PREFIX (48), CONT (24), NEG (16), NUM_NEG (4), LM_EPOCHS (100), LM_PATIENCE (5),
#      EBM_EPOCHS (60), EBM_PATIENCE (5), EBM_LR (0.0003), VARIANTS ("bit unit"),
#      EVAL_PREFIXES (400), EVAL_SAMPLES (64: n of the log-Z estimates and of the joint sampler),
#      EVAL_NS (2,4,8,16,32,64: Figure 2 left, <= EVAL_SAMPLES),
#      EVAL_TOPKS ("0": top-k of the joint sampler's proposals, one evaluation each; "0 10" adds
#      the paper's truncated sampling)
# The figures are written as PNG when matplotlib is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults SEEDS="1 2 3" PREFIX=48 CONT=24 NEG=16 NUM_NEG=4 LM_EPOCHS=100 LM_PATIENCE=5 EBM_EPOCHS=60 \
  EBM_PATIENCE=5 EBM_LR=0.0003 VARIANTS="bit unit" EVAL_PREFIXES=400 EVAL_SAMPLES=64 EVAL_NS=2,4,8,16,32,64 \
  EVAL_TOPKS=0 PYTHON=python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$NUM_NEG" -gt "$NEG" ]; then
  echo "residual_wikitext.sh: NUM_NEG ($NUM_NEG) must be <= NEG ($NEG), the stored negatives per prefix" >&2
  exit 2
fi
mkdir -p "$WORK"
log() { echo "==> $(date -u +%H:%M:%S) $*"; }

[ -d "$WORK/data/bin" ] || "$PYTHON" scripts/prepare/prepare_wikitext_completion.py "$FAIRSEQ_EXT_DATA/wikitext-2" "$WORK/data" \
  --context-size 1 --vocab-size 10000
DATA=$WORK/data/bin

if ! finished "$WORK/lm.log"; then
  log "base LM: until valid loss has not improved for $LM_PATIENCE epochs (at most $LM_EPOCHS)"
  fairseq-train "$DATA" --user-dir "$(fairseq-ext-dir)" --task language_modeling --arch transformer_lm \
    --decoder-layers 2 --decoder-embed-dim 128 --decoder-input-dim 128 --decoder-output-dim 128 --decoder-ffn-embed-dim 512 \
    --decoder-attention-heads 4 --share-decoder-input-output-embed --dropout 0.1 --tokens-per-sample 64 \
    --optimizer adam --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 100 --max-tokens 4096 \
    --max-epoch "$LM_EPOCHS" --patience "$LM_PATIENCE" --save-dir "$WORK/lm" --no-epoch-checkpoints \
    --log-format simple --seed 1 --num-workers 0 >> "$WORK/lm.log" 2>&1
fi
T=(--user-dir "$(fairseq-ext-dir)" --task residual_lm --residual-base-lm "$WORK/lm/checkpoint_best.pt" --residual-prefix-len "$PREFIX"
   --residual-continuation-len "$CONT" --residual-negatives-dir "$WORK/negatives")

if [ ! -s "$WORK/negatives/valid.negatives.pt" ]; then
  log "negatives: $NEG per prefix (untruncated)"
  "$PYTHON" scripts/prepare/sample_negatives.py "$DATA" "${T[@]}" --splits train,valid --num-samples "$NEG" \
    --sample-batch-size 64 --seed 1 > "$WORK/negatives.log" 2>&1
fi

for seed in $SEEDS; do
  for variant in $VARIANTS; do
    run="$WORK/${variant}.s$seed"
    if ! finished "$run.log"; then
      log "energy $variant seed $seed: NCE, $NUM_NEG of $NEG negatives per positive, until valid accuracy stops improving"
      fairseq-train "$DATA" "${T[@]}" --arch residual_energy --energy-variant "$variant" --encoder-layers 2 \
        --encoder-embed-dim 128 --encoder-ffn-embed-dim 512 --encoder-attention-heads 4 \
        --criterion residual_nce --residual-num-negatives "$NUM_NEG" --optimizer adam --lr "$EBM_LR" --lr-scheduler inverse_sqrt \
        --warmup-updates 100 --batch-size 32 --max-epoch "$EBM_EPOCHS" --patience "$EBM_PATIENCE" \
        --best-checkpoint-metric acc --maximize-best-checkpoint-metric --save-dir "$run" \
        --no-epoch-checkpoints --log-format json --log-interval 50 --seed "$seed" --num-workers 0 >> "$run.log" 2>&1
    fi
    for k in $EVAL_TOPKS; do
      out="$WORK/eval_${variant}.s${seed}_k$k"
      [ -s "$out.json" ] && continue
      log "evaluate $variant seed $seed, joint top-k $k: $EVAL_PREFIXES test prefixes, n = $EVAL_SAMPLES"
      "$PYTHON" scripts/score/eval_residual.py "$DATA" "${T[@]}" --path "$run/checkpoint_best.pt" \
        --gen-subset test --num-samples "$EVAL_SAMPLES" --max-prefixes "$EVAL_PREFIXES" --batch-size 16 --seed 1 \
        --range-ns "$EVAL_NS" --residual-joint-samples "$EVAL_SAMPLES" --residual-joint-topk "$k" \
        --samples-out "$out.samples.jsonl" --json "$out.json.tmp" \
        $("$PYTHON" -c 'import matplotlib' 2>/dev/null && echo --png "$out") \
        2> "$out.err" > "$out.txt"
      mv "$out.json.tmp" "$out.json"
    done
  done
done

"$PYTHON" examples/residual_ebm/table.py "$WORK" --seeds $SEEDS --variants $VARIANTS --topks $EVAL_TOPKS \
  | tee "$WORK/table.md"
read -r seed _ <<< "$SEEDS"
read -r variant _ <<< "$VARIANTS"
log "joint samples ($variant seed $seed, n = 16, untruncated base-LM samples) of the valid prefixes"
fairseq-generate "$DATA" "${T[@]}" --path "$WORK/$variant.s$seed/checkpoint_best.pt" --gen-subset valid \
  --residual-num-negatives "$NUM_NEG" --residual-joint-samples 16 --nbest 1 --batch-size 8 --seed 1 \
  2> "$WORK/generate.err" | grep -E "^(S|T|H)-" | head -24 > "$WORK/generate.txt" || true
log "done: $WORK"
