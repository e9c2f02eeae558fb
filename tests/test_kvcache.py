"""flash_attn_with_kvcache and split-KV.

GPU: contiguous and paged caches (page sizes 16, 64, 256) against a reference built from a
plain copy of the cache: appended rows checked exactly (within one rounding with rotary),
attention with the error rule of test_fwd.py on each batch entry's visible keys; rotary both
styles; forced splits 1..16 and the heuristic; num_splits=1 bitwise equal to the unsplit
forward; split-KV inside flash_attn_func; CUDA-graph capture and torch.compile(fullgraph)
with the in-place cache writes. CPU: argument checks.
"""
import pytest
import torch
import torch.nn.functional as F
from flashattn2 import _ext, flash_attn_func, flash_attn_with_kvcache
from flashattn2._launch import _flash_attn_forward, _launch_fwd, _mod_kwargs
from reference import attention_ref
from test_fwd import ATOL, LSE_ATOL, LSE_RTOL, dtype_id

gpu = pytest.mark.gpu


def rotate_ref(x, cos, sin, positions, interleaved):
    """x (s, h, d) rotated at `positions` (s,) over the first 2 * cos.shape[1] features,
    float32 math, rounded to x's dtype."""
    rot = 2 * cos.shape[1]
    xf = x.float()
    c = cos.float()[positions].unsqueeze(1)  # (s, 1, rot / 2)
    s = sin.float()[positions].unsqueeze(1)
    if interleaved:
        a, b = xf[..., 0:rot:2], xf[..., 1:rot:2]
    else:
        a, b = xf[..., : rot // 2], xf[..., rot // 2 : rot]
    ra, rb = a * c - b * s, a * s + b * c
    out = xf.clone()
    if interleaved:
        out[..., 0:rot:2], out[..., 1:rot:2] = ra, rb
    else:
        out[..., : rot // 2], out[..., rot // 2 : rot] = ra, rb
    return out.to(x.dtype)


def paged_copy(cache, page_size, generator):
    """A paged copy of a contiguous cache (b, s, h, d): pages in a random order plus unused
    pages; returns (paged, block_table)."""
    batch, seqlen = cache.shape[:2]
    pages_per_seq = seqlen // page_size
    num_pages = batch * pages_per_seq + 3
    perm = torch.randperm(num_pages, generator=generator)[: batch * pages_per_seq]
    paged = torch.randn(num_pages, page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
    paged[perm.to(cache.device)] = cache.reshape(batch * pages_per_seq, page_size, *cache.shape[2:])
    block_table = perm.view(batch, pages_per_seq).to(torch.int32).to(cache.device)
    return paged, block_table


def paged_kv(k_cache, v_cache, page_size, generator):
    """Paged copies of a contiguous K and V cache sharing one block table (paged_copy's, V's
    unused pages random): returns (k_paged, v_paged, block_table)."""
    kc, table = paged_copy(k_cache, page_size, generator)
    vc = torch.randn_like(kc)
    vc[table.flatten().long()] = v_cache.reshape(-1, page_size, *v_cache.shape[2:])
    return kc, vc, table


def unpage(paged, block_table):
    return paged[block_table.long()].flatten(1, 2)


def check_rule(name, out, ref, ref_pt, dtype):
    err = (out.float() - ref.float()).abs().max().item()
    err_pt = (ref_pt.float() - ref.float()).abs().max().item()
    bound = 2 * err_pt + ATOL[dtype]
    assert err <= bound, f"{name}: max err {err:.3e} > {bound:.3e} (PyTorch: {err_pt:.3e})"


def run_case(dtype=torch.bfloat16, batch=3, seqlen_q=1, nheads=8, nheads_k=2, headdim=128,
             cache_len=512, new=1, paged=0, rotary=None, causal=True, window_size=(-1, -1),
             leftpad=False, batch_idx=False, num_splits=0, strided=False):
    """Runs flash_attn_with_kvcache and checks the cache and the output against references.
    ``strided``: q, k and v are views of rows 3 elements wider (row strides the kernels
    cannot read: the function must copy them)."""
    if _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)] < 0:
        pytest.skip(f"no kernel for head dim {headdim} in this build")
    gen = torch.Generator().manual_seed(1)
    dev = "cuda"
    batch_cache = batch + 2 if batch_idx else batch
    k_cache = torch.randn(batch_cache, cache_len, nheads_k, headdim, device=dev, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, seqlen_q, nheads, headdim, device=dev, dtype=dtype)
    k = torch.randn(batch, new, nheads_k, headdim, device=dev, dtype=dtype) if new else None
    v = torch.randn_like(k) if new else None
    if strided:
        widened = (lambda t: None if t is None else F.pad(t, (0, 3))[..., :headdim])
        q, k, v = widened(q), widened(k), widened(v)
        assert q.stride(2) % 8  # the head stride: headdim + 3
    seqlens = torch.randint(0, cache_len - new + 1, (batch,), generator=gen)
    seqlens[0] = cache_len - new  # one entry exactly full
    pads = torch.randint(0, 40, (batch,), generator=gen).minimum(seqlens) if leftpad else None
    idx = torch.randperm(batch_cache, generator=gen)[:batch] if batch_idx else None
    cos = sin = None
    if rotary is not None:
        angle = torch.rand(cache_len, headdim // 4, generator=gen) * 6.28
        cos, sin = angle.cos().to(dev, dtype), angle.sin().to(dev, dtype)

    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    kw = dict(cache_seqlens=seqlens.to(dev, torch.int32), causal=causal, window_size=window_size,
              num_splits=num_splits, return_softmax_lse=True)
    if pads is not None:
        kw["cache_leftpad"] = pads.to(dev, torch.int32)
    if idx is not None:
        kw["cache_batch_idx"] = idx.to(dev, torch.int32)
    if rotary is not None:
        kw.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary == "interleaved")
    kc, vc = k_cache, v_cache
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, gen)
        kw["block_table"] = table
    out, lse = flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    if paged:
        got_k, got_v = unpage(kc, kw["block_table"]), unpage(vc, kw["block_table"])
    else:
        got_k, got_v = kc, vc

    outs_ref, outs_pt, lses_ref = [], [], []
    for b in range(batch):
        cb = int(idx[b]) if idx is not None else b
        n, pad = int(seqlens[b]), int(pads[b]) if pads is not None else 0
        q_b = q[b]
        if new:
            k_new = k[b]
            if rotary is not None:
                # flash-attn's positions: new key i at its cache row n + i, the left padding
                # not subtracted; q rows from n.
                pos = torch.arange(n, n + new, device=dev)
                k_new = rotate_ref(k_new, cos, sin, pos, rotary == "interleaved")
                q_pos = (torch.arange(seqlen_q, device=dev) if causal or window_size != (-1, -1)
                         else torch.zeros(seqlen_q, dtype=torch.long, device=dev)) + n
                q_b = rotate_ref(q_b, cos, sin, q_pos, rotary == "interleaved")
            expected_k[cb, n : n + new] = k_new
            expected_v[cb, n : n + new] = v[b]
        keys = expected_k[cb, pad : n + new].unsqueeze(0)
        vals = expected_v[cb, pad : n + new].unsqueeze(0)
        args = (q_b.unsqueeze(0), keys, vals)
        o, l = attention_ref(*args, causal=causal, window_size=window_size)
        o_pt, _ = attention_ref(*args, causal=causal, window_size=window_size, upcast=False)
        outs_ref.append(o), outs_pt.append(o_pt), lses_ref.append(l)
    if rotary is None:
        assert torch.equal(got_k, expected_k) and torch.equal(got_v, expected_v)
    else:  # one rounding of the rotation may differ (FMA contraction)
        torch.testing.assert_close(got_k, expected_k, atol=0, rtol=2 ** -7)
        assert torch.equal(got_v, expected_v)
    assert not out.isnan().any() and not lse.isnan().any()
    check_rule("out", out, torch.cat(outs_ref), torch.cat(outs_pt), dtype)
    tol = 1e-2 if rotary is not None else LSE_ATOL  # rotated q may differ by one rounding
    torch.testing.assert_close(lse, torch.cat(lses_ref), atol=tol, rtol=LSE_RTOL)
    return out, lse


