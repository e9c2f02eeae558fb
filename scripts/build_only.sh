#!/usr/bin/env bash
# gpu_check.sh's build step alone (HEAD_DIMS as there, e.g. "128" for a fast build), its logs
# in $1 (default $JOB_OUT/build); exits 1 if the module does not import, so that a job's
# benchmarks never run on SDPA alone.
#   (in a job) HEAD_DIMS="128" bash scripts/build_only.sh "$O/build" || exit 1
set -u
out=${1:-${JOB_OUT:-gpu_logs}/build}
OUT=$out SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh |
    tail -n 3
(cd /tmp && python3 -c "import flashattn2._C") || { echo "no flashattn2 module: stop"; exit 1; }
