#!/usr/bin/env bash
# Multi30k De-En: raw text -> joint sentencepiece BPE -> fairseq-preprocess.
#
# usage: scripts/prepare/prepare_multi30k.sh INPUT_DIR OUTPUT_DIR [VOCAB_SIZE]
#   INPUT_DIR   raw Multi30k: {train,val,test}.{de,en}, one sentence a line
#               (e.g. $FAIRSEQ_EXT_DATA/multi30k)
#   OUTPUT_DIR  gets spm.model/.vocab, {train,valid,test}.{de,en} (pieces)
#               and bin/ (fairseq binarized, joined dictionary)
#   VOCAB_SIZE  joint BPE vocabulary (default 8000)
# env: PYTHON (default python), WORKERS (fairseq-preprocess workers, default 2)
#
# The same as scripts/prepare/prepare_translation.py with Multi30k's file names (any
# other corpus: docs/data.md, "Bring your own data"). Generate with
# `--post-process sentencepiece` to get detokenized text back.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,15p' "$0" >&2
  exit 2
fi
IN=$1
OUT=$2
VOCAB=${3:-8000}
if ! [[ "$VOCAB" =~ ^[0-9]+$ ]] || [ "$VOCAB" -lt 100 ]; then
  echo "prepare_multi30k: VOCAB_SIZE must be an integer >= 100, got '$VOCAB'" >&2
  exit 1
fi
# raw text (no tokenization, no cleaning), every training sentence of both sides
exec "${PYTHON:-python}" "$(dirname "$0")/prepare_translation.py" "$OUT" --src de --tgt en \
  --train "$IN/train" --valid "$IN/val" --test "$IN/test" --bpe sentencepiece --vocab-size "$VOCAB" \
  --tokenize none --no-clean --binarize --joined-dictionary --workers "${WORKERS:-2}"