@gpu
@pytest.mark.parametrize("paged", [0, 16, 64, 256], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("new", [0, 1, 5], ids=lambda n: f"new{n}")
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_cache_layouts(dtype, seqlen_q, new, paged):
    if new and new < seqlen_q:
        new = seqlen_q  # decoding appends the tokens it queries
    run_case(dtype, seqlen_q=seqlen_q, new=new, paged=paged)


@gpu
@pytest.mark.parametrize("rotary", ["interleaved", "neox"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("paged", [0, 64], ids=["contig", "page64"])
def test_rotary(rotary, causal, paged):
    run_case(seqlen_q=3, new=3, rotary=rotary, causal=causal, paged=paged)


@gpu
@pytest.mark.parametrize("options", ["new0", "new3", "rotary", "batch_idx", "leftpad"])
@pytest.mark.parametrize("paged", [0, 16], ids=["contig", "page16"])
@pytest.mark.parametrize("headdim", [20, 59, 100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_head_dims_not_multiple_of_8(dtype, headdim, paged, options):
    """As flash-attn: the kernels run on padded copies, and the appended rows land in the
    caches given (run_case checks the whole cache: appended rows and untouched ones)."""
    if options == "batch_idx" and paged:
        pytest.skip("cache_batch_idx is for contiguous caches")
    kwargs = {
        "new0": dict(new=0),
        "new3": dict(new=3),
        "rotary": dict(new=3, rotary="neox"),
        "batch_idx": dict(new=3, batch_idx=True),
        "leftpad": dict(new=3, leftpad=True, rotary="interleaved"),
    }[options]
    run_case(dtype, seqlen_q=3, headdim=headdim, cache_len=256, paged=paged, **kwargs)


@gpu
@pytest.mark.parametrize("rotary", [None, "neox"], ids=["plain", "rotary"])
@pytest.mark.parametrize("new", [0, 3], ids=lambda n: f"new{n}")
@pytest.mark.parametrize("headdim", [64, 168])
def test_strided_q_k_v(headdim, new, rotary):
    """q, k, v whose row strides are not multiples of 8 elements run on copies (the append
    kernel takes q's strides even without rotary)."""
    if rotary and not new:
        pytest.skip("rotary rotates the appended keys")
    run_case(seqlen_q=3, new=new, headdim=headdim, cache_len=256, rotary=rotary, strided=True)


@gpu
@pytest.mark.parametrize("rotary", ["interleaved", "neox"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("paged", [0, 64], ids=["contig", "page64"])
def test_rotary_with_leftpad_rotates_at_the_cache_row(rotary, causal, paged):
    """As flash-attn: with cache_leftpad, new key i of entry b is rotated at its cache row
    cache_seqlens[b] + i (run_case's reference), not at cache_seqlens[b] - leftpad[b] + i."""
    run_case(seqlen_q=3, new=3, rotary=rotary, causal=causal, paged=paged, leftpad=True)


@gpu
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 16, 0])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_forced_splits(headdim, num_splits):
    run_case(headdim=headdim, cache_len=1024, num_splits=num_splits, batch=2)


@gpu
@pytest.mark.parametrize("num_splits", [12, 40, 128])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_many_splits(headdim, num_splits):
    """The combine kernel with 2 and 4 warps per row (combine_warps_per_row), more than one
    batch of loads per warp, and the largest split count."""
    run_case(headdim=headdim, cache_len=8192, num_splits=num_splits, batch=2, seqlen_q=2, new=2)


@gpu
@pytest.mark.parametrize("case", ["leftpad", "batch_idx", "window", "mha", "prefill"])
def test_cache_options(case):
    kwargs = {
        "leftpad": dict(leftpad=True, paged=64),
        "batch_idx": dict(batch_idx=True),
        "window": dict(seqlen_q=4, new=4, window_size=(100, 0)),
        "mha": dict(nheads=4, nheads_k=4, num_splits=4),
        "prefill": dict(seqlen_q=200, new=200, cache_len=512, headdim=64),
    }[case]
    run_case(**kwargs)


@gpu
@pytest.mark.parametrize("seqlen_q", [1, 100])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_one_split_is_the_plain_forward(dtype, seqlen_q):
    q = torch.randn(2, seqlen_q, 8, 128, device="cuda", dtype=dtype)
    k = torch.randn(2, 700, 2, 128, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    out, lse = flash_attn_with_kvcache(q, k, v, causal=True, num_splits=1, return_softmax_lse=True)
    out_p, lse_p = _flash_attn_forward(q, k, v, 128**-0.5, -1, 0, num_splits=1)
    assert torch.equal(out, out_p) and torch.equal(lse, lse_p)


@gpu
def test_flash_attn_func_splits_a_small_grid():
    q = torch.randn(1, 1, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 16384, 4, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    assert _ext._C.num_splits_heuristic(1, 4, 1, 16384, 128, 0) > 1
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    ref, lse_ref = attention_ref(q, k, v)
    ref_pt, _ = attention_ref(q, k, v, upcast=False)
    check_rule("out", out, ref, ref_pt, q.dtype)
    torch.testing.assert_close(lse, lse_ref, atol=LSE_ATOL, rtol=LSE_RTOL)


@gpu
def test_cuda_graph_capture_with_append():
    dtype = torch.bfloat16
    k_cache = torch.randn(2, 256, 2, 64, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(2, 1, 8, 64, device="cuda", dtype=dtype)
    k, v = torch.randn(2, 1, 2, 64, device="cuda", dtype=dtype), torch.randn(2, 1, 2, 64, device="cuda", dtype=dtype)
    seqlens = torch.tensor([10, 100], dtype=torch.int32, device="cuda")
    k0, v0 = k_cache.clone(), v_cache.clone()
    expected = flash_attn_with_kvcache(q, k0, v0, k, v, cache_seqlens=seqlens, num_splits=4)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the capture
        flash_attn_with_kvcache(q, k_cache.clone(), v_cache.clone(), k, v, cache_seqlens=seqlens,
                                num_splits=4)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens, num_splits=4)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


@gpu
def test_compile_fullgraph_with_cache_writes():
    torch._dynamo.reset()
    dtype = torch.float16
    k_cache = torch.randn(2, 128, 2, 64, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(2, 1, 4, 64, device="cuda", dtype=dtype)
    k, v = torch.randn(2, 1, 2, 64, device="cuda", dtype=dtype), torch.randn(2, 1, 2, 64, device="cuda", dtype=dtype)

    def step(q, k_cache, v_cache, k, v, n):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=n)
        return out * 2

    seqlens = torch.tensor([5, 50], dtype=torch.int32, device="cuda")
    k0, v0 = k_cache.clone(), v_cache.clone()
    eager = step(q, k0, v0, k, v, seqlens)
    compiled = torch.compile(step, fullgraph=True)(q, k_cache, v_cache, k, v, seqlens)
    torch.testing.assert_close(compiled, eager, atol=0, rtol=0)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)
    torch._dynamo.reset()


# ---- GQA packing (q_pack): the query heads of a group share the KV kernel's query tiles ------


def kvcache_kernel(q, k_cache, v_cache, cache_seqlens, block_table=None, causal=False,
                   window_size=(-1, -1), num_splits=0, softmax_scale=None):
    """The KV-cache forward (no append) as ``_kvcache_forward`` launches it, writing into
    NaN-poisoned out / lse; fails if any NaN survives. Returns (out, lse)."""
    batch, seqlen_q, nheads, headdim = q.shape
    nheads_k = k_cache.shape[2]
    out = torch.full_like(q, float("nan"))
    lse = torch.full((batch, nheads, seqlen_q), float("nan"), device=q.device)
    layout = dict(seqused_k=cache_seqlens.data_ptr())
    capacity = k_cache.shape[1]
    if block_table is not None:
        capacity = block_table.shape[1] * k_cache.shape[1]
        layout.update(block_table=block_table.data_ptr(),
                      block_table_batch_stride=block_table.stride(0), page_size=k_cache.shape[1],
                      num_pages=k_cache.shape[0])
    window_left, window_right = window_size
    if causal:
        window_right = 0
    _launch_fwd(q, k_cache, v_cache, out, lse, q.stride()[:3], k_cache.stride()[:3],
                v_cache.stride()[:3], out.stride()[:3], lse.stride()[:2], batch, seqlen_q,
                capacity, nheads, nheads_k, headdim, softmax_scale or headdim**-0.5, window_left,
                window_right,
                num_splits, _mod_kwargs(), **layout)
    assert not out.isnan().any(), "the kernel left part of out unwritten (or wrote NaN)"
    assert not lse.isnan().any(), "the kernel left part of lse unwritten (or wrote NaN)"
    return out, lse


def check_against_reference(out, lse, q, k_cache, v_cache, seqlens, causal, window_size):
    """Each batch entry against the float32 reference on its visible keys (2x rule, LSE)."""
    outs_ref, outs_pt, lses_ref = [], [], []
    for b, n in enumerate(seqlens.tolist()):
        args = (q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n])
        o, l = attention_ref(*args, causal=causal, window_size=window_size)
        o_pt, _ = attention_ref(*args, causal=causal, window_size=window_size, upcast=False)
        outs_ref.append(o), outs_pt.append(o_pt), lses_ref.append(l)
    check_rule("out", out, torch.cat(outs_ref), torch.cat(outs_pt), q.dtype)
    torch.testing.assert_close(lse, torch.cat(lses_ref), atol=LSE_ATOL, rtol=LSE_RTOL)


@gpu
@pytest.mark.parametrize("num_splits", [1, 2, 3, 8, 0], ids=lambda s: f"splits{s}")
@pytest.mark.parametrize("paged", [0, 16, 64], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("mask", ["full", "causal", "window"])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32_8", "mqa8_1"])
@pytest.mark.parametrize("seqlen_q", [1, 2, 4, 7, 33])
def test_gqa_packing(seqlen_q, heads, mask, paged, num_splits):
    """Packed query heads against the reference: any seqlen_q, GQA and MQA, causal / window
    (masks by query position, not tile row), split-KV partials and their combine, pages."""
    nheads, nheads_k = heads
    dtype, headdim, cache_len, batch = torch.bfloat16, 128, 512, 3
    if _ext.KERNEL_HEAD_DIM[headdim] < 0:
        pytest.skip(f"no kernel for head dim {headdim} in this build")
    gen = torch.Generator().manual_seed(seqlen_q)
    q = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, cache_len, nheads_k, headdim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    # one entry full, one shorter than seqlen_q (causal rows that see no key), one random
    seqlens = torch.tensor([cache_len, 5, int(torch.randint(40, cache_len, (1,), generator=gen))],
                           dtype=torch.int32)
    causal = mask != "full"
    window_size = (40, -1) if mask == "window" else (-1, -1)
    kc, vc, table = k_cache, v_cache, None
    if paged:
        kc, vc, table = paged_kv(k_cache, v_cache, paged, gen)
    lens = seqlens.to("cuda")
    out, lse = kvcache_kernel(q, kc, vc, lens, table, causal, window_size, num_splits)
    check_against_reference(out, lse, q, k_cache, v_cache, seqlens, causal, window_size)
    public, public_lse = flash_attn_with_kvcache(
        q, kc, vc, cache_seqlens=lens, block_table=table, causal=causal, window_size=window_size,
        num_splits=num_splits, return_softmax_lse=True)
    assert torch.equal(public, out) and torch.equal(public_lse, lse)


def head_coded_problem(batch, seqlen_q, nheads, nheads_k, headdim, seqlen_k):
    """q, k, v (float16) where, with softmax_scale 1, query (b, i, h) attends to one key
    (logit 30, every other logit <= 0: weight 1 - ~1e-11) whose value row is the constant
    code(b, i, h) = 1 + i * nheads + h + 256 * b, exact in float16: a row written to the
    wrong head or position shows a wrong integer."""
    assert seqlen_q * nheads <= headdim * 2 and seqlen_q * nheads < seqlen_k
    q = torch.zeros(batch, seqlen_q, nheads, headdim, device="cuda", dtype=torch.float16)
    k = torch.zeros(batch, seqlen_k, nheads_k, headdim, device="cuda", dtype=torch.float16)
    v = torch.zeros_like(k)
    group = nheads // nheads_k
    code = torch.empty(batch, seqlen_q, nheads, device="cuda")
    for b in range(batch):
        for i in range(seqlen_q):
            for h in range(nheads):
                key = i * nheads + h  # a distinct key per (i, h); keys of head h_k only
                hk = h // group
                dim, sign = key % headdim, 1.0 if key < headdim else -1.0
                q[b, i, h, dim] = 30.0 * sign
                k[b, key, hk, dim] = sign
                code[b, i, h] = 1 + i * nheads + h + 256 * b
                v[b, key, hk, :] = code[b, i, h]
    return q, k, v, code


@gpu
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("paged", [0, 16], ids=lambda p: f"page{p}" if p else "contig")
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa32_8", "mqa8_1"])
@pytest.mark.parametrize("seqlen_q", [1, 4, 7])
def test_gqa_packing_writes_each_head_and_position(seqlen_q, heads, paged, num_splits):
    """Every (batch, position, head) of out and lse goes to its own place: out holds the
    integer code of its (b, i, h) (see head_coded_problem), lse = 30 + ln(1 + ~0)."""
    nheads, nheads_k = heads
    batch, headdim, seqlen_k = 2, 128, 256
    if _ext.KERNEL_HEAD_DIM[headdim] < 0:
        pytest.skip(f"no kernel for head dim {headdim} in this build")
    q, k, v, code = head_coded_problem(batch, seqlen_q, nheads, nheads_k, headdim, seqlen_k)
    lens = torch.full((batch,), seqlen_k, dtype=torch.int32, device="cuda")
    table = None
    if paged:
        k, table = paged_copy(k, paged, torch.Generator().manual_seed(0))
        v_paged = torch.randn_like(k)
        v_paged[table.flatten().long()] = v.reshape(-1, paged, nheads_k, headdim)
        v = v_paged
    out, lse = kvcache_kernel(q, k, v, lens, table, num_splits=num_splits, softmax_scale=1.0)
    expected = code[..., None].expand_as(out).to(out.dtype)
    assert torch.equal(out, expected), "a row of out went to the wrong head or position"
    torch.testing.assert_close(lse, torch.full_like(lse, 30.0), atol=1e-4, rtol=0)


@gpu
@pytest.mark.parametrize("num_splits", [1, 3])
def test_out_of_range_block_table_entries_are_clamped(num_splits):
    """Block-table entries outside [0, num_pages) (not checked on the host: that would need a
    sync) are clamped: the attention and the appended rows go to the clamped pages, bitwise
    as with the clamped table, and the pages around the cache are never touched."""
    gen = torch.Generator().manual_seed(11)
    batch, page, num_pages, heads, heads_k, d = 2, 16, 6, 4, 2, 64
    dt = torch.bfloat16

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to("cuda", dt)

    # The cache is k_full[1:-1]: one guard page on each side.
    k_full, v_full = randn(num_pages + 2, page, heads_k, d), randn(num_pages + 2, page, heads_k, d)
    q, k_new, v_new = randn(batch, 2, heads, d), randn(batch, 2, heads_k, d), randn(batch, 2, heads_k, d)
    cache_seqlens = torch.tensor([40, 57], dtype=torch.int32, device="cuda")
    # The appends land in slot 2 (batch 0) and slot 3 (batch 1): both out of range.
    table = torch.tensor([[1, -1, num_pages + 5, 4], [2, 3, 1 << 30, -7]], dtype=torch.int32,
                         device="cuda")
    runs = []
    for t in (table, table.clamp(0, num_pages - 1)):
        kf, vf = k_full.clone(), v_full.clone()
        out = flash_attn_with_kvcache(q, kf[1:-1], vf[1:-1], k=k_new, v=v_new,
                                      cache_seqlens=cache_seqlens, block_table=t, causal=True,
                                      num_splits=num_splits)
        runs.append((out, kf, vf))
    (out, kf, vf), (out_c, kf_c, vf_c) = runs
    assert not out.isnan().any()
    assert torch.equal(out, out_c)
    assert torch.equal(kf, kf_c) and torch.equal(vf, vf_c)
    for guard in (0, -1):
        assert torch.equal(kf[guard], k_full[guard]) and torch.equal(vf[guard], v_full[guard])


# ---- CPU: argument checks ------------------------------------------------------------------


def _cpu(*shape, dtype=torch.float16):
    return torch.zeros(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "case, message",
    [
        (dict(q=_cpu(1, 1, 4, 60)), "headdim=60"),
        (dict(q=_cpu(1, 1, 4, 264), k_cache=_cpu(1, 64, 2, 264), v_cache=_cpu(1, 64, 2, 264)),
         "at most 256"),
        (dict(k_cache=_cpu(1, 64, 3, 64), v_cache=_cpu(1, 64, 3, 64)), "must divide"),
        (dict(v_cache=_cpu(1, 32, 2, 64)), "shape of k_cache"),
        (dict(k=_cpu(1, 1, 2, 64)), "together"),
        (dict(k=_cpu(1, 1, 2, 64), v=_cpu(1, 1, 2, 64), cache_seqlens=None), "cache_seqlens is required"),
        (dict(cache_seqlens=_cpu(1, dtype=torch.int64)), "int32"),
        (dict(cache_seqlens=65), "outside"),
        (dict(block_table=_cpu(1, 2, dtype=torch.int32), k_cache=_cpu(4, 24, 2, 64),
              v_cache=_cpu(4, 24, 2, 64)), "power of two"),
        (dict(block_table=_cpu(1, 2, dtype=torch.int32), k_cache=_cpu(4, 16, 2, 64),
              v_cache=_cpu(4, 16, 2, 64), cache_batch_idx=_cpu(1, dtype=torch.int32)),
         "cache_batch_idx"),
        (dict(block_table=_cpu(1, 2, dtype=torch.int32), k_cache=_cpu(0, 16, 2, 64),
              v_cache=_cpu(0, 16, 2, 64)), "no pages"),
        (dict(rotary_cos=_cpu(64, 16)), "together"),
        (dict(rotary_cos=_cpu(64, 16), rotary_sin=_cpu(64, 16)), "need the new k"),
        (dict(k=_cpu(1, 1, 2, 64), v=_cpu(1, 1, 2, 64), rotary_cos=_cpu(32, 16),
              rotary_sin=_cpu(32, 16)), "seqlen_ro"),
        (dict(num_splits=129), "num_splits"),
        (dict(k_cache=_cpu(1, 64, 2, 72)[..., 4:68]), "16-byte"),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_bad_arguments(case, message):
    args = dict(q=_cpu(1, 1, 4, 64), k_cache=_cpu(1, 64, 2, 64), v_cache=_cpu(1, 64, 2, 64),
                cache_seqlens=3)
    args.update(case)
    q, k_cache, v_cache = args.pop("q"), args.pop("k_cache"), args.pop("v_cache")
    with pytest.raises(ValueError, match=message):
        flash_attn_with_kvcache(q, k_cache, v_cache, **args)


def test_cpu_tensors_are_rejected():
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_with_kvcache(_cpu(1, 1, 4, 64), _cpu(1, 64, 2, 64), _cpu(1, 64, 2, 64),
                                cache_seqlens=3)


@pytest.mark.parametrize("headdim", [1, 20, 59])
def test_head_dims_not_multiple_of_8_pass_the_checks(headdim):
    """As flash-attn: any head dim up to 256 (padded copies), whatever the cache strides;
    on CPU tensors the call gets as far as the device check."""
    cache = _cpu(1, 64, 2, headdim)
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_with_kvcache(_cpu(1, 1, 4, headdim), cache, cache.clone(),
                                k=_cpu(1, 1, 2, headdim), v=_cpu(1, 1, 2, headdim),
                                cache_seqlens=3)


@gpu
@pytest.mark.parametrize("paged", [0, 16], ids=["contig", "page16"])
def test_window_bound_past_the_cache_is_unbounded(paged):
    # As flash-attn: a window bound >= the cache length (32 here: seqlen_cache, or 2 pages of
    # 16) is unbounded. It masks nothing (with 40 queries, a right bound of 32 would hide keys
    # from the first rows) and rotary rotates q at one position, as without a window.
    if _ext.KERNEL_HEAD_DIM[64] < 0:
        pytest.skip("no kernel for head dim 64 in this build")
    gen = torch.Generator(device="cuda").manual_seed(2)
    shape = (4, 16, 2, 64) if paged else (2, 32, 2, 64)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)
    q = torch.randn(2, 40, 4, 64, device="cuda", dtype=torch.float16, generator=gen)
    k, v = torch.randn(2, 2, 3, 2, 64, device="cuda", dtype=torch.float16, generator=gen)
    angle = torch.rand(32, 16, device="cuda", generator=gen) * 6.28
    kw = dict(cache_seqlens=torch.tensor([5, 29], dtype=torch.int32, device="cuda"),
              rotary_cos=angle.cos().half(), rotary_sin=angle.sin().half(),
              return_softmax_lse=True)
    if paged:
        kw["block_table"] = torch.tensor([[3, 0], [1, 2]], dtype=torch.int32, device="cuda")

    def run(window_size):
        caches = k_cache.clone(), v_cache.clone()
        return flash_attn_with_kvcache(q, *caches, k, v, window_size=window_size, **kw), caches

    (out, lse), caches = run((-1, -1))
    assert not out.isnan().any()
    for window_size in [(32, -1), (-1, 32), (40, 100)]:
        (out_w, lse_w), caches_w = run(window_size)
        assert torch.equal(out_w, out) and torch.equal(lse_w, lse), window_size
        assert all(torch.equal(a, b) for a, b in zip(caches_w, caches))
