#!/usr/bin/env bash
# WMT'14 De-En / WMT'16 Ro-En: Mask-Predict's CMLM and the Metropolis-Hastings
# samplers of Goyal's thesis, chapter 6 (Table 6.6 layout; Tables 6.2-6.5 on the
# "(20)" subset). Stages, in order:
#   download   the WMT archives (as fairseq's prepare-wmt14en2de.sh; WMT16 Ro-En from
#              statmt / OPUS), or link WMT_RAW (where they are extracted)
#   prepare    Moses punctuation normalization + aggressive tokenization (sacremoses;
#              Ro-En: Romanian normalized, diacritics removed), clean 1-250 tokens ratio
#              1.5, joint BPE of BPE_TOKENS merges (subword-nmt); valid newstest2013 /
#              newsdev2016, test newstest2014 / newstest2016
#   binarize   fairseq-preprocess, joined dictionary (Mask-Predict shares all embeddings)
#   subset20   the test pairs whose source has <= 20 words, binarized with the same dictionary
#   cmlm       cmlm_transformer as Mask-Predict: 6+6 layers, 512, Adam (0.9, 0.999),
#              lr 5e-4, 10k warm-up, 128k tokens per update, 300k updates, fp16 on GPUs
#   baselines  warm start (one greedy pass) and Mask-Predict (10 iterations, beam 1)
#   mh         the MH_RUNS samplers, 5 chains, 7 burn-in + 26 epochs, proposal temperature 0.8,
#              every proposal accepted in the first 2 epochs, on the full test set and the (20)
#              subset. raw, local (the headline runs): target temperature annealed linearly to
#              the floor (0.05) at 60% of the epochs, each chain's lowest-energy state printed
#              (--mh-anneal-floor-at 0.6 --mh-output best: the schedule that passed Mask-Predict
#              on Multi30k, examples/mh_sampler/README.md); gibbs: degenerate Gibbs.
#              raw_table66, local_table66 (not in the default MH_RUNS): the thesis's Table 6.6
#              set-up as written, target temperature lowered 0.02 per epoch, final state printed
#              (it ends at T = 0.36, still sampling; on Multi30k 0.02 per epoch was the weakest
#              rate even with the lowest-energy state printed)
#   score      BLEU of every run (fairseq's tokenized BLEU4 and sacreBLEU)
#
# usage: examples/mh_sampler/wmt.sh WORK_DIR [--stage NAME]... [--from NAME] [--to NAME]
#                               [--force] [--dry-run] [--list]
# your own data and model: DATA (a binarized fairseq translation directory, with a joined
#      dictionary if the cmlm stage trains on it: download, prepare and binarize have nothing to
#      make; subset20 is skipped, as the (20) subset is selected from the raw test text, so the
#      len20 evaluation set is not available and EVAL_SETS defaults to full), CMLM (a cmlm_transformer checkpoint trained on DATA's
#      dictionary, with --task translation_lev or translation_mh: the cmlm stage has nothing to make)
# env: PAIR (de-en or ro-en; default de-en, translated left to right), WMT_RAW (extracted
#      archives: skips the download), BPE_TOKENS (40000), MAX_UPDATE (300000), SUBSET (0: all
#      short pairs), EVAL_SETS ("full len20"), MH_RUNS ("gibbs local raw"; add raw_table66
#      local_table66 for the thesis's Table 6.6 schedule), CHAINS (5), NGPU, FP16 (1), WORKERS
#      (CPU count), PYTHON (python), EXTRA_TRAIN / EXTRA_CMLM (appended to the CMLM training),
#      EXTRA_MH (to the samplers)
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
STAGES=(download prepare binarize subset20 cmlm baselines mh score)
PATH_VARS=(WMT_RAW DATA CMLM)
recipe_args "$@"
PAIR=${PAIR:-de-en}
SRC=${PAIR%-*}
TGT=${PAIR#*-}
defaults BPE_TOKENS=40000 MAX_UPDATE=300000 SUBSET=0 CHAINS=5
ORIG=$WORK/orig
RAW=$WORK/raw
defaults DATA="$WORK/data-bin" CMLM="$WORK/cmlm/checkpoint_best.pt"

case $PAIR in
  de-en|en-de)
    URLS=(http://statmt.org/wmt13/training-parallel-europarl-v7.tgz
      http://statmt.org/wmt13/training-parallel-commoncrawl.tgz
      http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz
      http://data.statmt.org/wmt17/translation-task/dev.tgz
      http://statmt.org/wmt14/test-full.tgz)
    # normalized name -> file in the extracted archives ({l}: language)
    LINKS=("train1.{l}=training/europarl-v7.de-en.{l}" "train2.{l}=commoncrawl.de-en.{l}"
      "train3.{l}=training/news-commentary-v12.de-en.{l}" "valid.{l}=dev/newstest2013.{l}"
      "test.en.sgm=test-full/newstest2014-deen-src.en.sgm" "test.de.sgm=test-full/newstest2014-deen-ref.de.sgm")
    LANG_OPTS=() ;;
  ro-en|en-ro)
    URLS=(http://data.statmt.org/wmt16/translation-task/training-parallel-ep-v8.tgz
      "http://opus.nlpl.eu/download.php?f=SETIMES/v2/moses/en-ro.txt.zip"
      http://data.statmt.org/wmt16/translation-task/dev-romanian-updated.tgz
      http://data.statmt.org/wmt16/translation-task/test.tgz)
    LINKS=("train1.{l}=training-parallel-ep-v8/europarl-v8.ro-en.{l}" "train2.{l}=SETIMES.en-ro.{l}"
      "valid.ro.sgm=dev/newsdev2016-roen-src.ro.sgm" "valid.en.sgm=dev/newsdev2016-roen-ref.en.sgm"
      "test.ro.sgm=test/newstest2016-roen-src.ro.sgm" "test.en.sgm=test/newstest2016-roen-ref.en.sgm")
    LANG_OPTS=(--romanian) ;;
  *) echo "$0: PAIR must be de-en, en-de, ro-en or en-ro, got '$PAIR'" >&2; exit 2 ;;
