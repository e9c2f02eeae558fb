#!/usr/bin/env bash
# After gpu_job.sh's bwdab step (base_bbase[2] / base_bnew[2] in $JOB_OUT): the A/B's summary
# (scripts/ab_compare.py, into $JOB_OUT/ab.txt) and, only if the new build wins, the suite as
# gpu_job.sh runs it (pytest-xdist where installed, FORCE_SM80 test_kvcache + test_bwd,
# compute-sanitizer), so that a job builds, A/Bs and spends the suite's device time only on a
# candidate worth submitting. A win: the geomean of the counted groups' new / base ratios at
# least WIN_GEOMEAN (default 1.003) and each at least WIN_MIN (default 0); WIN_GROUPS, a
# regular expression on ab_compare's "dtype head-dim causal" group names, picks the counted
# groups (default all). AB_GROUP=g: an envab group g with specs base and new (e.g. a decode
# A/B, base=PYTHONPATH:/tmp/base) instead of bwdab's runs.
#   (in a job, after `bash scripts/gpu_job.sh`) WIN_GROUPS="bf16 128 False" bash scripts/suite_if_win.sh
set -u
O=${JOB_OUT:-gpu_logs}
if [ -z "${AB_GROUP:-}" ]; then
    (cd "$O" && ln -sfn base_bbase envab9_base_1 && ln -sfn base_bbase2 envab9_base_2 &&
        ln -sfn base_bnew envab9_new_1 && ln -sfn base_bnew2 envab9_new_2)
fi
python3 scripts/ab_compare.py "$O" --group "${AB_GROUP:-9}" --specs base,new > "$O/ab.txt" 2>&1
sed -n '/^geomean/,$p' "$O/ab.txt"
if WIN_GROUPS=${WIN_GROUPS:-.} WIN_GEOMEAN=${WIN_GEOMEAN:-1.003} WIN_MIN=${WIN_MIN:-0} \
    python3 - "$O/ab.txt" <<'PY'
import math, os, re, sys
g = [float(x) for name, x in re.findall(r"^\s*(.+): new ([0-9.]+)$", open(sys.argv[1]).read(), re.M)
     if re.search(os.environ["WIN_GROUPS"], name)]
ok = bool(g) and math.prod(g) ** (1 / len(g)) >= float(os.environ["WIN_GEOMEAN"]) and \
    min(g) >= float(os.environ["WIN_MIN"])
print("groups", g, "win" if ok else "no win")
sys.exit(0 if ok else 1)
PY
then
    echo "=== $(date -Is) new wins: the suite"
    PYTEST_XDIST="-n 4 --dist loadfile"
    python3 -c "import xdist" || PYTEST_XDIST=""
    OUT=$O/check SKIP_BUILD=1 SKIP_BENCH=1 SKIP_DECODE=1 TEST_TIMEOUT=500 \
        PYTEST_ARGS="--ignore=tests/test_distributed.py $PYTEST_XDIST" TESTS=tests \
        SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py" bash scripts/gpu_check.sh
else
    echo "=== $(date -Is) no win: no suite"
fi
