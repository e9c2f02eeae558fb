#!/usr/bin/env bash
# One call on a GPU machine does everything: env info, build, self-check, tests,
# compute-sanitizer, benchmark. Run from the repository root:
#
#   bash scripts/gpu_check.sh
#   SKIP_BUILD=1 BENCH_ARGS=--quick PYTEST_ARGS="-k fwd" bash scripts/gpu_check.sh
#   ARCHS=90a-real HEAD_DIMS=128 SKIP_BENCH=1 bash scripts/gpu_check.sh
#
# Switches: SKIP_BUILD SKIP_TESTS SKIP_SM80_TESTS SKIP_SANITIZER SKIP_BENCH SKIP_DECODE (=1),
# TEST_TIMEOUT (seconds per test step, default 480: a hang fails the step, the rest runs),
# BENCH_ARGS, DECODE_ARGS, TESTS (pytest paths, default tests), PYTEST_ARGS, SM80_TESTS
# (forward and backward test files run a
# second time with FLASHATTN2_FORCE_SM80=1, so that on a Hopper GPU both kernel families are
# tested), ARCHS (default 90a-real: the mma.sync kernels and the Hopper ones), HEAD_DIMS
# (default: all), SM90_BWD_EXPERIMENTAL (the Hopper backward's extensions, a subset of
# "d64;window;varlen;mods;dq_bulk;d256"; default CMake's: all), EXPERIMENTAL (other unvalidated features,
# FLASHATTN2_EXPERIMENTAL: "bias"; default none), SANITIZER_TOOLS (default "memcheck racecheck synccheck"; initcheck also works),
# SANITIZER_ARGS (extra flags), PYTHON (default python3).
#
# Output, at most 8 files and 2 levels under ${OUT:-gpu_logs} (the device tool returns
# at most 8 files, 2 folders deep):
#   logs.txt                      every step's full output, appended under a header
#   junit.xml, junit_sm80.xml     pytest results (default, forward files on FORCE_SM80)
#   summary.txt                   the step table printed last
#   bench/results.{json,csv,png}  benchmarks/bench.py output
#   decode/decode.{json,csv}      benchmarks/bench_decode.py output
# stdout carries only step start/end lines, the tail of each failed step, the pytest and
# benchmark summaries, and the step table, so a truncated console tail stays useful.
# Every step runs even if an earlier one failed; the exit status is 1 if any failed.
set -uo pipefail

OUT=${OUT:-gpu_logs}
# NVLink multicast off for the 2-GPU tests (NCCL NVLS and torch symmetric memory).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# Unbuffered Python output, and pytest's faulthandler dumping every thread's traceback when one
# test runs past 300 s: a hung test shows in logs.txt where it stopped (the eleventh session's
# run 5 stopped somewhere after ~92 % of the suite with only an 8 KiB buffer flush to go by).
export PYTHONUNBUFFERED=1
PYTEST_HANG=(-o faulthandler_timeout=300)
# A hung kernel must not eat the device call: each test step is killed after this long.
TEST_TIMEOUT=${TEST_TIMEOUT:-480}
PYTHON=${PYTHON:-python3}
LOG="$OUT/logs.txt"
mkdir -p "$OUT"
: > "$LOG"
STEPS=()
FAILED=0

# run_step NAME SHOW_LINES CMD...: append CMD's output to logs.txt under a header; print
# its last SHOW_LINES lines on success, the last 40 on failure; record status and time.
run_step() {
    local name=$1 show=$2
    shift 2
    local start=$SECONDS offset rc
    offset=$(($(wc -c < "$LOG") + 1))
    printf '\n===== %s: %s =====\n$ %s\n' "$name" "$(date -Is)" "$*" >> "$LOG"
    echo ">>> $name"
    "$@" >> "$LOG" 2>&1
    rc=$?
    local secs=$((SECONDS - start))
    printf '===== %s: exit %d after %ds =====\n' "$name" "$rc" "$secs" >> "$LOG"
    if [ "$rc" -ne 0 ]; then
        FAILED=1
        STEPS+=("$(printf '%-12s FAIL (exit %d) %6ds' "$name" "$rc" "$secs")")
        echo "--- $name FAILED (exit $rc), last lines:"
        tail -c +"$offset" "$LOG" | tail -n 40
    else
        STEPS+=("$(printf '%-12s ok             %6ds' "$name" "$secs")")
        [ "$show" -gt 0 ] && tail -c +"$offset" "$LOG" | tail -n $((show + 1)) | head -n "$show"
    fi
    return 0
}

skip_step() {
    STEPS+=("$(printf '%-12s skip (%s)' "$1" "$2")")
    printf '\n===== %s: skipped (%s) =====\n' "$1" "$2" >> "$LOG"
}

env_info() {
    nvidia-smi
    "$PYTHON" - <<'EOF'
import platform, torch
print("python", platform.python_version(), "| torch", torch.__version__,
      "| cuda", torch.version.cuda, "| cudnn", torch.backends.cudnn.version())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
          f"{p.total_memory / 2**30:.1f} GiB")
