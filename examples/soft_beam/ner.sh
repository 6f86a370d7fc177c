#!/usr/bin/env bash
# Continuous relaxation of beam search on CoNLL-2003 NER (Goyal thesis Table 4.2
# layout, and the normalisation / initialisation comparison of Tables 5.1-5.3),
# or on CoNLL-2003 POS with TAG_COLUMN=pos (the stand-in for the thesis's CCG
# supertagging: Table 4.1 layout, and Tables 5.2-5.3 with ENCODER=uni / bi), CPU
# scale.
#
# Pre-training (PRE_EPOCHS epochs, lr 0.005): `ce` (cross-entropy; or the
# checkpoint CE_CKPT, %s = seed) and `sn` (self_normalized_ce, lambda 0.1).
# Fine-tuning from one of them (FT_EPOCHS epochs, lr FT_LR, fresh optimizer,
# update counter and epoch count; k = 3; NER only: --soft-beam-hamming-weights O=2.0):
#   hinge_annealed, hinge_fixed, dl_fixed, dl_annealed   from ce, local scores
#   ce_global                                            from ce, global scores
#   sn_local, sn_global                                  from sn
#   ce_ft: cross-entropy fine-tuning from ce (the control: as many more updates
#   at the lower lr, no search)
# "annealed": alpha 1 -> ALPHA_FINAL geometrically over ALPHA_UPDATES updates,
# then held; "fixed": alpha 1. Every run keeps the checkpoint with the best dev
# F1 (NER) or tag accuracy (POS) under the decoder used at test, SELECT (default
# the hard beam, k = 3, under the run's normalisation: --tagging-eval-search;
# "greedy" for greedy decoding), the same rule for the search-aware runs and the
# ce_ft control; fine-tunes stop early when it has not improved for PATIENCE
# epochs (at most FT_EPOCHS), pre-training likewise within PRE_EPOCHS. (The thesis,
# section 4.5.3, trains 50 epochs and keeps the best on dev; the defaults, at most 30
# epochs with patience 4, are the CPU version of that, as in examples/dss/ner.sh.) Each model is
# decoded on dev and test greedy (--beam 1), with the hard beam (k = 3) and the
# soft beam (k = 3, alpha = the run's final training alpha; 1 for the
# pre-trained models), scoring under the run's normalisation (global for
# *_global); F1 with conlleval semantics (NER) or token accuracy (POS).
# Also: log Z mean / variance of ce and sn on train and dev (Table 5.1).
#
# One training job at a time; the decodes of a model run in the background
# beside the next training (DECODE_JOBS of them at most).
#
# usage: examples/soft_beam/ner.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), SEEDS ("1 2 3"), PRE_EPOCHS (30), FT_EPOCHS (30),
#      PATIENCE (4), FT_LR (0.001), SELECT (hard | greedy),
#      ALPHA_FINAL (100), ALPHA_UPDATES (444, two epochs at --max-tokens 1000),
#      CE_CKPT (e.g. /tmp/ner/work/ce.s%s/checkpoint_best.pt; default: train ce),
#      DECODE_JOBS (1), ONLY (space-separated run names; default all),
#      TAG_COLUMN (ner | pos), ARCH (tagging_lstm_$TAG_COLUMN),
#      ENCODER (bi | uni: --encoder-unidirectional, the label-bias ablation of section 5.4.2)
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults SEEDS="1 2 3" PATIENCE=4 SELECT=hard PRE_EPOCHS=30 FT_EPOCHS=30 FT_LR=0.001 ALPHA_FINAL=100 \
  ALPHA_UPDATES=444 CE_CKPT= DECODE_JOBS=1 PYTHON=python TAG_COLUMN=ner
defaults ARCH="tagging_lstm_$TAG_COLUMN" ENCODER=bi
case "$TAG_COLUMN" in
  ner) BEST=f1; METRIC="F1 (micro, conlleval)"; HAMMING="--soft-beam-hamming-weights O=2.0" ;;
  pos) BEST=tag_acc; METRIC="token accuracy"; HAMMING="" ;;
  *) echo "TAG_COLUMN must be ner or pos" >&2; exit 2 ;;
esac
case "$ENCODER" in
  bi) ENCODER_OPTS=() ;;
  uni) ENCODER_OPTS=(--encoder-unidirectional) ;;
  *) echo "ENCODER must be bi or uni" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=1
