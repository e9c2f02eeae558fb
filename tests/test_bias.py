"""attn_bias (flash_attn_func) and attn_mask (scaled_dot_product_attention): argument checks
on the CPU in every build; on a GPU, in builds with FLASHATTN2_EXPERIMENTAL=bias, the
forward, dq / dk / dv and the bias gradient against a float32 autograd reference (the 2x
rule: at most twice PyTorch's own error in the input dtype, plus a small atol).
"""
import math

import flashattn2
import pytest
import torch
from flashattn2 import _launch
from flashattn2 import bias as bias_mod
from reference import attention_scores, dropout_keep_mask
from test_decode_kernel import binding_args
from test_sdpa import plain_attention, torch_sdpa

gpu = pytest.mark.gpu
BUILT = bias_mod.bias_built()
needs_bias = pytest.mark.skipif(not BUILT, reason="build without FLASHATTN2_EXPERIMENTAL=bias")


def _qkv(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_k=2, headdim=16, **kw):
    q = torch.randn(batch, seqlen_q, nheads, headdim, **kw)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, **kw)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, **kw)
    return q, k, v


# ---- CPU: checks, in every build -----------------------------------------------------------


@pytest.mark.parametrize(
    "bias,error,match",
    [
        ("not a tensor", TypeError, "attn_bias must be a tensor or None"),
        (torch.zeros(2, 4, 5, 7, dtype=torch.float64), ValueError, "float16, bfloat16, float32"),
        (torch.zeros(2, 4, 5, 7, dtype=torch.int32), ValueError, "float16, bfloat16, float32"),
        (torch.zeros(2, 4, 5, 8), ValueError, "broadcastable"),
        (torch.zeros(3, 1, 1, 7), ValueError, "broadcastable"),
        (torch.zeros(1, 2, 4, 5, 7), ValueError, "broadcastable"),
        (torch.zeros(7, 5), ValueError, "broadcastable"),
    ],
)
def test_bad_bias_is_named_before_the_device_check(bias, error, match):
    q, k, v = (t.half() for t in _qkv())
    with pytest.raises(error, match=match):
        flashattn2.flash_attn_func(q, k, v, attn_bias=bias)


@pytest.mark.skipif(BUILT, reason="this build has the bias kernels")
@pytest.mark.parametrize("shape", [(2, 4, 5, 7), (5, 7), (7,), (2, 1, 1, 7), ()])
def test_unbuilt_bias_says_how_to_build(shape):
    q, k, v = (t.half() for t in _qkv())
    with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL=bias"):
        flashattn2.flash_attn_func(q, k, v, attn_bias=torch.zeros(shape))
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with pytest.raises(NotImplementedError, match="FLASHATTN2_EXPERIMENTAL=bias"):
        flashattn2.scaled_dot_product_attention(qt, kt, vt, attn_mask=torch.ones(5, 7).bool(),
                                                enable_gqa=True)  # fmt: skip


@needs_bias
def test_good_bias_reaches_the_device_check():
    q, k, v = (t.half() for t in _qkv())
    with pytest.raises(ValueError, match="CUDA tensors"):
        flashattn2.flash_attn_func(q, k, v, attn_bias=torch.zeros(4, 5, 7))


@needs_bias
def test_sdpa_mask_errors():
    q, k, v = (t.half().transpose(1, 2) for t in _qkv(nheads_k=4))
    with pytest.raises(ValueError, match="cannot both be given"):
        flashattn2.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 7).bool(),
                                                is_causal=True)  # fmt: skip
    with pytest.raises(ValueError, match="attn_mask must be broadcastable"):
        flashattn2.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 6).bool())
    with pytest.raises(ValueError, match="attn_mask must be float16"):
        flashattn2.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 7).long())


@pytest.mark.parametrize("shape", [(2, 4, 5, 7), (1, 4, 5, 7), (2, 1, 1, 7), (5, 7), (7,),
                                   (4, 1, 7), ()])  # fmt: skip
def test_bias_gradient_sums_the_broadcast_dims(shape):
    """reduce_to is the adjoint of the broadcast: it equals autograd through expand."""
    full = (2, 4, 5, 7)
    grad = torch.randn(full)
    bias = torch.randn(shape, requires_grad=True)
    bias.expand(full).backward(grad)
    torch.testing.assert_close(bias_mod.reduce_to(grad, shape), bias.grad, rtol=1e-6, atol=1e-6)


