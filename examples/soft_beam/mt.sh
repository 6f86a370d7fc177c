#!/usr/bin/env bash
# Continuous relaxation of beam search on Multi30k De-En (Goyal thesis Table 5.4
# layout, beam 3; section 5.4.3): does global normalisation, started from a
# self-normalised model, help translation? CPU scale.
#
# Data: scripts/prepare/prepare_multi30k.sh, joint sentencepiece BPE of VOCAB types.
# Model: fairseq `lstm` with attention, 1-layer bidirectional encoder, 1-layer
# decoder, EMBED-wide embeddings, HIDDEN units (the thesis's MT model is a
# BiLSTM encoder-decoder with attention, 256 units).
# Pre-training (Adam 0.002, clip 1.0, --max-tokens 4000, validation every epoch,
# checkpoint with the best valid loss, stopped when it has not improved for PATIENCE
# epochs, at most PRE_EPOCHS: the thesis pre-trains "to convergence"):
#   ce  cross-entropy
#   sn  self_normalized_ce, lambda 0.1 (the init for global normalisation)
# Fine-tuning from the best checkpoint of one of them (at most FT_EPOCHS epochs, Adam
# at FT_LR, fresh optimizer, update counter and meters), the same budget and rule for
# all, each validated every VALID_EVERY updates by dev BLEU under the decoder used at
# test (our hard beam, k = 3, the run's normalisation: --task translation_search
# --eval-bleu), the best such checkpoint kept, stopped when it has not improved for
# FT_PATIENCE validations (the same rule for the control):
#   ce_ft                 cross-entropy from ce (the control: as many more updates
#                         at the lower lr, no search)
#   ce_local, ce_global   soft_beam_direct_loss from ce, local / global scores
#   sn_local, sn_global   soft_beam_direct_loss from sn, local / global scores
# soft_beam_direct_loss: k = 3, Hamming cost over BPE tokens against the reference
# (over the longer of hypothesis and reference), open length under the decoder's
# EOS rules up to reference length + 2 (--soft-beam-extra-len), no dropout in the
# search pass (--soft-beam-dropout none); alpha 1 -> ALPHA_FINAL geometrically
# over ALPHA_UPDATES updates (two epochs: annealed across epochs, as the thesis does),
# then held.
# Decoding (task translation_search, dev = val and test2016, --max-len-a 1.2
# --max-len-b 10, --post-process sentencepiece): every model greedy (--beam 1,
# fairseq's search) and with our hard beam k = 3 (--search-algorithm hard;
# local scores for the pre-trained models and ce_ft, the run's own normalisation
# otherwise); the fine-tuned models also with the soft beam k = 3
# (--search-algorithm soft, alpha = ALPHA_FINAL, the run's normalisation).
# BLEU: scripts/score/score.py (sacreBLEU corpus BLEU, 13a, on the detokenized D- lines).
# Also: log Z mean / variance of ce and sn on train and dev (scripts/inspect/log_z.py).
#
# Seeds: SEEDS (pre-training and fine-tuning seed); scripts/score/compare_runs.py then
# compares every fine-tune's hard-beam test output with ce_ft's, seed by seed
# (sacreBLEU's paired bootstrap, pooled over the seeds).
#
# One training job at a time; the decodes of a model run in the background beside
# the next training (DECODE_JOBS of them at most). A stage that finished is
# skipped (WORK_DIR/NAME.sSEED/trained, .../done); an interrupted training resumes
# from its checkpoint_last.pt (optimizer state included).
#
# usage: examples/soft_beam/mt.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), VOCAB (2000), EMBED (128), HIDDEN (256),
#      PRE_EPOCHS (30), PATIENCE (3), FT_EPOCHS (3, 501 updates), FT_PATIENCE (4),
#      FT_LR (0.0001; the relaxed loss is linear only within about 1e-4 of the
#      parameters, and at 0.001, ner.sh's, the direct loss wrecked a Multi30k model:
#      examples/soft_beam/README.md), ALPHA_FINAL (100),
#      ALPHA_UPDATES (334, two epochs of 167 updates), VALID_EVERY (84, half an epoch),
#      SEEDS ("1 2 3"), DECODE_JOBS (1),
#      ONLY (space-separated run names; default all: ce sn ce_ft ce_local ce_global
#      sn_local sn_global)
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults VOCAB=2000 EMBED=128 HIDDEN=256 PRE_EPOCHS=30 PATIENCE=3 FT_EPOCHS=3 FT_PATIENCE=4 FT_LR=0.0001 \
  ALPHA_FINAL=100 ALPHA_UPDATES=334 SEEDS="1 2 3" VALID_EVERY=84 DECODE_JOBS=1 PYTHON=python
