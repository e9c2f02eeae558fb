"""Multi-process harness of the context-parallel tests (tests/test_distributed*.py).

``run_world(world_size, backend, cases, ...)`` spawns ``world_size`` processes
(torch.multiprocessing), joins them into a process group through a file (no network), and
runs every case on every rank: build the full q, k, v (seeded, identical on all ranks),
shard them, run the distributed function with autograd, and compare this rank's output,
LSE and gradients with the single-process result of the same inputs. Each rank writes
``{case name: error message or ""}`` to a JSON file; ``run_world`` returns the union (a
case fails if it failed on any rank). Comparisons happen after every collective of a case,
so a failed comparison on one rank cannot leave the others waiting.

CPU (gloo): the block attention is the float32 reference, so results must equal
single-process reference attention within float32 rounding. CUDA (NCCL): bf16, held to
the 2x rule (the larger of single-GPU flash_attn_func's and plain PyTorch bf16's error on the
full sequence); past 16k tokens the references run by query chunks (_reference). A case
with ``vs_world2`` also runs on ranks 0 and 1 as a 2-rank group, and the two results,
gathered whole, must agree within the same bound (_two_rank_results).
"""
import datetime
import json
import os
import sys
import tempfile
import time
import traceback
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def case_name(case):
    return "-".join(f"{key}={value}" for key, value in sorted(case.items()))


def _full_inputs(case, device, dtype):
    generator = torch.Generator().manual_seed(zlib.crc32(case_name(case).encode()))
    world_size = case["world_size"]
    batch, seqlen, nheads, nheads_k, headdim = (case.get("batch", 2),
                                                 case["seqlen_local"] * world_size,
                                                 case["nheads"], case["nheads_k"],
                                                 case.get("headdim", 16))  # fmt: skip
    shapes = [(batch, seqlen, nheads, headdim), (batch, seqlen, nheads_k, headdim),
              (batch, seqlen, nheads_k, headdim), (batch, seqlen, nheads, headdim)]
    return [torch.randn(s, generator=generator).to(device=device, dtype=dtype) for s in shapes]


def _attn_kwargs(case):
    return dict(causal=case.get("causal", False), softmax_scale=case.get("softmax_scale"),
                window_size=tuple(case.get("window", (-1, -1))), softcap=case.get("softcap", 0.0))


def _distributed(case, q, k, v, dout, rank, world_size, group=None):
    """This rank's (out, lse, dq, dk, dv) from the distributed function under test, over
    ``group`` (default: the world)."""
    import flashattn2.distributed as cp

    func = {"ring": cp.ring_attn_func, "gather": cp.gather_attn_func,
            "ulysses": cp.ulysses_attn_func}[case["variant"]]  # fmt: skip
    layout = case.get("layout", "zigzag")
    local = [cp.shard_sequence(t, rank, world_size, layout).requires_grad_() for t in (q, k, v)]
    out, lse = func(*local, group=group, layout=layout, return_lse=True,
                    deterministic=case.get("deterministic", False), **_attn_kwargs(case))
    out.backward(cp.shard_sequence(dout, rank, world_size, layout))
    return [out.detach(), lse] + [t.grad for t in local]


def _shards(tensors, rank, world_size, layout):
    from flashattn2.distributed import shard_sequence

    out, lse, *grads = tensors
    return ([shard_sequence(out, rank, world_size, layout),
             shard_sequence(lse, rank, world_size, layout, dim=2)]
            + [shard_sequence(g, rank, world_size, layout) for g in grads])  # fmt: skip


# Sequences up to this length get their references in one piece; longer ones by query
# chunks of about 1 GiB of float32 scores (8 heads at 128k in one piece: 512 GiB).
_DENSE_MAX = 16384


