#!/usr/bin/env bash
# Thirty-fourth session, run 3 (~200 s; HEAD c4f996c + records, no kernel change): why the
# decode kernel's time over the read floor is a constant that grows with the batch (H200,
# graph calls: b16 1k 4.0 us over the floor, 8k 5.0; b64 1k 8.4, 8k 9.9; cuDNN 2.8 / 5 / 3.4 /
# 5). ncu of ours and cuDNN at b16 1k, b64 1k, b64 8k: the duration, the per-SM spread of
# active cycles and CTAs (imbalance), DRAM throughput, occupancy and the stall reasons.
# Then issue 20's default sweep on HEAD (d128 build).
set -u
O=${OUT:-gpu_logs}
mkdir -p "$O"
python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/w . -C cmake.define.FLASHATTN2_CUDA_ARCHS=90a-real \
    -C "cmake.define.FLASHATTN2_HEAD_DIMS=128" -C build-dir=/tmp/b > "$O/build.txt" 2>&1 \
    && python3 -m zipfile -e /tmp/w/*.whl /tmp/m || { tail -20 "$O/build.txt"; exit 1; }
echo "=== $(date -Is) built"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
m=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg
m=$m,sm__cycles_elapsed.max,sm__ctas_launched.min,sm__ctas_launched.max,sm__ctas_launched.sum
m=$m,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct
m=$m,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum
m=$m,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic
m=$m,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__waves_per_multiprocessor
for st in long_scoreboard barrier short_scoreboard lg_throttle wait mio_throttle no_instruction; do
    m=$m,smsp__average_warp_latency_issue_stalled_$st
done
for cfg in "16 1024" "64 1024" "64 8192" "1 1024"; do
    for impl in ours cudnn; do
        echo "=== $(date -Is) ncu $impl b/cache $cfg"
        PYTHONPATH=/tmp/m timeout 120 "$NCU" --profile-from-start off --clock-control none --metrics "$m" \
            --csv --page raw --print-units base python3 jobs/s34_ncu_decode.py $impl $cfg \
            > "$O/ncu_${impl}_${cfg// /_}.csv" 2> "$O/ncu_${impl}_${cfg// /_}.err"
        python3 - "$O/ncu_${impl}_${cfg// /_}.csv" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))
        if r.get("ID", "").isdigit()]
for r in rows:
    print(r["Kernel Name"][:70])
    print("   " + "  ".join(f"{k.replace('smsp__average_warp_latency_issue_stalled_', 'stall_')}={v}"
                          for k, v in r.items() if "__" in k and v not in ("", "n/a")))
PY
    done
done
echo "=== $(date -Is) sweep"
PYTHONPATH=/tmp/m timeout 300 python3 benchmarks/bench_decode.py --out "$O/sweep" > "$O/sweep.txt" 2>&1
sed -n '/^Summary/,$p' "$O/sweep.txt"
tar czf "$O/logs.tar.gz" -C "$O" --exclude=logs.tar.gz . 2> /dev/null
echo "=== $(date -Is) done"