def test_bool_mask_view_is_zero_or_minus_inf_without_copying_the_broadcast():
    mask = torch.rand(1, 1, 5, 7) > 0.5
    view = bias_mod.bias_view(mask, (2, 4, 5, 7), torch.bfloat16)
    assert view.shape == (2, 4, 5, 7) and view.dtype is torch.bfloat16
    assert view.stride()[:2] == (0, 0)
    assert torch.equal(view == 0, mask.expand(2, 4, 5, 7))
    assert torch.isneginf(view[~mask.expand(2, 4, 5, 7)]).all()


def test_kernel_arguments_refuse_a_bias_that_is_not_two_bytes():
    """The kernels read 2-byte elements in q's dtype: a float32 view reaching the launch
    arguments would be read as garbage halves, so it raises (bias_view casts first)."""
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        _launch._mod_kwargs(attn_bias=torch.zeros(1, 1, 2, 3))
    mods = _launch._mod_kwargs(attn_bias=torch.zeros(1, 1, 2, 3, dtype=torch.bfloat16))
    assert mods["bias_dtype"] == 1 and mods["bias_strides"] == (6, 6, 3, 1)


class _FakeC:
    """Records the keyword arguments of _C.fwd / _C.bwd (no GPU): the Python side's plumbing
    of the bias, checked against the real binding's argument names."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def _record(self, name, args, kwargs):
        names = binding_args(getattr(self.real, name))  # (positional ones by the signature)
        unknown = [key for key in kwargs if key not in names[len(args):]]
        assert not unknown, f"_C.{name} has no argument(s) {unknown}"
        self.calls.append((name, {**dict(zip(names, args)), **kwargs}))
        return 80

    def fwd(self, *args, **kwargs):
        return self._record("fwd", args, kwargs)

    def bwd(self, *args, **kwargs):
        return self._record("bwd", args, kwargs)

    def sm90_fwd_applies(self, *args):
        return False

    def bwd_dq_chains(self, *args):
        return 1

    def bwd_workspace_floats(self, *args):
        return 16, 16


@needs_bias
@pytest.mark.parametrize("bias_dtype", [torch.float16, torch.bfloat16, torch.float32, torch.bool])
def test_bias_reaches_the_binding_as_a_broadcast_view(monkeypatch, bias_dtype):
    """Whatever the bias's dtype, the kernels get q's (fp16 here: code 0), the broadcast dims
    as 0 strides; the gradient comes back in the bias's dtype and shape."""
    code = 0
    fake = _FakeC(_launch._C)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(bias_mod._ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("P", (), {"multi_processor_count": 132}))
    q, k, v = (t.half().requires_grad_() for t in _qkv(2, 70, 90, 4, 2, 64))
    bias = torch.randn(2, 1, 1, 90).to(bias_dtype)
    if bias_dtype is not torch.bool:
        bias.requires_grad_()
    out, _ = bias_mod._FlashAttnBiasFunc.apply(q, k, v, bias, 0.125, -1, -1, False, 0.0, None,
                                               0.0, None)  # fmt: skip
    (name, fwd), = fake.calls
    assert name == "fwd" and fwd["num_splits"] == 1 and fwd["q_pack"] == 1
    assert fwd["bias_strides"] == (90, 0, 0, 1) and fwd["bias_dtype"] == code
    out.backward(torch.randn_like(out))
    name, bwd = fake.calls[1]
    assert name == "bwd" and bwd["attn_bias"] == fwd["attn_bias"]
    assert bwd["bias_strides"] == fwd["bias_strides"] and bwd["bias_dtype"] == code
    if bias_dtype is torch.bool:
        assert "dbias" not in bwd and bias.grad is None
    else:  # (heads by float32 atomics into a (2, 1, 70, 90) buffer: head stride 0; rows
        # by torch. 6300 there, as before GPU run 8, sent heads 1-3 past the buffer.)
        assert bwd["dbias_strides"] == (70 * 90, 0, 90) and bwd["dbias_add"]
        assert bwd["dbias_dtype"] == 2
        assert bias.grad.shape == bias.shape and bias.grad.dtype == bias_dtype


