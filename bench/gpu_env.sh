# Sourced by the scripts run on the lent GPU machine (bench/gpu_session.sh,
# examples/mh_sampler/cmlm_gpu.sh): fairseq from the wheels carried in .whl/, this checkout on
# PYTHONPATH, the machine's description in $OUT/env.txt.
#
# The machine has torch but not fairseq: wheels for its Python (3.12) travel in .whl/ (fairseq-fixed,
# hydra-core, omegaconf, antlr4-python3-runtime, bitarray, cffi, editdistance, at this checkout's
# .venv versions), fetched before the session, on this machine, by bench/fetch_gpu_wheels.sh.
OUT=${OUT:?set OUT to a directory for the logs}
export PYTHONUNBUFFERED=1 FAIRSEQ_EXT_FORKSERVER=0
if ! python3 -c "import fairseq" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
{
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv || true
    python3 -c "import sys, torch, numpy, fairseq; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'fairseq', fairseq.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" || true
} 2>&1 | tee "$OUT/env.txt"

