#!/usr/bin/env bash
# Would compiling the per-message hot path pay? (issue 18; BENCHMARKS.md, "Compiling the hot
# path: measured"). Copies the tree to a scratch directory, compiles the hot modules there
# unchanged with Cython (pure Python mode: `cythonize -i -3` on the .py files), and counts
# user-space instructions (valgrind callgrind) of the pure tree and the compiled copy:
#   - 64 B `await node.send`, both ends in one process (msg_cost.py --callgrind: two run
#     lengths, the difference divided by the extra messages)
#   - one request round trip, both nodes in one process, one caller (cache_op_cost.py
#     --callgrind --ops request: only the measured loop is counted)
# then runs the unit tests against the compiled copy (SKIP_TESTS=1 skips them).
# The copy lives outside the checkout on purpose: an extension module next to a .py takes
# precedence on import, and a stale one would shadow later edits.
#
# Needs: Cython (`pip install cython`), a C compiler, valgrind. Slow: about 3 CPU-minutes to
# compile, 2-3 CPU-minutes per callgrind run.
#   bash benchmarks/compiled_cost.sh [SCRATCH_DIR]
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-$(mktemp -d /tmp/aionet-compiled.XXXXXX)}
modules=(
    aionet/codecs/framing.py aionet/codecs/batch.py aionet/codecs/envelope.py
    aionet/core/link_state.py aionet/core/link.py aionet/core/dispatch.py aionet/core/router.py
    aionet/transports/tcp.py
)

command -v cythonize >/dev/null || { echo "cythonize not found: pip install cython" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "valgrind not found: apt-get install valgrind" >&2; exit 2; }

mkdir -p "$scratch"
(cd "$repo" && tar --exclude=__pycache__ --exclude=.git --exclude=build -cf - \
    aionet benchmarks tests deploy docs examples pyproject.toml README.md) | tar -C "$scratch" -xf -
echo "compiling ${#modules[@]} modules in $scratch"
(cd "$scratch" && cythonize -i -3 "${modules[@]}" >"$scratch/cythonize.log" 2>&1) \
    || { tail -30 "$scratch/cythonize.log" >&2; exit 1; }

for tree in "$repo" "$scratch"; do
    label=$([ "$tree" = "$repo" ] && echo pure || echo compiled)
    echo "== $label ($tree)"
    (cd "$tree" && PYTHONPATH=$tree python3 -c \
        'import aionet.core.link as m; print("aionet.core.link from", m.__file__)')
    (cd "$tree" && PYTHONPATH=$tree python3 benchmarks/msg_cost.py --callgrind --api send)
    (cd "$tree" && PYTHONPATH=$tree python3 benchmarks/cache_op_cost.py --callgrind --ops request -n 3000)
done

if [ "${SKIP_TESTS:-0}" != 1 ]; then
    echo "== unit tests against the compiled copy"
    (cd "$scratch" && PYTHONPATH=$scratch python3 -m pytest tests/unit -q -p no:cacheprovider) || true
fi