def test_bias_operators_fake_implementations():
    """flashattn2::fwd_bias / ::bwd_bias on meta tensors (their fake implementations): outputs
    like fwd / bwd's, dbias float32 of the bias view's shape, or empty when not asked for."""
    q = torch.empty(2, 33, 4, 64, device="meta", dtype=torch.bfloat16)
    k = v = torch.empty(2, 40, 2, 64, device="meta", dtype=torch.bfloat16)
    bias = torch.empty(2, 1, 1, 40, device="meta", dtype=torch.float32).expand(2, 4, 33, 40)
    out, lse = torch.ops.flashattn2.fwd_bias(q, k, v, bias, 0.125, -1, 0)
    assert out.shape == q.shape and lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    for bias_grad in (True, False):
        dq, dk, dv, dbias = torch.ops.flashattn2.bwd_bias(out, q, k, v, out, lse, bias, 0.125,
                                                          -1, 0, False, bias_grad)  # fmt: skip
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        assert dbias.dtype == torch.float32
        assert dbias.shape == ((2, 4, 33, 40) if bias_grad else (0,))
    # with the bias's shape and dtype (the autograd node's): its gradient
    *_, dbias = torch.ops.flashattn2.bwd_bias(out, q, k, v, out, lse, bias, 0.125, -1, 0, False,
                                              True, bias_shape=[2, 1, 1, 40],
                                              bias_dtype=torch.bfloat16)  # fmt: skip
    assert dbias.shape == (2, 1, 1, 40) and dbias.dtype == torch.bfloat16


@needs_bias
def test_make_fx_records_the_bias_operators(monkeypatch):
    from test_compile import NoLaunch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setattr(_launch, "_C", NoLaunch(_launch._C))

    def f(q, k, v, mask):
        return flashattn2.flash_attn_func(q, k, v, causal=True, attn_bias=mask)

    with FakeTensorMode():
        q, k, v = _qkv(2, 33, 40, 4, 2, 64, device="cuda", dtype=torch.float16)
        mask = torch.empty(2, 1, 1, 40, device="cuda", dtype=torch.bool)
        graph = make_fx(f)(q, k, v, mask).code
        assert f(q, k, v, mask).shape == q.shape
    assert graph.count("torch.ops.flashattn2.fwd_bias.default(") == 1
    assert "torch.ops.flashattn2.fwd.default(" not in graph


# ---- GPU: the kernels (builds with the bias) -------------------------------------------------


def _probs(q, k, bias, causal, window_size, softcap, alibi_slopes):
    """Softmax of the logits plus ``bias`` in q's dtype; rows that see no key give 0."""
    scores, _ = attention_scores(q, k, causal, window_size, None, softcap, alibi_slopes)
    scores = scores + bias.to(scores.dtype)
    dead = torch.isneginf(scores).all(-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def _reference(q, k, v, bias, upcast, causal=False, window_size=(-1, -1), softcap=0.0,
               alibi_slopes=None, keep=None, dropout_p=0.0):  # fmt: skip
    """out of attention with ``bias`` (a (b, h, sq, sk) float view) added to the logits, by
    autograd-friendly torch ops: float32 (upcast) or in q's dtype. Rows that see no key give
    0, as the kernels."""
    dtype = q.dtype
    if upcast:
        q, k, v, bias = q.float(), k.float(), v.float(), bias.float()
    probs = _probs(q, k, bias, causal, window_size, softcap, alibi_slopes)
    if keep is not None:
        probs = probs.masked_fill(~keep, 0.0) / (1.0 - dropout_p)
    v = v.repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    return torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v).to(dtype)


def _check(ours, ref, low, name, atol, ref_given=None):
    """The 2x rule, the atol a rounding at magnitude 1 scaled to the binade of the largest
    reference value (as test_fuzz.check_rule); ``ref_given``: the float32 FA2 backward at
    our output (``_dbias_shift``), the closer of the two references counts."""
    err = (ours.float() - ref.float()).abs().max().item()
    if ref_given is not None:
        err = min(err, (ours.float() - ref_given.float()).abs().max().item())
    base = (low.float() - ref.float()).abs().max().item()
    peak = ref.float().abs().max().item()
    atol *= 2.0 ** math.floor(math.log2(peak)) if peak >= 1 else 1.0
    assert not math.isnan(err), f"{name}: NaN"
    assert err <= 2 * base + atol, f"{name}: max error {err:.3e} > 2 x {base:.3e} + {atol}"