export OMP_NUM_THREADS=1
mkdir -p "$WORK"
D=$WORK/data/bin

[ -d "$D" ] || bash scripts/prepare/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB" \
  > "$WORK/prepare.log" 2>&1
MODEL=(--user-dir "$(fairseq-ext-dir)" --arch lstm --encoder-layers 1 --decoder-layers 1
  --encoder-bidirectional --encoder-embed-dim "$EMBED" --encoder-hidden-size "$HIDDEN"
  --decoder-embed-dim "$EMBED" --decoder-hidden-size "$HIDDEN" --decoder-out-embed-dim "$EMBED" --dropout 0.2
  --optimizer adam --clip-norm 1.0 --max-tokens 4000 --num-workers 0 --no-epoch-checkpoints
  --log-format simple --log-interval 25)
SB="--criterion soft_beam_direct_loss --soft-beam-size 3 --soft-beam-alpha 1 --soft-beam-alpha-schedule exponential
  --soft-beam-alpha-final $ALPHA_FINAL --soft-beam-alpha-updates $ALPHA_UPDATES"

# name -> "init|normalisation|criterion options"; init "-" = pre-training
declare -A RUNS=(
  [ce]="-|local|--criterion cross_entropy"
  [sn]="-|local|--criterion self_normalized_ce --self-norm-lambda 0.1"
  [ce_ft]="ce|local|--criterion cross_entropy"
  [ce_local]="ce|local|$SB --soft-beam-normalization local"
  [ce_global]="ce|global|$SB --soft-beam-normalization global"
  [sn_local]="sn|local|$SB --soft-beam-normalization local"
  [sn_global]="sn|global|$SB --soft-beam-normalization global"
)
ORDER="ce sn ce_ft ce_local ce_global sn_local sn_global"
ONLY=${ONLY:-$ORDER}

gen() {  # dir split mode options... (skipped when its score file is newer than the checkpoint:
  # a resumed decode; a run retrained after its score files were copied in is decoded again)
  local dir=$1 split=$2 mode=$3; shift 3
  [ "$dir/$split.$mode.json" -nt "$dir/checkpoint_best.pt" ] && return 0
  fairseq-generate "$D" --user-dir "$(fairseq-ext-dir)" --task translation_search --path "$dir/checkpoint_best.pt" \
    --gen-subset "$split" --batch-size 128 --max-len-a 1.2 --max-len-b 10 --post-process sentencepiece "$@" \
    > "$dir/$split.$mode.gen" 2> "$dir/$split.$mode.gen.log"
  "$PYTHON" scripts/score/score.py "$dir/$split.$mode.gen" --json "$dir/$split.$mode.json" > /dev/null
}

decode() {  # dir init normalisation; test first, the hard beam first (what the comparison
  # with the control needs), so a run interrupted during decoding loses dev numbers, not the table's
  local dir=$1 init=$2 norm=$3 split
  for split in test valid; do
    gen "$dir" $split hard --beam 3 --search-algorithm hard --search-normalization "$norm"
    gen "$dir" $split greedy --beam 1 --search-algorithm fairseq
    [ "$init" = - ] || gen "$dir" $split soft --beam 3 --search-algorithm soft --search-normalization "$norm" \
      --search-alpha "$ALPHA_FINAL"
  done
  touch "$dir/done"
}

logz() {  # dir: log Z statistics of a checkpoint on train and dev (Table 5.1)
  "$PYTHON" scripts/inspect/log_z.py "$D" --user-dir "$(fairseq-ext-dir)" --task translation --path "$1/checkpoint_best.pt" \
    --valid-subset train,valid --max-tokens 4000 --num-workers 0 > "$1/logz.log" 2>&1
}