esac

GEN=(--user-dir "$(fairseq-ext-dir)" "${GEN_DEVICE[@]}" --path "$CMLM" --gen-subset test --batch-size 50
  --required-batch-size-multiple 1 --remove-bpe --seed 1)
# section 6.8's set-up: 5 chains, proposal temperature 0.8, acceptance forced to 1 in the first two
# epochs. The headline runs anneal the target temperature to the floor at 60% of the epochs and print
# each chain's lowest-energy state (on Multi30k the raw energy so passed Mask-Predict by +3.87 BLEU,
# p = 0.05; 0.02 per epoch ends at T = 0.36, still sampling); *_table66 are the thesis's Table 6.6
# rows as written; degenerate Gibbs at the same proposal temperature
MH=(--task translation_mh --mh-chains "$CHAINS" --nbest 1 --mh-proposal-temperature 0.8 --mh-burn-in 7 --mh-epochs 26)
ANNEAL="--mh-accept-all-epochs 2 --mh-anneal-floor-at 0.6 --mh-output best"
declare -A RUNS=(
  [gibbs]="--mh-kernel gibbs"
  [local]="--mh-energy local $ANNEAL"
  [raw]="--mh-energy raw $ANNEAL"
  [local_table66]="--mh-energy local --mh-target-anneal 0.02 --mh-accept-all-epochs 2"
  [raw_table66]="--mh-energy raw --mh-target-anneal 0.02 --mh-accept-all-epochs 2"
)
MH_RUNS=${MH_RUNS:-gibbs local raw}
for name in $MH_RUNS; do
  [ -n "${RUNS[$name]+x}" ] || { echo "$0: MH_RUNS takes ${!RUNS[*]}, got '$name'" >&2; exit 2; }
done
# the (20) subset is selected from the raw test text, which a given DATA does not come with
EVAL_SETS=${EVAL_SETS:-$(is_given DATA && echo full || echo full len20)}
SETS=()
for set in $EVAL_SETS; do
  case $set in full) SETS+=("full=$DATA") ;; len20) SETS+=("len20=$DATA-20") ;;
    *) echo "$0: EVAL_SETS takes full and len20, got '$set'" >&2; exit 2 ;; esac
  if [ "$set" = len20 ] && is_given DATA; then
    echo "$0: EVAL_SETS=len20 needs the raw test text to select the (20) subset from; with DATA= given" \
      "only the full test set is available (EVAL_SETS=full)" >&2
    exit 2
  fi
done

