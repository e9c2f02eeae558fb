#!/usr/bin/env bash
# The whole GPU session as one detached job (scripts/gpu_detach.sh start bash scripts/gpu_job.sh):
# build, self-check, the suite (less the CPU-only test_distributed.py, which CI runs), the
# forward and backward test files again under FLASHATTN2_FORCE_SM80 (the mma.sync kernels;
# gpu_check.sh's list, SM80_TESTS narrows it), compute-sanitizer, then the
# benchmarks in priority order (cp: the context-parallel one, on a 2-GPU kind), each into its
# own folder of $JOB_OUT (probe: a side build with PROBE_FLAGS against this one). Steps to skip: SKIP
# (space-separated names of the steps below). Meanwhile a second build (base: a base commit's
# kernels) serves A/B runs (fwdab, bwdab, decab).
# HEAD_DIMS limits the main build (default: all); TEST_FILES narrows the suite (pytest
# arguments, e.g. "tests/test_fwd.py tests/test_sm90.py"); PYTEST_XDIST: pytest-xdist options
# for the suite and FORCE_SM80 (e.g. "-n 4 --dist loadfile"; pytest-xdist installed first).
set -u
O=${JOB_OUT:-gpu_logs}
SKIP=" ${SKIP:-} "
want() { [[ "$SKIP" != *" $1 "* ]]; }
stamp() { echo "=== $(date -Is) $*"; }
mkdir -p "$O"
# .xdist (carried, git-ignored): the pytest-xdist and execnet wheels, installed offline for the
# suite's -n (suite_if_win.sh, PYTEST_XDIST), so that job scripts need not each install them.
if [ -d .xdist ] && ! python3 -c "import xdist" 2> /dev/null; then
    python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
        python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
fi
# SMI_MS: nvidia-smi logs the clocks, power, temperatures and clock-event reasons every SMI_MS
# ms for the whole job into $O/smi.csv (bench.py rows carry the time they finished, to match
# a slow row to the GPU's state).
if [ -n "${SMI_MS:-}" ]; then
    reasons=clocks_event_reasons.active
    nvidia-smi --query-gpu=$reasons --format=csv > /dev/null 2>&1 || reasons=clocks_throttle_reasons.active
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,temperature.memory,$reasons \
        --format=csv -lms "$SMI_MS" > "$O/smi.csv" 2>&1 &
    SMI_PID=$!
    trap 'kill $SMI_PID 2> /dev/null' EXIT
fi