D=$FAIRSEQ_EXT_DATA/conll2003
mkdir -p "$WORK"
TASK=(--user-dir "$(fairseq-ext-dir)" --task sequence_tagging --tagging-column "$TAG_COLUMN" --tagging-cache-dir "$WORK/cache")
case "$SELECT" in
  hard) SELECT_OPTS=(--tagging-eval-search hard --tagging-eval-beam 3) ;;
  greedy) SELECT_OPTS=() ;;
  *) echo "SELECT must be hard or greedy" >&2; exit 2 ;;
esac
COMMON=(--arch "$ARCH" "${ENCODER_OPTS[@]}" --optimizer adam --max-tokens 1000 --no-epoch-checkpoints
  --no-save-optimizer-state --num-workers 0 --tagging-eval "${SELECT_OPTS[@]}" --best-checkpoint-metric "$BEST"
  --maximize-best-checkpoint-metric --patience "$PATIENCE" --log-format simple)
SB="--soft-beam-size 3 $HAMMING"
FIXED="--soft-beam-alpha 1 --soft-beam-alpha-schedule fixed"
ANNEALED="--soft-beam-alpha 1 --soft-beam-alpha-schedule exponential --soft-beam-alpha-final $ALPHA_FINAL
  --soft-beam-alpha-updates $ALPHA_UPDATES"

# name -> "init|normalisation|soft-decoding alpha|criterion options"; init "-" = pre-training
declare -A RUNS=(
  [ce]="-|local|1|--criterion cross_entropy"
  [ce_ft]="ce|local|1|--criterion cross_entropy"
  [sn]="-|local|1|--criterion self_normalized_ce --self-norm-lambda 0.1"
  [hinge_annealed]="ce|local|$ALPHA_FINAL|--criterion soft_beam_hinge $SB $ANNEALED --soft-beam-normalization local"
  [hinge_fixed]="ce|local|1|--criterion soft_beam_hinge $SB $FIXED --soft-beam-normalization local"
  [dl_fixed]="ce|local|1|--criterion soft_beam_direct_loss $SB $FIXED --soft-beam-normalization local"
  [dl_annealed]="ce|local|$ALPHA_FINAL|--criterion soft_beam_direct_loss $SB $ANNEALED --soft-beam-normalization local"
  [ce_global]="ce|global|$ALPHA_FINAL|--criterion soft_beam_direct_loss $SB $ANNEALED --soft-beam-normalization global"
  [sn_local]="sn|local|$ALPHA_FINAL|--criterion soft_beam_direct_loss $SB $ANNEALED --soft-beam-normalization local"
  [sn_global]="sn|global|$ALPHA_FINAL|--criterion soft_beam_direct_loss $SB $ANNEALED --soft-beam-normalization global"
)
ORDER="ce ce_ft dl_annealed dl_fixed hinge_annealed hinge_fixed ce_global sn sn_global sn_local"
ONLY=${ONLY:-$ORDER}

# binarize once
[ -d "$WORK/cache" ] || fairseq-train "$D" "${TASK[@]}" --arch "$ARCH" --criterion cross_entropy \
  --optimizer adam --max-tokens 1000 --max-update 1 --no-save --disable-validation --num-workers 0 \
  > "$WORK/prepare.log" 2>&1

decode() {  # dir normalisation alpha
  local dir=$1 norm=$2 alpha=$3 split
  for split in valid test; do
    # greedy: fairseq's search (argmax is the same under local and global scores)
    fairseq-generate "$D" "${TASK[@]}" --path "$dir/checkpoint_best.pt" --gen-subset $split --beam 1 \
      --search-algorithm fairseq --batch-size 256 > "$dir/$split.greedy.gen" 2> "$dir/$split.greedy.gen.log"
    fairseq-generate "$D" "${TASK[@]}" --path "$dir/checkpoint_best.pt" --gen-subset $split --beam 3 \
      --search-algorithm hard --search-normalization "$norm" --batch-size 256 \
      > "$dir/$split.hard.gen" 2> "$dir/$split.hard.gen.log"
    fairseq-generate "$D" "${TASK[@]}" --path "$dir/checkpoint_best.pt" --gen-subset $split --beam 3 \
      --search-algorithm soft --search-alpha "$alpha" --search-normalization "$norm" --batch-size 256 \
      > "$dir/$split.soft.gen" 2> "$dir/$split.soft.gen.log"
    for mode in greedy hard soft; do
      "$PYTHON" scripts/score/score_tagging.py "$dir/$split.$mode.gen" --json "$dir/$split.$mode.json" > /dev/null
    done
  done
  touch "$dir/done"
}

