#!/usr/bin/env bash
# Twelfth session, run 4: the job of jobs/s12run4.env, then the forward test files on the probe
# build (PYTHONPATH=/tmp/probe), so that a probe that wins is also known to be correct.
source jobs/s12run4.env
bash scripts/gpu_job.sh
O=${JOB_OUT:-gpu_logs}
echo "=== $(date -Is) forward tests on the probe build"
PYTHONPATH=/tmp/probe PYTHONUNBUFFERED=1 timeout 500 python3 -m pytest tests/test_sm90.py tests/test_fwd.py tests/test_varlen.py tests/test_variants.py tests/test_sm90_fwd_protos.py tests/test_sm90_narrow_step.py tests/test_sm90_fa3_order.py tests/test_bias.py tests/test_kvcache.py \
    -q -p no:cacheprovider -o faulthandler_timeout=200 > "$O/probe_tests.txt" 2>&1
echo "rc=$?"; tail -n 8 "$O/probe_tests.txt"
PYTHONPATH=/tmp/probe python3 -c "import flashattn2, flashattn2._C as c; print(flashattn2.__file__)"

for spec in FLASHATTN2_SM90_TILE_WALK=counter FLASHATTN2_SM90_STAGE_O=1; do
    echo "=== $(date -Is) probe build, $spec"
    env "$spec" PYTHONPATH=/tmp/probe timeout 300 python3 -m pytest tests/test_sm90.py \
        tests/test_varlen.py tests/test_fwd.py -q -p no:cacheprovider > "$O/probe_tests_${spec%%=*}.txt" 2>&1
    echo "rc=$?"; tail -n 3 "$O/probe_tests_${spec%%=*}.txt"
done
echo "=== $(date -Is) split-KV batch 3 on the probe build and the default"
PYTHONPATH=/tmp/probe timeout 120 python3 jobs/s12_splitkv_check.py 2>&1 | tail -n 7
timeout 120 python3 jobs/s12_splitkv_check.py 2>&1 | tail -n 2
echo "=== $(date -Is) all done"
