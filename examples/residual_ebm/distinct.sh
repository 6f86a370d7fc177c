#!/usr/bin/env bash
# The residual EBM where the gain must show (examples/residual_ebm/README.md, "Designed check"):
# a generated corpus whose continuations never repeat a word (fairseq_ext/synthetic/residual.py,
# exact perplexity known), a deliberately small base LM that has not learned that
# constraint, and the joint model P_LM exp(-E) / Z with a bidirectional energy (BiT)
# trained by NCE on NEG stored negatives per prefix until the validation loss stops
# improving (--patience). Per seed: the base LM's and the joint model's perplexity
# (range) against the truth, and the share of distinct words in base-LM and joint
# samples (truth: 1).
#
# A rerun skips finished stages (fairseq-train resumes from checkpoint_last.pt).
#
# usage: examples/residual_ebm/distinct.sh WORK_DIR
# env: SEEDS ("1 2 3"), LM_UPDATES (150), NEG (16), NUM_NEG (4), EBM_EPOCHS (40), PATIENCE (5),
#      VOCAB (12), P (8), L (6), TRAIN (4000), EVAL_SAMPLES (32), JOINT (16), EBM_LR (0.001), BATCH (32)
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
defaults SEEDS="1 2 3" LM_UPDATES=150 NEG=16 NUM_NEG=4 EBM_EPOCHS=40 PATIENCE=5 VOCAB=12 P=8 L=6 TRAIN=4000 \
  EVAL_SAMPLES=32 JOINT=16 EBM_LR=0.001 BATCH=32 PYTHON=python
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$WORK"
log() { echo "==> $(date +%H:%M:%S) $*"; }

if [ ! -s "$WORK/bin/dict.txt" ]; then
  "$PYTHON" -m fairseq_ext.synthetic.residual "$WORK/raw" --vocab "$VOCAB" --prefix-len "$P" --continuation-len "$L" \
    --train "$TRAIN" --valid 300 --test 300 --seed 1
  "$PYTHON" -c "from fairseq_ext.synthetic import toy; toy.binarize_lines('$WORK/raw', '$WORK/bin')" > "$WORK/preprocess.log" 2>&1
fi

for seed in $SEEDS; do
  S="$WORK/s$seed"
  mkdir -p "$S"
  T=(--user-dir "$(fairseq-ext-dir)" --task residual_lm --residual-base-lm "$S/lm/checkpoint_last.pt" --residual-prefix-len "$P"
     --residual-continuation-len "$L" --seed "$seed")
  if ! finished "$S/lm.log"; then
    log "seed $seed: base LM, $LM_UPDATES updates (1 layer, 16 units: deliberately weak)"
    fairseq-train "$WORK/bin" --user-dir "$(fairseq-ext-dir)" --task language_modeling --arch transformer_lm \
      --decoder-layers 1 --decoder-embed-dim 16 --decoder-output-dim 16 --decoder-ffn-embed-dim 32 \
      --decoder-attention-heads 2 --tokens-per-sample $((P + L)) --optimizer adam --lr 0.005 \
      --max-tokens 2000 --max-update "$LM_UPDATES" --save-dir "$S/lm" --no-epoch-checkpoints --disable-validation \
      --num-workers 0 --seed "$seed" >> "$S/lm.log" 2>&1
  fi
  if [ ! -s "$S/neg/valid.negatives.pt" ]; then
    log "seed $seed: $NEG negatives per prefix"
    "$PYTHON" scripts/prepare/sample_negatives.py "$WORK/bin" "${T[@]}" --splits train,valid,test --num-samples "$NEG" \
      --out-dir "$S/neg" > "$S/neg.log" 2>&1
  fi
  if ! finished "$S/ebm.log"; then
    log "seed $seed: BiT energy, NCE with $NUM_NEG of the $NEG negatives per positive, until valid loss stops improving"
    fairseq-train "$WORK/bin" "${T[@]}" --residual-negatives-dir "$S/neg" --residual-num-negatives "$NUM_NEG" --arch residual_energy \
      --energy-variant bit --encoder-layers 2 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 \
      --encoder-attention-heads 4 --dropout 0.1 --criterion residual_nce --optimizer adam --lr "$EBM_LR" \
      --batch-size "$BATCH" --max-epoch "$EBM_EPOCHS" --patience "$PATIENCE" --save-dir "$S/ebm" --no-epoch-checkpoints \
      --num-workers 0 --log-format json >> "$S/ebm.log" 2>&1
  fi
  if [ ! -s "$S/eval.json" ]; then
    log "seed $seed: evaluation (log Z from $EVAL_SAMPLES samples per prefix, joint samples from $JOINT)"
    "$PYTHON" scripts/score/eval_residual.py "$WORK/bin" "${T[@]}" --path "$S/ebm/checkpoint_best.pt" --gen-subset test \
      --num-samples "$EVAL_SAMPLES" --range-ns 4,16,"$EVAL_SAMPLES" --residual-joint-samples "$JOINT" \
      --samples-out "$S/samples.jsonl" --json "$S/eval.json" > "$S/eval.log" 2>&1
  fi
done

"$PYTHON" - "$WORK" "$VOCAB" "$L" $SEEDS <<'PY'
import json, sys
from fairseq_ext.evaluation.comparison import format_mean_std
from fairseq_ext.evaluation.train_log import read_log
from fairseq_ext.synthetic import residual
f = lambda v: format_mean_std(v, 3)
work, vocab, L, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rows = {k: [] for k in ("lm_ppl", "joint_lo", "joint_hi", "real", "base_lm", "joint", "acc")}
for s in seeds:
    res = json.load(open(f"{work}/s{s}/eval.json"))
    recs = [json.loads(l) for l in open(f"{work}/s{s}/samples.jsonl")]
    rows["lm_ppl"].append(res["base_lm_ppl"])
    rows["joint_lo"].append(res["joint_ppl_lower"])
    rows["joint_hi"].append(res["joint_ppl_upper"])
    for k in ("real", "base_lm", "joint"):
        rows[k].append(residual.distinct_share([r[k].split() for r in recs]))
    valid = [stats for tag, stats in read_log(f"{work}/s{s}/ebm.log") if tag == "valid"]
    rows["acc"].append(max(v["valid_acc"] for v in valid))
print(f"seeds {' '.join(seeds)}; truth: perplexity {residual.true_perplexity(vocab, L):.3f}, distinct share 1")
print("| | base LM | joint (lower / upper log Z) | truth |")
print("|---|---|---|---|")
print(f"| perplexity per continuation token | {f(rows['lm_ppl'])} | {f(rows['joint_lo'])} / {f(rows['joint_hi'])} "
      f"| {residual.true_perplexity(vocab, L):.3f} |")
print(f"| distinct share of samples | {f(rows['base_lm'])} | {f(rows['joint'])} | {f(rows['real'])} |")
print(f"best validation NCE accuracy: {f(rows['acc'])}")
PY
