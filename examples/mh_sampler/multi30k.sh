#!/usr/bin/env bash
# Metropolis-Hastings sampling from a conditional masked LM (Goyal thesis ch. 6,
# Tables 6.2-6.6, Figures 6.2-6.4), CPU scale, on Multi30k De-En.
#
# 1. a small cmlm_transformer (2+2 layers, 192 units, joint 4k BPE) trained with
#    fairseq's translation_lev recipe (--noise random_mask, nat_loss) for UPDATES updates,
#    validated every 1000 (the run resumes when rerun; checkpoint_best by validation loss);
# 2. the "De-En (20)" evaluation set: the first SENTENCES test2016 pairs whose
#    source has at most 20 words (50 by default: a local- or raw-energy run of the
#    grid costs up to an hour on one core at 50 sentences x 5 chains x 33 epochs, every
#    changed proposal needing one masked forward per position); outputs in WORK/nSENTENCES;
# 3. baselines: greedy warm start (one pass, no refinement) and Mask-Predict
#    (fairseq's iterative refinement, 10 iterations);
# 4. samplers through fairseq-generate --task translation_mh, CHAINS chains per
#    sentence, BURN_IN + EPOCHS epochs (the thesis: at least 5 chains, 7 + >= 26 epochs),
#    statistics with --mh-history; the grid of Tables 6.2 (proposal temperature), 6.3
#    (nucleus, with the exact nucleus mixture and, for local, the thesis's pure nucleus),
#    6.4 (block), 6.5 (annealing 0.02 / 0.04 / 0.06 per epoch, and to the floor at 60% of
#    the epochs printing each chain's lowest-energy state) and 6.6 (annealing with
#    proposal temperature 0.8 and 2 accept-all epochs);
# 5. scripts/plot/plot_mh.py: the table (averages after burn-in) and PNG curves of every finished run
#    in WORK/nSENTENCES (table order), whatever ONLY ran this time.
#
# usage: examples/mh_sampler/multi30k.sh WORK_DIR
# env: FAIRSEQ_EXT_DATA (required), UPDATES (12000, about 3.5 h on one core; by then the
#      validation loss falls about 0.03 per 1000 updates), SENTENCES (50), CHAINS (5), BURN_IN (7),
#      EPOCHS (26), JOBS (2), VOCAB (4000), ONLY (run names, or "claims": the 12 runs behind the
#      thesis's three claims), SEED (1: the samplers' seed; seed s > 1 writes to WORK/nSENTENCES_sS),
#      CMLM (use this checkpoint instead of training one), CMLM_ONLY (1: train the CMLM, then stop)
# On a machine with a CUDA device fairseq-train and fairseq-generate use it (same options). To train
# the CMLM alone there: CMLM_ONLY=1 bash examples/mh_sampler/multi30k.sh WORK_DIR; then run the
# sampling stages with the same command on WORK_DIR or a copy of it (WORK_DIR/data and WORK_DIR/cmlm,
# or CMLM=the copied checkpoint_best.pt).
# A run whose score file exists in WORK/nSENTENCES* is skipped, so every row of one directory must
# come from one CMLM: a CMLM trained again, even with the same command and seed, is another model
# (examples/mh_sampler/README.md); give a retrained CMLM a new WORK_DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
. examples/lib.sh
WORK=${1:?usage: $0 WORK_DIR}
: "${FAIRSEQ_EXT_DATA:?set FAIRSEQ_EXT_DATA to the shared corpora directory}"
defaults UPDATES=12000 SENTENCES=50 CHAINS=5 BURN_IN=7 EPOCHS=26 JOBS=2 SEED=1 VOCAB=4000 PYTHON=python
export OMP_NUM_THREADS=1
# the grid, checked before any work starts
declare -A RUNS=()
ORDER=""
add() { RUNS[$1]=$2; ORDER="$ORDER $1"; }  # name, sampler options
for t in 2.0 1.5 1.0 0.8 0.5; do  # Table 6.2: proposal temperature
  add "deg_t$t" "--mh-kernel gibbs --mh-proposal-temperature $t"
  add "local_t$t" "--mh-energy local --mh-proposal-temperature $t"
done
add raw_t1.0 "--mh-energy raw"
for p in 0.99 0.95 0.9 0.8; do  # Table 6.3: nucleus (MH with the exact mixture, the default)
  add "deg_p$p" "--mh-kernel gibbs --mh-top-p $p"
  add "local_p$p" "--mh-energy local --mh-top-p $p"