if stage download; then
  if ! given DATA; then
    run mkdir -p "$ORIG" "$RAW"
    if [ -n "${WMT_RAW:-}" ]; then
      run ln -sfn "$WMT_RAW" "$ORIG/extracted"
    else
      run mkdir -p "$ORIG/extracted"
      for url in "${URLS[@]}"; do
        file=$ORIG/$(basename "${url%%\?*}"); [[ $url != *"?f="* ]] || file=$ORIG/$(basename "${url#*\?f=}")
        run wget -nv -O "$file" "$url"
        if [[ $file == *.zip ]]; then run unzip -o -q "$file" -d "$ORIG/extracted"
        else run tar -xzf "$file" -C "$ORIG/extracted"; fi
      done
    fi
    for link in "${LINKS[@]}"; do
      for l in $SRC $TGT; do
        [[ $link == *"{l}"* || $link == *".$l.sgm="* ]] || continue
        name=${link%%=*} target=${link#*=}
        run ln -sfn "$ORIG/extracted/${target//\{l\}/$l}" "$RAW/${name//\{l\}/$l}"
      done
    done
  fi
  stage_done download
fi

if stage prepare; then
  if ! given DATA; then
    trains=()
    for link in "${LINKS[@]}"; do [[ $link != train* ]] || trains+=("$RAW/${link%%=*}"); done
    valid=$RAW/valid.{l}; [[ " ${LINKS[*]} " != *" valid.$SRC.sgm="* ]] || valid=$RAW/valid.{l}.sgm
    run "$PYTHON" scripts/prepare/prepare_translation.py "$WORK/prep" --src "$SRC" --tgt "$TGT" \
      --train "${trains[@]}" --valid "$valid" --test "$RAW/test.{l}.sgm" --normalize --aggressive "${LANG_OPTS[@]}" \
      --min-len 1 --max-len 250 --ratio 1.5 --bpe-tokens "$BPE_TOKENS" --workers "$WORKERS"
  fi
  stage_done prepare
fi

if stage binarize; then
  if ! given DATA; then
    run rm -rf "$DATA"
    run_log "$WORK/logs/binarize.log" fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
      --joined-dictionary --trainpref "$WORK/prep/train" --validpref "$WORK/prep/valid" \
      --testpref "$WORK/prep/test" --destdir "$DATA" --workers "$WORKERS"
  fi
  stage_done binarize
fi

if stage subset20; then
  if is_given DATA; then
    echo "# DATA=$DATA given: no raw test text to select the (20) subset from; subset20 skipped," \
      "only the full test set is evaluated"
  else
    run "$PYTHON" scripts/prepare/short_source_subset.py "$WORK/prep/tok/test.$SRC" "$WORK/prep/test" \
      "$WORK/prep/test20" --src "$SRC" --tgt "$TGT" --max-words 20 --limit "$SUBSET"
    run rm -rf "$DATA-20"
    run_log "$WORK/logs/subset20.log" fairseq-preprocess --source-lang "$SRC" --target-lang "$TGT" \
      --testpref "$WORK/prep/test20" --srcdict "$DATA/dict.$SRC.txt" --tgtdict "$DATA/dict.$TGT.txt" \
      --destdir "$DATA-20" --workers 1
  fi
  stage_done subset20
fi

# Mask-Predict's training command (facebookresearch/Mask-Predict README) in fairseq's
# cmlm_transformer; 8192 tokens x 16 = 128k tokens per update, as its 16 GPUs
# shellcheck disable=SC2086
stage_unless_given cmlm CMLM train cmlm "$DATA" "${FP16_ARGS[@]}" --task translation_mh --noise random_mask \
  --arch cmlm_transformer --share-all-embeddings --encoder-learned-pos --decoder-learned-pos --apply-bert-init \
  --dropout 0.3 --weight-decay 0.01 --criterion nat_loss --label-smoothing 0.1 --length-loss-factor 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.999)' --adam-eps 1e-6 --lr 5e-4 --lr-scheduler inverse_sqrt \
  --warmup-updates 10000 --warmup-init-lr 1e-7 --stop-min-lr 1e-9 --max-tokens 8192 --update-freq "$(update_freq 16)" \
  --max-update "$MAX_UPDATE" --ddp-backend legacy_ddp --fixed-validation-seed 7 \
  --save-interval-updates 10000 --keep-interval-updates 5 ${EXTRA_CMLM:-}

if stage baselines; then
  for set in "${SETS[@]}"; do
    run_log "$WORK/gen/warm_start.${set%%=*}.txt" fairseq-generate "${set#*=}" "${GEN[@]}" --task translation_lev \
      --iter-decode-max-iter 0 --iter-decode-eos-penalty 0
    run_log "$WORK/gen/mask_predict.${set%%=*}.txt" fairseq-generate "${set#*=}" "${GEN[@]}" --task translation_lev \
      --iter-decode-max-iter 10 --iter-decode-eos-penalty 0 --iter-decode-with-beam 1
  done
  stage_done baselines
fi

if stage mh; then
  for set in "${SETS[@]}"; do
    for name in $MH_RUNS; do
      # shellcheck disable=SC2086
      run_log "$WORK/gen/$name.${set%%=*}.txt" fairseq-generate "${set#*=}" "${GEN[@]}" "${MH[@]}" ${RUNS[$name]} \
        --mh-stats-file "$WORK/gen/$name.${set%%=*}.jsonl" ${EXTRA_MH:-}
    done
  done
  stage_done mh
fi

if stage score; then
  rows=()
  for set in "${SETS[@]}"; do
    for name in warm_start mask_predict $MH_RUNS; do
      out=$WORK/gen/$name.${set%%=*}
      run_log "$out.score" "$PYTHON" scripts/score/score.py "$out.txt" --json "$out.json"
      rows+=("$name/${set%%=*}=$out.json")
    done
  done
  run "$PYTHON" scripts/score/print_table.py "${rows[@]}"
  [ "$DRY_RUN" = 1 ] || grep -H "BLEU4" "$WORK"/gen/*.txt | sed "s|$WORK/gen/||" || true
  stage_done score
fi
