#!/usr/bin/env bash
# Multi30k De-En: raw text -> joint sentencepiece BPE -> fairseq-preprocess.
#
# usage: scripts/prepare_multi30k.sh INPUT_DIR OUTPUT_DIR [VOCAB_SIZE]
#   INPUT_DIR   raw Multi30k: {train,val,test}.{de,en}, one sentence a line
#               (e.g. $FAIRSEQ_EXT_DATA/multi30k)
#   OUTPUT_DIR  gets spm.model/.vocab, spm/{train,valid,test}.{de,en} (pieces)
#               and bin/ (fairseq binarized, joined dictionary)
#   VOCAB_SIZE  joint BPE vocabulary (default 8000)
# env: PYTHON (default python), WORKERS (fairseq-preprocess workers, default 2)
#
# Generate with `--post-process sentencepiece` to get detokenized text back.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
IN=$1
OUT=$2
VOCAB=${3:-8000}
PYTHON=${PYTHON:-python}
WORKERS=${WORKERS:-2}
for split in train val test; do
  for l in de en; do
    if [ ! -s "$IN/$split.$l" ]; then
      echo "prepare_multi30k: missing input file $IN/$split.$l" >&2
      exit 1
    fi
  done
done
if ! [[ "$VOCAB" =~ ^[0-9]+$ ]] || [ "$VOCAB" -lt 100 ]; then
  echo "prepare_multi30k: VOCAB_SIZE must be an integer >= 100, got '$VOCAB'" >&2
  exit 1
fi
mkdir -p "$OUT/spm"

echo "==> [1/3] training joint sentencepiece BPE (vocab $VOCAB) on train.de + train.en"
"$PYTHON" - "$IN" "$OUT" "$VOCAB" <<'PY'
import sys
import sentencepiece as spm
inp, out, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
spm.SentencePieceTrainer.train(
    input=f"{inp}/train.de,{inp}/train.en", model_prefix=f"{out}/spm", vocab_size=vocab,
    model_type="bpe", character_coverage=1.0,  # all sentences, no sampling: deterministic
    bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2, num_threads=2,
)
PY

echo "==> [2/3] encoding train/valid/test into pieces"
"$PYTHON" - "$IN" "$OUT" <<'PY'
import sys
import sentencepiece as spm
inp, out = sys.argv[1], sys.argv[2]
sp = spm.SentencePieceProcessor(model_file=f"{out}/spm.model")
for src, dst in (("train", "train"), ("val", "valid"), ("test", "test")):
    for lang in ("de", "en"):
        with open(f"{inp}/{src}.{lang}", encoding="utf-8") as f, open(f"{out}/spm/{dst}.{lang}", "w", encoding="utf-8") as g:
            for line in f:
                g.write(" ".join(sp.encode(line.strip(), out_type=str)) + "\n")
PY

echo "==> [3/3] fairseq-preprocess (joined dictionary) -> $OUT/bin"
rm -rf "$OUT/bin"
fairseq-preprocess --source-lang de --target-lang en --joined-dictionary \
  --trainpref "$OUT/spm/train" --validpref "$OUT/spm/valid" --testpref "$OUT/spm/test" \
  --destdir "$OUT/bin" --workers "$WORKERS" > "$OUT/preprocess.log" 2>&1 \
  || { echo "prepare_multi30k: fairseq-preprocess failed, see $OUT/preprocess.log" >&2; exit 1; }
echo "done: $OUT/bin"
