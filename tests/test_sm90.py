"""The Hopper forward (cpp/sm90): which forwards it takes, and its results at its own tile
boundaries (192 / 128 query rows, 128 / 112 / 80 keys per step).

Every other forward test runs on it too on an sm_90 GPU; scripts/gpu_check.sh runs the
forward test files a second time with FLASHATTN2_FORCE_SM80=1 for the mma.sync kernels.
"""
import os

import pytest
import torch
from flashattn2 import _ext, flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from flashattn2 import flash_attn_with_kvcache, force_sm80
from flashattn2._launch import _flash_attn_forward
from test_fwd import ATOL, check_kernel, check_output, dtype_id, make_qkv

pytestmark = pytest.mark.gpu

SM90_HEAD_DIMS = tuple(_ext.build_info().get("sm90_fwd_head_dims", ()))


def on_hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)


def require_sm90(headdim):
    if not on_hopper():
        pytest.skip("needs an sm_90 GPU")
    kernel = _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)]
    if kernel not in SM90_HEAD_DIMS:
        pytest.skip(f"this build has no sm90 forward for head dim {headdim}")


def arch_of(fn):
    _ext.last_fwd_arch = None
    fn()
    torch.cuda.synchronize()
    return _ext.last_fwd_arch


@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_hopper_runs_the_sm90_kernels_by_default(headdim):
    require_sm90(headdim)
    q, k, v = make_qkv(2, 300, 300, 4, 2, headdim, torch.bfloat16)
    assert arch_of(lambda: flash_attn_func(q, k, v, causal=True)) == 90
    assert arch_of(lambda: flash_attn_func(q, k, v, softcap=20.0, window_size=(50, 7))) == 90
    with force_sm80():
        assert arch_of(lambda: flash_attn_func(q, k, v, causal=True)) == 80
    assert arch_of(lambda: flash_attn_func(q, k, v, causal=True)) == 90


def test_what_stays_on_the_sm80_kernels():
    require_sm90(128)
    q, k, v = make_qkv(2, 300, 300, 4, 2, 128, torch.bfloat16)
    assert arch_of(lambda: flash_attn_func(q, k, v, dropout_p=0.1)) == 80
    assert arch_of(lambda: flash_attn_func(q[:, :64], k, v)) == 80  # decoding-sized
    cache_seqlens = torch.full((2,), 200, dtype=torch.int32, device="cuda")
    assert arch_of(lambda: flash_attn_with_kvcache(q, k, v, cache_seqlens=cache_seqlens)) == 80
    if 96 in _ext.build_info()["head_dims"]:
        q96, k96, v96 = make_qkv(2, 300, 300, 4, 2, 96, torch.bfloat16)
        assert arch_of(lambda: flash_attn_func(q96, k96, v96)) == 80


# Lengths around the tiles: 1, a partial tile, exactly one, one past, several.
SEQLENS = [(65, 65), (128, 80), (129, 81), (192, 193), (300, 1000), (1000, 300), (1111, 1111)]


@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256, 40, 112, 160, 200])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_tile_boundaries(dtype, headdim, causal, seqlens):
    require_sm90(headdim)
    q, k, v = make_qkv(2, *seqlens, 6, 2, headdim, dtype)
    check_kernel(q, k, v, causal=causal)
    assert _ext.last_fwd_arch == 90