def _dbias_shift(q, k, v, bias_full, out, dout, shape, causal, window_size, softcap,
                 alibi_slopes):  # fmt: skip
    """What the FA2 backward's D = rowsum(dO o out), taken from our rounded out rather than
    the exact one, moves dbias by: dS = P (dP - D) changes by -P delta, delta = rowsum(dO o
    (out - out_exact)). A bias shared by the heads ("keys") sums that over the heads, where
    the same keys dominate (H100, d64 bf16, sq 1: dbias 2.7e-2 against PyTorch's 8.8e-3)."""
    probs = _probs(q.float(), k.float(), bias_full.float(), causal, window_size, softcap,
                   alibi_slopes)  # fmt: skip
    v = v.float().repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    exact = torch.einsum("bhqk,bkhd->bqhd", probs, v)  # (the reference's out before rounding)
    delta = (dout.float() * (out.float() - exact)).sum(-1).transpose(1, 2)
    return bias_mod.reduce_to(probs * delta.unsqueeze(-1), shape)


def _make_bias(kind, batch, nheads, seqlen_q, seqlen_k, dtype):
    shape = {"full": (batch, nheads, seqlen_q, seqlen_k), "heads": (1, nheads, seqlen_q, seqlen_k),
             "keys": (batch, 1, 1, seqlen_k), "plane": (seqlen_q, seqlen_k),
             "batch": (batch, 1, seqlen_q, seqlen_k)}[kind]  # fmt: skip
    return torch.randn(shape, device="cuda", dtype=dtype) * 2


def _run_case(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype, bias_dtype, kind,
              causal=False, window_size=(-1, -1), softcap=0.0, alibi=False,
              deterministic=False, bias_grad=True):  # fmt: skip
    """Forward and backward against float32 autograd; without ``bias_grad`` the bias is a
    constant (a mask): no dbias, which the Hopper backward takes."""
    from flashattn2 import _ext

    if max(_ext.build_info()["head_dims"]) < headdim:  # development builds of fewer head dims
        pytest.skip(f"this build has no kernel head dim >= {headdim}")
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, device="cuda", dtype=dtype)
    bias = _make_bias(kind, batch, nheads, seqlen_q, seqlen_k, bias_dtype)
    slopes = torch.rand(nheads, device="cuda") * 0.3 if alibi else None
    n = 4 if bias_grad else 3
    leaves = [t.detach().clone().requires_grad_(i < n) for i, t in enumerate((q, k, v, bias))]
    out = flashattn2.flash_attn_func(*leaves[:3], causal=causal, window_size=window_size,
                                     softcap=softcap, alibi_slopes=slopes,
                                     deterministic=deterministic, attn_bias=leaves[3])  # fmt: skip
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves[:n], dout)
    full = (batch, nheads, seqlen_q, seqlen_k)
    results = {}
    for upcast in (True, False):
        ref_leaves = [t.detach().clone().requires_grad_(i < n)
                      for i, t in enumerate((q, k, v, bias))]
        ref_out = _reference(*ref_leaves[:3], ref_leaves[3].expand(full), upcast, causal,
                             window_size, softcap, slopes)  # fmt: skip
        results[upcast] = (ref_out, *torch.autograd.grad(ref_out, ref_leaves[:n], dout))
    atol = 4e-3 if dtype is torch.bfloat16 else 1e-3  # test_sdpa.py ATOL
    shift = _dbias_shift(q, k, v, bias.expand(full), out, dout, bias.shape, causal, window_size,
                         softcap, slopes)  # fmt: skip
    for i, name in enumerate(("out", "dq", "dk", "dv", "dbias")[:n + 1]):
        ours = out if i == 0 else grads[i - 1]
        assert ours.shape == results[True][i].shape and ours.dtype == results[True][i].dtype
        given = results[True][4].float() - shift if name == "dbias" else None
        _check(ours, results[True][i], results[False][i], name, atol, given)
    return out, grads