for SEED in $SEEDS; do
for name in $ONLY; do
  dir="$WORK/$name.s$SEED"
  # (one line for read: options continued on a second line would be dropped)
  IFS='|' read -r init norm opts <<< "${RUNS[$name]//$'\n'/ }"
  if [ -e "$dir/done" ]; then echo "done already: $name"; continue; fi
  # a killed run resumes from its checkpoint_last.pt (fairseq ignores --finetune-from-model then)
  if [ ! -e "$dir/trained" ]; then
    mkdir -p "$dir"
    start=$(date +%s)
    if [ "$init" = - ]; then
      # shellcheck disable=SC2086
      fairseq-train "$D" "${MODEL[@]}" --task translation $opts --lr 0.002 --max-epoch "$PRE_EPOCHS" \
        --patience "$PATIENCE" --save-dir "$dir" --seed "$SEED" >> "$dir.train.log" 2>&1
    else
      # fine-tune: fresh optimizer, lr schedule, meters and update counter (the alpha schedule;
      # --finetune-from-model, first launch: the directory is new); keep the checkpoint with the
      # best dev BLEU under the hard beam (k = 3) with the run's normalisation
      # shellcheck disable=SC2086
      fairseq-train "$D" "${MODEL[@]}" --task translation_search --search-algorithm hard \
        --search-normalization "$norm" $opts --lr "$FT_LR" --max-epoch "$FT_EPOCHS" --patience "$FT_PATIENCE" \
        --validate-interval-updates "$VALID_EVERY" --save-interval-updates "$VALID_EVERY" \
        --keep-interval-updates 1 --eval-bleu --eval-bleu-args '{"beam": 3, "max_len_a": 1.2, "max_len_b": 10}' \
        --eval-bleu-detok space --eval-bleu-remove-bpe sentencepiece --best-checkpoint-metric bleu \
        --maximize-best-checkpoint-metric --finetune-from-model "$WORK/$init.s$SEED/checkpoint_best.pt" \
        --save-dir "$dir" --seed "$SEED" >> "$dir.train.log" 2>&1
      rm -f "$dir"/checkpoint_*_*.pt
    fi
    rm -f "$dir/checkpoint_last.pt"
    touch "$dir/trained"
    echo "trained: $name in $(( $(date +%s) - start )) s ($(date -u +%H:%M:%S))"
  fi
  throttle "$DECODE_JOBS"
  { decode "$dir" "$init" "$norm"; [ "$init" != - ] || logz "$dir"; echo "decoded: $name ($(date -u +%H:%M:%S))"; } &
done
done
wait

echo "All decodings, sacreBLEU (dev = val, test = test2016), mean +- std over seeds"
"$PYTHON" examples/dss/table.py "$WORK" --std --suffix .greedy --suffix .hard ce sn
"$PYTHON" examples/dss/table.py "$WORK" --std --suffix .greedy --suffix .hard --suffix .soft ce_ft ce_local \
  ce_global sn_local sn_global
# Table 5.4 layout: the fine-tunes against the control, test, paired by seed
FT=""
for name in ce_ft ce_local ce_global sn_local sn_global; do [[ " $ONLY " == *" $name "* ]] && FT+=" $name"; done
if [[ " $FT " == *" ce_ft "* ]]; then
  for mode in hard soft; do
    specs=()
    for name in $FT; do specs+=("$(seed_spec "$name" "$WORK/$name.s@SEED@/test.$mode.gen")"); done
    echo
    echo "test, $mode beam k = 3, against ce_ft (sacreBLEU paired bootstrap; BLEU's parts below)"
    "$PYTHON" scripts/score/compare_runs.py --control ce_ft "${specs[@]}" --bleu-details \
      --json "$WORK/compare.$mode.json" | tee "$WORK/compare.$mode.md"
  done
fi
echo "Table 5.1 layout: log Z on train / dev"
for f in "$WORK"/{ce,sn}.s*/logz.log; do
  [ -e "$f" ] && grep -o "valid on '[a-z]*' subset.*log_z_var [0-9.e+-]*" "$f" | sed "s|^|$(basename "$(dirname "$f")"): |"
done
true
