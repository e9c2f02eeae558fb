#!/usr/bin/env python3
"""A few small flashattn2 forward calls for compute-sanitizer (memcheck, racecheck, synccheck).

    compute-sanitizer --tool memcheck  --error-exitcode 1 python3 scripts/sanitize_subset.py
    compute-sanitizer --tool racecheck --error-exitcode 1 python3 scripts/sanitize_subset.py
    compute-sanitizer --tool synccheck --error-exitcode 1 python3 scripts/sanitize_subset.py

Covers fp16 and bf16, head dims 64, 128, a padded 40, 8 and 16 (the d16 kernels where built), causal (bottom-right aligned,
also sq > sk with fully masked rows) and not, ragged lengths (17, 113, 333), GQA/MQA,
sq = 1, strided q/k/v views of one packed qkv tensor, softcap alone at d64 (its own
kernel instance), head dims 192 and 256 (on sm_90: the Hopper kernels, as is every case of
more than 64 query rows there; d256 dense in one split (forced: the heuristic splits these
small grids): the staged-O instance and its barriers, with FA3's step order from 2048 keys,
also with a warpgroup past seqlen_q; grids a part of a wave past the SMs: the stream-K
tail); dense backwards of head
dims 128, 64 and 40 (on sm_90 the Hopper backward where built); then varlen (empty and
single-token sequences) forward + backward, and KV-cache calls (contiguous and paged with
16-row pages, appended tokens, split-KV merged in the decode kernel and by the combine
kernel); in builds with the
attention bias (FLASHATTN2_EXPERIMENTAL=bias), forward + backward with a broadcast bias
read through strides and its gradient written (ragged tails: reads and writes at the
bias's edges); float32 forward + backward under full precision and TF32 (the Hopper float32
kernels' 3xTF32 and single-TF32 instances). Inputs are made on the CPU
and copied over, and the float32 reference runs on the CPU, so the kernels the
sanitizer instruments are (almost) only ours. Exits 1 on any mismatch or error.

Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under memcheck: otherwise torch's caching
allocator hands out pieces of big segments and a read past a tensor's end stays inside
a valid allocation, invisible to memcheck (scripts/gpu_check.sh sets it).
"""
import math
import os
import sys

import torch

import flashattn2
from flashattn2 import _launch

