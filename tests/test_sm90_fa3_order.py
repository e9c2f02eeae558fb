"""FA3's step order in the Hopper forward (cpp/sm90/fwd_kernel.cuh FwdTraits kOrder_ 3: the two
consumer warpgroups issue their MMAs without the ping-pong turn, and a step rescales O right
after issuing its S, before its P V). It is the default for plain dense full attention in one
split at kernel head dim 256 (head dims 193-256) from 2048 keys (cpp/sm90/fwd_config.h
sm90_fwd_fa3_order); FLASHATTN2_SM90_FA3_ORDER=0 or ``_ext.sm90_fa3_order(False)`` never takes it.

GPU tests: results against the float32 reference under test_fwd.py's rule (out and lse
NaN-poisoned before the kernel writes them) at 2048-4096 keys with key tails (2049, 3000) and
query tails (65, 129, 300 rows: partial tiles, a warpgroup with no row), padded head dim 200,
GQA, fp16 / bf16, many tiles per persistent CTA; which instance runs (the kernel's name, read
by torch.profiler): order 3 with the switch on, the old order with it off, below 2048 keys,
at d192, and for causal, windowed, softcap, ALiBi, split-KV and varlen forwards. One split is
forced (``num_splits=1``) where the heuristic would split the small shapes.
"""
import re

import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func, flash_attn_varlen_func
from test_decode_kernel import fake_launch
from test_fwd import ATOL, check_output, dtype_id, make_qkv
from test_sm90 import require_sm90

MIN_KEYS = 2048  # (sm90_fwd_fa3_order)


@pytest.mark.parametrize("enabled", [True, False])
def test_switch_reaches_the_binding(monkeypatch, enabled):
    with _ext.sm90_fa3_order(enabled):
        (_, _), (_, fwd) = fake_launch(monkeypatch, code=80)
    assert fwd["sm90_fa3_order"] is enabled


