#!/usr/bin/env python3
"""Context parallelism on 2 GPUs (flashattn2.distributed) against 1 GPU, forward+backward.

For each total sequence length S, K/V head count and causal flag: one GPU runs
flash_attn_func on the whole sequence; two GPUs run ring, all-gather and Ulysses
attention on zigzag shards (S / 2 tokens each). Reported per scheme:

- ms: median fwd+bwd time of one step (CUDA events, after warmup; each rank times its
  own GPU, the slower rank counts);
- efficiency = T(1 GPU) / (2 * T(2 GPUs));
- ring only: compute_ms, the same ring with its transfers skipped
  (``Ring.disabled``), so exposed_comm_ms = ms - compute_ms; comm_ms, the ring's transfers
  alone (K/V W - 1 times forward and backward, dK/dV W times, float32), so hidden_comm_ms
  = comm_ms - exposed_comm_ms; bytes_per_step and the link bandwidth a ring step needs to
  stay compute-bound (bytes moved per step / compute time per step);
- peak_mem_gib: torch.cuda.max_memory_allocated during the step.

    python benchmarks/bench_cp.py                      # the issue's sweep (< 5 min, 2 H100s)
    python benchmarks/bench_cp.py --seqlens 32768 --nheads-k 4 --causal true --iters 2

Spawns its 2 processes itself (file rendezvous, no network); run it through
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
    p.add_argument("--world-size", type=int, default=2)
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


def slowest(value):
    """The largest value over the ranks (the step ends when the slowest rank ends)."""
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def run_config(args, rank, world, seqlen, nheads_k, causal, iters):
    import flashattn2
    import flashattn2.distributed as cp
    from flashattn2.distributed._common import Ring

    heads, d = args.nheads, args.headdim
    gen = torch.Generator(device="cuda").manual_seed(0)
    full = [torch.randn(1, seqlen, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for h in (heads, nheads_k, nheads_k, heads)]  # q, k, v, dout
    rows = []
    base = dict(seqlen=seqlen, tokens_per_gpu=seqlen // world, nheads=heads, nheads_k=nheads_k,
                headdim=d, causal=causal, world_size=world)

    q, k, v, dout = (t.clone().requires_grad_(i < 3) for i, t in enumerate(full))

    def single():
        out = flashattn2.flash_attn_func(q, k, v, causal=causal)
        out.backward(dout)

    ms1, mem1 = timed(single, args.warmup, iters)
    ms1 = slowest(ms1)
    del q, k, v
    rows.append(dict(base, scheme="1gpu", ms=ms1, peak_mem_gib=mem1, efficiency=1.0))

    local = [cp.shard_sequence(t, rank, world) for t in full]
    del full
    ql, kl, vl = (t.clone().requires_grad_() for t in local[:3])
    dl = local[3]
    funcs = {"ring": cp.ring_attn_func, "gather": cp.gather_attn_func,
             "ulysses": cp.ulysses_attn_func}
    for scheme in args.schemes.split(","):
        if scheme == "ulysses" and (heads % world or nheads_k % world):
            continue
        func = funcs[scheme]

        def step():
            out = func(ql, kl, vl, causal=causal, check_shards=False)
            out.backward(dl)

        ms, mem = timed(step, args.warmup, iters)
        row = dict(base, scheme=scheme, ms=slowest(ms), peak_mem_gib=mem)
        row["efficiency"] = ms1 / (world * row["ms"])
        if scheme == "ring":
            Ring.disabled = True
            try:
                compute, _ = timed(step, 1, iters)
            finally:
                Ring.disabled = False
            row["compute_ms"] = slowest(compute)
            row.update(ring_comm(kl, vl, world, args.warmup, iters))
            row["exposed_comm_ms"] = max(0.0, row["ms"] - row["compute_ms"])
            row["hidden_comm_ms"] = max(0.0, row["comm_ms"] - row["exposed_comm_ms"])
            steps = world  # ring steps per pass
            row["compute_ms_per_step"] = row["compute_ms"] / steps
            row["gbps_needed_to_hide"] = (row["bytes_per_step"] / 1e9) / (
                row["compute_ms_per_step"] / 1e3)
        rows.append(row)
    return rows


def ring_comm(k, v, world, warmup, iters):
    """Time of the ring's transfers alone for one fwd+bwd: K/V (world - 1) hops forward and
    backward, dK/dV (float32) world hops; and the bytes one rank sends per ring step."""
    rank = dist.get_rank()
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros_like(dk)

    def exchange(tensors):
        recvs = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, nxt) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, prv) for t in recvs]
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
    return dict(comm_ms=slowest(ms), bytes_per_step=bytes_per_step)


def worker(rank, args, init_file, out_file):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=args.world_size)
    rows = []
    causal_flags = {"true": [True], "false": [False], "both": [True, False]}[args.causal]
    for seqlen in (int(s) for s in args.seqlens.split(",")):
        iters = args.iters if seqlen <= 65536 else args.long_iters
        for nheads_k in (int(h) for h in args.nheads_k.split(",")):
            for causal in causal_flags:
                if not causal and seqlen > args.max_noncausal_seqlen:
                    continue
                new = run_config(args, rank, args.world_size, seqlen, nheads_k, causal, iters)
                rows += new
                torch.cuda.empty_cache()
                if rank == 0:
                    for r in new:
                        extra = (f" compute {r['compute_ms']:.1f} exposed "
                                 f"{r['exposed_comm_ms']:.1f} comm {r['comm_ms']:.1f}"
                                 if "compute_ms" in r else "")
                        print(f"S={seqlen:>6} hk={nheads_k:>2} causal={causal!s:5} "
                              f"{r['scheme']:>7}: {r['ms']:8.2f} ms  eff {r['efficiency']:.3f}"
                              f"  mem {r['peak_mem_gib']:.1f} GiB{extra}", flush=True)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    args = parse_args()
    if torch.cuda.device_count() < args.world_size:
        sys.exit(f"needs {args.world_size} GPUs; found {torch.cuda.device_count()}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows_file = os.path.join(tmp, "rows.json")
        mp.spawn(worker, args=(args, os.path.join(tmp, "init"), rows_file),
                 nprocs=args.world_size, join=True)
        with open(rows_file) as f:
            rows = json.load(f)
    gpu = torch.cuda.get_device_name(0)
    tag = "h200" if "H200" in gpu else "h100" if "H100" in gpu else "gpu"
    day = datetime.date.today().isoformat()
    path = os.path.join(args.out, f"{tag}-cp-{args.world_size}gpu-{day}.json")
    meta = dict(gpu=gpu, world_size=args.world_size, torch=torch.__version__, argv=sys.argv[1:],
                nccl=".".join(map(str, torch.cuda.nccl.version())), dtype="bf16")
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