# Cases whose persistent CTAs walk two or more tiles, so that the producer rewrites a slot of
# published tile work (fwd_tile.cuh, a ring of two) once the consumers' tile_empty arrivals say
# they read it. racecheck does not see mbarrier ordering and reports each rewrite as a
# shared-memory hazard, so under racecheck (FLASHATTN2_SANITIZE_TOOL, set by gpu_check.sh) these
# run under memcheck and synccheck only; test_sm90_stream_k.py and test_sm90.py's tile counter
# tests check their results on the GPU (benchmarks/NOTES.md, sixteenth session).
MULTI_TILE = [
    (1, 300, 2049, 67, 67, 128, False, torch.bfloat16, False, 0.0, 1),
    (1, 200, 2048, 67, 67, 64, False, torch.float16, False, 0.0, 1),
]

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, dtype, packed_qkv[, softcap[,
# num_splits]]) (num_splits: forced through _launch._flash_attn_forward; else the heuristic's)
CASES = [
    (2, 128, 128, 4, 4, 64, False, torch.bfloat16, False),
    (2, 128, 128, 4, 4, 64, True, torch.float16, True),
    (1, 17, 113, 4, 2, 128, True, torch.bfloat16, False),
    (2, 113, 17, 6, 2, 40, True, torch.float16, False),    # sq > sk: first rows see no key
    (1, 113, 113, 2, 1, 40, False, torch.bfloat16, False),
    (3, 1, 113, 8, 2, 128, False, torch.float16, False),
    (1, 200, 333, 2, 2, 128, True, torch.bfloat16, False),
    (2, 200, 333, 4, 2, 64, False, torch.bfloat16, False, 5.0),
    (1, 130, 130, 2, 2, 64, True, torch.float16, False, 30.0),
    # More than 64 query rows on an sm_90 GPU: the Hopper kernels (TMA, wgmma, mbarriers).
    (1, 300, 517, 4, 1, 256, True, torch.bfloat16, False),
    (2, 257, 200, 3, 3, 192, False, torch.float16, True),
    # d256 dense full attention in one split (the heuristic splits these small grids): O
    # staged in the last K / V stage (fwd_kernel.cuh kStageO, its kBarStageO barriers), GQA;
    # 2049 keys take FA3's step order (FLASHATTN2_SM90_FA3_ORDER: no turns, O rescaled before
    # P V), 1500 the ping-pong order; sq 130: warpgroup 1 of the second tile has no rows (no
    # key steps), sq 200: query tails in both tiles
    (1, 200, 2049, 8, 2, 256, False, torch.bfloat16, False, 0.0, 1),
    (1, 130, 2049, 4, 1, 256, False, torch.float16, False, 0.0, 1),
    (1, 200, 1500, 8, 2, 256, False, torch.bfloat16, False, 0.0, 1),
    (1, 130, 1500, 4, 1, 256, False, torch.float16, False, 0.0, 1),
    # Dense grids of more tiles than an H100's 132 SMs by part of a wave: the stream-K tail
    # (fwd_config.h sm90_fwd_stream_k: split tiles merged through the float32 workspace and
    # its flags): d128 201 tiles of 17 key blocks (a key tail); d64 134 tiles of 16
    # (MULTI_TILE: not under racecheck).
    *MULTI_TILE,
    # Head dims 1-16: the d16 kernels where built (FLASHATTN2_HEAD_DIMS with 16), else d32.
    (2, 113, 17, 6, 2, 16, True, torch.float16, False),
    (1, 200, 333, 4, 1, 8, False, torch.bfloat16, False),
    (1, 130, 130, 2, 2, 16, True, torch.float16, True, 30.0),
]
ATOL = {torch.float16: 1e-2, torch.bfloat16: 4e-2}   # loose: this is a sanitizer harness


def reference(q, k, v, causal, softcap=0.0, bias=None):
    """float32 SDPA math on the CPU, flash-attn semantics: bottom-right causal, GQA, softcap,
    an additive ``bias`` (broadcastable to (b, h, sq, sk)), fully masked rows give out = 0
    and lse = +inf. Returns out (b, sq, h, d), lse (b, h, sq)."""
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))    # (b, h, s, d)
    group = qf.shape[1] // kf.shape[1]
    kf, vf = kf.repeat_interleave(group, 1), vf.repeat_interleave(group, 1)
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(qf.shape[-1])
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias
    if causal:
        sq, sk = scores.shape[-2:]
        visible = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
        scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, -1)
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    return (probs @ vf).transpose(1, 2), lse.masked_fill(lse == -math.inf, math.inf)


def run_case(case, gen):
    """Inputs are made on the CPU (q, k, v) and copied (qg, kg, vg); packed: q, k, v are
    strided views into one (b, s, 3, h, d) tensor on both sides."""
    b, sq, sk, h, hk, d, causal, dtype, packed, *mods = case
    softcap = mods[0] if mods else 0.0
    num_splits = mods[1] if len(mods) > 1 else 0
    if packed:
        qkv = torch.randn(b, sq, 3, h, d, generator=gen).to(dtype)
        q, k, v = qkv.unbind(2)
        qg, kg, vg = qkv.cuda().unbind(2)
    else:
        q, k, v = (torch.randn(b, s, n, d, generator=gen).to(dtype)
                   for s, n in ((sq, h), (sk, hk), (sk, hk)))
        qg, kg, vg = (x.cuda() for x in (q, k, v))
    if num_splits:
        out = torch.full_like(qg, math.nan)  # (NaN: rows the kernel missed fail)
        lse = torch.full((b, h, sq), math.nan, device=qg.device)
        _launch._flash_attn_forward(qg, kg, vg, d**-0.5, -1, 0 if causal else -1, out, lse,
                                    softcap=softcap, num_splits=num_splits)
    else:
        out, lse, _ = flashattn2.flash_attn_func(qg, kg, vg, causal=causal, softcap=softcap,
                                                 return_attn_probs=True)
    torch.cuda.synchronize()
    out, lse = out.cpu().float(), lse.cpu()
    ref_out, ref_lse = reference(q, k, v, causal, softcap)
    out_err = (out - ref_out).abs().max().item()
    finite = torch.isfinite(ref_lse)
    lse_err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    ok = (out.shape == ref_out.shape and out_err <= ATOL[dtype] and lse_err <= 1e-2
          and torch.equal(torch.isfinite(lse), finite))
    return ok, f"out err {out_err:.2e}, lse err {lse_err:.2e}"


