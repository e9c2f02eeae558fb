"""The decode kernel (cpp/sm80/decode_kernel.cuh; builds with FLASHATTN2_EXPERIMENTAL=decode).

GPU (skipped without the build item): flash_attn_with_kvcache on what the kernel takes
(seqlen_q * h / h_k <= 16 rows, kernel head dim 64 / 128) against the float32 reference with
the error rule of test_fwd.py, through test_kvcache.py's run_case (ragged cache_seqlens,
appended keys, rotary, pages 16 / 64 / 256, cache_batch_idx, left padding, windows, forced
and heuristic splits) and NaN-poisoned out / lse (kvcache_kernel); softcap and ALiBi;
flash_attn_func with few rows and the backward on its out / LSE; that the decode kernel ran
there (_ext.last_fwd_kernel) and the KV kernel for an out-of-scope call and with the runtime
switch off; split counts up to kMaxSplits (ragged lengths, splits without keys) merged by the
combine kernel; NaN / Inf in the cache memory past the lengths; the two copy layouts; the
split heuristic's unsplit full grid. CPU: the runtime switch and its plumbing into _C (every
argument by position, in the binding's order), the split workspace as one buffer.
"""
import re

import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func, flash_attn_with_kvcache
from flashattn2._launch import _launch_fwd
from reference import attention_ref
from test_bwd import check_grads
from test_fwd import LSE_ATOL, LSE_RTOL, dtype_id
from test_kvcache import check_against_reference, check_rule, kvcache_kernel, paged_kv, run_case

gpu = pytest.mark.gpu
needs_decode = pytest.mark.skipif("decode" not in _ext.EXPERIMENTAL,
                                  reason="needs a build with FLASHATTN2_EXPERIMENTAL=decode")
HEADS = {"gqa32_8": (32, 8), "mha8_8": (8, 8), "mqa16_1": (16, 1)}


def assert_kernel(name):
    assert _ext.last_fwd_kernel == name, f"ran {_ext.last_fwd_kernel}, expected {name}"


def decode_case(**kwargs):
    """run_case (test_kvcache.py) on a shape the decode kernel takes; checks that it ran."""
    run_case(**kwargs)
    assert_kernel("decode")


@gpu
@needs_decode
@pytest.mark.parametrize("cache_len", [1, 7, 100, 1000, 4097])
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("heads", list(HEADS), ids=str)
@pytest.mark.parametrize("seqlen_q", [1, 2, 4])
def test_shapes(seqlen_q, heads, headdim, cache_len):
    """sq 1 / 2 / 4 x GQA / MHA / MQA x d64 / d128 x cache lengths around the 16-key tile and
    the splits, ragged cache_seqlens, causal, appended keys where the cache has room."""
    nheads, nheads_k = HEADS[heads]
    if seqlen_q * nheads // nheads_k > 16:
        pytest.skip("more than 16 packed rows: the KV kernel's (test_out_of_scope)")
    new = seqlen_q if cache_len >= seqlen_q else 0
    decode_case(seqlen_q=seqlen_q, nheads=nheads, nheads_k=nheads_k, headdim=headdim,
                cache_len=cache_len, new=new)


@gpu
@needs_decode
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("case", ["page16", "page64", "page256", "batch_idx", "leftpad",
                                  "leftpad_page64", "rotary", "rotary_leftpad", "causal_sq4",
                                  "window", "window_left", "full", "d96"])
def test_layouts(case, dtype):
    kwargs = {
        "page16": dict(paged=16, new=1),
        "page64": dict(paged=64, seqlen_q=2, new=2),
        "page256": dict(paged=256, seqlen_q=4, new=4, cache_len=2048),
        "batch_idx": dict(batch_idx=True, new=1),
        "leftpad": dict(leftpad=True, new=1),
        "leftpad_page64": dict(leftpad=True, paged=64, seqlen_q=4, new=4),
        "rotary": dict(seqlen_q=4, new=4, rotary="neox"),
        "rotary_leftpad": dict(seqlen_q=2, new=2, rotary="interleaved", leftpad=True, paged=64),
        "causal_sq4": dict(seqlen_q=4, new=4, causal=True),
        "window": dict(seqlen_q=4, new=4, window_size=(100, 0)),
        "window_left": dict(seqlen_q=2, new=2, causal=False, window_size=(37, -1)),
        "full": dict(seqlen_q=4, new=4, causal=False),
        "d96": dict(headdim=96, new=1),  # on the d128 kernel, zero-padded
    }[case]
    kwargs.setdefault("cache_len", 1024)
    if _ext.KERNEL_HEAD_DIM[kwargs.get("headdim", 128)] not in (64, 128):
        pytest.skip("the decode kernel is built for kernel head dims 64 and 128")
    decode_case(dtype=dtype, nheads=16, nheads_k=4, **kwargs)


