#!/usr/bin/env python3
"""Context parallelism (flashattn2.distributed) on W GPUs against 1 GPU, forward+backward.

For each total sequence length S, K/V head count and causal flag: every GPU runs
flash_attn_func on the whole sequence (the 1-GPU baseline; the slowest counts); then, for
each W of --world-sizes, ranks 0..W-1 run ring, all-gather and Ulysses attention on zigzag
shards (S / W tokens each) while the others wait. One spawn of max(W) processes, so every W
is compared with the same baseline. Reported per scheme and W:

- ms: median fwd+bwd time of one step (CUDA events, after warmup; each rank times its
  own GPU, the slowest rank counts);
- efficiency = T(1 GPU) / (W * T(W GPUs)); for W > 2 also efficiency_vs_2gpu
  = 2 * T(2 GPUs) / (W * T(W GPUs)) of the same scheme in the same run;
- ring only: compute_ms, the same ring with its transfers skipped
  (``Ring.bench_mode = "skip"``), so exposed_comm_ms = ms - compute_ms; sync_ms, the ring
  with one element sent in place of each tensor (``"sync"``: the step-by-step waits on the
  neighbours without the bytes), so sync_ms - compute_ms is what waiting costs (uneven
  steps across ranks) and ms - sync_ms what the bytes cost; comm_ms, the ring's transfers
  alone (K/V W - 1 times forward and backward, dK/dV W times, float32), so hidden_comm_ms
  = comm_ms - exposed_comm_ms; bytes_per_step and the link bandwidth a ring step needs to
  stay compute-bound (bytes moved per step / compute time per step);
- peak_mem_gib: torch.cuda.max_memory_allocated during the step, the largest rank's.

    python benchmarks/bench_cp.py                      # 2 GPUs, 32k-256k (< 5 min, H100s)
    python benchmarks/bench_cp.py --seqlens 32768 --nheads-k 4 --causal true --iters 2
    # issue 22's scaling run on 4 GPUs: 128k-1M tokens, 4 K/V heads, causal
    python benchmarks/bench_cp.py --world-sizes 2,4 --seqlens 131072,262144,524288,1048576 \
        --nheads-k 4 --causal true --long-iters 1 --max-tokens-per-gpu 262144

Spawns its processes itself (file rendezvous, no network); run it through
scripts/cp_bench.sh, which sets NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1.
Writes JSON ({"meta": ..., "rows": [...]}) to --out (default benchmarks/results/).
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqlens", default="32768,65536,131072,262144")
    p.add_argument("--nheads", type=int, default=16)
    p.add_argument("--nheads-k", default="16,4")
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--causal", default="both", choices=["true", "false", "both"])
    p.add_argument("--max-noncausal-seqlen", type=int, default=131072,
                   help="non-causal runs only up to this S (time budget)")
    p.add_argument("--schemes", default="ring,gather,ulysses")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--long-iters", type=int, default=2, help="iterations above 64k tokens")
    p.add_argument("--world-sizes", default="2",
                   help="comma-separated, e.g. 2,4: one spawn of the largest; smaller ones "
                        "run on ranks 0..w-1 against the same 1-GPU baseline")
    p.add_argument("--max-tokens-per-gpu", type=int, default=1 << 30,
                   help="a world size w runs S only if S / w <= this (time budget)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    return p.parse_args()


def timed(fn, warmup, iters):
    """Median ms of fn() over iters (after warmup), and the peak memory (GiB) it reached."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def slowest(value, group=None):
    """The largest value over the ranks of ``group`` (a step ends when its slowest rank
    ends; the peak memory is the largest rank's)."""
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def run_config(args, rank, world, groups, seqlen, nheads_k, causal, iters):
    """One config: flash_attn_func on the whole sequence on every rank at once (the slowest
    counts), then each scheme on each world size w of ``groups`` ({w: process group of ranks
    0..w-1}; ranks past w wait at the barrier)."""
    import flashattn2
    import flashattn2.distributed as cp
    from flashattn2.distributed._common import Ring

    heads, d = args.nheads, args.headdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    full = [torch.randn(1, seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for h in (heads, nheads_k, nheads_k, heads)]  # q, k, v, dout
    rows = []
    base = dict(seqlen=seqlen, nheads=heads, nheads_k=nheads_k, headdim=d, causal=causal)

    q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(full))

    def single():
        out = flashattn2.flash_attn_func(q, k, v, causal=causal)
        out.backward(dout)

    ms1, mem1 = timed(single, args.warmup, iters)
    ms1, mem1 = slowest(ms1), slowest(mem1)
    del q, k, v, dout
    torch.cuda.empty_cache()
    rows.append(dict(base, world_size=1, tokens_per_gpu=seqlen, scheme="1gpu", ms=ms1,
                     peak_mem_gib=mem1, efficiency=1.0))

    # Every rank holds its shard for each world size it takes part in; then the full
    # tensors go.
    shards = {w: [cp.shard_sequence(t, rank, w) for t in full]
              for w in groups if rank < w and seqlen // w <= args.max_tokens_per_gpu}
    del full
    funcs = {"ring": cp.ring_attn_func, "gather": cp.gather_attn_func,
             "ulysses": cp.ulysses_attn_func}
    ms_by = {}  # (scheme, world size) -> ms
    for w, group in groups.items():
        if seqlen // w > args.max_tokens_per_gpu:
            continue
        if rank >= w:
            dist.barrier()
            continue
        ql, kl, vl = (t.clone().requires_grad_() for t in shards[w][:3])
        dl = shards[w][3]
        for scheme in args.schemes.split(","):
            if scheme == "ulysses" and (heads % w or nheads_k % w):
                continue
            func = funcs[scheme]

            def step():
                out = func(ql, kl, vl, group=group, causal=causal, check_shards=False)
                out.backward(dl)

            ms, mem = timed(step, args.warmup, iters)
            row = dict(base, world_size=w, tokens_per_gpu=seqlen // w, scheme=scheme,
                       ms=slowest(ms, group), peak_mem_gib=slowest(mem, group))
            row["efficiency"] = ms1 / (w * row["ms"])
            ms_by[scheme, w] = row["ms"]
            if (scheme, 2) in ms_by and w > 2:
                # scaling from the 2-GPU figure of the same scheme in this run
                row["efficiency_vs_2gpu"] = 2 * ms_by[scheme, 2] / (w * row["ms"])
            if scheme == "ring":
                for mode, key in (("skip", "compute_ms"), ("sync", "sync_ms")):
                    Ring.bench_mode = mode
                    try:
                        row[key], _ = timed(step, 1, iters)
                    finally:
                        Ring.bench_mode = None
                    row[key] = slowest(row[key], group)
                row.update(ring_comm(kl, vl, w, group, args.warmup, iters))
                row["exposed_comm_ms"] = max(0.0, row["ms"] - row["compute_ms"])
                row["hidden_comm_ms"] = max(0.0, row["comm_ms"] - row["exposed_comm_ms"])
                steps = w  # ring steps per pass
                row["compute_ms_per_step"] = row["compute_ms"] / steps
                row["gbps_needed_to_hide"] = (row["bytes_per_step"] / 1e9) / (
                    row["compute_ms_per_step"] / 1e3)
            rows.append(row)
        del ql, kl, vl, dl
        torch.cuda.empty_cache()
        dist.barrier()
    return rows


def ring_comm(k, v, world, group, warmup, iters):
    """Time of the ring's transfers alone for one fwd+bwd: K/V (world - 1) hops forward and
    backward, dK/dV (float32) world hops; and the bytes one rank sends per ring step."""
    rank = dist.get_rank()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros_like(dk)

    def exchange(tensors):
        recvs = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, prv, group) for t in recvs]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    def comm():
        for _ in range(world - 1):
            exchange([k, v])
        for _ in range(world - 1):
            exchange([k, v])
        for _ in range(world):
            exchange([dk, dv])

    ms, _ = timed(comm, warmup, iters)
    kv_bytes = 2 * k.numel() * k.element_size()
    # Per ring step of fwd+bwd: K/V forward, K/V + dK/dV (fp32) backward.
    bytes_per_step = kv_bytes + kv_bytes + 2 * dk.numel() * dk.element_size()
    return dict(comm_ms=slowest(ms, group), bytes_per_step=bytes_per_step)


