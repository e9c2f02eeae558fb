"""The bias gradient (dbias) on the Hopper backward (cpp/sm90/bwd_kernel.cuh, kDbias instances;
on by default; FLASHATTN2_SM90_DBIAS=0 at import or ``_ext.sm90_dbias(False)`` leaves it to
the mma.sync backward). The kernel sends dS of its dS^T pass to the target that
``bias.dbias_target`` picks, a key pair per store: the gradient itself in the bias's dtype
(a bias without broadcast dims, q's dtype), a float32 buffer by red.add (broadcast over batch
/ heads), float32 stores (deterministic mode with a broadcast, or a float32 bias). CPU: the
switch's plumbing; GPU (sm_90, builds with the bias and the Hopper backward's mods): every
target against the float32 reference under test_bias's 2x rule, masks, windows, GQA, ALiBi,
NaN-filled targets, guard regions, bitwise reproducibility, and what falls back.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from flashattn2 import bias as bias_mod
from test_bias import BUILT, _check, _dbias_shift, _FakeC, _qkv, _reference, needs_bias
from test_dbias import _visible

gpu = pytest.mark.gpu
_INFO = _ext.build_info()
SM90_BWD_HEAD_DIMS = tuple(_INFO.get("sm90_bwd_head_dims", ()))
MODS = "mods" in _INFO.get("sm90_bwd_experimental", ())


# ---- CPU: the switch ----------------------------------------------------------------------


def test_sm90_dbias_switch_sets_and_restores():
    before = _ext.SM90_DBIAS
    with _ext.sm90_dbias(True):
        assert _ext.SM90_DBIAS is True
        with _ext.sm90_dbias(False):
            assert _ext.SM90_DBIAS is False
        assert _ext.SM90_DBIAS is True
    assert _ext.SM90_DBIAS is before
    assert "sm90_dbias: bool = False" in _ext._C.bwd.__doc__


@needs_bias
@pytest.mark.parametrize("enabled", [False, True])
@pytest.mark.parametrize("bias_grad", [False, True])
def test_sm90_dbias_switch_reaches_the_binding(monkeypatch, enabled, bias_grad):
    """With a dbias, _C.bwd gets sm90_dbias = the switch (the kernel choice is the binding's:
    sm90/bwd_config.h sm90_bwd_takes_bias); without one, nothing."""
    fake = _FakeC(_launch._C)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(bias_mod._ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("P", (), {"multi_processor_count": 132}))
    q, k, v = (t.half().requires_grad_() for t in _qkv(2, 70, 96, 4, 2, 64))
    bias = torch.randn(2, 4, 70, 96).half().requires_grad_(bias_grad)
    with _ext.sm90_dbias(enabled):
        out, _ = bias_mod._FlashAttnBiasFunc.apply(q, k, v, bias, 0.125, -1, -1, False, 0.0,
                                                   None, 0.0, None)  # fmt: skip
        out.backward(torch.randn_like(out))
    name, bwd = fake.calls[1]
    assert name == "bwd"
    if bias_grad:
        assert bwd["sm90_dbias"] is enabled and bwd["dbias_dtype"] == 0
    else:
        assert "sm90_dbias" not in bwd and "dbias" not in bwd


# ---- GPU ----------------------------------------------------------------------------------


@pytest.fixture
def hopper_dbias(monkeypatch):
    """The Hopper backward on, with dbias (skips where it cannot run)."""
    if not BUILT:
        pytest.skip("build without FLASHATTN2_EXPERIMENTAL=bias")
    if not (torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)):
        pytest.skip("needs an sm_90 GPU")
    if not SM90_BWD_HEAD_DIMS or not MODS:
        pytest.skip("needs the Hopper backward with its mods instances (a bias runs there)")
    monkeypatch.setattr(_ext, "SM90_BWD", True)
    monkeypatch.setattr(_ext, "SM90_BWD_D64", True)
    monkeypatch.setattr(_ext, "SM90_DBIAS", True)


def _require(headdim):
    if headdim not in SM90_BWD_HEAD_DIMS:
        pytest.skip(f"this build has no Hopper backward of kernel head dim {headdim}")


# Leaf shapes of the bias (b, h, sq, sk) and the view attn_bias gets: "expanded" is a full-
# shape view with 0 batch / query strides (its target: the full gradient, which autograd
# sums back to the leaf); "narrowed" the first seqlen_k keys of rows padded to a multiple of
# 8 (aligned rows, any seqlen_k); "shifted" a view one key into wider rows (rows not 16-byte
# aligned: the mma.sync backward).
def _leaf_shape(kind, batch, nheads, seqlen_q, seqlen_k):
    return {"full": (batch, nheads, seqlen_q, seqlen_k), "batch": (1, nheads, seqlen_q, seqlen_k),
            "heads": (batch, 1, seqlen_q, seqlen_k), "plane": (seqlen_q, seqlen_k),
            "keys": (batch, 1, 1, seqlen_k), "expanded": (1, nheads, 1, seqlen_k),
            "narrowed": (batch, nheads, seqlen_q, seqlen_k + -seqlen_k % 8),
            "shifted": (batch, nheads, seqlen_q, seqlen_k + 1)}[kind]


def _view(kind, full):
    if kind == "expanded":
        return lambda t: t.expand(full)
    if kind == "shifted":
        return lambda t: t[..., 1:]
    if kind == "narrowed":
        return lambda t: t[..., :full[3]]
    return lambda t: t


def _run(kind, batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, bias_dtype,
         causal=False, window_size=(-1, -1), alibi=False, softcap=0.0, deterministic=False):
    """Forward and backward with a bias that requires grad, against float32 autograd (the 2x
    rule of test_bias._run_case; dbias also against the reference moved by our rounded out,
    _dbias_shift); returns (out, grads, the generation of the backward that ran)."""
    full = (batch, nheads, seqlen_q, seqlen_k)
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, device="cuda", dtype=dtype)
    shape = _leaf_shape(kind, batch, nheads, seqlen_q, seqlen_k)
    bias = torch.randn(shape, device="cuda", dtype=bias_dtype) * 2
    view = _view(kind, full)
    slopes = torch.rand(nheads, device="cuda") * 0.3 if alibi else None
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    _ext.last_bwd_arch = None
    out = flashattn2.flash_attn_func(*leaves[:3], causal=causal, window_size=window_size,
                                     softcap=softcap, alibi_slopes=slopes,
                                     deterministic=deterministic, attn_bias=view(leaves[3]))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    torch.cuda.synchronize()
    arch = _ext.last_bwd_arch
    results = {}
    for upcast in (True, False):
        ref_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
        ref_out = _reference(*ref_leaves[:3], view(ref_leaves[3]).expand(full), upcast, causal,
                             window_size, softcap, slopes)  # fmt: skip
        results[upcast] = (ref_out, *torch.autograd.grad(ref_out, ref_leaves, dout))
    atol = 4e-3 if dtype is torch.bfloat16 else 1e-3
    shift = _dbias_shift(q, k, v, view(bias).expand(full), out, dout, view(bias).shape, causal,
                         window_size, softcap, slopes)  # fmt: skip
    if kind in ("expanded", "narrowed", "shifted"):  # (to the leaf, as autograd does)
        leaf = bias.detach().float().requires_grad_()
        shift = torch.autograd.grad(view(leaf), leaf, shift)[0]
    for i, name in enumerate(("out", "dq", "dk", "dv", "dbias")):
        ours = out if i == 0 else grads[i - 1]
        assert ours.shape == results[True][i].shape and ours.dtype == results[True][i].dtype
        given = results[True][4].float() - shift if name == "dbias" else None
        _check(ours, results[True][i], results[False][i], name, atol, given)
    return out, grads, arch


KINDS = ["full", "batch", "heads", "plane", "keys", "expanded"]
DTYPES = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
          (torch.bfloat16, torch.float32)]  # fmt: skip


@gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,bias_dtype", DTYPES, ids=["bf16", "fp16", "bf16-fp32bias"])
@pytest.mark.parametrize("seqlens", [(113, 200), (256, 264), (1, 136), (300, 128)])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_against_float32(hopper_dbias, kind, dtype, bias_dtype, seqlens, headdim):
    """Every target (stored in bf16 / fp16 / fp32, float32 red.add over batch / heads, then
    torch over queries; a 0-stride full view), tiles with tails in queries and keys (key
    counts multiples of 8: 16-byte aligned bias rows, which the Hopper backward needs)."""
    _require(headdim)
    _, _, arch = _run(kind, 2, *seqlens, 4, 2, headdim, dtype, bias_dtype)
    assert arch == 90


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("seqlens", [(150, 261), (77, 203), (1, 97), (129, 129)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_odd_key_counts(hopper_dbias, dtype, seqlens, causal, headdim):
    """A bias viewed out of rows padded to 16 bytes, with an odd seqlen_k: the last key pair's
    second element is the target row's padding (written with dS = 0), outside the gradient."""
    _require(headdim)
    _, _, arch = _run("narrowed", 2, *seqlens, 4, 2, headdim, dtype, dtype, causal=causal)
    assert arch == 90


