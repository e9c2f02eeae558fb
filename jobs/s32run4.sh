#!/usr/bin/env bash
# Prepared in the thirty-second session (its device time ran out), for the next one's first
# device call (~230 s): `bash jobs/s32run4.sh`.
# 1. test_decode_kernel.py + test_kvcache.py on a d64 / d128 90a build of this tree, among them
#    test_long_paged_cache_in_one_split (new, not yet run on a GPU): one split over 5119 keys
#    in shuffled 16-key pages, so each warp's block-table entries come in three batches of
#    32 steps (a1e5991's mechanism; the suite that passed on a1e5991 had no paged case with
#    more than 32 steps a warp, the benchmark's long paged runs are not checked).
# 2. issue 20's default decode sweep (bench_decode.py, no flags but --out): with 64k / 128k,
#    SDPA-flash, paged 16 / 64 / 256 and the host time.
# 3. b16 with 2 splits forced (2 CTAs an SM, twice the bytes in flight): does it close paged
#    16 / 64's remaining +3-4 % (placement: shuffled vs sequential pages)?
# 4. b1 8k (1.51x the floor): the decode and combine kernels' own times (torch.profiler, L2
#    flushed before each call), against the call's 18.8 us: where the rest goes.
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=64;128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
PYTHONPATH=/tmp/m timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode_kernel.py \
    tests/test_kvcache.py > "$O/tests.txt" 2>&1
grep -E "FAILED|passed|failed" "$O/tests.txt" | tail -n 12
PYTHONPATH=/tmp/m python3 benchmarks/bench_decode.py --out "$O/sweep" 2>&1 | tail -n 60
PYTHONPATH=/tmp/m python3 benchmarks/bench_decode.py --no-summary --parts decode --batches 16 --sq 1 \
    --cache-lens 8k,32k --page-sizes 16,64 --splits 2 --impls flashattn2 --out "$O/splits" 2>&1 | tail -n 20
PYTHONPATH=/tmp/m python3 - <<'PY' 2>&1 | tail -n 14
import torch, flashattn2
from torch.profiler import profile, ProfilerActivity
q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for _ in range(20):
    flashattn2.flash_attn_with_kvcache(q, k, v)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(100):
        flush.zero_()
        flashattn2.flash_attn_with_kvcache(q, k, v)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
PY