@gpu
@needs_decode
@pytest.mark.parametrize("leftpad", [False, True], ids=["aligned", "leftpad"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_long_paged_cache_in_one_split(headdim, leftpad):
    """One split over up to 5119 keys in shuffled 16-key pages: each warp steps through up to 80
    tiles, so its block-table entries come in three batches of 32 steps (decode_kernel.cuh,
    pages_cur / pages_next, shuffled to the issuing step); with left padding the tiles straddle
    pages. d128 copies whole rows here, d64 the default layout."""
    decode_case(headdim=headdim, cache_len=5120, paged=16, leftpad=leftpad, num_splits=1,
                batch=2, nheads=8, nheads_k=2)


@gpu
@needs_decode
@pytest.mark.parametrize("headdim", [64, 128])
def test_grid_of_several_waves(headdim):
    """~3.9 4-warp CTAs an SM (b64 x 8 KV heads on 132 SMs): more than the SMs hold at once, so
    the grid runs 2-warp CTAs, which they hold in one wave (flash_api_splits.cpp decode_launch;
    d128 4 an SM, d64 6); every CTA's rows checked."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = -(-sms * 31 // 8 // 8)  # ceil(3.875 x SMs / 8 KV heads)
    decode_case(headdim=headdim, cache_len=300, batch=batch, nheads=32, nheads_k=8, new=1)


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 40, 0], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("headdim", [64, 128])
def test_splits(headdim, num_splits):
    """Forced split counts (the partials merged by the combine kernel; some splits without a
    key tile at 40) and the heuristic (0)."""
    decode_case(headdim=headdim, cache_len=2048, num_splits=num_splits, batch=2, seqlen_q=2,
                new=2, nheads=8, nheads_k=2)


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("paged", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_every_row_written(seqlen_q, mask, paged, num_splits):
    """NaN-poisoned out / lse (kvcache_kernel): every row of every head is written, entries
    with no visible key included (cache_seqlens 0 and 2 < seqlen_q under causal)."""
    nheads, nheads_k, headdim, cache_len = 32, 8, 128, 1024
    gen = torch.Generator().manual_seed(seqlen_q)
    q = torch.randn(4, seqlen_q, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(4, cache_len, nheads_k, headdim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([cache_len, 0, 2, 333], dtype=torch.int32)
    causal = mask != "full"
    window_size = (40, -1) if mask == "window" else (-1, -1)
    kc, vc, table = k_cache, v_cache, None
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, gen)
    out, lse = kvcache_kernel(q, kc, vc, seqlens.to("cuda"), table, causal, window_size,
                              num_splits)
    assert_kernel("decode")
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, causal, window_size)


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [1, 3, 0], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("paged", [0, 16, 256], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("seqlen_q", [1, 4])
def test_unused_cache_memory_is_never_used(seqlen_q, headdim, paged, num_splits):
    """A cache allocated with torch.empty holds anything past cache_seqlens: here NaN and Inf
    in those rows, paged also in the unused pages, with the block-table entries past an
    entry's pages pointing anywhere (-1, past the cache). out and lse must be those of the
    visible keys only (no 0 x NaN from a masked key's V row), wherever the lengths fall in a
    16-key tile, split or not. (A probe that read a tile's rows before knowing the length
    relied on this: jobs/s35_decode_early.patch.)"""
    nheads, nheads_k, cache_len = 16, 4, 512
    gen = torch.Generator().manual_seed(headdim + seqlen_q)
    q = torch.randn(6, seqlen_q, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(6, cache_len, nheads_k, headdim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([1, 17, 37, 100, 130, 509], dtype=torch.int32)
    for b, n in enumerate(seqlens.tolist()):
        k_cache[b, n:] = float("nan")
        v_cache[b, n:] = float("nan")
        v_cache[b, n + 1 :: 2] = float("inf")
    kc, vc, table = k_cache, v_cache, None
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, gen)
        used = torch.zeros(kc.shape[0], dtype=torch.bool)
        for b, n in enumerate(seqlens.tolist()):
            pages = -(-n // paged)
            used[table[b, :pages].long().cpu()] = True
            bad = torch.tensor([-1, kc.shape[0] + 7], dtype=torch.int32, device=table.device)
            table[b, pages:] = bad.repeat(table.shape[1])[: table.shape[1] - pages]
        kc[~used.to(kc.device)] = float("nan")
        vc[~used.to(vc.device)] = float("inf")
    out, lse = kvcache_kernel(q, kc, vc, seqlens.to("cuda"), table, True, (-1, -1), num_splits)
    assert_kernel("decode")
    assert not out.isnan().any() and not lse.isnan().any()
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, True, (-1, -1))


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [1, 3], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("paged", [0, 16], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("ramp", [4.0, 0.25, -1.0], ids=["steep", "gentle", "falling"])
@pytest.mark.parametrize("headdim", [64, 128])
def test_scores_rising_along_the_walk(headdim, ramp, paged, num_splits):
    """The lazy reference max (decode_kernel.cuh, step): a warp walks its tiles from the last
    key down, and its row max moves only when a tile would give a P above 2^8. Key norms grow
    by `ramp` every 16 keys toward the cache start, so along the walk the scores rise by far
    more than that every tile ("steep": a rescale each step, scores in the thousands), by a
    few units of log2 ("gentle": P between 1 and 2^8 between rescales), or fall ("falling":
    none after the first tile). Ragged lengths, pages, splits; the 2x rule and LSE."""
    nheads, nheads_k, cache_len = 16, 4, 1024
    gen = torch.Generator().manual_seed(headdim)
    q = torch.randn(3, 1, nheads, headdim, device="cuda", dtype=torch.bfloat16)
    k_cache = torch.randn(3, cache_len, nheads_k, headdim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tiles_from_end = (cache_len - 1 - torch.arange(cache_len, device="cuda")) // 16
    norm = 1 + ramp * tiles_from_end if ramp > 0 else 1 + torch.arange(cache_len, device="cuda") // 16
    k_cache *= norm.to(k_cache.dtype)[None, :, None, None]
    seqlens = torch.tensor([cache_len, 700, 333], dtype=torch.int32)
    kc, vc, table = k_cache, v_cache, None
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, gen)
    out, lse = kvcache_kernel(q, kc, vc, seqlens.to("cuda"), table, False, (-1, -1), num_splits)
    assert_kernel("decode")
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, False, (-1, -1))


@gpu
@needs_decode
def test_row_strides_past_the_copy_offsets_run_the_kv_kernel():
    """The decode copies address a tile's rows by 32-bit element offsets (decode_config.h
    decode_row_offsets_fit): a cache whose row stride is 2^30 elements (K and V interleaved
    in rows of one 4 GiB buffer, 3 rows) runs the KV kernel, correctly; a stride just inside
    the bound runs the decode kernel, correctly."""
    headdim, n = 64, 3
    free, _ = torch.cuda.mem_get_info()
    if free < 6 * 2**30:
        pytest.skip("needs 6 GiB of free GPU memory")
    for stride, kernel in ((2**30, "sm80"), (2**31 // 17 // 8 * 8, "decode")):
        buf = torch.empty((n - 1) * stride + 2 * headdim, device="cuda", dtype=torch.bfloat16)
        k_cache = buf.as_strided((1, n, 1, headdim), (0, stride, headdim, 1))
        v_cache = buf.as_strided((1, n, 1, headdim), (0, stride, headdim, 1), headdim)
        k_cache.copy_(torch.randn(1, n, 1, headdim))
        v_cache.copy_(torch.randn(1, n, 1, headdim))
        q = torch.randn(1, 1, 4, headdim, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.tensor([n], dtype=torch.int32)
        out, lse = kvcache_kernel(q, k_cache, v_cache, seqlens.to("cuda"))
        assert_kernel(kernel)
        check_against_reference(out, lse, q, k_cache, v_cache, seqlens, False, (-1, -1))
        del buf, k_cache, v_cache


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [1, 0], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("mods", ["softcap", "alibi", "softcap_alibi"])
@pytest.mark.parametrize("heads", ["gqa32_8", "mqa16_1"])
def test_score_mods(heads, mods, num_splits):
    """Softcap (heads packed) and ALiBi (per-head slopes: one query head per CTA) with causal
    sq 2, ragged cache_seqlens."""
    nheads, nheads_k = HEADS[heads]
    seqlen_q = 2 if nheads // nheads_k <= 8 else 1
    dtype, headdim, cache_len, batch = torch.bfloat16, 128, 777, 3
    q = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, cache_len, nheads_k, headdim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([cache_len, 17, 500], dtype=torch.int32)
    softcap = 10.0 if "softcap" in mods else 0.0
    slopes = (torch.rand(batch, nheads, device="cuda") * 0.3 if "alibi" in mods else None)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens.to("cuda"),
                                       causal=True, softcap=softcap, alibi_slopes=slopes,
                                       num_splits=num_splits, return_softmax_lse=True)
    assert_kernel("decode")
    outs_ref, outs_pt, lses_ref = [], [], []
    for b, n in enumerate(seqlens.tolist()):
        args = (q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n])
        kw = dict(causal=True, softcap=softcap,
                  alibi_slopes=None if slopes is None else slopes[b])
        o, l = attention_ref(*args, **kw)
        o_pt, _ = attention_ref(*args, upcast=False, **kw)
        outs_ref.append(o), outs_pt.append(o_pt), lses_ref.append(l)
    check_rule("out", out, torch.cat(outs_ref), torch.cat(outs_pt), dtype)
    torch.testing.assert_close(lse, torch.cat(lses_ref), atol=LSE_ATOL, rtol=LSE_RTOL)


@gpu
@needs_decode
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_attn_func_few_rows_and_its_backward(causal):
    """flash_attn_func with 3 query rows x group 4 runs the decode kernel (heuristic splits);
    its out and LSE are what the backward needs (gradients against the reference's)."""
    q = torch.randn(2, 3, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 900, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 900, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert_kernel("decode")
    args = tuple(t.detach() for t in (q, k, v))
    ref, lse_ref = attention_ref(*args, causal=causal)
    ref_pt, _ = attention_ref(*args, causal=causal, upcast=False)
    check_rule("out", out, ref, ref_pt, q.dtype)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)
    dout = torch.randn_like(out)
    check_grads(torch.autograd.grad(out, (q, k, v), dout), *args, dout, causal=causal)


@gpu
@needs_decode
def test_out_of_scope_and_switched_off_run_the_kv_kernel():
    """More than 16 packed rows (sq 5 x group 4), and any call with the switch off, run the
    KV kernel, also correct; the two kernels agree on an in-scope call."""
    run_case(seqlen_q=5, new=5, nheads=32, nheads_k=8, cache_len=1024)
    assert_kernel("sm80")
    with _ext.decode_kernel(False):
        run_case(seqlen_q=1, new=1, nheads=32, nheads_k=8, cache_len=1024)
    assert_kernel("sm80")
    q = torch.randn(2, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 3000, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out, lse = flash_attn_with_kvcache(q, k, v, return_softmax_lse=True)
    assert_kernel("decode")
    with _ext.decode_kernel(False):
        out_kv, lse_kv = flash_attn_with_kvcache(q, k, v, return_softmax_lse=True)
    assert_kernel("sm80")
    torch.testing.assert_close(out, out_kv, atol=2e-2, rtol=0)
    torch.testing.assert_close(lse, lse_kv, atol=1e-4, rtol=1e-5)


@gpu
@needs_decode
@pytest.mark.parametrize("num_splits", [2, 5, 16, 17, 64, 65, 128], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("headdim", [64, 128])
def test_split_counts_against_the_reference(headdim, seqlen_q, num_splits):
    """Forced split counts up to kMaxSplits (128) on the decode kernel, merged by the combine
    kernel: ragged cache_seqlens, an empty entry, splits without keys (more splits than the
    longest entry's 16-key tiles)."""
    nheads, nheads_k, cache_len, dtype = 32, 8, 1500, torch.bfloat16
    q = torch.randn(3, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k_cache = torch.randn(3, cache_len, nheads_k, headdim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    seqlens = torch.tensor([cache_len, 0, 77], dtype=torch.int32)
    out, lse = kvcache_kernel(q, k_cache, v_cache, seqlens.to("cuda"), causal=True,
                              num_splits=num_splits)
    assert_kernel("decode")
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, True, (-1, -1))


@gpu
@needs_decode
@pytest.mark.parametrize("case", ["contig", "page16_leftpad", "d112_window"])
def test_copy_layouts_agree(case):
    """The two K / V copy layouts (decode_config.h decode_full_rows: whole 256-byte rows per
    warp instruction at d128 where seqlen_k >= 512 x num_splits, else 8 rows x 64 bytes) give
    bitwise the same out and lse: the same keys through the cache's first 512 rows (or 32
    pages of 16), then through a view of its first 496 (31 pages), num_splits 1. On rows that
    straddle pages (left padding), a head dim below the kernel's (its rows shorter than the
    copied row), ragged lengths (31 keys: one warp with 2 tiles, the others fewer)."""
    # (112: kernel head dim 128 in every build)
    headdim = 112 if case == "d112_window" else 128
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 2, 16, headdim, device="cuda", dtype=torch.float16)
    k_cache = torch.randn(3, 512, 4, headdim, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    kwargs = dict(cache_seqlens=torch.tensor([480, 300, 31], dtype=torch.int32, device="cuda"),
                  causal=True, return_softmax_lse=True, num_splits=1)
    if case == "page16_leftpad":
        k_cache, v_cache, table = paged_kv(k_cache, v_cache, 16, gen)
        assert table.shape[1] == 32
        kwargs["cache_leftpad"] = torch.tensor([5, 0, 17], dtype=torch.int32, device="cuda")
        full, short = dict(block_table=table), dict(block_table=table[:, :31])
        k_short, v_short = k_cache, v_cache
    else:
        full, short = {}, {}
        k_short, v_short = k_cache[:, :496], v_cache[:, :496]
    if case == "d112_window":
        kwargs["window_size"] = (100, 0)
    out, lse = flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs, **full)
    assert_kernel("decode")
    out_short, lse_short = flash_attn_with_kvcache(q, k_short, v_short, **kwargs, **short)
    assert_kernel("decode")
    assert not out.isnan().any()
    assert torch.equal(out, out_short) and torch.equal(lse, lse_short)


@gpu
@needs_decode
def test_split_heuristic_leaves_a_full_grid_unsplit():
    """decode_num_splits: no split once batch x KV heads fills 90 % of the SMs with one CTA
    each; a small grid still splits (the combine kernel merges)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    groups = -(-9 * sms // 10)  # ceil(0.9 x SMs)
    heuristic = _ext._C.num_splits_heuristic
    # (batch, KV heads, packed rows, keys, head dim, device, sm90, decode)
    assert heuristic(groups, 1, 4, 8192, 128, 0, False, True) == 1
    assert heuristic(groups - 1, 1, 4, 8192, 128, 0, False, True) > 1
    assert heuristic(1, 8, 4, 8192, 128, 0, False, True) > 1
    q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16)
    flash_attn_with_kvcache(q, k, torch.randn_like(k))
    assert_kernel("decode")


@gpu
@needs_decode
@pytest.mark.parametrize("headdim, per_sm", [(128, 1), (64, 2)])
def test_split_heuristic_fills_the_sms_in_one_wave(headdim, per_sm):
    """decode_num_splits below the unsplit threshold: the fewest splits that give every SM
    per_sm CTAs (64 KiB of K/V in flight: one d128 CTA, two d64 ones) within 95 %, never more
    CTAs than the SMs hold at once. Where no split count reaches that fill in one wave (an
    A100 holds one d128 CTA an SM; one group and at most 128 splits), only the bound is
    checked."""
    if _ext.KERNEL_HEAD_DIM[headdim] != headdim:  # (a build without the d64 kernels)
        pytest.skip(f"this build runs head dim {headdim} on another kernel")
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    smem = getattr(props, "shared_memory_per_multiprocessor", 0)
    stages = 4 if headdim == 64 else 3
    cta_smem = 2 * headdim * (16 + 4 * stages * 2 * 16) + 1024
    resident = min(228 * 1024, smem) // cta_smem if smem else per_sm
    heuristic = _ext._C.num_splits_heuristic
    want, slots = per_sm * sms, resident * sms
    for groups in range(1, -(-9 * sms // 10)):
        s = heuristic(groups, 1, 4, 32768, headdim, 0, False, True)
        assert 1 <= s and groups * s <= max(groups, slots), (groups, s)
        if groups * 128 >= want and slots - want >= groups - 1:  # some s fills [want, slots]
            assert groups * s >= 0.95 * want > groups * (s - 1), (groups, s)


# ---- CPU: the runtime switch ---------------------------------------------------------------


def test_context_manager_restores_the_switch():
    before = _ext.DECODE_KERNEL
    with _ext.decode_kernel(False):
        assert _ext.DECODE_KERNEL is False
        with _ext.decode_kernel(True):
            assert _ext.DECODE_KERNEL is True
        assert _ext.DECODE_KERNEL is False
    assert _ext.DECODE_KERNEL == before


def binding_args(fn):
    """Parameter names of a pybind11 function, in order, from its signature line."""
    return re.findall(r"(?:\(|, )(\w+): ", fn.__doc__.splitlines()[0])


class _FakeC:
    """Records the arguments of _C.fwd / _C.num_splits_heuristic by name (no GPU), positional
    ones named by the real binding's signature; fwd answers `code`."""

    def __init__(self, real, code):
        self.real, self.code, self.calls = real, code, []

    def _record(self, name, args, kwargs):
        names = binding_args(getattr(self.real, name))
        assert len(args) <= len(names), f"_C.{name} takes {len(names)} arguments"
        named = dict(zip(names, args))
        unknown = [key for key in kwargs if key not in names or key in named]
        assert not unknown, f"_C.{name}: unknown or repeated argument(s) {unknown}"
        named.update(kwargs)
        self.calls.append((name, named))

    def fwd(self, *args, **kwargs):
        self._record("fwd", args, kwargs)
        return self.code

    def num_splits_heuristic(self, *args, **kwargs):
        self._record("num_splits_heuristic", args, kwargs)
        return 3


def fake_launch(monkeypatch, code=81, num_splits=0, **layout):
    """_launch_fwd of a small GQA decode (8 / 2 heads, d64, 100 keys) against _FakeC; returns
    the recorded calls."""
    fake = _FakeC(_ext._C, code)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 100, 2, 64, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(1, 8, 1)
    _launch_fwd(q, k, v, out, lse, q.stride()[:3], k.stride()[:3], v.stride()[:3],
                out.stride()[:3], lse.stride()[:2], 1, 1, 100, 8, 2, 64, 0.125, -1, -1,
                num_splits=num_splits, **layout)
    return fake.calls


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("code", [80, 81])
def test_switch_reaches_the_binding_and_the_kernel_is_recorded(monkeypatch, enabled, code):
    with _ext.decode_kernel(enabled):
        (name, heuristic), (name2, fwd) = fake_launch(monkeypatch, code)
    assert name == "num_splits_heuristic" and heuristic["decode"] is enabled
    assert name2 == "fwd" and fwd["allow_decode"] is enabled and fwd["num_splits"] == 3
    assert fwd["q_pack"] == 4
    assert _ext.last_fwd_arch == 80
    assert _ext.last_fwd_kernel == ("decode" if code == 81 else "sm80")


def test_launch_passes_every_argument_by_position(monkeypatch):
    """_launch_fwd's positional call (_launch._FWD_OPTIONAL) follows the binding's order,
    and the layout reaches the parameters of its names."""
    names = binding_args(_ext._C.fwd)
    assert names[22:] == list(_launch._FWD_OPTIONAL)
    assert names[20:22] == ["device", "stream"]
    (_, heuristic), (_, fwd) = fake_launch(monkeypatch, seqused_k=1234, seqlen_k_new=1,
                                           block_table=4096, page_size=16, num_pages=7)
    assert len(fwd) == len(names)
    assert (fwd["seqused_k"], fwd["seqlen_k_new"], fwd["block_table"], fwd["page_size"],
            fwd["num_pages"], fwd["cu_seqlens_q"]) == (1234, 1, 4096, 16, 7, 0)
    assert (fwd["softcap"], fwd["alibi_slopes"], fwd["dropout_p"], fwd["attn_bias"]) == (0, 0, 0, 0)
    assert len(heuristic) == len(binding_args(_ext._C.num_splits_heuristic))


def test_split_workspace_is_one_buffer(monkeypatch):
    """o_accum and lse_accum: one float32 allocation, lse_accum after the rows x headdim
    partial outputs, both 16-byte aligned."""
    (_, fwd), = fake_launch(monkeypatch, num_splits=5)
    rows = 5 * 1 * 8 * 1  # splits x batch x nheads x seqlen_q
    assert fwd["num_splits"] == 5
    assert fwd["lse_accum"] - fwd["o_accum"] == 4 * rows * 64
    assert fwd["o_accum"] % 16 == 0 and fwd["lse_accum"] % 16 == 0
    (_, fwd), = fake_launch(monkeypatch, num_splits=1)
    assert fwd["o_accum"] == fwd["lse_accum"] == 0


def test_launch_rejects_unknown_arguments(monkeypatch):
    with pytest.raises(TypeError, match="seqused"):
        fake_launch(monkeypatch, seqused=1)
    with pytest.raises(TypeError, match="softcapp"):
        fake_launch(monkeypatch, mods={"softcapp": 1.0})