def _reference(q, k, v, dout, case, upcast=True, chunk=None):
    """(out, lse, dq, dk, dv) of attention_ref on the full sequence: ``upcast`` float32 (the
    reference), else in the inputs' dtype (PyTorch's own error, the brief's base for the 2x
    rule). By query chunks of ``chunk`` rows (default: the whole sequence up to _DENSE_MAX):
    rows i0..i1 against keys :i1 where the right window bound is 0 (causal: bottom-right
    aligned, so each chunk's mask is the full sequence's rows of it), else all keys; dK / dV
    summed over the chunks in float32 (in the inputs' dtype they round once, after the sum)."""
    from flashattn2._reference import attention_ref

    kwargs = _attn_kwargs(case)
    right_bound_0 = kwargs["causal"] or kwargs["window_size"][1] == 0
    batch, seqlen, nheads, _ = q.shape
    if chunk is None:
        chunk = seqlen if seqlen <= _DENSE_MAX else max(128, 2**28 // (batch * nheads * seqlen))
    assert chunk >= seqlen or right_bound_0 or kwargs["window_size"] == (-1, -1), \
        "chunks: causal or full attention"
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    outs, lses, dqs = [], [], []
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for i0 in range(0, seqlen, chunk):
        i1 = min(seqlen, i0 + chunk)
        end = i1 if right_bound_0 else seqlen
        qc, kc, vc = (cast(t).requires_grad_() for t in (q[:, i0:i1], k[:, :end], v[:, :end]))
        out, lse = attention_ref(qc, kc, vc, upcast=upcast, **kwargs)
        out.backward(cast(dout[:, i0:i1]))
        outs.append(out.detach())
        # detached: the logsumexp node would keep the chunk's float32 scores alive (1 GiB a
        # chunk at 128k; the 64k and 128k cases ran out of an H200's memory that way)
        lses.append(lse.detach())
        dqs.append(qc.grad)
        dk[:, :end] += kc.grad.float()
        dv[:, :end] += vc.grad.float()
    dtype = torch.float32 if upcast else q.dtype
    return [torch.cat(outs, 1), torch.cat(lses, 2), torch.cat(dqs, 1), dk.to(dtype),
            dv.to(dtype)]


def _flash_single(q, k, v, dout, case):
    """(out, lse, dq, dk, dv) of single-GPU flash_attn_func on the full sequence."""
    import flashattn2

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flashattn2.flash_attn_func(*leaves, return_attn_probs=True,
                                             **_attn_kwargs(case))  # fmt: skip
    out.backward(dout)
    return [out.detach(), lse] + [t.grad for t in leaves]


NAMES = ("out", "lse", "dq", "dk", "dv")


def _compare_cpu(ours, ref):
    for name, a, b in zip(NAMES, ours, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda m, n=name: f"{n}: {m}")


def _bound(flash, lowp, ref, atol):
    """The 2x rule's bound of one tensor: twice the larger of the errors of single-GPU
    flash_attn_func and of plain PyTorch in bf16 against the float32 reference, plus atol."""
    err_flash = (flash.float() - ref.float()).abs().max().item()
    err_torch = (lowp.float() - ref.float()).abs().max().item()
    return 2 * max(err_flash, err_torch) + atol, err_flash, err_torch


def _compare_gpu(ours, flash, lowp, ref, atol):
    """The 2x rule for out and gradients, the base the larger of the errors of single-GPU
    flash_attn_func and of plain PyTorch in bf16; LSE within float32 rounding. (The ring sums
    each dK / dV from several bf16 block gradients, one rounding each: ring + softcap, causal,
    GQA 8 / 2 gave dv 5.7e-2 against the single kernel's 2.1e-2, H100 2026-11-25.)"""
    for name, a, f, t, r in zip(NAMES, ours, flash, lowp, ref):
        if name == "lse":
            torch.testing.assert_close(a, r, atol=1e-4, rtol=1e-5)
            continue
        err = (a.float() - r.float()).abs().max().item()
        bound, err_flash, err_torch = _bound(f, t, r, atol)
        assert err <= bound, (
            f"{name}: max |ours - ref| = {err:.3e} > {bound:.3e} "
            f"(single-GPU flash_attn_func: {err_flash:.3e}, PyTorch bf16: {err_torch:.3e})"
        )


_PAIR_GROUPS = {}  # world size -> the process group of ranks 0 and 1 (made once a process)


def _two_rank_results(case, q, k, v, dout, ours, rank, world_size):
    """``vs_world2`` cases: (this world's result gathered whole, the same case run again by
    ranks 0 and 1 as a 2-rank group on the same full sequence, gathered whole); None on
    ranks >= 2 and for other cases. Every rank makes the pair's group (torch.distributed's
    rule) and joins the world's gathers; all of it happens before any comparison."""
    if not case.get("vs_world2"):
        return None
    from flashattn2.distributed import gather_sequence

    layout = case.get("layout", "zigzag")
    if world_size not in _PAIR_GROUPS:
        _PAIR_GROUPS[world_size] = dist.new_group([0, 1])
    pair = _PAIR_GROUPS[world_size]
    dims = [2 if name == "lse" else 1 for name in NAMES]
    whole = [gather_sequence(t, layout=layout, dim=d) for t, d in zip(ours, dims)]
    if rank >= 2:
        return None
    two = _distributed(case, q, k, v, dout, rank, 2, group=pair)
    return whole, [gather_sequence(t, group=pair, layout=layout, dim=d)
                   for t, d in zip(two, dims)]


def _bf16_step(ref):
    """The spacing of bfloat16 numbers at the largest magnitude of ``ref`` (8 bits of
    significand: 2^(floor(log2 max|ref|) - 7))."""
    return 2.0 ** (torch.log2(ref.float().abs().max()).floor().item() - 7)


def _compare_two_ranks(results, flash, lowp, ref, atol, world_size):
    """The whole results of the world and of the 2-rank group agree within the 2x rule's
    bound (the bound each of them is held to against the float32 reference) plus one bf16
    step at the tensor's largest magnitude: each result rounds its own float32 sums to bf16
    once, so the two may sit on either side of a rounding boundary. (Ring, causal, GQA 8 / 2,
    4 ranks against 2 on H200s, 2026-11-26: dv differed by 6.25e-2, one step at |dv| in
    [8, 16), against a bound of 5.8e-2 without the step.)"""
    for name, a, b, f, t, r in zip(NAMES, *results, flash, lowp, ref):
        if name == "lse":
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-5,
                                       msg=lambda m: f"lse, {world_size} ranks vs 2: {m}")
            continue
        err = (a.float() - b.float()).abs().max().item()
        bound, _, _ = _bound(f, t, r, atol)
        step = _bf16_step(r)
        assert err <= bound + step, (
            f"{name}: max |{world_size} ranks - 2 ranks| = {err:.3e} > {bound:.3e} (the 2x "
            f"rule's bound against the reference) + {step:.3e} (one bf16 step)")


