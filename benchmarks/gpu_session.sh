#!/usr/bin/env bash
# The GPU checks, as run on a lent GPU machine (one short script; every step bounded).
#
#   OUT=/some/dir [STEPS="ceilings tests ucx p2p allreduce frames ucxgpu"] bash benchmarks/gpu_session.sh [wheel-dir]
#
# The machine is assumed to have CuPy and PyTorch with CUDA; aionet's other dependencies (lz4 and
# pyzmq are not in its image, structlog was missing on one machine of 2026-11-27, ucxx for the
# ucx:// rows) may come as wheels in [wheel-dir], installed into /tmp/site.
# Writes gpu.log and JSON results under $OUT. Steps: the copy ceilings, the GPU tests (staging
# over tcp://, device frames over ucx://, collectives and the bench CLI on CuPy buffers), then
# `aionet bench` p2p and allreduce on GPU and host buffers in the same run. Not in the default
# steps: `frames`, large CuPy frames through bare ucxx (tells a ucxx fault from an aionet one);
# `ucxgpu`, `aionet bench p2p --device gpu` up to 256 MiB over ucx:// and tcp://.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu.log") 2>&1
WHEELS=${1:-}
if [ -n "$WHEELS" ] && ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl
  export PYTHONPATH=$PWD:/tmp/site
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
STEPS=${STEPS:-"ceilings tests ucx p2p allreduce"}
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() { echo; echo "=== $* ($(date +%T))"; }
step machine
nvidia-smi -L; nproc; python3 -c "import cupy, numpy, sys; print(sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__, 'cuda', cupy.cuda.runtime.runtimeGetVersion())"
python3 -c "import ucxx; print('ucxx', ucxx.__version__, ucxx.get_active_transports() if hasattr(ucxx, 'get_active_transports') else '')" || echo "ucxx: not importable"
want ceilings && step ceilings && timeout 60 python3 benchmarks/gpu_ceiling.py --json "$OUT/ceiling.json"
want tests && step "GPU tests" && timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rsf -s --tb=short --timeout 120 \
  tests/unit/devices tests/integration/test_devices.py tests/integration/test_node_device_arrays.py \
  tests/integration/test_collectives_device.py "tests/system/test_cli_bench.py::test_bench_device_gpu_runs_on_cupy_buffers_or_says_why_not" \
  2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^\s*$" | tail -60
want ucx && step "UCX tests (fresh process)" && AIONET_UCX_ISOLATED=1 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  -o addopts="" -rsf --tb=short --timeout 60 tests/system/test_ucx.py 2>&1 | tee "$OUT/ucx_tests.log" | tail -40
want p2p && for t in tcp ucx; do
  for d in gpu cpu; do
    step "bench p2p $t $d"
    timeout 90 python3 -m aionet bench p2p --transport $t --device $d --min 64K --max 256M --factor 16 --iters 20 --json > "$OUT/p2p_${t}_${d}.json"
    cat "$OUT/p2p_${t}_${d}.json"
  done
done
want allreduce && for n in 2 4; do
  for d in gpu cpu; do
    step "bench allreduce n=$n $d"
    timeout 90 python3 -m aionet bench allreduce --nodes $n --device $d --min 1M --max 64M --factor 4 --iters 5 --warmup 2
  done
done
want frames && step "bare ucxx, CuPy frames" && timeout -k 5 200 python3 benchmarks/ucx_frames.py --device gpu \
  --sizes ${FRAME_SIZES:-64MiB,256MiB} --count 3 --timeout 40
# output to a file, not a pipe: a killed bench's node processes would hold a pipe open
want ucxgpu && for t in ucx tcp; do
  step "bench p2p $t gpu, 1M-256M"
  UCX_LOG_LEVEL=warn timeout -k 5 ${P2P_TIMEOUT:-60} python3 -m aionet bench p2p --transport $t --device gpu \
    --min 1M --max 256M --factor 16 --iters 5 --warmup 1 --json > "$OUT/p2p_${t}_gpu_big.json" 2> "$OUT/p2p_${t}_gpu_big.err"
  echo "rc $?"; cat "$OUT/p2p_${t}_gpu_big.json"; tail -5 "$OUT/p2p_${t}_gpu_big.err"
done
step done