for mod in ("triton", "matplotlib", "tqdm", "pytest"):
    try:
        print(mod, __import__(mod).__version__)
    except Exception as e:
        print(mod, "unavailable:", e)
EOF
    command -v nvcc && nvcc --version | tail -n 2
    cmake --version | head -n 1
}

find_sanitizer() {
    command -v compute-sanitizer && return
    local c
    for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer \
             $(find /opt/nvidia -name compute-sanitizer -type f 2>/dev/null); do
        [ -x "$c" ] && { echo "$c"; return; }
    done
}

# 1. environment
run_step env 0 env_info

# 2. build (no network on the GPU machine: no build isolation, no dependency resolution)
if [ "${SKIP_BUILD:-0}" = 1 ]; then
    skip_step build SKIP_BUILD
else
    run_step build 0 "$PYTHON" -m pip install --no-build-isolation --no-deps -v . \
        -C "cmake.define.FLASHATTN2_CUDA_ARCHS=${ARCHS:-90a-real}" \
        ${HEAD_DIMS:+-C "cmake.define.FLASHATTN2_HEAD_DIMS=$HEAD_DIMS"} \
        ${SM90_BWD_EXPERIMENTAL:+-C "cmake.define.FLASHATTN2_SM90_BWD_EXPERIMENTAL=$SM90_BWD_EXPERIMENTAL"} \
        ${EXPERIMENTAL:+-C "cmake.define.FLASHATTN2_EXPERIMENTAL=$EXPERIMENTAL"}
fi

# 3. what was built, GPU check, quick correctness and speed check
run_step selfcheck 20 "$PYTHON" -m flashattn2

# 4. tests (the full run, not -x)
if [ "${SKIP_TESTS:-0}" = 1 ]; then
    skip_step tests SKIP_TESTS
else
    # shellcheck disable=SC2086  # TESTS and PYTEST_ARGS are lists of words
    run_step tests 3 timeout -k 10 "$TEST_TIMEOUT" "$PYTHON" -m pytest ${TESTS:-tests} -q -ra --durations=15 "${PYTEST_HANG[@]}" \
        --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-}
fi

# 4b. the forward and backward tests again on the mma.sync kernels (on Hopper the default is
# cpp/sm90 where it applies)
SM80_TESTS=${SM80_TESTS:-tests/test_fwd.py tests/test_bwd.py tests/test_variants.py tests/test_varlen.py tests/test_compile.py tests/test_kvcache.py}
if [ "${SKIP_TESTS:-0}" = 1 ] || [ "${SKIP_SM80_TESTS:-0}" = 1 ]; then
    skip_step tests_sm80 "SKIP_TESTS or SKIP_SM80_TESTS"
else
    # shellcheck disable=SC2086
    run_step tests_sm80 3 timeout -k 10 "$TEST_TIMEOUT" env FLASHATTN2_FORCE_SM80=1 "$PYTHON" -m pytest $SM80_TESTS -q -ra "${PYTEST_HANG[@]}" \
        --junitxml="$OUT/junit_sm80.xml" ${PYTEST_ARGS:-}
fi

# 5. compute-sanitizer; no caching allocator, so reads past a tensor's end are visible
SANITIZER=$(find_sanitizer)
for tool in ${SANITIZER_TOOLS:-memcheck racecheck synccheck}; do
    if [ "${SKIP_SANITIZER:-0}" = 1 ]; then
        skip_step "$tool" SKIP_SANITIZER
    elif [ -z "$SANITIZER" ]; then
        skip_step "$tool" "compute-sanitizer not found"
    else
        # shellcheck disable=SC2086
        run_step "$tool" 2 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 FLASHATTN2_SANITIZE_TOOL="$tool" \
            "$SANITIZER" --tool "$tool" \
            --error-exitcode 1 ${SANITIZER_ARGS:-} "$PYTHON" scripts/sanitize_subset.py
    fi
done

# 6. benchmark, straight into $OUT/bench
if [ "${SKIP_BENCH:-0}" = 1 ]; then
    skip_step bench SKIP_BENCH
else
    # shellcheck disable=SC2086
    run_step bench 8 "$PYTHON" benchmarks/bench.py --out "$OUT/bench" ${BENCH_ARGS:-}
fi

# 7. decode / varlen benchmark, straight into $OUT/decode
if [ "${SKIP_DECODE:-0}" = 1 ]; then
    skip_step decode SKIP_DECODE
else
    # shellcheck disable=SC2086
    run_step decode 30 "$PYTHON" benchmarks/bench_decode.py --out "$OUT/decode" ${DECODE_ARGS:-}
fi

{
    echo "step         status          seconds"
    printf '%s\n' "${STEPS[@]}"
    [ "$FAILED" = 0 ] && echo "all steps ok" || echo "SOME STEPS FAILED (details in $LOG)"
} > "$OUT/summary.txt"
echo
cat "$OUT/summary.txt"
exit "$FAILED"