# Dense backwards: (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, dtype[,
# deterministic[, dq chains (None: the default choice)]]). On sm_90 those of head dims 64
# (where built) and 128 run the Hopper backward (TMA, wgmma, mbarriers, bulk reduces into
# dq_accum; deterministic: its ordered reduces, descending for causal, rotated for full
# attention, ascending with more key than query blocks, in 1-4 dQ chains), and d256 its
# column-split kernel where built (FLASHATTN2_SM90_BWD_EXPERIMENTAL=d256; else the
# mma.sync d256 backward; deterministic too with dq_warp); the name says which ran.
BWD_CASES = [
    (1, 200, 333, 4, 2, 128, True, torch.bfloat16),
    (2, 113, 113, 2, 2, 128, False, torch.float16),
    (1, 77, 130, 4, 1, 64, True, torch.bfloat16),  # sq <= sk: every row sees a key
    (1, 65, 129, 2, 2, 40, False, torch.float16),
    (1, 300, 333, 4, 2, 128, True, torch.bfloat16, True),
    (2, 300, 257, 2, 2, 128, False, torch.bfloat16, True),
    # d64 steps of 128 query rows: tails in both halves, deterministic orders
    (1, 300, 333, 4, 2, 64, True, torch.bfloat16, True),
    (2, 300, 257, 2, 2, 64, False, torch.float16, True),
    # dQ chains: rotated (3 key blocks in 4 chains), ascending (5 key blocks, 2 query tiles)
    (1, 300, 333, 4, 2, 128, False, torch.bfloat16, True, 4),
    (1, 129, 600, 4, 2, 64, False, torch.bfloat16, True, 2),
    # d256: 64-key CTAs with a key tail, query tails in both warpgroups' halves, GQA
    (1, 130, 200, 4, 2, 256, True, torch.bfloat16),
    # d256 deterministic (dq_warp builds): dQ staged in the stages' sQ / sdO chunks, warp 2's
    # reduces and stage releases; descending (causal) and rotated (full, 2 chains), tails
    (1, 130, 200, 4, 2, 256, True, torch.float16, True),
    (2, 200, 130, 2, 1, 256, False, torch.bfloat16, True, 2),
    # d16 (where built): each warp's partial dK / dV summed in the epilogue, 2-lane row copies
    (1, 200, 333, 4, 2, 16, True, torch.bfloat16),
    (2, 113, 129, 2, 2, 8, False, torch.float16, True),
]


def backward_cases(gen):
    """(name, ok, detail) for dense backwards against float32 autograd through the CPU
    reference on the same data (error bound as ATOL, scaled: a sanitizer harness)."""
    results = []
    for b, sq, sk, h, hk, d, causal, dtype, *det in BWD_CASES:
        if flashattn2._ext.KERNEL_HEAD_DIM[d] not in flashattn2._ext.build_info()["bwd_head_dims"]:
            continue  # a build without this head dim (e.g. HEAD_DIMS=64;128)
        deterministic = bool(det and det[0])
        chains = det[1] if len(det) > 1 else None
        q, k, v = (torch.randn(b, s, n, d, generator=gen).to(dtype)
                   for s, n in ((sq, h), (sk, hk), (sk, hk)))
        dout = torch.randn(b, sq, h, d, generator=gen).to(dtype)
        leaves = [x.cuda().requires_grad_() for x in (q, k, v)]
        out = flashattn2.flash_attn_func(*leaves, causal=causal, deterministic=deterministic)
        with flashattn2._ext.dq_chains(chains):
            grads = torch.autograd.grad(out, leaves, dout.cuda())
        torch.cuda.synchronize()
        arch = flashattn2._ext.last_bwd_arch
        ref_leaves = [x.float().requires_grad_() for x in (q, k, v)]
        ref_out, _ = reference(*ref_leaves, causal)
        ref_grads = torch.autograd.grad(ref_out, ref_leaves, dout.float())
        err = max((g.cpu().float() - r).abs().max().item() for g, r in zip(grads, ref_grads))
        name = (f"bwd b{b} sq{sq} sk{sk} h{h}/{hk} d{d} {'causal' if causal else 'full'} "
                f"{str(dtype).removeprefix('torch.')}{' deterministic' if deterministic else ''}"
                f"{f' {chains} chains' if chains else ''} (sm{arch} backward)")
        results.append((name, err <= 4 * ATOL[dtype], f"max grad err {err:.2e}"))
    return results


