#!/usr/bin/env bash
# Nineteenth session, run 6: the submitted commit (the rotated backward loop at d128 only):
# default build, the full suite, FORCE_SM80 test_kvcache / test_bwd, compute-sanitizer.
export SKIP="base fwdab bwdab decab chains bwdprof bncu fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu mem host grid cp envsan envtest ptests probe envab power"
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
bash scripts/gpu_job.sh