def _orders(fn):
    """(kernel head dim, step order) of each Hopper forward kernel `fn` launches
    (torch.profiler; the order is FwdTraits' second template argument)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    found = []
    for event in prof.events():
        name = event.name
        if event.device_type != DeviceType.CUDA or "fwd_kernel" not in name or "sm90" not in name:
            continue
        # (demangled: "FwdTraits<256, 3>"; mangled: "FwdTraitsILi256ELi3EEE")
        m = (re.search(r"FwdTraits<(\d+)(?:, ?(\d+))?>", name)
             or re.search(r"FwdTraitsILi(\d+)E(?:Li(\d+)E)?E", name))
        assert m, f"cannot read the traits of {name}"
        found.append((int(m.group(1)), int(m.group(2) or 0)))
    return found


def _forward(q, k, v, num_splits=1, window=(-1, -1), causal=False, **mods):
    """The forward into NaN-poisoned out / lse with `num_splits` (0: the heuristic); returns
    (out, lse, [(kernel head dim, order)] of the Hopper kernels that ran)."""
    d = q.shape[-1]
    out = torch.full_like(q, float("nan"))
    lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("nan"), device=q.device)
    left, right = window
    ran = _orders(lambda: _launch._flash_attn_forward(
        q, k, v, d**-0.5, left, 0 if causal else right, out, lse, num_splits=num_splits,
        **mods))
    assert _ext.last_fwd_arch == 90
    assert not out.isnan().any() and not lse.isnan().any()
    return out, lse, ran


SEQLENS = [(2048, 2048), (300, 2049), (65, 3000), (129, 4096)]


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)], ids=str)
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("headdim", [256, 200])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_matches_reference(dtype, headdim, seqlens, heads):
    """Order 3 runs (one split) and is within the error rule: whole and partial key blocks
    (2049 = 25 x 80 + 49, 3000 = 37 x 80 + 40), query tails, GQA, a padded head dim."""
    require_sm90(headdim)
    (seqlen_q, seqlen_k), (nheads, nheads_k) = seqlens, heads
    q, k, v = make_qkv(2, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    out, lse, ran = _forward(q, k, v)
    assert ran == [(256, 3)]
    check_output(out, lse, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_many_tiles_per_cta(dtype):
    """2 x 16 heads x 16 query tiles = 512 tiles over the persistent grid (~4 a CTA; the
    heuristic takes one split), GQA 16 / 4, through the public function: order 3 with the
    switch on, the old order with it off, both within the rule."""
    require_sm90(256)
    q, k, v = make_qkv(2, 2048, 2500, 16, 4, 256, dtype)
    for enabled in (True, False):
        with _ext.sm90_fa3_order(enabled):
            out, lse, ran = _forward(q, k, v, num_splits=0)
            assert ran == [(256, 3 if enabled else 0)]
            check_output(out, lse, q, k, v)
            res = {}
            ran = _orders(lambda: res.update(out=flash_attn_func(q, k, v)))
            assert ran == [(256, 3 if enabled else 0)]
            torch.testing.assert_close(res["out"], out, atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_k", [MIN_KEYS - 1, 1000, 81])
def test_fewer_keys_keep_the_old_order(seqlen_k):
    require_sm90(256)
    q, k, v = make_qkv(2, 300, seqlen_k, 4, 2, 256, torch.bfloat16)
    out, lse, ran = _forward(q, k, v)
    assert ran == [(256, 0)]
    check_output(out, lse, q, k, v)


@pytest.mark.gpu
def test_switch_off_keeps_the_old_order():
    require_sm90(256)
    q, k, v = make_qkv(2, 300, 3000, 4, 2, 256, torch.float16)
    with _ext.sm90_fa3_order(False):
        out, lse, ran = _forward(q, k, v)
    assert ran == [(256, 0)]
    check_output(out, lse, q, k, v)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["causal", "window", "split"])
def test_other_forwards_keep_the_old_order(case):
    """Causal, windowed and split-KV forwards at 4096 keys run their own instances, right."""
    require_sm90(256)
    q, k, v = make_qkv(1, 700, 4096, 4, 2, 256, torch.bfloat16)
    kwargs = {"causal": dict(causal=True), "window": dict(window=(1000, 300)),
              "split": dict(num_splits=3)}[case]
    out, lse, ran = _forward(q, k, v, **kwargs)
    assert ran and all(order == 0 for _, order in ran)
    check_output(out, lse, q, k, v, causal=case == "causal",
                 window_size=kwargs.get("window", (-1, -1)))


@pytest.mark.gpu
def test_score_mods_keep_the_old_order():
    require_sm90(256)
    from reference import attention_ref

    q, k, v = make_qkv(2, 300, 2500, 4, 2, 256, torch.bfloat16)
    slopes = torch.rand(2, 4, device="cuda") * 0.3
    out, lse, ran = _forward(q, k, v, softcap=15.0, alibi_slopes=slopes)
    assert ran and all(order == 0 for _, order in ran)
    out_ref, lse_ref = attention_ref(q, k, v, softcap=15.0, alibi_slopes=slopes)
    out_pt, _ = attention_ref(q, k, v, softcap=15.0, alibi_slopes=slopes, upcast=False)
    err = (out.float() - out_ref.float()).abs().max().item()
    err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
    assert err <= 2 * err_pt + ATOL[torch.bfloat16]
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
def test_varlen_keeps_the_old_order():
    require_sm90(256)
    from reference import attention_ref

    lengths_q, lengths_k = [300, 129], [2049, 3000]
    q = torch.randn(sum(lengths_q), 4, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(lengths_k), 2, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).int()
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).int()
    res = {}
    ran = _orders(lambda: res.update(out=flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k))))
    assert ran and all(order == 0 for _, order in ran)
    for i in range(2):
        sl_q = slice(cu_q[i].item(), cu_q[i + 1].item())
        sl_k = slice(cu_k[i].item(), cu_k[i + 1].item())
        args = (q[None, sl_q], k[None, sl_k], v[None, sl_k])
        out_ref, _ = attention_ref(*args)
        out_pt, _ = attention_ref(*args, upcast=False)
        err = (res["out"][None, sl_q].float() - out_ref.float()).abs().max().item()
        err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
        assert err <= 2 * err_pt + ATOL[torch.bfloat16], f"sequence {i}"


@pytest.mark.gpu
def test_d192_keeps_the_old_order():
    """d192 (not measured) keeps the old order at any length."""
    require_sm90(192)
    if _ext.KERNEL_HEAD_DIM[192] != 192:
        pytest.skip("this build has no d192 kernel (192 runs d256's)")
    q, k, v = make_qkv(2, 300, 4096, 4, 2, 192, torch.bfloat16)
    out, lse, ran = _forward(q, k, v)
    assert ran == [(192, 0)]
    check_output(out, lse, q, k, v)
