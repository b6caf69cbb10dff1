#!/usr/bin/env bash
# The GPU checks as one command, on a machine with one NVIDIA GPU: the device as
# nvidia-smi reports it, the CUDA tests, then benchmarks/gpu_job.py (the same job packed
# and unpacked, each against its forecast), all within BUDGET_S seconds (default 540).
# Results go to benchmarks/results/ (gpu_checks_nvidia_smi.txt, gpu_checks_tests.log,
# gpu_job.json, gpu_job.log), and are copied to $OUT as well when it is set.
#
#   python benchmarks/gpu_wheels.py     # where pip reaches a package index: .whl/
#   bash benchmarks/gpu_checks.sh       # on the GPU machine, .whl/ beside it if it has no index
#
# PYTHON (default python3) is the interpreter with PyTorch, RESULTS (default
# benchmarks/results) where the results go, TESTS_S (default 150) the most seconds the
# tests may take. The job gets what is left of BUDGET_S; it writes its results file after
# each step, so a job cut short keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
TESTS_S=${TESTS_S:-150}
RESULTS=${RESULTS:-benchmarks/results}
SMI=$RESULTS/gpu_checks_nvidia_smi.txt
TESTS=$RESULTS/gpu_checks_tests.log
JOB=$RESULTS/gpu_job.json
JOB_LOG=$RESULTS/gpu_job.log
mkdir -p "$RESULTS"

finish() {
    # gpu_job.py stops its MPS daemon itself, unless it was killed: then it is stopped here.
    for pipe in "${TMPDIR:-/tmp}"/elastune-mps-*/pipe; do
        [ -e "$pipe/control" ] && echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe nvidia-cuda-mps-control
    done
    if [ -n "${OUT:-}" ]; then
        for file in "$SMI" "$TESTS" "$JOB" "$JOB_LOG"; do
            [ -f "$file" ] && cp "$file" "$OUT"/
        done
    fi
    echo "gpu checks: ${SECONDS} s"
}
trap finish EXIT

# elastune's dependencies, where the machine has no package index (benchmarks/gpu_wheels.py),
# then elastune itself, whose subpackages are the repository's top-level folders.
if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/elastune-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/elastune-site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PYTHON" -c "import elastune.flows" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
fi

{
    date -u
    nvidia-smi
    "$PYTHON" -c "import torch, prefect, mlflow, optuna
print('torch', torch.__version__, 'prefect', prefect.__version__, 'mlflow', mlflow.__version__,
      'optuna', optuna.__version__, 'cuda', torch.cuda.is_available())"
} >"$SMI" 2>&1
cat "$SMI"

# test_devices.py's tests carry no cuda marker (they run without a GPU too): the files are
# named, those with cuda-marked tests among them.
cuda_files=$(grep -l "pytest.mark.cuda" tests/test_*.py)
command=("$PYTHON" -m pytest -q -p no:cacheprovider tests/test_devices.py $cuda_files)
{
    echo "# $(date -u), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
    echo "# ${command[*]}"
    timeout -k 10 "$TESTS_S" "${command[@]}"
    echo "# exit $?"
} >"$TESTS" 2>&1
tail -n 3 "$TESTS"

left=$((BUDGET_S - SECONDS - 15))
echo "gpu_job.py: ${left} s at most"
timeout -k 20 "$left" "$PYTHON" benchmarks/gpu_job.py --out "$JOB" >"$JOB_LOG" 2>&1
echo "# exit $?" >>"$JOB_LOG"
tail -n 6 "$JOB_LOG"
