#!/usr/bin/env bash
# The main job on the embedded toy data set (fairseq_ext/toy.py): generate the
# data, binarize, train a tiny transformer with MLE, decode the test set greedily
# and with beam 4, score, print a table. Deterministic (seeded); no download.
#
# usage: examples/demo.sh [WORK_DIR]      (make demo runs it in ./demo_work)
# env: MAX_UPDATE (default 600), PYTHON (default python)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-demo_work}
MAX_UPDATE=${MAX_UPDATE:-600}
PYTHON=${PYTHON:-python}
mkdir -p "$WORK"
log() { echo "==> $*"; }

log "[1/5] toy data -> $WORK/raw"
"$PYTHON" -m fairseq_ext.toy "$WORK/raw" --train 2000 --valid 200 --test 200 --seed 1

log "[2/5] fairseq-preprocess -> $WORK/bin"
rm -rf "$WORK/bin"
fairseq-preprocess --source-lang src --target-lang tgt --joined-dictionary --workers 1 \
  --trainpref "$WORK/raw/train" --validpref "$WORK/raw/valid" --testpref "$WORK/raw/test" \
  --destdir "$WORK/bin" > "$WORK/preprocess.log" 2>&1

log "[3/5] fairseq-train: tiny transformer, MLE, $MAX_UPDATE updates (log: $WORK/train_mle.log)"
rm -rf "$WORK/ckpt_mle"
fairseq-train "$WORK/bin" --user-dir fairseq_ext --seed 1 \
  --arch transformer --encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64 --decoder-embed-dim 64 \
  --encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --dropout 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.003 \
  --lr-scheduler inverse_sqrt --warmup-updates 200 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 1024 --max-update "$MAX_UPDATE" --validate-interval 5 --save-interval 5 --save-dir "$WORK/ckpt_mle" --no-epoch-checkpoints \
  --log-format simple --log-interval 200 --num-workers 0 2>&1 | tee "$WORK/train_mle.log" | grep -E "\| valid \|" || true
test -s "$WORK/ckpt_mle/checkpoint_best.pt" || { echo "demo: training failed, see $WORK/train_mle.log" >&2; exit 1; }

log "[4/5] fairseq-generate on the test set (greedy and beam 4)"
for beam in 1 4; do
  fairseq-generate "$WORK/bin" --user-dir fairseq_ext --path "$WORK/ckpt_mle/checkpoint_best.pt" \
    --gen-subset test --beam "$beam" --batch-size 100 --max-len-a 1.5 --max-len-b 5 \
    > "$WORK/gen_mle_beam$beam.out" 2> "$WORK/gen_mle_beam$beam.log"
done

log "[5/5] scoring"
rows=()
for beam in 1 4; do
  "$PYTHON" scripts/score.py "$WORK/gen_mle_beam$beam.out" --json "$WORK/scores_mle_beam$beam.json" > /dev/null
  rows+=("MLE/beam$beam=$WORK/scores_mle_beam$beam.json")
done
"$PYTHON" examples/print_table.py "${rows[@]}"
