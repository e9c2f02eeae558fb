#!/usr/bin/env bash
# Twenty-first session, run 3: the full suite on the submitted kernels (a18109f's cpp /
# python: the rotated walk alone), in the 450 s of device time left. pytest-xdist (wheels
# carried in .xdist/, git-ignored: carry [".xdist"]) runs the suite in 4 processes, whole
# files per process (--dist loadfile: a file's large tests stay sequential); same tests,
# same counts as the serial run. Then FORCE_SM80 and compute-sanitizer as usual.
#   WAIT=400 OUT=$OUT bash scripts/gpu_detach.sh start bash jobs/s21run3.sh
set -u
python3 -m pip install --no-deps --no-index -q .xdist/*.whl ||
    python3 -m pip install --no-deps --no-index -q --break-system-packages .xdist/*.whl
export SKIP="base fwdab bwdab decab chains bwdprof fncu xncu fp32 race fp32probe fwd bwd variants bias decode ncu bncu mem host grid cp envsan envtest ptests envab power probe smoke"
export SM80_TESTS="tests/test_kvcache.py tests/test_bwd.py"
export PYTEST_XDIST="-n 4 --dist loadfile"
python3 -c "import xdist" || { echo "no pytest-xdist: the suite runs serially"; PYTEST_XDIST=""; }
bash scripts/gpu_job.sh
