#!/usr/bin/env bash
# Thirty-eighth session, run 2 (detached, carry .xdist): the suite on this tree (the autograd
# nodes no longer materialise lse's zero gradient), FORCE_SM80 and the sanitizers
# (gpu_check.sh through gpu_job.sh), then the host-time A/B (jobs/s38_host_ab.py).
#   WAIT=570 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s38run2.sh
set -u
O=${JOB_OUT:-gpu_logs}
SRC=$PWD
export SKIP="base fwdab bwdab decab chains bwdprof fncu bncu fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest envab power probe ptests race smoke xncu fp32"
export PYTEST_XDIST="-n 4 --dist loadfile"
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py tests/test_varlen.py"
bash scripts/gpu_job.sh
echo "=== $(date -Is) host A/B"
(cd /tmp && timeout 240 python3 "$SRC/jobs/s38_host_ab.py") > "$O/host_ab.txt" 2>&1
echo "host A/B rc $?"; grep -v Warning "$O/host_ab.txt" | head -12
echo "=== $(date -Is) done"