@gpu
@pytest.mark.parametrize("kind", ["full", "heads", "keys"])
@pytest.mark.parametrize("window", [(-1, 0), (40, 8), (30, -1), (-1, 24)])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_masks_and_windows(hopper_dbias, kind, window, deterministic, headdim):
    """Causal and sliding windows (bottom-right aligned, sq > sk): the steps the kernel
    visits write dS (0 where masked), the rest of the zero-filled target stays exactly 0.
    Deterministic: a broadcast bias's target is float32 stores (then torch's sum)."""
    _require(headdim)
    seqlen_q, seqlen_k = 190, 168
    causal = window == (-1, 0)
    size = (-1, -1) if causal else window
    _, grads, arch = _run(kind, 2, seqlen_q, seqlen_k, 4, 2, headdim, torch.bfloat16,
                          torch.bfloat16, causal=causal, window_size=size,
                          deterministic=deterministic)  # fmt: skip
    assert arch == 90
    hidden = ~_visible(seqlen_q, seqlen_k, window).cuda()
    dbias = grads[3]
    if kind == "keys":  # (summed over queries: a key hidden from every query)
        hidden = hidden.all(0, keepdim=True)
    assert torch.equal(dbias[..., hidden], torch.zeros_like(dbias[..., hidden]))
    assert torch.count_nonzero(dbias[..., ~hidden]) > 0