done
add local_p0.9_pure "--mh-energy local --mh-top-p 0.9 --mh-nucleus-mix 0"
for e in deg local raw; do  # Table 6.4: block proposals, 4 annealed to 1
  k=$([ $e = deg ] && echo "--mh-kernel gibbs" || echo "--mh-energy $e")
  add "${e}_block" "$k --mh-block-size 4 --mh-anneal-block"
done
for e in raw local; do  # Tables 6.5 / 6.6: annealing the target temperature
  for a in 0.02 0.04 0.06; do
    add "${e}_anneal$a" "--mh-energy $e --mh-proposal-temperature 0.8 --mh-target-anneal $a --mh-accept-all-epochs 2 --mh-output best"
  done
  add "${e}_floor" "--mh-energy $e --mh-proposal-temperature 0.8 --mh-anneal-floor-at 0.6 --mh-accept-all-epochs 2 --mh-output best"
done
# the runs behind the thesis's three claims first (a local- or raw-energy run takes up to
# an hour on one core), then the rest of the grid in table order
CLAIMS="deg_t2.0 local_t2.0 deg_t1.0 local_t1.0 raw_t1.0 local_floor raw_floor deg_block local_block raw_block"
CLAIMS+=" local_anneal0.04 raw_anneal0.04"
FIRST="$CLAIMS deg_p0.9 local_p0.9 local_p0.9_pure"
for name in $ORDER; do [[ " $FIRST " == *" $name "* ]] || FIRST+=" $name"; done
ONLY=${ONLY:-$FIRST}
[ "$ONLY" != claims ] || ONLY=$CLAIMS
for name in $ONLY; do
  [ -n "${RUNS[$name]+x}" ] || { echo "multi30k.sh: ONLY names an unknown run: $name" >&2; exit 2; }
done
mkdir -p "$WORK"

[ -d "$WORK/data/bin" ] || bash scripts/prepare/prepare_multi30k.sh "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data" "$VOCAB" \
  > "$WORK/prepare.log" 2>&1

CMLM=${CMLM:-$WORK/cmlm/checkpoint_best.pt}
if [ "$CMLM" = "$WORK/cmlm/checkpoint_best.pt" ] && ! finished "$WORK/cmlm.log"; then
  echo "==> training the CMLM ($UPDATES updates; resumes from $WORK/cmlm/checkpoint_last.pt)"
  fairseq-train "$WORK/data/bin" --user-dir "$(fairseq-ext-dir)" --task translation_mh --noise random_mask \
    --source-lang de --target-lang en --arch cmlm_transformer --encoder-layers 2 --decoder-layers 2 \
    --encoder-embed-dim 192 --decoder-embed-dim 192 --encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 \
    --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings --encoder-learned-pos \
    --decoder-learned-pos --apply-bert-init --dropout 0.1 --criterion nat_loss --label-smoothing 0.1 \
    --length-loss-factor 0.1 --optimizer adam --adam-betas '(0.9,0.98)' --lr 0.001 --lr-scheduler inverse_sqrt \
    --warmup-updates 400 --warmup-init-lr 1e-7 --clip-norm 1.0 --max-tokens 4096 --max-update "$UPDATES" \
    --seed 1 --save-dir "$WORK/cmlm" --no-epoch-checkpoints --num-workers 0 --log-format simple \
    --validate-interval-updates 1000 --save-interval-updates 500 --keep-interval-updates 1 \
    --log-interval 50 >> "$WORK/cmlm.log" 2>&1 || { tail "$WORK/cmlm.log"; exit 1; }
fi
[ "${CMLM_ONLY:-0}" = 0 ] || exit 0  # the CMLM alone (e.g. trained on a GPU)

# De-En (20): short-source test pairs, binarized with the model's dictionaries
if [ ! -s "$WORK/data/bin20_n$SENTENCES/test.de-en.de.bin" ]; then
  mkdir -p "$WORK/data/raw20_n$SENTENCES"
  "$PYTHON" - "$WORK/data" "$FAIRSEQ_EXT_DATA/multi30k" "$WORK/data/raw20_n$SENTENCES" "$SENTENCES" <<'PY'