def _set_tf32(on):
    """Sets PyTorch's float32-matmul setting, which flashattn2 follows (_ext.fp32_tf32), and
    returns a function that puts the previous one back."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if on else "ieee"
        return lambda: setattr(matmul, "fp32_precision", before)
    before = matmul.allow_tf32
    matmul.allow_tf32 = on
    return lambda: setattr(matmul, "allow_tf32", before)


def float32_cases(gen):
    """(name, ok, detail) for float32 forward + backward (where built) against float32 autograd
    on the CPU, under PyTorch's full precision (3xTF32) and under TF32 (the single-TF32
    instances of the Hopper float32 kernels, whose backward producers stage the next step's
    rows by cp.async, zero-filled past seqlen_q and the head dim): d128 and d64, ragged
    lengths (a query tail in the producer's steps, a key tail in the CTA), causal with sq < sk,
    GQA, a head dim padded to the kernel's (d 40 -> 64). Loose bounds (a sanitizer harness;
    tests/test_fp32*.py hold the accuracy rules)."""
    if "fp32" not in flashattn2.build_info().get("experimental", ()):
        return []
    results = []
    restore = _set_tf32(False)
    try:
        for tf32 in (False, True):
            _set_tf32(tf32)
            for b, sq, sk, h, hk, d, causal in ((1, 113, 203, 4, 2, 128, True),
                                                (2, 77, 77, 2, 2, 128, False),
                                                (1, 100, 150, 2, 1, 64, True),
                                                (2, 45, 70, 2, 2, 40, False)):
                q, k, v = (torch.randn(b, s, n, d, generator=gen)
                           for s, n in ((sq, h), (sk, hk), (sk, hk)))
                dout = torch.randn(b, sq, h, d, generator=gen)
                leaves = [x.cuda().requires_grad_() for x in (q, k, v)]
                out = flashattn2.flash_attn_func(*leaves, causal=causal)
                grads = torch.autograd.grad(out, leaves, dout.cuda())
                torch.cuda.synchronize()
                kernels = f"{flashattn2._ext.last_fwd_kernel} / {flashattn2._ext.last_bwd_kernel}"
                ref_leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                ref_out, _ = reference(*ref_leaves, causal)
                ref_grads = torch.autograd.grad(ref_out, ref_leaves, dout)
                err = max((x.cpu() - r).abs().max().item()
                          for x, r in zip((out, *grads), (ref_out, *ref_grads)))
                name = (f"float32 {'tf32' if tf32 else 'ieee'} b{b} sq{sq} sk{sk} h{h}/{hk} d{d} "
                        f"{'causal' if causal else 'full'} ({kernels})")
                results.append((name, err <= (1e-2 if tf32 else 1e-4), f"max err {err:.2e}"))
    finally:
        restore()
    return results


def layout_cases(gen):
    """(name, ok, detail) for the varlen and KV-cache paths, checked against the dense path
    (itself checked above) on the same data."""
    results = []
    dev, dtype = "cuda", torch.bfloat16
    lengths = [5, 0, 70, 1]
    cu = torch.tensor([0, 5, 5, 75, 76], dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(76, h, 64, generator=gen).to(dtype).to(dev).requires_grad_()
               for h in (4, 2, 2))
    out = flashattn2.flash_attn_varlen_func(q, k, v, cu, cu, 70, 70, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    err = 0.0
    for start, n in zip(cu.tolist(), lengths):
        if n == 0:
            continue
        s = slice(start, start + n)
        sub = [t.detach()[s].unsqueeze(0).requires_grad_() for t in (q, k, v)]
        ref = flashattn2.flash_attn_func(*sub, causal=True)
        ref_grads = torch.autograd.grad(ref, sub, torch.ones_like(ref))
        err = max(err, (out[s] - ref[0]).abs().max().item(),
                  *((g[s] - r[0]).abs().max().item() for g, r in zip(grads, ref_grads)))
    torch.cuda.synchronize()
    results.append(("varlen fwd+bwd", err <= 5e-2, f"max err {err:.2e}"))

    # (the decode kernel, its splits merged by the combine kernel; with left padding, tiles
    # that cross a page end take the copy's per-slot path)
    for page, pads in ((0, None), (16, None), (16, [5, 3])):
        cache = torch.randn(2, 256, 2, 128, generator=gen).to(dtype).to(dev)
        vcache = torch.randn(2, 256, 2, 128, generator=gen).to(dtype).to(dev)
        qd = torch.randn(2, 1, 8, 128, generator=gen).to(dtype).to(dev)
        kn = torch.randn(2, 1, 2, 128, generator=gen).to(dtype).to(dev)
        vn = torch.randn(2, 1, 2, 128, generator=gen).to(dtype).to(dev)
        lens = [37, 255]
        kw = dict(cache_seqlens=torch.tensor(lens, dtype=torch.int32, device=dev), num_splits=3)
        if pads:
            kw["cache_leftpad"] = torch.tensor(pads, dtype=torch.int32, device=dev)
        kc, vc = cache.clone(), vcache.clone()
        if page:
            table = torch.arange(2 * 256 // page, dtype=torch.int32, device=dev).flip(0).view(2, -1)
            kc = torch.empty(2 * 256 // page, page, 2, 128, dtype=dtype, device=dev)
            vc = torch.empty_like(kc)
            kc[table.flatten().long()] = cache.reshape(-1, page, 2, 128)
            vc[table.flatten().long()] = vcache.reshape(-1, page, 2, 128)
            kw["block_table"] = table
        out = flashattn2.flash_attn_with_kvcache(qd, kc, vc, kn, vn, **kw)
        err = 0.0
        for b, n in enumerate(lens):
            pad = pads[b] if pads else 0
            keys = torch.cat([cache[b, pad:n], kn[b]]).unsqueeze(0)
            vals = torch.cat([vcache[b, pad:n], vn[b]]).unsqueeze(0)
            ref = flashattn2.flash_attn_func(qd[b : b + 1], keys, vals)
            err = max(err, (out[b] - ref[0]).abs().max().item())
        torch.cuda.synchronize()
        results.append((f"kvcache {'paged 16' if page else 'contiguous'}"
                        f"{' left-padded' if pads else ''} split 3",
                        err <= 5e-2, f"max err {err:.2e}"))
    return results


def bias_cases(gen):
    """(name, ok, detail) for attention with a bias (where built): forward + backward against
    float32 autograd on the CPU. With the gradient (the mma.sync backward): a float32
    (b, 1, sq, sk) bias (0-stride heads: float32 atomics into a (b, 1, sq, sk) plane), a bf16
    (1, h, sq, 264) one (16-byte rows: the staged tile; atomics over the batch) and a full
    bf16 one with an odd sk (pairs stored straight into the gradient, padded rows); without:
    a bool key mask and a constant bias whose rows are a view of wider ones (sk = 203 of 208:
    the staged copies' partial chunks; on sm_90 the Hopper backward). With the gradient and
    16-byte rows, which the Hopper backward writes under FLASHATTN2_SM90_DBIAS=1: a full bf16
    (2, 2, 90, 200) one, d64 causal (16-byte stores through the staged tile), and a full bf16
    one viewed out of wider rows (sk = 203 of 208: a chunk across seqlen_k into the padding)."""
    if "bias" not in flashattn2.build_info().get("experimental", ()):
        return []
    results = []
    for b, sq, sk, h, hk, d, causal, kind in ((2, 77, 113, 4, 2, 64, True, "float"),
                                              (2, 100, 264, 4, 2, 64, True, "batch"),
                                              (2, 90, 203, 2, 2, 128, False, "full"),
                                              (1, 70, 200, 2, 2, 128, False, "bool"),
                                              (2, 130, 203, 2, 2, 128, True, "view"),
                                              (2, 90, 200, 2, 2, 64, True, "full16"),
                                              (2, 77, 203, 2, 2, 128, False, "viewgrad")):
        q, k, v = (torch.randn(b, s, n, d, generator=gen).to(torch.bfloat16)
                   for s, n in ((sq, h), (sk, hk), (sk, hk)))
        grad = kind in ("float", "batch", "full", "full16", "viewgrad")
        if kind == "float":
            bias = torch.randn(b, 1, sq, sk, generator=gen)
        elif kind in ("batch", "full", "full16"):
            bias = torch.randn(1 if kind == "batch" else b, h, sq, sk,
                               generator=gen).to(torch.bfloat16)
        elif kind in ("view", "viewgrad"):
            bias = torch.randn(b, 1 if kind == "view" else h, sq, 208,
                               generator=gen).to(torch.bfloat16)
        else:
            bias = torch.rand(b, 1, 1, sk, generator=gen) > 0.3
        dout = torch.randn(b, sq, h, d, generator=gen).to(torch.bfloat16)
        leaves = [x.cuda().requires_grad_() for x in (q, k, v)]
        bias_g = bias.cuda().requires_grad_(grad)
        if kind in ("view", "viewgrad"):
            bias, bias_g = bias[..., :sk], bias_g[..., :sk]  # rows 416 bytes apart
        out = flashattn2.flash_attn_func(*leaves, causal=causal, attn_bias=bias_g)
        wrt = leaves + ([bias_g] if grad else [])
        grads = torch.autograd.grad(out, wrt, dout.cuda())
        torch.cuda.synchronize()
        ref_leaves = [x.float().requires_grad_() for x in (q, k, v)]
        ref_bias = bias.float().requires_grad_() if grad else \
            bias.float() if kind == "view" else \
            torch.zeros(bias.shape).masked_fill(~bias, -math.inf)
        ref_out, _ = reference(*ref_leaves, causal, bias=ref_bias)
        ref_wrt = ref_leaves + ([ref_bias] if grad else [])
        ref_grads = torch.autograd.grad(ref_out, ref_wrt, dout.float())
        err = max((g.cpu().float() - r).abs().max().item()
                  for g, r in zip((out, *grads), (ref_out, *ref_grads)))
        arch = flashattn2._ext.last_bwd_arch
        results.append((f"bias {kind} b{b} sq{sq} sk{sk} d{d} {'causal' if causal else 'full'} "
                        f"(sm{arch} backward)",
                        err <= 4 * ATOL[torch.bfloat16], f"max err {err:.2e}"))
    return results


def main():
    if not torch.cuda.is_available():
        sys.exit("sanitize_subset.py: no CUDA device")
    gen = torch.Generator().manual_seed(0)
    failures = 0
    racecheck = os.environ.get("FLASHATTN2_SANITIZE_TOOL") == "racecheck"
    for case in CASES:
        if racecheck and case in MULTI_TILE:
            continue
        b, sq, sk, h, hk, d, causal, dtype, packed, *mods = case
        name = (f"b{b} sq{sq} sk{sk} h{h}/{hk} d{d} {'causal' if causal else 'full'} "
                f"{str(dtype).removeprefix('torch.')}{' packed' if packed else ''}"
                f"{f' softcap {mods[0]:g}' if mods and mods[0] else ''}"
                f"{f' splits {mods[1]}' if len(mods) > 1 else ''}")
        try:
            ok, detail = run_case(case, gen)
        except Exception as e:  # report every case, not just the first failure
            ok, detail = False, f"{type(e).__name__}: {e}"
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    layout = []
    for part, cases in (("dense backward", backward_cases), ("varlen / kvcache", layout_cases),
                        ("bias", bias_cases), ("float32", float32_cases)):
        try:
            layout += cases(gen)
        except Exception as e:
            layout.append((part, False, f"{type(e).__name__}: {e}"))
    for name, ok, detail in layout:
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    total = len(CASES) - (len(MULTI_TILE) if racecheck else 0) + len(layout)
    print(f"{total - failures}/{total} cases ok")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