@gpu
@pytest.mark.parametrize("nheads_k", [1, 2, 8])
@pytest.mark.parametrize("kind", ["full", "heads", "plane"])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_gqa_and_alibi(hopper_dbias, nheads_k, kind, alibi, headdim):
    """GQA / MQA: a CTA walks every query head of its KV head, each writing its own plane
    (or adding into the shared one); ALiBi (a mod the bias instance carries) moves the
    logits, not dS's definition."""
    _require(headdim)
    _, _, arch = _run(kind, 2, 150, 200, 8, nheads_k, headdim, torch.bfloat16, torch.bfloat16,
                      causal=True, alibi=alibi)  # fmt: skip
    assert arch == 90


@gpu
@pytest.mark.parametrize("kind", ["full", "heads", "expanded"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_fills_a_nan_target(hopper_dbias, monkeypatch, kind, causal, deterministic,
                                       headdim):  # fmt: skip
    """A stored target of full attention is not zero-filled: NaN-filled here (padding
    included), every entry of the gradient must come back written (the 2x rule sees a NaN;
    a torch sum over a broadcast dim would carry one)."""
    _require(headdim)
    real = bias_mod.dbias_target
    poisoned = []

    def poison(shape, dtype, full, device, window_left, window_right, deterministic):
        target, add = real(shape, dtype, full, device, window_left, window_right, deterministic)
        if not add and window_left < 0 and window_right < 0:
            rows = target.shape[0] * target.shape[1] * target.shape[2]
            target.as_strided((rows * target.stride(2),), (1,)).fill_(float("nan"))
            poisoned.append(target)
        return target, add

    monkeypatch.setattr(bias_mod, "dbias_target", poison)
    _, grads, arch = _run(kind, 2, 200, 264, 4, 2, headdim, torch.bfloat16, torch.bfloat16,
                          causal=causal, deterministic=deterministic)  # fmt: skip
    assert arch == 90
    assert not torch.isnan(grads[3]).any()
    assert poisoned or causal or (kind == "heads" and not deterministic)


@gpu
@pytest.mark.parametrize("kind", ["full", "heads", "batch", "keys", "plane"])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_writes_nothing_outside_its_target(hopper_dbias, monkeypatch, kind,
                                                      bias_dtype, causal, headdim):  # fmt: skip
    """The target between two guard regions of a sentinel (each a whole target's size:
    where a wrong plane stride lands), inside one allocation: gradients under the 2x rule,
    guards untouched (query tails: 113, 77 rows; keys 200 / 136, partial key blocks)."""
    _require(headdim)
    real = bias_mod.dbias_target
    guards = []

    def guarded(shape, dtype, full, device, window_left, window_right, deterministic):
        target, add = real(shape, dtype, full, device, window_left, window_right, deterministic)
        n = target.untyped_storage().nbytes() // target.element_size()
        pad = n + -n % 64
        room = torch.full((n + 2 * pad,), 1536.0, dtype=target.dtype, device=device)
        room[pad:pad + n] = target.as_strided((n,), (1,))  # (padding included)
        guards.append((room, pad, n))
        return room[pad:pad + n].as_strided(target.shape, target.stride()), add

    monkeypatch.setattr(bias_mod, "dbias_target", guarded)
    for seqlens in ((113, 200), (77, 136)):
        _, _, arch = _run(kind, 2, *seqlens, 4, 2, headdim, torch.bfloat16, bias_dtype,
                          causal=causal)  # fmt: skip
        assert arch == 90
    assert guards, "the bias gradient did not go through dbias_target"
    for room, pad, n in guards:
        assert torch.all(room[:pad] == 1536.0) and torch.all(room[pad + n:] == 1536.0)


@gpu
@pytest.mark.parametrize("kind", ["full", "heads", "expanded"])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_deterministic_is_bitwise_reproducible(hopper_dbias, kind, bias_dtype,
                                                          headdim):  # fmt: skip
    """Each (b, h, i, j) is stored once by one CTA (no atomics in deterministic mode): two
    runs give the same bits, dq included (the dQ order)."""
    _require(headdim)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        out, grads, arch = _run(kind, 2, 300, 264, 4, 2, headdim, torch.bfloat16, bias_dtype,
                                causal=True, deterministic=True)  # fmt: skip
        assert arch == 90
        runs.append((out, *grads))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@gpu
@pytest.mark.parametrize("headdim", [64, 128])
def test_sm90_dbias_falls_back_where_it_does_not_apply(hopper_dbias, headdim):
    """The mma.sync backward writes dbias with softcap (dbias is dS before the softcap
    factor), a float16 gradient of a bfloat16 attention, unaligned bias rows, dbias rows
    that are not 16-byte multiples, and with the switch off; gradients under the 2x rule
    either way."""
    _require(headdim)
    args = (2, 130, 200, 4, 2, headdim, torch.bfloat16)
    assert _run("full", *args, torch.bfloat16, softcap=5.0)[2] == 80
    assert _run("full", *args, torch.float16)[2] == 80
    assert _run("heads", *args, torch.float16)[2] == 90  # (float32 buffer: red.add)
    assert _run("shifted", *args, torch.bfloat16)[2] == 80
    # a 16-bit target whose rows are not 16-byte multiples (the 16-byte stores need them;
    # bias.dbias_target pads to 8 elements): the mma.sync backward's pair stores
    real = bias_mod.dbias_target

    def even_rows(shape, dtype, full, device, window_left, window_right, deterministic):
        target, add = real(shape, dtype, full, device, window_left, window_right, deterministic)
        rows = torch.empty(target.shape[:3] + (full[3] + full[3] % 2,), dtype=target.dtype,
                           device=device)
        return rows[..., :full[3]], add

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bias_mod, "dbias_target", even_rows)
        assert _run("narrowed", *args[:2], 203, *args[3:], torch.bfloat16)[2] == 80
    assert _run("narrowed", *args[:2], 203, *args[3:], torch.bfloat16)[2] == 90
    with _ext.sm90_dbias(False):
        assert _run("full", *args, torch.bfloat16)[2] == 80
    assert _run("full", *args, torch.bfloat16)[2] == 90