import sys
spm_dir, raw, out, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
pieces = {l: open(f"{spm_dir}/test.{l}").read().splitlines() for l in ("de", "en")}
words = open(f"{raw}/test.de").read().splitlines()
keep = [i for i, w in enumerate(words) if len(w.split()) <= 20][:n]
for l in ("de", "en"):
    with open(f"{out}/test.{l}", "w") as f:
        f.writelines(pieces[l][i] + "\n" for i in keep)
PY
  fairseq-preprocess --source-lang de --target-lang en --testpref "$WORK/data/raw20_n$SENTENCES/test" \
    --srcdict "$WORK/data/bin/dict.de.txt" --tgtdict "$WORK/data/bin/dict.en.txt" \
    --destdir "$WORK/data/bin20_n$SENTENCES" --workers 1 > "$WORK/data/bin20_n$SENTENCES.log" 2>&1
fi

OUT=$WORK/n$SENTENCES  # the samplers' outputs, per evaluation set size (and sampler seed after the first)
[ "$SEED" = 1 ] || OUT=${OUT}_s$SEED
mkdir -p "$OUT"
GEN=(--user-dir "$(fairseq-ext-dir)" --gen-subset test --batch-size 50 --required-batch-size-multiple 1
  --post-process sentencepiece --seed "$SEED")
MH=(--task translation_mh --mh-chains "$CHAINS" --nbest 1 --mh-burn-in "$BURN_IN" --mh-epochs "$EPOCHS" --mh-history)

baseline() {  # name iterations
  [ -s "$OUT/$1.json" ] && return
  fairseq-generate "$WORK/data/bin20_n$SENTENCES" "${GEN[@]}" --task translation_lev --path "$CMLM" \
    --iter-decode-max-iter "$2" --iter-decode-eos-penalty 0 > "$OUT/$1.gen" 2> "$OUT/$1.gen.log"
  "$PYTHON" scripts/score/score.py "$OUT/$1.gen" --json "$OUT/$1.json" > /dev/null
}
baseline warm_start 0
baseline mask_predict 10

run() {  # name
  local name=$1
  if [ ! -s "$OUT/$name.json" ]; then
    # shellcheck disable=SC2086
    fairseq-generate "$WORK/data/bin20_n$SENTENCES" "${GEN[@]}" "${MH[@]}" ${RUNS[$name]} --path "$CMLM" \
      --mh-stats-file "$OUT/$name.jsonl" > "$OUT/$name.gen" 2> "$OUT/$name.gen.log"
    "$PYTHON" scripts/score/score.py "$OUT/$name.gen" --json "$OUT/$name.json" > /dev/null
  fi
  # the row's curves and averages, small enough to keep with its scores (the stats file is not)
  [ -s "$OUT/$name.curves.json" ] || [ ! -s "$OUT/$name.jsonl" ] || "$PYTHON" scripts/plot/plot_mh.py \
    "$OUT/$name.jsonl" --labels "$name" --json "$OUT/$name.curves.json" > /dev/null
  echo "done: $name"
}
for name in $ONLY; do
  throttle "$JOBS"
  run "$name" &
done
wait

# the summary covers every finished run of OUT in table order, not only this call's ONLY (a call
# that runs a few rows would otherwise overwrite the table and figures of the others)
stats() {  # name: its stats file, or where there is none (results/ holds no stats files), its curves file
  if [ -s "$OUT/$1.jsonl" ]; then echo "$OUT/$1.jsonl"; else echo "$OUT/$1.curves.json"; fi
}
FINISHED=""
for name in $ORDER; do [ -s "$OUT/$name.json" ] && [ -s "$(stats "$name")" ] && FINISHED+=" $name"; done
echo "BLEU of the printed hypotheses (baselines; samplers: chain 0's final state, or its lowest-energy state with --mh-output best)"
for b in warm_start mask_predict $FINISHED; do
  echo "$b: $("$PYTHON" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["bleu"], 2))' "$OUT/$b.json")"
done
echo "Averages over the epochs after burn-in, all chains"
files=(); for name in $FINISHED; do files+=("$(stats "$name")"); done
"$PYTHON" scripts/plot/plot_mh.py "${files[@]}" --labels "$(echo $FINISHED | tr ' ' ,)" --json "$OUT/mh_summary.json" \
  $("$PYTHON" -c 'import matplotlib' 2>/dev/null && echo --png "$OUT/mh")
