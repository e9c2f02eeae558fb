#!/usr/bin/env bash
# Seventeenth session: the forward test files on the mma.sync path (FLASHATTN2_FORCE_SM80=1)
# on the submitted kernels, default build (run 4 ran FORCE_SM80 for test_bwd.py only).
set -u
O=${OUT:-gpu_logs}; mkdir -p "$O"
python3 -m pip install --no-build-isolation --no-deps -q . -C build-dir=/tmp/bsm80 > "$O/build.txt" 2>&1 || { tail -20 "$O/build.txt"; exit 1; }
cd tests && FLASHATTN2_FORCE_SM80=1 timeout 200 python3 -m pytest test_fwd.py test_variants.py test_varlen.py test_compile.py test_kvcache.py -q -x -p no:cacheprovider 2>&1 | tail -n 6
