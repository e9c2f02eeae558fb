"""The Hopper forward's staged O (cpp/sm90/fwd_kernel.cuh kStageO): at d192 / d256 (one Q
buffer) the plain instance stages each warpgroup's O in the K or V buffer of the tile's last
stage and frees the Q buffer after the tile's last S. Dense full attention always does;
FLASHATTN2_SM90_STAGE_O=1 (or ``_ext.sm90_stage_o()``) has causal, windowed and varlen tiles
do it too. (Its sibling prototype, the
overlapped epilogue at d64 / d128, measured 0.95-0.98x and was removed.)

The GPU tests turn the switch on and cover every head dim (d64 / d128 run their default
instance: a control). Results against the float32 reference under test_fwd.py's rule (out and
lse NaN-poisoned before the kernel writes them): tails of every tile shape, tiles with no key
block and warpgroups that see none (causal sq > sk, rows past seqlen_q), GQA, windows, varlen
(empty tiles of short sequences, O copied by 16-byte stores), split-KV (O straight from the
accumulators), both tile walks with many tiles per persistent CTA, and that the staged-O
instance is the one that runs. The first two tests run without a GPU.
"""
import re

import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func
from test_decode_kernel import fake_launch
from test_fwd import ATOL, check_kernel, check_output, dtype_id, make_qkv
from test_sm90 import check_varlen, require_sm90


@pytest.mark.parametrize("stage_o", [False, True])
def test_switch_reaches_the_binding(monkeypatch, stage_o):
    with _ext.sm90_stage_o(stage_o):
        (_, _), (_, fwd) = fake_launch(monkeypatch, code=80)
    assert fwd["sm90_stage_o"] is stage_o