@gpu
@needs_bias
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind", ["full", "heads", "keys", "plane"])
@pytest.mark.parametrize("seqlens", [(113, 203), (256, 256), (1, 97), (200, 264)])
def test_bias_forward_and_gradients(dtype, headdim, causal, kind, seqlens):
    """(200, 264): keys a multiple of 8 with a partial last key block and a partial query
    block, the staged-bias path of the Hopper forward (d64 / d128, 16-byte aligned rows)."""
    _run_case(2, *seqlens, 4, 2, headdim, dtype, dtype, kind, causal=causal)


@gpu
@needs_bias
@pytest.mark.parametrize("bias_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("headdim", [32, 96, 256])
def test_bias_dtypes_and_head_dims(bias_dtype, headdim):
    _run_case(1, 130, 150, 2, 1, headdim, torch.bfloat16, bias_dtype, "full")


@gpu
@needs_bias
@pytest.mark.parametrize("mods", [dict(softcap=5.0), dict(alibi=True), dict(softcap=4.0, alibi=True),
                                  dict(window_size=(40, 8)), dict(causal=True, window_size=(30, 0))])
def test_bias_with_other_modifiers(mods):
    _run_case(2, 190, 170, 4, 4, 64, torch.bfloat16, torch.bfloat16, "full", **mods)


@gpu
@needs_bias
@pytest.mark.parametrize("sm80", [False, True], ids=["default", "force_sm80"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_bias_forward_on_both_kernel_families(sm80, headdim):
    """On an sm_90 GPU the Hopper forward takes the bias (more than 64 query rows); forced to
    the mma.sync kernels, the same inputs give the same answer within the 2x rule."""
    from flashattn2 import _ext

    with flashattn2.force_sm80(sm80):
        _run_case(2, 200, 333, 4, 2, headdim, torch.bfloat16, torch.bfloat16, "heads",
                  causal=True)  # fmt: skip
        arch = _ext.last_fwd_arch
    hopper = (torch.cuda.get_device_capability() == (9, 0)
              and headdim in _ext.build_info()["sm90_fwd_head_dims"])  # fmt: skip
    assert arch == (90 if hopper and not sm80 else 80)


@gpu
@needs_bias
@pytest.mark.parametrize("kind", ["full", "heads", "keys", "plane"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", [(200, 264), (256, 256), (1, 96), (300, 136)])
def test_bias_without_grad_on_the_hopper_backward(kind, causal, seqlens):
    """A constant bias (a mask: no dbias) with 16-byte aligned rows runs the Hopper backward's
    staged-bias instance on an sm_90 GPU; gradients of q, k, v under the 2x rule. A bias that
    needs its gradient (unless _ext.SM90_DBIAS), or unaligned rows, takes the mma.sync
    backward."""
    from flashattn2 import _ext

    _ext.last_bwd_arch = None
    _run_case(2, *seqlens, 4, 2, 128, torch.bfloat16, torch.bfloat16, kind, causal=causal,
              bias_grad=False)  # fmt: skip
    hopper = (torch.cuda.get_device_capability() == (9, 0)
              and 128 in _ext.build_info()["sm90_bwd_head_dims"]
              and "mods" in _ext.build_info()["sm90_bwd_experimental"])  # fmt: skip
    assert _ext.last_bwd_arch == (90 if hopper else 80)
    _run_case(1, *seqlens, 2, 2, 128, torch.bfloat16, torch.bfloat16, kind, causal=causal)
    # dbias: the mma.sync backward writes it, the Hopper one under FLASHATTN2_SM90_DBIAS=1
    # (test_sm90_dbias.py)
    assert _ext.last_bwd_arch == (90 if hopper and _ext.SM90_DBIAS else 80)
    if seqlens[1] % 8:
        return
    # Unaligned rows (a view one key in): per-score loads of the mma.sync backward.
    torch.manual_seed(0)
    q, k, v = _qkv(1, seqlens[0], seqlens[1], 2, 2, 128, device="cuda", dtype=torch.bfloat16)
    wide = torch.randn(1, 2, seqlens[0], seqlens[1] + 1, device="cuda", dtype=torch.bfloat16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashattn2.flash_attn_func(*leaves, causal=causal, attn_bias=wide[..., 1:])
    out.backward(torch.randn_like(out))
    assert _ext.last_bwd_arch == 80


@gpu
@needs_bias
def test_bias_deterministic_is_bitwise_reproducible():
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        out, grads = _run_case(2, 300, 300, 4, 2, 64, torch.bfloat16, torch.float32, "heads",
                               causal=True, deterministic=True)  # fmt: skip
        runs.append((out, *grads))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@gpu
@needs_bias
def test_bias_with_dropout_matches_the_kernels_mask():
    batch, seqlen_q, seqlen_k, nheads, headdim, p = 2, 140, 120, 2, 64, 0.2
    q, k, v = _qkv(batch, seqlen_q, seqlen_k, nheads, nheads, headdim, device="cuda",
                   dtype=torch.float16)  # fmt: skip
    bias = _make_bias("full", batch, nheads, seqlen_q, seqlen_k, torch.float16)
    torch.manual_seed(7)
    seed, offset = _launch._rng_state(q.device).tolist()
    keep = dropout_keep_mask(seed, offset, batch, nheads, seqlen_q, seqlen_k, p, q.device)
    torch.manual_seed(7)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
    out = flashattn2.flash_attn_func(*leaves[:3], dropout_p=p, attn_bias=leaves[3])
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, dout)
    refs = {}
    for upcast in (True, False):
        ref_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
        ref = _reference(*ref_leaves[:3], ref_leaves[3], upcast, keep=keep, dropout_p=p)
        refs[upcast] = (ref, *torch.autograd.grad(ref, ref_leaves, dout))
    names = ("out", "dq", "dk", "dv", "dbias")
    for ours, r, lo, name in zip((out, *grads), refs[True], refs[False], names):
        _check(ours, r, lo, name, 5e-4)


@gpu
@needs_bias
def test_bool_mask_rows_without_keys_give_zero():
    q, k, v = _qkv(2, 70, 90, 2, 2, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.rand(2, 1, 70, 90, device="cuda") > 0.3
    mask[:, :, 5] = False  # row 5 sees no key
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = flashattn2.flash_attn_func(*leaves, attn_bias=mask)
    assert torch.equal(out[:, 5], torch.zeros_like(out[:, 5]))
    grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
    assert all(torch.isfinite(g).all() for g in grads)
    bias = torch.zeros(mask.shape, device="cuda").masked_fill(~mask, float("-inf"))
    ref = _reference(q, k, v, bias.expand(2, 2, 70, 90), True)
    low = _reference(q, k, v, bias.expand(2, 2, 70, 90), False)
    _check(out, ref, low, "out", 2e-3)


@gpu
@needs_bias
def test_every_output_element_is_written():
    """NaN-filled out and lse: the kernel writes every element (rows past 64 in the plain
    kernel, bias read through a transposed, strided view)."""
    q, k, v = _qkv(2, 77, 131, 4, 2, 64, device="cuda", dtype=torch.float16)
    bias = torch.randn(2, 4, 131, 77, device="cuda", dtype=torch.float16).transpose(2, 3)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, 77), float("nan"), device="cuda")
    _launch._flash_attn_forward(q, k, v, 0.125, -1, -1, out=out, lse=lse, attn_bias=bias)
    ref = _reference(q, k, v, bias, True)
    low = _reference(q, k, v, bias, False)
    assert torch.isfinite(lse).all()
    _check(out, ref, low, "out", 5e-4)


@gpu
@needs_bias
@pytest.mark.parametrize("shape", [(2, 4, 129, 257), (1, 1, 1, 257)])
def test_compile_fullgraph_matches_eager(shape):
    q, k, v = _qkv(2, 129, 257, 4, 2, 64, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)

    def loss_fn(q, k, v, bias):
        out = flashattn2.flash_attn_func(q, k, v, causal=True, attn_bias=bias)
        return (out.float() * dout.float()).sum(), out

    results = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, bias)]
        loss, out = fn(*leaves)
        loss.backward()
        results.append([out] + [t.grad for t in leaves])
    for a, b in zip(results[0][:4], results[1][:4]):  # the same kernels on the same inputs
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # (the bias gradient's sum over broadcast dims may run in another order once compiled)
    torch.testing.assert_close(results[0][4], results[1][4])


@gpu
@needs_bias
def test_opcheck_bias_operators():
    q, k, v = _qkv(2, 77, 130, 4, 2, 64, device="cuda", dtype=torch.float16)
    bias = torch.randn(2, 1, 77, 130, device="cuda").expand(2, 4, 77, 130)
    args = (q, k, v, bias, 0.125, -1, -1)  # (window -1, -1: full, as flash_attn_func's default)
    torch.library.opcheck(torch.ops.flashattn2.fwd_bias.default, args)
    out, lse = torch.ops.flashattn2.fwd_bias(*args)
    torch.testing.assert_close(out, flashattn2.flash_attn_func(q, k, v, attn_bias=bias),
                               atol=0, rtol=0)  # fmt: skip
    dout = torch.randn_like(q)
    for bias_grad in (True, False):
        torch.library.opcheck(torch.ops.flashattn2.bwd_bias.default,
                              (dout, q, k, v, out, lse, bias, 0.125, -1, 0, False, bias_grad))
    for shape, dtype in (((2, 1, 77, 130), torch.float32), ((2, 4, 77, 130), torch.float16)):
        torch.library.opcheck(torch.ops.flashattn2.bwd_bias.default,
                              (dout, q, k, v, out, lse, bias, 0.125, -1, 0, False, True),
                              dict(bias_shape=list(shape), bias_dtype=dtype))


# SDPA entry point: against torch's SDPA math backend in float32 (the truth); PyTorch's own
# error is the larger of that backend's in the input dtype and plain attention's
# (test_sdpa.py's rule).


@gpu
@needs_bias
@pytest.mark.parametrize("mask_kind", ["bool", "float"])
@pytest.mark.parametrize("shape", [(2, 4, 100, 130), (100, 130), (2, 1, 1, 130), (4, 1, 130)])
@pytest.mark.parametrize("enable_gqa", [False, True])
def test_sdpa_attn_mask_matches_torch(mask_kind, shape, enable_gqa):
    heads_k = 2 if enable_gqa else 4
    q = torch.randn(2, 4, 100, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, heads_k, 130, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, heads_k, 130, 64, device="cuda", dtype=torch.bfloat16)
    if mask_kind == "bool":
        mask = torch.rand(shape, device="cuda") > 0.2
        mask[..., 0] = True  # (rows without keys: torch's math backend gives NaN before 2.5)
    else:
        mask = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    tensors = [q, k, v] + ([mask] if mask_kind == "float" else [])
    dout = torch.randn(2, 4, 100, 64, device="cuda", dtype=torch.bfloat16)

    def run(fn, upcast):
        cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
        leaves = [cast(t).requires_grad_() for t in tensors]
        m = leaves[3] if mask_kind == "float" else mask
        out = fn(*leaves[:3], m)
        return [out, *torch.autograd.grad(out, leaves, cast(dout))]

    ours = run(lambda q, k, v, m: flashattn2.scaled_dot_product_attention(
        q, k, v, attn_mask=m, enable_gqa=enable_gqa), False)
    truth = run(lambda q, k, v, m: torch_sdpa(q, k, v, enable_gqa, attn_mask=m), True)
    pt_sdpa = run(lambda q, k, v, m: torch_sdpa(q, k, v, enable_gqa, attn_mask=m), False)
    pt_plain = run(lambda q, k, v, m: plain_attention(q, k, v, enable_gqa, attn_mask=m), False)
    for name, x, t, a, b in zip(("out", "dq", "dk", "dv", "dmask"), ours, truth, pt_sdpa, pt_plain):
        assert x.shape == t.shape and x.dtype == torch.bfloat16, name
        err = (x.float() - t).abs().max().item()
        err_pt = max((a.float() - t).abs().max().item(), (b.float() - t).abs().max().item())
        assert err <= 2 * err_pt + 4e-3, f"{name}: {err:.3e} > 2 x {err_pt:.3e} + 4e-3"
