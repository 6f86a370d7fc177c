#!/usr/bin/env bash
# CPU-scale residual EBM on WikiText-2 (Deng et al., 2020; Table 1 layout at toy
# scale): a small base transformer_lm, negatives sampled once from it, energy
# models (bit, unit) trained with residual_nce, the perplexity range from the
# log-Z estimates on test prefixes, and joint samples (Algorithm 1).
#
# usage: examples/residual_wikitext.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), LM_UPDATES (800), EBM_UPDATES (600),
#      PREFIX (24), CONT (8), NEG (4), EVAL_PREFIXES (400), EVAL_SAMPLES (64: n of the log-Z
#      estimates and of the joint sampler), EVAL_NS (2,4,8,16,32,64: Figure 2 left, <= EVAL_SAMPLES),
#      EVAL_TOPK (0: top-k of the joint sampler's proposals in the evaluation)
# The figures (Figure 2 left and right, Figure 3) are written as PNG when matplotlib is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
LM_UPDATES=${LM_UPDATES:-800}
EBM_UPDATES=${EBM_UPDATES:-600}
PREFIX=${PREFIX:-24}
CONT=${CONT:-8}
NEG=${NEG:-4}
EVAL_PREFIXES=${EVAL_PREFIXES:-400}
EVAL_SAMPLES=${EVAL_SAMPLES:-64}
EVAL_NS=${EVAL_NS:-2,4,8,16,32,64}
EVAL_TOPK=${EVAL_TOPK:-0}
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
log() { echo "==> $(date -u +%H:%M:%S) $*"; }

[ -d "$WORK/data/bin" ] || "$PYTHON" scripts/prepare_wikitext_completion.py "$FAIRSEQ_EXT_DATA/wikitext-2" "$WORK/data" \
  --context-size 1 --vocab-size 10000
DATA=$WORK/data/bin

if [ ! -s "$WORK/lm/checkpoint_best.pt" ]; then
  log "base LM: $LM_UPDATES updates"
  fairseq-train "$DATA" --user-dir fairseq_ext --task language_modeling --arch transformer_lm \
    --decoder-layers 2 --decoder-embed-dim 128 --decoder-input-dim 128 --decoder-output-dim 128 --decoder-ffn-embed-dim 512 \
    --decoder-attention-heads 4 --share-decoder-input-output-embed --dropout 0.1 --tokens-per-sample 64 \
    --optimizer adam --lr 0.002 --lr-scheduler inverse_sqrt --warmup-updates 100 --max-tokens 4096 \
    --max-update "$LM_UPDATES" --save-dir "$WORK/lm" --no-epoch-checkpoints --log-format simple --seed 1 \
    --num-workers 0 > "$WORK/lm.log" 2>&1
fi
T=(--user-dir fairseq_ext --task residual_lm --base-lm "$WORK/lm/checkpoint_best.pt" --prefix-len "$PREFIX"
   --continuation-len "$CONT" --negatives-dir "$WORK/negatives")

if [ ! -s "$WORK/negatives/valid.negatives.pt" ]; then
  log "negatives: $NEG per prefix"
  "$PYTHON" scripts/sample_negatives.py "$DATA" "${T[@]}" --splits train,valid --num-samples "$NEG" \
    --sample-batch-size 64 --seed 1 > "$WORK/negatives.log" 2>&1
fi

for variant in bit unit; do
  if [ ! -s "$WORK/ebm_$variant/checkpoint_best.pt" ]; then
    log "energy model $variant: $EBM_UPDATES updates"
    fairseq-train "$DATA" "${T[@]}" --arch residual_energy --energy-variant "$variant" --encoder-layers 2 \
      --encoder-embed-dim 128 --encoder-ffn-embed-dim 512 --encoder-attention-heads 4 \
      --criterion residual_nce --num-negatives "$NEG" --optimizer adam --lr 0.0003 --lr-scheduler inverse_sqrt \
      --warmup-updates 50 --batch-size 32 --max-update "$EBM_UPDATES" --save-dir "$WORK/ebm_$variant" \
      --no-epoch-checkpoints --log-format simple --log-interval 50 --seed 1 --num-workers 0 \
      > "$WORK/ebm_$variant.log" 2>&1
  fi
  log "evaluate $variant: $EVAL_PREFIXES test prefixes, n = $EVAL_SAMPLES"
  "$PYTHON" scripts/eval_residual.py "$DATA" "${T[@]}" --path "$WORK/ebm_$variant/checkpoint_best.pt" \
    --gen-subset test --num-samples "$EVAL_SAMPLES" --max-prefixes "$EVAL_PREFIXES" --batch-size 16 --seed 1 \
    --range-ns "$EVAL_NS" --joint-samples "$EVAL_SAMPLES" --joint-topk "$EVAL_TOPK" \
    --samples-out "$WORK/samples_$variant.jsonl" --json "$WORK/eval_$variant.json" \
    $("$PYTHON" -c 'import matplotlib' 2>/dev/null && echo --png "$WORK/fig_$variant") \
    2> "$WORK/eval_$variant.err" | tee "$WORK/eval_$variant.txt"
done

log "joint samples (bit, n = 16, top-k 10) of the valid prefixes"
fairseq-generate "$DATA" "${T[@]}" --path "$WORK/ebm_bit/checkpoint_best.pt" --gen-subset valid \
  --joint-samples 16 --joint-topk 10 --nbest 1 --batch-size 8 --seed 1 \
  2> "$WORK/generate.err" | grep -E "^(S|T|H)-" | head -24 > "$WORK/generate.txt" || true
log "done: $WORK"