class _Recorder:
    """Stands in for _launch._C: records (sm90_stage_o, tile counter or 0) of
    each _C.fwd and runs the real one."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __getattr__(self, name):
        return getattr(self.real, name)

    def fwd(self, *args):
        tail = dict(zip(_launch._FWD_OPTIONAL, args[22:]))  # (test_decode_kernel: the order)
        self.calls.append((tail["sm90_stage_o"], tail["tile_counter"]))
        return self.real.fwd(*args)


@pytest.fixture
def protos(monkeypatch):
    """The switch on for the test; returns the recorder of the launches."""
    recorder = _Recorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    monkeypatch.setattr(_ext, "SM90_STAGE_O", True)
    return recorder


# Lengths around the tiles (192 / 128 query rows, 128 / 112 / 80 keys): one partial tile,
# exactly one, one past (the last tile's last warpgroup sees no row), tails of both, sq > sk
# (causal: tiles and warpgroups with no key block), sq < sk, many tiles.
SEQLENS = [(65, 65), (128, 80), (129, 81), (192, 193), (300, 1000), (1000, 300), (1111, 1111)]
HEAD_DIMS = [64, 128, 192, 256, 40, 112, 200]


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_tile_boundaries(protos, dtype, headdim, causal, seqlens):
    require_sm90(headdim)
    q, k, v = make_qkv(2, *seqlens, 6, 2, headdim, dtype)
    check_kernel(q, k, v, causal=causal)
    assert _ext.last_fwd_arch == 90
    assert [call[0] for call in protos.calls] == [True]


@pytest.mark.gpu
@pytest.mark.parametrize("walk", ["counter", "blocks"])
@pytest.mark.parametrize("case", ["full", "causal", "window", "causal_sq_gt_sk"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_tile_walks(protos, monkeypatch, headdim, case, walk):
    """More tiles than SMs: each persistent CTA stages O in both stages over many tiles. The
    default walk takes them from the tile counter."""
    require_sm90(headdim)
    monkeypatch.setattr(_ext, "SM90_TILE_WALK", walk)
    if case == "causal_sq_gt_sk":
        q, k, v = make_qkv(2, 1000, 333, 16, 4, headdim, torch.bfloat16)
        check_kernel(q, k, v, causal=True)
    else:
        q, k, v = make_qkv(3, 1000, 1024, 24, 8, headdim, torch.bfloat16)
        check_kernel(q, k, v, causal=case == "causal",
                     window_size=(200, 50) if case == "window" else (-1, -1))
    assert _ext.last_fwd_arch == 90
    (stage_o, counter), = protos.calls
    assert stage_o
    if case != "full":
        assert bool(counter) == (walk == "counter")


@pytest.mark.gpu
@pytest.mark.parametrize("window_size", [(0, 0), (100, 30), (-1, 200), (300, -1), (10, 10)],
                         ids=str)
@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_window(protos, headdim, window_size):
    """Windows: tiles whose warpgroups see different key ranges (one may see none)."""
    require_sm90(headdim)
    q, k, v = make_qkv(2, 700, 900, 4, 4, headdim, torch.bfloat16)
    check_kernel(q, k, v, window_size=window_size)
    assert _ext.last_fwd_arch == 90


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_varlen(protos, headdim, causal):
    """Packed sequences at offsets that cross tiles (the grid's extra m blocks of the short
    ones are empty tiles): O is copied from its staging by 16-byte stores of the sequence's
    rows only."""
    require_sm90(headdim)
    check_varlen([70, 300, 129, 1, 511, 1000], [200, 300, 81, 400, 65, 1000], headdim, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_split_kv(protos, headdim, causal):
    """Split-KV tiles write float32 partials from the accumulators (nothing staged) inside the
    staged-O instance."""
    check_split_kv(headdim, causal)


def check_split_kv(headdim, causal):
    """700 queries over 3000 keys in 3 splits: the Hopper forward's partials and the combine
    fill out and lse (NaN before), within the error rule."""
    require_sm90(headdim)
    q, k, v = make_qkv(1, 700, 3000, 2, 1, headdim, torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((1, 2, 700), float("nan"), device="cuda")
    _launch._flash_attn_forward(q, k, v, headdim**-0.5, -1, 0 if causal else -1, out, lse,
                                num_splits=3)
    assert _ext.last_fwd_arch == 90
    assert not out.isnan().any() and not lse.isnan().any()
    check_output(out, lse, q, k, v, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim", [64, 128, 192, 256])
def test_score_mods_keep_their_instance(protos, headdim):
    """Softcap / ALiBi run their own instance with the switch on: still right."""
    require_sm90(headdim)
    from reference import attention_ref

    q, k, v = make_qkv(2, 333, 555, 4, 2, headdim, torch.bfloat16)
    slopes = torch.rand(2, 4, device="cuda") * 0.3
    out, lse, _ = flash_attn_func(q, k, v, causal=True, softcap=15.0, alibi_slopes=slopes,
                                  return_attn_probs=True)
    out_ref, lse_ref = attention_ref(q, k, v, causal=True, softcap=15.0, alibi_slopes=slopes)
    out_pt, _ = attention_ref(q, k, v, causal=True, softcap=15.0, alibi_slopes=slopes,
                              upcast=False)
    err = (out.float() - out_ref.float()).abs().max().item()
    err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
    assert err <= 2 * err_pt + ATOL[torch.bfloat16]
    torch.testing.assert_close(lse, lse_ref, atol=1e-3, rtol=1e-4)


def _fwd_kernel_flags(fn):
    """The template flags (kMods, kBias, kBiasSmem, kStageO, kNarrowStep) of each sm90 forward
    kernel `fn` launches (torch.profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()
             if e.device_type == DeviceType.CUDA and "fwd_kernel" in e.name]
    # (demangled: "..., false, true>(...)"; mangled: "...Lb0ELb1EEEv...")
    return [tuple(flag in ("true", "1") for flag in
                  (re.findall(r"\b(true|false)\b", name) or re.findall(r"Lb([01])E", name))[-5:])
            for name in names]


STAGED = (False, False, False, True, False)
PLAIN = (False, False, False, False, False)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim", [256, 192, 128, 64])
def test_the_staged_instance_runs(headdim):
    """d192 / d256: dense full attention runs the staged-O instance by default, causal only
    with the switch; d64 / d128 never (their Q ring). Each within the error rule."""
    require_sm90(headdim)
    staged = STAGED if headdim > 128 else PLAIN
    q, k, v = make_qkv(2, 500, 500, 4, 4, headdim, torch.bfloat16)
    for enabled in (True, False):
        # (the narrow step off: causal tiles would run its instance; test_sm90_narrow_step.py)
        with _ext.sm90_stage_o(enabled), _ext.sm90_narrow_step(False):
            ran = _fwd_kernel_flags(lambda: flash_attn_func(q, k, v, causal=True))
            check_kernel(q, k, v, causal=True)
            assert ran == [staged if enabled else PLAIN]
            ran = _fwd_kernel_flags(lambda: flash_attn_func(q, k, v))
            check_kernel(q, k, v)
            assert ran == [staged]