# base: the same build of a base commit's cpp/ and python/ (`.base`, made here by
# `rm -rf .base && mkdir .base && git archive REV cpp python | tar -x -C .base`, carried to the
# device: `.base` is git-ignored), for A/B runs against it in one job (fwdab, bwdab); its head
# dims BASE_HEAD_DIMS (default HEAD_DIMS or 64;128;256). It starts before the main build, so
# that the two overlap.
if want base && [ -d .base/cpp ]; then
    stamp "base build (.base/cpp), in the background"
    rm -rf /tmp/base_src && mkdir -p /tmp/base_src
    tar --exclude=./build --exclude=./.git --exclude=./.base -cf - . | tar -x -C /tmp/base_src
    for d in cpp python; do
        [ -d ".base/$d" ] && rm -rf "/tmp/base_src/$d" && cp -r ".base/$d" "/tmp/base_src/$d"
    done
    ( cd /tmp/base_src && python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/base_whl . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
        -C "cmake.define.FLASHATTN2_HEAD_DIMS=${BASE_HEAD_DIMS:-${HEAD_DIMS:-64;128;256}}" -C build-dir=/tmp/build-base \
        ${SM90_BWD_EXPERIMENTAL:+-C "cmake.define.FLASHATTN2_SM90_BWD_EXPERIMENTAL=$SM90_BWD_EXPERIMENTAL"} \
      && rm -rf /tmp/base && python3 -m zipfile -e /tmp/base_whl/*.whl /tmp/base ) \
        > "$O/base_build.txt" 2>&1 &
    BASE_PID=$!
fi
if want check; then
    stamp build
    OUT=$O/build HEAD_DIMS=${HEAD_DIMS:-} SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 SKIP_DECODE=1 bash scripts/gpu_check.sh
    # Nothing after this measures anything without the module (SDPA-only benchmark rows).
    (cd /tmp && python3 -c "import flashattn2._C") || { stamp "no flashattn2 module: stop"; exit 1; }
fi
# side_build NAME CMAKE_DEFINES...: a wheel of this tree with the given -C options (90a only),
# unpacked into /tmp/NAME for PYTHONPATH, built in the background; its log $O/NAME_build.txt.
side_build() {
    local name=$1
    shift
    ( python3 -m pip wheel --no-build-isolation --no-deps -w "/tmp/${name}_whl" . \
        -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real "$@" -C "build-dir=/tmp/build-$name" \
      && rm -rf "/tmp/$name" && python3 -m zipfile -e "/tmp/${name}_whl"/*.whl "/tmp/$name" ) \
        > "$O/${name}_build.txt" 2>&1 &
}
# ab_bench NAME A_NAME B_NAME BENCH_ARGS...: bench.py with the side build NAME (A) and the
# default build (B) interleaved, A B A B, into $O/NAME_<A_NAME|B_NAME>[2].
ab_bench() {
    local name=$1 a=$2 b=$3 run pp
    shift 3
    for run in "$a" "$b" "${a}2" "${b}2"; do
        pp=""; [[ $run == "$a"* ]] && pp=/tmp/$name
        PYTHONPATH=$pp python3 "${AB_SCRIPT:-benchmarks/bench.py}" --no-summary --out "$O/${name}_$run" "$@" \
            2> /dev/null | tail -n 16
    done
}
# probe: its side build (step probe below) starts now, in the background (PROBE_HEAD_DIMS:
# its head dims, default HEAD_DIMS or 64;128;256).
if want probe && [ -n "${PROBE_FLAGS:-}" ]; then
    side_build probe -C "cmake.define.CMAKE_CUDA_FLAGS=$PROBE_FLAGS" \
        -C "cmake.define.FLASHATTN2_HEAD_DIMS=${PROBE_HEAD_DIMS:-${HEAD_DIMS:-64;128;256}}" \
        ${SM90_BWD_EXPERIMENTAL:+-C "cmake.define.FLASHATTN2_SM90_BWD_EXPERIMENTAL=$SM90_BWD_EXPERIMENTAL"}
    PROBE_PID=$!
fi
# probe2: a second side build (PROBE2_FLAGS, same head dims) into /tmp/probe2, for envab specs
# that put it on PYTHONPATH (e.g. ENVAB_1="plain= p1=PYTHONPATH:/tmp/probe p2=PYTHONPATH:/tmp/probe2").
if want probe && [ -n "${PROBE2_FLAGS:-}" ]; then
    side_build probe2 -C "cmake.define.CMAKE_CUDA_FLAGS=$PROBE2_FLAGS" \
        -C "cmake.define.FLASHATTN2_HEAD_DIMS=${PROBE_HEAD_DIMS:-${HEAD_DIMS:-64;128;256}}" \
        ${SM90_BWD_EXPERIMENTAL:+-C "cmake.define.FLASHATTN2_SM90_BWD_EXPERIMENTAL=$SM90_BWD_EXPERIMENTAL"}
    PROBE2_PID=$!
fi
# smoke: the test files of what is new (SMOKE_TESTS) first, in their own process with -x, so
# that a crash there (a CUDA error kills the process's context: every later test errors) is
# seen at once and does not hide the rest of the suite's results. SMOKE_STOP=1: a failure (or
# its timeout: a hang) ends the job there, before the suite spends its device time.
if want smoke && [ -n "${SMOKE_TESTS:-}" ]; then
    stamp "smoke: $SMOKE_TESTS"
    # shellcheck disable=SC2086
    timeout "${SMOKE_TIMEOUT:-600}" python3 -m pytest $SMOKE_TESTS -q -x -p no:cacheprovider 2>&1 | tail -n 15
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ] && [ -n "${SMOKE_STOP:-}" ]; then
        stamp "smoke failed (exit $rc): stop (SMOKE_STOP)"
        exit 1
    fi
fi
if want check && want suite; then  # (suite: the tests alone, after check's build)
    stamp tests
    OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=${TEST_TIMEOUT:-900} \
        PYTEST_ARGS="--ignore=tests/test_distributed.py ${PYTEST_XDIST:-}" TESTS="${TEST_FILES:-tests}" \
        SM80_TESTS=${SM80_TESTS:-} bash scripts/gpu_check.sh
fi
if want fwdab && [ -n "${BASE_PID:-}" ]; then
    stamp "forward A/B: base (.base/cpp) vs this tree, interleaved, SDPA in each run"
    wait "$BASE_PID"
    tail -n 2 "$O/base_build.txt"
    ab_bench base base new --modes fwd --headdims "${FWDAB_DIMS:-64,128,256}" --dtypes bf16 \
        --impls flashattn2,sdpa_cudnn ${FWDAB_ARGS:-}
fi
if want bwdab && [ -n "${BASE_PID:-}" ]; then
    stamp "backward A/B: base (.base/cpp) vs this tree, interleaved, SDPA-cuDNN in each run"
    wait "$BASE_PID"
    ab_bench base bbase bnew --modes bwd,fwd_bwd --headdims "${BWDAB_DIMS:-64,128}" --dtypes bf16 \
        --impls flashattn2,sdpa_cudnn ${BWDAB_ARGS:-}
fi
if want decab && [ -n "${BASE_PID:-}" ]; then
    stamp "decode A/B: base (.base/cpp) vs this tree, interleaved, SDPA-cuDNN and the floor in each"
    wait "$BASE_PID"
    for run in base new base2 new2; do
        pp=""; [[ $run == base* ]] && pp=/tmp/base
        # shellcheck disable=SC2086
        PYTHONPATH=$pp python3 benchmarks/bench_decode.py --impls flashattn2,sdpa_cudnn,read_floor \
            --parts decode ${DECAB_ARGS:-} --out "$O/dec_$run" 2> /dev/null | tail -n 4
    done
fi
if want chains; then
    # CHAINS_ARGS: bench.py's selection (default: bwd, d64 / d128, causal)
    stamp "deterministic backward: dQ chains 1 / 2 / 4 forced (FLASHATTN2_DQ_CHAINS), twice"
    for c in 1 2 4 1b 2b 4b; do
        # shellcheck disable=SC2086
        FLASHATTN2_DQ_CHAINS=${c%b} python3 benchmarks/bench.py --dtypes bf16 --impls flashattn2_det \
            --no-summary --out "$O/chains_$c" ${CHAINS_ARGS:---modes bwd --headdims 64,128 --causal true} \
            2> /dev/null | tail -n 13
    done
fi
# Run-time switches A/B'd in the main build (FLASHATTN2_* variables read at import). A run spec
# is NAME=VAR:VAL,VAR:VAL (NAME= alone: the defaults), e.g. "fuse=FLASHATTN2_SM90_DQ_FUSE:1".
# envtest: pytest ENVTEST_FILES once per spec of ENVTEST; envsan: compute-sanitizer
# (ENVSAN_TOOLS, default racecheck synccheck) on scripts/sanitize_subset.py per spec of ENVSAN;
# envab: bench.py per group g of ENVAB_GROUPS (default "1"): the specs ENVAB_<g> interleaved,
# rounds ENVAB_<g>_REPS or ENVAB_REPS (default 2), the script ENVAB_<g>_SCRIPT (default
# benchmarks/bench.py; also benchmarks/bench_decode.py) with options ENVAB_<g>_ARGS (e.g.
# --no-summary), into $O/envab<g>_NAME_<round>.
spec_env() {  # spec -> the env assignments, one per line
    local kv envs=${1#*=}
    [ -z "$envs" ] && return
    IFS=, read -ra kv <<< "$envs"
    printf '%s\n' "${kv[@]/:/=}"
}
if want envtest && [ -n "${ENVTEST:-}" ]; then
    for spec in $ENVTEST; do
        stamp "envtest ${spec%%=*}: $(spec_env "$spec" | tr '\n' ' ')"
        mapfile -t e < <(spec_env "$spec")
        # shellcheck disable=SC2086
        env "${e[@]}" timeout "${ENVTEST_TIMEOUT:-900}" python3 -m pytest ${ENVTEST_FILES:-tests/test_sm90_bwd.py} \
            -q -p no:cacheprovider 2>&1 | tail -n 6
    done
fi
if want envsan && [ -n "${ENVSAN:-}" ]; then
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for spec in $ENVSAN; do
        mapfile -t e < <(spec_env "$spec")
        for tool in ${ENVSAN_TOOLS:-racecheck synccheck}; do
            stamp "envsan ${spec%%=*} $tool"
            env "${e[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 900 "$san" --tool "$tool" \
                --error-exitcode 1 python3 scripts/sanitize_subset.py > "$O/envsan_${spec%%=*}_$tool.txt" 2>&1
            echo "$tool rc=$?"; tail -n 3 "$O/envsan_${spec%%=*}_$tool.txt"
        done
    done
fi
# ptests: PROBE_TESTS (pytest files) on each probe build, once it is built (PTESTS_TIMEOUT s
# each, default 600: a probe kernel that hangs costs no more).
if want ptests && [ -n "${PROBE_TESTS:-}" ]; then
    for b in probe probe2; do
        pid_var=${b^^}_PID
        [ -n "${!pid_var:-}" ] || continue
        wait "${!pid_var}"
        tail -n 1 "$O/${b}_build.txt"
        stamp "ptests on /tmp/$b: $PROBE_TESTS"
        # shellcheck disable=SC2086
        PYTHONPATH=/tmp/$b timeout "${PTESTS_TIMEOUT:-600}" python3 -m pytest $PROBE_TESTS -q -p no:cacheprovider \
            2>&1 | tail -n 6
    done
fi
if want envab; then
    # (A spec may put a probe build first on PYTHONPATH: it must be there.)
    [ -n "${PROBE_PID:-}" ] && wait "$PROBE_PID"
    [ -n "${PROBE2_PID:-}" ] && wait "$PROBE2_PID"
    [ -n "${BASE_PID:-}" ] && wait "$BASE_PID"  # (and the base build: PYTHONPATH:/tmp/base)
    for g in ${ENVAB_GROUPS:-1}; do
        specs_var=ENVAB_$g args_var=ENVAB_${g}_ARGS reps_var=ENVAB_${g}_REPS
        script_var=ENVAB_${g}_SCRIPT
        [ -z "${!specs_var:-}" ] && continue
        for r in $(seq 1 "${!reps_var:-${ENVAB_REPS:-2}}"); do
            for spec in ${!specs_var}; do
                stamp "envab $g ${spec%%=*} round $r"
                mapfile -t e < <(spec_env "$spec")
                # shellcheck disable=SC2086
                env "${e[@]}" python3 "${!script_var:-benchmarks/bench.py}" \
                    --out "$O/envab${g}_${spec%%=*}_$r" ${!args_var:-} 2> /dev/null | tail -n 20
            done
        done
        # The A/B's summary: each spec's best round against the first spec's, per config and
        # geomean (scripts/ab_compare.py), into the console and $O/envab<g>_summary.txt.
        names=$(for spec in ${!specs_var}; do printf '%s,' "${spec%%=*}"; done)
        if [[ ${names%,} == *,* ]]; then
            stamp "envab $g summary"
            python3 scripts/ab_compare.py "$O" --group "$g" --specs "${names%,}" \
                > "$O/envab${g}_summary.txt" 2>&1
            sed -n '/^geomean/,$p' "$O/envab${g}_summary.txt"
        fi
    done
fi
# bwdprof: CUDA time per kernel of one backward (preprocess, main, dQ convert) next to
# SDPA-cuDNN's (scripts/bwd_profile.py; BWDPROF_ARGS: its options).
if want bwdprof; then
    stamp "bwdprof: the backward's kernels"
    # shellcheck disable=SC2086
    timeout 300 python3 scripts/bwd_profile.py ${BWDPROF_ARGS:-} 2>&1 | tail -n 30
fi
if want bncu; then
    # BNCU_DIM (default 128), BNCU_SEQLEN (8192), BNCU_CAUSAL (0)
    bd=${BNCU_DIM:-128} bs=${BNCU_SEQLEN:-8192} bc=${BNCU_CAUSAL:-0}
    stamp "ncu: the Hopper backward, d$bd s$bs causal=$bc (sections, then source counters)"
    PASS=bwd HEAD_DIM=$bd SEQLEN=$bs CAUSAL=$bc timeout 300 bash scripts/ncu.sh \
        > "$O/ncu_bwd_d${bd}_s${bs}_c$bc.txt" 2>&1
    grep -E "Duration|Throughput|Issue Slots Busy|stalled|Registers|Achieved" \
        "$O/ncu_bwd_d${bd}_s${bs}_c$bc.txt" | head -n 24
    SOURCE="$O/src_bwd_d${bd}_s${bs}_c$bc.csv" PASS=bwd HEAD_DIM=$bd SEQLEN=$bs CAUSAL=$bc \
        timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
    python3 scripts/sass_stalls.py "$O/src_bwd_d${bd}_s${bs}_c$bc.csv" 2>&1 | head -n 40
fi
if want probe && [ -n "${PROBE_FLAGS:-}" ] && [ "${PROBE_AB:-1}" = 1 ]; then
    # A side build of this tree with extra nvcc flags (PROBE_FLAGS, e.g. a -D of a timing probe
    # compiled into a kernel), benchmarked against the default build, A B A B (PROBE_ARGS:
    # bench.py's selection).
    stamp "probe: this tree with CMAKE_CUDA_FLAGS=$PROBE_FLAGS vs without"
    wait "$PROBE_PID"
    tail -n 2 "$O/probe_build.txt"
    # (PROBE_TESTS ran in step ptests.) PROBE_SCRIPT: the benchmark (default bench.py; also
    # benchmarks/bench_decode.py).
    # shellcheck disable=SC2086
    AB_SCRIPT=${PROBE_SCRIPT:-} \
        ab_bench probe probe plain ${PROBE_ARGS:---modes bwd --dtypes bf16 --impls flashattn2,sdpa_cudnn}
fi
if want fncu; then
    stamp "ncu: the Hopper forward at short lengths (d128 s512 full, d64 s512 causal)"
    for c in "128 512 0" "64 512 1"; do
        set -- $c
        PASS=fwd HEAD_DIM=$1 SEQLEN=$2 CAUSAL=$3 timeout 300 bash scripts/ncu.sh \
            > "$O/ncu_fwd_d$1_s$2_c$3.txt" 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|stalled" \
            "$O/ncu_fwd_d$1_s$2_c$3.txt" | head -n 12
        SOURCE="$O/src_fwd_d$1_s$2_c$3.csv" PASS=fwd HEAD_DIM=$1 SEQLEN=$2 CAUSAL=$3 \
            timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
        python3 scripts/sass_stalls.py "$O/src_fwd_d$1_s$2_c$3.csv" 2>&1 | head -n 40
    done
fi
# power: benchmarks/bench_power.py (sustained runs on a warm GPU: TFLOP/s, SM clock, power,
# pJ per FLOP) with POWER_ARGS (e.g. "--headdims 64,128 --seconds 10"), only where it is set.
if want power && [ -n "${POWER_ARGS+x}" ]; then
    stamp "bench_power $POWER_ARGS"
    # shellcheck disable=SC2086
    python3 benchmarks/bench_power.py --out "$O/power" $POWER_ARGS 2> /dev/null | tail -n 30
fi
# xncu: ncu.sh per spec of XNCU ("PASS:IMPL:HEAD_DIM:SEQLEN:CAUSAL:BATCH[:DTYPE[:PRECISION]]",
# e.g. "decode:cudnn:128:8192:0:16", "fwd:ours:128:512:0:32" or "bwd:ours:128:4096:0:4:fp32:tf32"):
# sections, then source counters.
if want xncu && [ -n "${XNCU:-}" ]; then
    for spec in $XNCU; do
        IFS=: read -r xp xi xd xs xc xb xt xf <<< "$spec"
        xt=${xt:-bf16} xf=${xf:-ieee}
        tag="${xp}_${xi}_d${xd}_s${xs}_c${xc}_b${xb}"
        [ "$xt" = bf16 ] || tag="${tag}_${xt}_$xf"
        stamp "xncu $tag"
        export DTYPE=$xt FP32_PRECISION=$xf
        PASS=$xp IMPL=$xi HEAD_DIM=$xd SEQLEN=$xs CAUSAL=$xc BATCH=$xb timeout 300 \
            bash scripts/ncu.sh > "$O/xncu_$tag.txt" 2>&1
        grep -E "Duration|Throughput|Issue Slots Busy|Registers Per|Grid Size|Block Size|Shared Memory Config|Dynamic Shared|Achieved Occupancy|stalled|pipe_tensor" \
            "$O/xncu_$tag.txt" | head -n 30
        [ -n "${XNCU_SOURCE:-}" ] || continue
        SOURCE="$O/xsrc_$tag.csv" PASS=$xp IMPL=$xi HEAD_DIM=$xd SEQLEN=$xs CAUSAL=$xc BATCH=$xb \
            timeout 300 bash scripts/ncu.sh > /dev/null 2>&1
        python3 scripts/sass_stalls.py "$O/xsrc_$tag.csv" 2>&1 | head -n 30
    done
fi
if want fp32; then
    stamp "bench float32 (3xTF32) against SDPA's float32 backends"
    python3 benchmarks/bench.py --headdims 64,128 --seqlens 1024,4096,8192 --dtypes fp32 \
        --modes fwd,bwd --impls flashattn2,sdpa_efficient,sdpa_math --no-summary \
        --out "$O/fp32" 2> /dev/null | tail -n 30
fi
if want race; then
    stamp "race: racecheck of the decode and float32 kernels apart, full reports"
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    for part in "test_decode_kernel.py -k test_splits or test_every_row_written" \
                "test_fp32.py -k against_float64"; do
        file=${part%% *}; expr=${part#* -k }
        [[ -n "${RACE_ONLY:-}" && "$file" != "$RACE_ONLY" ]] && continue  # one file only
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 400 "$san" --tool racecheck \
            --print-limit 20 python3 -m pytest "tests/$file" -q -p no:cacheprovider -k "$expr" \
            > "$O/race_${file%.py}.txt" 2>&1
        grep -E "passed|failed|RACECHECK SUMMARY" "$O/race_${file%.py}.txt" | tail -n 3
    done
fi
if want fp32probe; then
    stamp "fp32 probe: the float32 backward's error against the length"
    python3 scripts/fp32_probe.py 2>&1 | tee "$O/fp32_probe.txt" | tail -n 30
fi
if want fwd; then
    stamp "bench fwd: the standard sweep, bf16 and fp16"
    python3 benchmarks/bench.py --modes fwd --headdims 64,128,256 --dtypes bf16,fp16 \
        --impls flashattn2,flashattn2_sm80,sdpa_flash,sdpa_cudnn --out "$O/fwd" 2> /dev/null \
        | tail -n 12
fi
if want bwd; then
    stamp "bench bwd"
    python3 benchmarks/bench.py --modes bwd,fwd_bwd --headdims "${BWD_DIMS:-64,128,256}" \
        --dtypes bf16 --impls flashattn2,flashattn2_det,flashattn2_sm80,sdpa_flash,sdpa_cudnn \
        --out "$O/bwd" 2> /dev/null | tail -n 12
fi
if want variants; then
    stamp "bench backward variants, Hopper vs mma.sync"
    python3 benchmarks/bench.py --modes bwd --headdims 128 --dtypes bf16 --seqlens 2048,8192 \
        --impls flashattn2,flashattn2_sm80 --softcap 30 --alibi --window 1024 --no-summary \
        --out "$O/variants"
fi
if want bias; then
    stamp "bench bias"
    python3 benchmarks/bench.py --headdims 64,128 --seqlens 1024,4096,8192 --dtypes bf16 \
        --modes fwd,bwd --impls flashattn2,sdpa_efficient,sdpa_cudnn --bias ${BIAS_ARGS:-} \
        --out "$O/bias" 2> /dev/null | tail -n 12
fi
if want decode; then
    stamp "bench decode"
    python3 benchmarks/bench_decode.py --out "$O/decode" ${DECODE_ARGS:-} 2> /dev/null | tail -n 60
fi
if want ncu; then
    stamp "ncu: the Hopper backward, d128 8k full and causal"
    for c in 0 1; do
        PASS=bwd HEAD_DIM=128 SEQLEN=8192 CAUSAL=$c timeout 300 bash scripts/ncu.sh \
            > "$O/ncu_bwd_d128_causal$c.txt" 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|stalled" "$O/ncu_bwd_d128_causal$c.txt" | head -n 12
    done
fi
if want mem; then
    stamp "backward workspace memory, ours and SDPA's"
    python3 benchmarks/bwd_memory.py --out "$O/bwd_memory.json"
fi
if want host; then
    stamp "host time profile of flash_attn_with_kvcache"
    python3 scripts/host_profile.py > "$O/host_profile.txt" 2>&1
    head -n 12 "$O/host_profile.txt"
fi
if want grid; then
    stamp "bench grid"
    python3 benchmarks/bench.py --grid --rep 30 --warmup 10 --out "$O/grid"
fi
if want cp; then
    # CP_ARGS: bench_cp.py's options, e.g. issue 22's scaling run on 4 GPUs (its docstring)
    stamp "bench context parallel ($(nvidia-smi -L | wc -l) GPUs) ${CP_ARGS:-}"
    # shellcheck disable=SC2086
    bash scripts/cp_bench.sh --out "$O/cp" ${CP_ARGS:-}
fi
stamp done