logz() {  # dir: log Z statistics of a checkpoint on train and dev (Table 5.1)
  "$PYTHON" scripts/inspect/log_z.py "$D" "${TASK[@]}" --path "$1/checkpoint_best.pt" \
    --valid-subset train,valid --max-tokens 4000 --num-workers 0 > "$1/logz.log" 2>&1
}

for seed in $SEEDS; do
  for name in $ONLY; do
    dir="$WORK/$name.s$seed"
    # (one line for read: options continued on a second line would be dropped)
    IFS='|' read -r init norm alpha opts <<< "${RUNS[$name]//$'\n'/ }"
    # done: decoded here, or its score files copied from results/
    if [ -e "$dir/done" ] || [ -s "$dir/test.soft.json" ]; then echo "done already: $name seed $seed"; continue; fi
    # a killed run leaves a checkpoint_best.pt: start it again from scratch, so that every
    # result comes from one uninterrupted run (the runs are minutes long)
    if [ ! -e "$dir/trained" ]; then
      rm -rf "$dir"; mkdir -p "$dir"
      start=$(date +%s)
      if [ "$name" = ce ] && [ -n "$CE_CKPT" ]; then
        # shellcheck disable=SC2059
        cp "$(printf "$CE_CKPT" "$seed")" "$dir/checkpoint_best.pt"
      elif [ "$init" = - ]; then
        # shellcheck disable=SC2086
        fairseq-train "$D" "${TASK[@]}" "${COMMON[@]}" $opts --lr 0.005 --max-epoch "$PRE_EPOCHS" \
          --save-dir "$dir" --seed "$seed" > "$dir.train.log" 2>&1
      else
        # fine-tune: fresh optimizer, lr schedule, meters, update counter (the alpha schedule) and
        # epoch count (--finetune-from-model; the directory is new, so this is its first launch)
        # shellcheck disable=SC2086
        fairseq-train "$D" "${TASK[@]}" "${COMMON[@]}" $opts --lr "$FT_LR" --max-epoch "$FT_EPOCHS" \
          --finetune-from-model "$WORK/$init.s$seed/checkpoint_best.pt" \
          --save-dir "$dir" --seed "$seed" > "$dir.train.log" 2>&1
      fi
      rm -f "$dir/checkpoint_last.pt"
      touch "$dir/trained"
      echo "trained: $name seed $seed in $(( $(date +%s) - start )) s"
    fi
    throttle "$DECODE_JOBS"
    { [ "$init" != - ] || logz "$dir"; decode "$dir" "$norm" "$alpha"; echo "decoded: $name seed $seed"; } &
  done
done
wait

MODES=(--suffix .greedy --suffix .hard --suffix .soft --std --control ce_ft)
echo "Table 4.1 (POS) / 4.2 (NER) layout: $METRIC, mean +- std over seeds"
"$PYTHON" examples/dss/table.py "$WORK" "${MODES[@]}" ce ce_ft hinge_annealed hinge_fixed dl_fixed dl_annealed \
  > "$WORK/table4.md"
cat "$WORK/table4.md"
echo "Chapter 5: initialisation (ce, sn) x normalisation of the direct-loss fine-tuning, $METRIC"
"$PYTHON" examples/dss/table.py "$WORK" "${MODES[@]}" ce ce_ft dl_annealed ce_global sn sn_local sn_global \
  > "$WORK/table5.md"
cat "$WORK/table5.md"
if [ "$TAG_COLUMN" = ner ]; then
  echo "Macro F1 (the thesis's Table 4.2 metric)"
  "$PYTHON" examples/dss/table.py "$WORK" "${MODES[@]}" --metric f1_macro $ORDER > "$WORK/table_macro.md"
  cat "$WORK/table_macro.md"
fi
echo "Table 5.1 layout: log Z on train / dev"
for f in "$WORK"/{ce,sn}.s*/logz.log; do
  [ -e "$f" ] && grep -o "valid on '[a-z]*' subset.*log_z_var [0-9.e+-]*" "$f" | sed "s|^|$(basename "$(dirname "$f")"): |"
done
true
