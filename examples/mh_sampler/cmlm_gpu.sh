#!/usr/bin/env bash
# Issue 22's CMLM trained on the lent GPU machine (the workplace's device tool), so that
# one model serves every session: examples/mh_sampler/multi30k.sh's CMLM stage (same options,
# UPDATES updates, checkpoint_best by validation loss) on the Multi30k data binarized
# here, then its model-only checkpoint (no optimizer state) under $OUT, with the
# dictionaries it was trained with and the training log's validation lines.
#
# Here, first (the device machine has neither ../shared nor the binarized data):
#   mkdir -p .carry/mh/data && cp -r WORK/data/bin .carry/mh/data/ && echo /.carry/ >> .git/info/exclude
#   (WORK: a work directory of examples/mh_sampler/multi30k.sh or dss_multi30k.sh, VOCAB 4000)
# Then the device call: command "OUT=$OUT bash examples/mh_sampler/cmlm_gpu.sh", carry [".whl", ".carry"].
# Back here: CMLM=<the returned cmlm.pt> bash examples/mh_sampler/multi30k.sh WORK, after checking that
# the returned dict.*.txt equal WORK/data/bin's.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT to a directory for the results}
. bench/gpu_env.sh
WORK=${WORK:-.carry/mh}
[ -s "$WORK/data/bin/train.de-en.de.bin" ] || { echo "mh_cmlm_gpu.sh: no binarized data in $WORK/data/bin" >&2; exit 2; }
t0=$SECONDS
FAIRSEQ_EXT_DATA=${FAIRSEQ_EXT_DATA:-$WORK} CMLM_ONLY=1 PYTHON=python3 bash examples/mh_sampler/multi30k.sh "$WORK"
echo "==> CMLM trained in $((SECONDS - t0)) s"
python3 - "$WORK/cmlm/checkpoint_best.pt" "$OUT/cmlm.pt" <<'PY'
import sys, torch
state = torch.load(sys.argv[1], map_location="cpu", weights_only=False)
state.pop("last_optimizer_state", None)  # what --no-save-optimizer-state leaves out
torch.save(state, sys.argv[2])
n = sum(v.numel() for v in state["model"].values())
print(f"model-only checkpoint: {n / 1e6:.2f}M parameters, best validation loss {state['extra_state']['best']}")
PY
cp "$WORK"/data/bin/dict.*.txt "$OUT/"
grep -E "\| valid \||done training" "$WORK/cmlm.log" > "$OUT/cmlm.valid.log" || true
tail -n 3 "$OUT/cmlm.valid.log"
ls -la "$OUT"