def worker(rank, args, init_file, out_file):
    torch.cuda.set_device(rank)
    world = max(args.world_sizes)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    # every rank creates every group, in the same order (torch.distributed's rule)
    groups = {w: dist.new_group(list(range(w))) if w < world else dist.group.WORLD
              for w in sorted(args.world_sizes)}
    rows = []
    causal_flags = {"true": [True], "false": [False], "both": [True, False]}[args.causal]
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        iters = args.iters if seqlen <= 65536 else args.long_iters
        for nheads_k in (int(h) for h in args.nheads_k.split(",")):
            for causal in causal_flags:
                if not causal and seqlen > args.max_noncausal_seqlen:
                    continue
                new = run_config(args, rank, world, groups, seqlen, nheads_k, causal, iters)
                rows += new
                torch.cuda.empty_cache()
                if rank == 0:
                    for r in new:
                        extra = (f" compute {r['compute_ms']:.1f} sync {r['sync_ms']:.1f}"
                                 f" exposed {r['exposed_comm_ms']:.1f} comm {r['comm_ms']:.1f}"
                                 if "compute_ms" in r else "")
                        if "efficiency_vs_2gpu" in r:
                            extra += f" eff/2gpu {r['efficiency_vs_2gpu']:.3f}"
                        print(f"S={seqlen:>7} hk={nheads_k:>2} causal={causal!s:5} "
                              f"W={r['world_size']} {r['scheme']:>7}: {r['ms']:9.2f} ms  "
                              f"eff {r['efficiency']:.3f}  mem {r['peak_mem_gib']:.1f} GiB"
                              f"{extra}", flush=True)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = parse_args()
    args.world_sizes = sorted({int(w) for w in args.world_sizes.split(",")})
    world = max(args.world_sizes)
    if min(args.world_sizes) < 2:
        sys.exit("--world-sizes: each at least 2 (the 1-GPU baseline is always measured)")
    if torch.cuda.device_count() < world:
        sys.exit(f"needs {world} GPUs; found {torch.cuda.device_count()}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = os.path.join(tmp, "rows.json")
        mp.spawn(worker, args=(args, os.path.join(tmp, "init"), rows_file),
                 nprocs=world, join=True)
        with open(rows_file) as f:
            rows = json.load(f)
    gpu = torch.cuda.get_device_name(0)
    tag = "h200" if "H200" in gpu else "h100" if "H100" in gpu else "gpu"
    day = datetime.date.today().isoformat()
    path = os.path.join(args.out, f"{tag}-cp-{world}gpu-{day}.json")
    meta = dict(gpu=gpu, world_sizes=args.world_sizes, torch=torch.__version__, argv=sys.argv[1:],
                nccl=".".join(map(str, torch.cuda.nccl.version())), dtype="bf16")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
