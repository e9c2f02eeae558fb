#!/usr/bin/env bash
# Prepared in the thirty-sixth session for the next one (~200 s, no carry): the checks the
# thirty-sixth session's landing run lost (a second job removed its folder on the machine):
# FLASHATTN2_FORCE_SM80 test_kvcache + test_bwd + test_decode_kernel, and compute-sanitizer
# memcheck / racecheck / synccheck of scripts/sanitize_subset.py (its decode cases now include
# a left-padded 16-token-page cache, whose tiles cross page ends: the copy's per-slot path), on
# a d64 + d128 90a build of this tree.
#   bash jobs/s37run2.sh
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps .xdist/*.whl > /dev/null 2>&1
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wd . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" -C build-dir=/tmp/bd > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/wd/*.whl /tmp/md || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
N=$(python3 -c "import xdist" 2>/dev/null && echo "-n 4")
PYTHONPATH=/tmp/md FLASHATTN2_FORCE_SM80=1 timeout 400 python3 -m pytest -q $N tests/test_kvcache.py \
    tests/test_bwd.py tests/test_decode_kernel.py -p no:cacheprovider > "$O/sm80.txt" 2>&1
echo "FORCE_SM80 rc $?"; tail -n 2 "$O/sm80.txt"
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck synccheck; do
    PYTHONPATH=/tmp/md PYTORCH_NO_CUDA_MEMORY_CACHING=1 FLASHATTN2_SANITIZE_TOOL=$tool timeout 300 \
        "$SAN" --tool $tool --error-exitcode 1 python3 scripts/sanitize_subset.py > "$O/$tool.txt" 2>&1
    echo "$tool rc $?"; grep -E "kvcache|ERROR SUMMARY|hazard|cases" "$O/$tool.txt" | tail -n 6
done
echo "=== $(date -Is) done"