def _run_case(case, rank, world_size, device):
    layout = case.get("layout", "zigzag")
    if device.type == "cpu":
        q, k, v, dout = _full_inputs(case, device, torch.float32)
        ours = _distributed(case, q, k, v, dout, rank, world_size)
        _compare_cpu(ours, _shards(_reference(q, k, v, dout, case), rank, world_size, layout))
        return
    q, k, v, dout = _full_inputs(case, device, torch.bfloat16)
    ours = _distributed(case, q, k, v, dout, rank, world_size)
    pair = _two_rank_results(case, q, k, v, dout, ours, rank, world_size)
    flash = _flash_single(q, k, v, dout, case)
    lowp = _reference(q, k, v, dout, case, upcast=False)
    ref = _reference(q, k, v, dout, case)
    atol = case.get("atol", 4e-3)
    _compare_gpu(ours, *(_shards(t, rank, world_size, layout) for t in (flash, lowp, ref)),
                 atol=atol)
    if pair is not None:
        _compare_two_ranks(pair, flash, lowp, ref, atol, world_size)
    del ref, lowp, flash, ours, pair
    torch.cuda.empty_cache()


def _expect_error(case, rank, world_size, device):
    """Error cases: ``case["error"]`` names the check; the call must raise ValueError."""
    import flashattn2.distributed as cp

    seqlen_local = case["seqlen_local"]
    if case["error"] == "mismatched" and rank == 1:
        seqlen_local += 2
    nheads = case.get("nheads", 4)
    q = torch.randn(1, seqlen_local, nheads, 16, device=device)
    k = torch.randn(1, seqlen_local, case.get("nheads_k", nheads), 16, device=device)
    if device.type == "cuda" and case["error"] != "cpu_tensors":
        q, k = q.bfloat16(), k.bfloat16()
    if case["error"] == "cpu_tensors":
        q, k = q.cpu(), k.cpu()
    func = cp.ulysses_attn_func if case["error"] == "ulysses_heads" else cp.ring_attn_func
    try:
        func(q, k, k, causal=True)
    except ValueError as exc:
        if case["match"] not in str(exc):
            raise AssertionError(f"wrong message: {exc}") from None
        return
    raise AssertionError("no ValueError raised")


def _worker(rank, world_size, backend, init_file, cases, result_dir):
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {}
    try:
        for case in cases:
            try:
                if "error" in case:
                    _expect_error(case, rank, world_size, device)
                else:
                    _run_case(case, rank, world_size, device)
                results[case_name(case)] = ""
            except Exception:  # noqa: BLE001  (reported to the test, per case)
                results[case_name(case)] = f"rank {rank}: {traceback.format_exc()}"
            dist.barrier()
    finally:
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        if backend == "nccl":
            dist.destroy_process_group()
    # gloo: destroy_process_group could wait forever on torch 2.4 for a rank that had already
    # exited (CI hung there), and leaving the group to the interpreter's teardown aborted a
    # rank in about one run in four on torch 2.13 ("terminate called without an active
    # exception": a gloo thread still joinable when its destructor ran). The results are on
    # disk, so the rank ends here without any teardown. Reached only when no exception
    # escaped (one that did is the rank's failure and still surfaces through spawn).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_world(world_size, backend, cases, timeout=600):
    """Runs ``cases`` on a fresh ``world_size``-process group; ``{case name: errors}``.
    Raises TimeoutError (killing the ranks) if they have not all ended after ``timeout``
    seconds, so that a hung collective fails the test instead of hanging the suite."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "init")
        context = mp.start_processes(_worker, args=(world_size, backend, init_file, cases, tmp),
                                     nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() >= deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"{world_size} {backend} ranks still running after {timeout} s")
        merged = {case_name(case): "" for case in cases}
        for rank in range(world_size):
            with open(os.path.join(tmp, f"rank{rank}.json")) as f:
                for name, error in json.load(f).items():
                    if error:
                        merged[name] = (merged[name] + "\n" + error).strip()
        return merged
