#!/usr/bin/env bash
# The whole GPU check in one command: the CUDA tests (tests/test_cuda.py, and FlexAttention's forward
# and backward against the materialised path in tests/test_flex.py), then the GPU benchmark
# (benchmarks/gpu.py), each one's output printed and written to a folder.
#
#   bash benchmarks/gpu_check.sh [DIR] [gpu.py options, e.g. --quick]
#
# DIR defaults to $OUT when set, else ./gpu-check. It receives cuda_tests.txt, gpu_benchmark.txt,
# gpu_benchmark.json and summary.txt. Exits 1 without a CUDA device, else non-zero when the tests
# or the benchmark failed. $PYTHON picks the interpreter (default python3). seqzoo is installed
# (editable, without dependencies or network) first when the interpreter cannot import it.
set -u

out="${1:-${OUT:-gpu-check}}"
[ $# -gt 0 ] && shift
mkdir -p "$out" && out="$(cd "$out" && pwd)"  # absolute: the commands below run from the repo root
cd "$(dirname "$0")/.." || exit 1
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1

if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: needs a CUDA device, and $py's torch sees none" | tee "$out/summary.txt" >&2
    exit 1
fi
if ! "$py" -c "import seqzoo" 2>/dev/null; then
    "$py" -m pip install -q --no-deps --no-build-isolation -e . || exit 1
fi

# -m cuda replaces pyproject's addopts "-m 'not slow'" (the last -m wins): every CUDA test runs.
"$py" -m pytest -m cuda tests/test_cuda.py tests/test_flex.py -q -rs -p no:cacheprovider --durations=10 2>&1 \
    | tee "$out/cuda_tests.txt"
tests=${PIPESTATUS[0]}

"$py" benchmarks/gpu.py --json "$out/gpu_benchmark.json" "$@" 2>&1 | tee "$out/gpu_benchmark.txt"
bench=${PIPESTATUS[0]}

echo "gpu_check: cuda tests exit $tests, benchmark exit $bench; output in $out" | tee "$out/summary.txt"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
