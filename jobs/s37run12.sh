#!/usr/bin/env bash
# Thirty-seventh session, run 1: s37run1 (ncu PC sampling of the decode kernel) and s37run2
# (FORCE_SM80 + the sanitizers) in one device call; run2's build starts in the background first
# so that the two builds overlap (its own pip wheel call then finds the build done).
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O/r1" "$O/r2"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wd_pre . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" -C build-dir=/tmp/bd > /tmp/pre_build.txt 2>&1 &
pre=$!
OUT=$O/r1 bash jobs/s37run1.sh
wait $pre
OUT=$O/r2 bash jobs/s37run2.sh
tar czf "$O/r2.tar.gz" -C "$O" r2