@pytest.mark.parametrize("window_size", [(0, 0), (100, 30), (-1, 200), (300, -1)], ids=str)
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_window(headdim, window_size):
    require_sm90(headdim)
    q, k, v = make_qkv(2, 700, 900, 4, 4, headdim, torch.bfloat16)
    check_kernel(q, k, v, window_size=window_size)
    assert _ext.last_fwd_arch == 90


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_split_kv_with_several_batches(headdim, causal):
    """Split-KV (3 splits) of a batch of 3: the producer hands each tile's batch and split to
    the consumers packed in one word (fwd_kernel.cuh FwdTileWork); unpacked wrongly, a split
    would write another batch's partial rows."""
    require_sm90(headdim)
    q, k, v = make_qkv(3, 700, 3000, 4, 2, headdim, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((3, 4, 700), float("nan"), device="cuda")
    _ext.last_fwd_arch = None
    _flash_attn_forward(q, k, v, headdim ** -0.5, -1, 0 if causal else -1, out, lse, num_splits=3)
    assert _ext.last_fwd_arch == 90
    check_output(out, lse, q, k, v, causal=causal)


@pytest.mark.parametrize("walk", ["counter", "blocks"])
@pytest.mark.parametrize("case", ["causal", "window", "causal_gqa_long"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_tile_walks(monkeypatch, headdim, case, walk):
    """Causal / windowed tiles from the tile counter (persistent CTAs, several tiles each:
    more tiles than SMs) and one CTA per tile give the reference's result."""
    require_sm90(headdim)
    monkeypatch.setattr(_ext, "SM90_TILE_WALK", walk)
    if case == "causal_gqa_long":
        q, k, v = make_qkv(1, 2500, 3000, 16, 4, headdim, torch.bfloat16)
        check_kernel(q, k, v, causal=True)
    else:
        q, k, v = make_qkv(3, 1000, 1100, 12, 12, headdim, torch.bfloat16)
        check_kernel(q, k, v, causal=case == "causal",
                     window_size=(200, 50) if case == "window" else (-1, -1))
    assert _ext.last_fwd_arch == 90


@pytest.mark.parametrize("case", ["causal", "window", "varlen"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_default_walk_takes_the_counter_at_every_length(monkeypatch, headdim, case):
    """By default, causal, windowed and varlen tiles come from the tile counter at any number
    of keys and any head dim (with the next tile claimed late, the faster walk everywhere:
    benchmarks/NOTES.md, fifteenth session), here 3000 keys, past the old rule's 2k."""
    require_sm90(headdim)
    if "FLASHATTN2_SM90_TILE_WALK" in os.environ:
        pytest.skip("FLASHATTN2_SM90_TILE_WALK is set")
    from flashattn2 import _launch
    from test_sm90_fwd_protos import _Recorder

    recorder = _Recorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    if case == "varlen":
        check_varlen([1000, 3000], [1200, 3000], headdim, causal=True)
    else:
        q, k, v = make_qkv(1, 3000, 3000, 4, 2, headdim, torch.bfloat16)
        check_kernel(q, k, v, causal=case == "causal",
                     window_size=(500, 0) if case == "window" else (-1, -1))
    assert _ext.last_fwd_arch == 90
    assert [bool(counter) for _, counter in recorder.calls] == [True]


def test_tile_counter_is_kept_per_stream_and_left_zeroed(monkeypatch):
    """One tile counter per (device, stream), zeroed again by each launch's last claim: calls
    after the first (which would otherwise start past the last tile and leave rows unwritten),
    a second stream with its own counter, and a CUDA graph (a counter of its own, which every
    replay leaves zeroed) all give the reference's result."""
    require_sm90(128)
    from flashattn2 import _launch

    monkeypatch.setattr(_ext, "SM90_TILE_WALK", "counter")
    monkeypatch.setattr(_launch, "_TILE_COUNTERS", {})
    q, k, v = make_qkv(2, 1000, 1100, 12, 4, 128, torch.bfloat16)  # 192 tiles, > the SMs
    for _ in range(3):
        out, _ = check_kernel(q, k, v, causal=True)
    counters = list(_launch._TILE_COUNTERS.values())
    assert len(counters) == 1 and not counters[0].any()  # (the counter, the stream-K flags)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            on_side = flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert torch.equal(on_side, out)  # (each tile's result is the same whichever CTA ran it)
    assert len(_launch._TILE_COUNTERS) == 2
    assert not any(c.any() for c in _launch._TILE_COUNTERS.values())

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = flash_attn_func(q, k, v, causal=True)
    assert len(_launch._TILE_COUNTERS) == 2  # (the graph's counter is its own)
    for _ in range(3):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)
    assert not any(c.any() for c in _launch._TILE_COUNTERS.values())


def test_matches_the_sm80_kernels():
    """Both paths compute the same function: their difference is within the sum of the
    errors each is allowed."""
    require_sm90(128)
    q, k, v = make_qkv(3, 777, 1234, 8, 2, 128, torch.bfloat16)
    out90 = flash_attn_func(q, k, v, causal=True)
    with force_sm80():
        out80 = flash_attn_func(q, k, v, causal=True)
    assert (out90.float() - out80.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_strided_qkv_views(dtype):
    """q, k, v as views of one packed (b, s, 3, h, d) tensor: no copies, TMA reads the
    strides."""
    require_sm90(128)
    qkv = torch.randn(2, 500, 3, 4, 128, device="cuda", dtype=dtype)
    out = flash_attn_qkvpacked_func(qkv, causal=True)
    assert _ext.last_fwd_arch == 90
    q, k, v = qkv.unbind(2)
    from reference import attention_ref

    out_ref, _ = attention_ref(q, k, v, causal=True)
    out_pt, _ = attention_ref(q, k, v, causal=True, upcast=False)
    err = (out.float() - out_ref.float()).abs().max().item()
    err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
    assert err <= 2 * err_pt + ATOL[dtype]


@pytest.mark.parametrize("mods", ["softcap", "alibi", "both"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_score_mods(headdim, mods):
    require_sm90(headdim)
    from reference import attention_ref

    q, k, v = make_qkv(2, 333, 555, 4, 2, headdim, torch.bfloat16)
    kwargs = {}
    if mods in ("softcap", "both"):
        kwargs["softcap"] = 15.0
    if mods in ("alibi", "both"):
        kwargs["alibi_slopes"] = torch.rand(2, 4, device="cuda") * 0.3
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True, **kwargs)
    assert _ext.last_fwd_arch == 90
    out_ref, lse_ref = attention_ref(q, k, v, causal=True, **kwargs)
    out_pt, _ = attention_ref(q, k, v, causal=True, upcast=False, **kwargs)
    err = (out.float() - out_ref.float()).abs().max().item()
    err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
    assert err <= 2 * err_pt + ATOL[torch.bfloat16]
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen(headdim, causal):
    """Sequences of the packed tensor at tile offsets that cross tiles: a TMA box reads into
    the next sequence, whose rows must be masked (keys) or not stored (queries)."""
    require_sm90(headdim)
    check_varlen([70, 300, 129, 1, 511], [200, 300, 81, 400, 65], headdim, causal)


def check_varlen(lengths_q, lengths_k, headdim, causal):
    """flash_attn_varlen_func on packed bf16 sequences (4 query heads, 2 KV heads) runs the
    Hopper forward, and each sequence is within the 2x rule of the float32 reference."""
    from reference import attention_ref

    q = torch.randn(sum(lengths_q), 4, headdim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, headdim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k),
                                 causal=causal)  # fmt: skip
    assert _ext.last_fwd_arch == 90
    for i in range(len(lengths_q)):
        sl_q = slice(cu_q[i].item(), cu_q[i + 1].item())
        sl_k = slice(cu_k[i].item(), cu_k[i + 1].item())
        args = (q[None, sl_q], k[None, sl_k], v[None, sl_k])
        out_ref, _ = attention_ref(*args, causal=causal)
        out_pt, _ = attention_ref(*args, causal=causal, upcast=False)
        err = (out[None, sl_q].float() - out_ref.float()).abs().max().item()
        err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
        assert err <= 2 * err_pt + ATOL[torch.bfloat16], f"sequence {i}"


def test_rows_that_see_no_key_and_gqa():
    require_sm90(128)
    q, k, v = make_qkv(2, 700, 200, 8, 1, 128, torch.float16)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert _ext.last_fwd_arch == 90
    check_output(out, lse, q, k, v, causal=True)
