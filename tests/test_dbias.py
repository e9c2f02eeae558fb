"""The bias gradient's targets (bias.dbias_target): the kernel stores dS straight into the
gradient in the bias's dtype when the bias broadcasts nowhere, adds it by float32 atomics
into a buffer without the broadcast batch / head dims, and keeps the float32 (b, h, sq, sk)
buffer (stores, then torch's sum) in deterministic mode. CPU: the plan and the binding's
checks; GPU: each path against the float32 reference (test_bias._run_case), NaN-filled
targets, exact zeros outside a window.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _launch
from flashattn2 import bias as bias_mod
from test_bias import _qkv, _run_case, needs_bias

gpu = pytest.mark.gpu
FULL = (2, 4, 6, 9)  # (batch, nheads, seqlen_q, seqlen_k), odd seqlen_k


@pytest.mark.parametrize(
    "shape,deterministic,dims,add",
    [
        ((2, 4, 6, 9), False, (2, 4, 6, 9), False),  # no broadcast: the gradient itself
        ((4, 6, 9), False, (1, 4, 6, 9), True),      # over batch
        ((2, 1, 6, 9), False, (2, 1, 6, 9), True),   # over heads
        ((6, 9), False, (1, 1, 6, 9), True),         # over both
        ((2, 1, 1, 9), False, (2, 1, 6, 9), True),   # heads by atomics, queries by torch
        ((1, 4, 6, 1), False, (1, 4, 6, 9), True),
        ((6, 9), True, (2, 4, 6, 9), False),         # deterministic: stores, torch sums
        ((2, 4, 6, 9), True, (2, 4, 6, 9), False),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_dbias_target_plan(shape, deterministic, dims, add, dtype):
    for window in ((-1, -1), (3, 0)):
        target, got_add = bias_mod.dbias_target(shape, dtype, FULL, "cpu", *window, deterministic)
        assert target.shape == dims and got_add == add
        assert target.dtype == (dtype if shape == FULL else torch.float32)
        # rows of an even length (the kernel writes key pairs; 16-bit: a multiple of 8, the
        # Hopper backward's 16-byte stores), the padding outside the view
        row = 10 if target.dtype is torch.float32 else 16
        assert target.stride() == (dims[1] * 6 * row, 6 * row, row, 1)
        if add or window != (-1, -1):
            assert torch.count_nonzero(target) == 0
        grad = bias_mod.reduce_to(target, shape)
        assert grad.shape == shape


@pytest.mark.parametrize("shape", [(2, 4, 6, 9), (4, 6, 9), (2, 1, 6, 9), (6, 9), (2, 1, 1, 9),
                                   (1, 4, 6, 1)])  # fmt: skip
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_indexes_the_target_as_expanded_to_the_full_shape(shape, deterministic, dtype):
    """The kernel sends (b, h, i, j) to b * batch_stride + h * head_stride + i * row + j: the
    strides it gets must be those of the target expanded to (b, h, sq, sk) (0 where the
    target has one plane for every batch / head), and every (b, h, i, j) must land inside the
    target's storage. (GPU run 8: a size-1 dim's contiguous stride sent batch / head 1 past
    a (1, h, sq, sk) buffer: dv NaN, an illegal address, memcheck errors.)"""
    target, add = bias_mod.dbias_target(shape, dtype, FULL, "cpu", -1, -1, deterministic)
    args = _launch._dbias_args(target, add)
    assert args["dbias_strides"] == target.expand(FULL).stride()[:3]
    assert args["dbias_add"] == add and args["dbias"] == target.data_ptr()
    assert args["dbias_dtype"] == {torch.bfloat16: 1, torch.float32: 2}[target.dtype]
    last = sum((n - 1) * s for n, s in zip(FULL, args["dbias_strides"])) + FULL[3] + FULL[3] % 2
    assert last <= target.untyped_storage().nbytes() // target.element_size()


def test_dbias_direct_switch_keeps_the_float32_buffer(monkeypatch):
    monkeypatch.setattr(bias_mod._ext, "DBIAS_DIRECT", False)
    for shape in ((2, 4, 6, 9), (6, 9)):
        target, add = bias_mod.dbias_target(shape, torch.bfloat16, FULL, "cpu", -1, -1, False)
        assert target.shape == FULL and target.dtype == torch.float32 and not add


def test_dbias_target_without_broadcast_is_returned_as_is():
    """The gradient is the kernel's target itself (no float32 copy, no pass over it)."""
    target, add = bias_mod.dbias_target((1, 4, 6, 8), torch.bfloat16, (1, 4, 6, 8), "cpu",
                                        -1, -1, False)  # fmt: skip
    assert not add and target.is_contiguous()
    grad = bias_mod.reduce_to(target, (4, 6, 8)).to(torch.bfloat16)
    assert grad.data_ptr() == target.data_ptr()


def _bwd_args(dbias_strides, dbias_dtype=2, dbias_add=False, deterministic=False, dbias=512):
    """_C.bwd's arguments for (batch 2, 4 heads, sq 6, sk 9, d 64) with fake pointers: the
    bias checks run before anything touches the device."""
    s = (6 * 4 * 64, 4 * 64, 64)
    args = [16] * 11 + [s] * 8 + [(24, 6), 2, 6, 9, 4, 4, 64, 0.125, -1, -1, 1, 0, 0]
    return args, dict(deterministic=deterministic, attn_bias=256, bias_strides=(216, 54, 9, 1),
                      bias_dtype=1, dbias=dbias, dbias_strides=dbias_strides,
                      dbias_dtype=dbias_dtype, dbias_add=dbias_add)  # fmt: skip


@needs_bias
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dbias_strides=(240, 60, 10), dbias_add=True, deterministic=True), "reproducible"),
        (dict(dbias_strides=(0, 60, 10)), "needs dbias_add"),
        (dict(dbias_strides=(240, 0, 10)), "needs dbias_add"),
        (dict(dbias_strides=(216, 54, 9)), "even"),
        (dict(dbias_strides=(240, 60, 8)), "at least seqlen_k"),
        (dict(dbias_strides=(240, 60, 10), dbias=516), "aligned"),
        (dict(dbias_strides=(240, 60, 10), dbias_dtype=1, dbias_add=True), "float32"),
        (dict(dbias_strides=(240, 60, 10), dbias_dtype=3), "dbias_dtype"),
    ],
)
def test_binding_refuses_a_dbias_the_kernel_cannot_write(kwargs, match):
    args, kw = _bwd_args(**kwargs)
    with pytest.raises(ValueError, match=match):
        _launch._C.bwd(*args, **kw)


# ---- GPU --------------------------------------------------------------------------------


def _visible(seqlen_q, seqlen_k, window):
    """Bool (sq, sk): key j visible to query i (bottom-right aligned, as the kernels)."""
    i = torch.arange(seqlen_q).unsqueeze(1) + seqlen_k - seqlen_q
    j = torch.arange(seqlen_k).unsqueeze(0)
    left, right = window
    return ((j >= i - left) | (left < 0)) & ((j <= i + right) | (right < 0))


@gpu
@needs_bias
@pytest.mark.parametrize("kind", ["full", "heads", "batch", "plane", "keys"])
@pytest.mark.parametrize("dtype,bias_dtype", [(torch.bfloat16, torch.bfloat16),
                                              (torch.float16, torch.float16),
                                              (torch.bfloat16, torch.float32)])  # fmt: skip
@pytest.mark.parametrize("seqlens", [(113, 203), (200, 264), (1, 97), (256, 255)])
def test_dbias_paths_against_float32(kind, dtype, bias_dtype, seqlens):
    """Every target: stored in bf16 / fp16 / fp32 (full), float32 atomics over batch and / or
    heads, atomics then torch's sum over the queries (keys); odd key counts (padded rows)."""
    for headdim in (64, 128):
        _run_case(2, *seqlens, 4, 2, headdim, dtype, bias_dtype, kind)


@gpu
@needs_bias
@pytest.mark.parametrize("kind", ["full", "heads", "plane"])
@pytest.mark.parametrize("window", [(-1, 0), (40, 8), (30, -1)])
@pytest.mark.parametrize("deterministic", [False, True])
def test_dbias_is_exactly_zero_outside_the_window(kind, window, deterministic):
    seqlen_q, seqlen_k = 190, 171
    causal = window == (-1, 0)
    size = (-1, -1) if causal else window
    _, grads = _run_case(2, seqlen_q, seqlen_k, 4, 4, 64, torch.bfloat16, torch.bfloat16, kind,
                         causal=causal, window_size=size, deterministic=deterministic)
    hidden = ~_visible(seqlen_q, seqlen_k, window).cuda()
    dbias = grads[3]
    assert torch.equal(dbias[..., hidden], torch.zeros_like(dbias[..., hidden]))
    assert torch.count_nonzero(dbias[..., ~hidden]) > 0


@gpu
@needs_bias
@pytest.mark.parametrize("kind", ["full", "heads", "keys"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_dbias_target_is_written_wherever_it_is_not_zeroed(monkeypatch, kind, causal,
                                                           deterministic):  # fmt: skip
    """A stored target of full attention is not zero-filled: NaN-filled here (padding
    included), every entry of the user-visible gradient must come back written (a summed
    buffer shows one NaN too)."""
    real = bias_mod.dbias_target

    def poisoned(shape, dtype, full, device, window_left, window_right, deterministic):
        target, add = real(shape, dtype, full, device, window_left, window_right, deterministic)
        if not add and window_left < 0 and window_right < 0:
            rows = target.shape[0] * target.shape[1] * target.shape[2]
            target.as_strided((rows * target.stride(2),), (1,)).fill_(float("nan"))
        return target, add

    monkeypatch.setattr(bias_mod, "dbias_target", poisoned)
    _run_case(2, 200, 263, 4, 2, 64, torch.bfloat16, torch.bfloat16, kind, causal=causal,
              deterministic=deterministic)  # fmt: skip


@gpu
@needs_bias
@pytest.mark.parametrize("kind", ["full", "heads", "batch", "keys", "plane"])
@pytest.mark.parametrize("bias_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128])
def test_dbias_writes_nothing_outside_its_target(monkeypatch, kind, bias_dtype, causal, headdim):
    """GPU run 8's failures: a (1, h, sq, sk) / (b, 1, sq, sk) target got its size-1 dim's
    contiguous stride, so batch / head 1 wrote past it (test_bias: dv NaN at sq 113, sk 203,
    d64 / d128, then an illegal address; memcheck: a float32 (2, 1, 77, 113) bias, d64,
    causal). Here the target lies between two guard regions of a sentinel, inside one
    allocation: the gradients must pass the 2x rule and the guards stay untouched."""
    real = bias_mod.dbias_target
    guards = []

    def guarded(shape, dtype, full, device, window_left, window_right, deterministic):
        target, add = real(shape, dtype, full, device, window_left, window_right, deterministic)
        n = target.untyped_storage().nbytes() // target.element_size()
        pad = n + -n % 64  # (a whole target's worth: where a wrong plane stride lands)
        room = torch.full((n + 2 * pad,), 1536.0, dtype=target.dtype, device=device)
        room[pad:pad + n] = target.as_strided((n,), (1,))  # (padding included)
        guards.append((room, pad, n))
        return room[pad:pad + n].as_strided(target.shape, target.stride()), add

    monkeypatch.setattr(bias_mod, "dbias_target", guarded)
    for seqlens in ((113, 203), (77, 113)):
        _run_case(2, *seqlens, 4, 2, headdim, torch.bfloat16, bias_dtype, kind, causal=causal)
    assert guards, "the bias gradient did not go through dbias_target"
    for room, pad, n in guards:
        assert torch.all(room[:pad] == 1536.0) and torch.all(room[pad + n:] == 1536.0)


@gpu
@needs_bias
@pytest.mark.parametrize("shape", [(2, 4, 150, 133), (4, 150, 133), (150, 133)])
def test_direct_dbias_matches_the_float32_buffer_path(monkeypatch, shape):
    """The A/B switch (FLASHATTN2_DBIAS_DIRECT=0): the same kernel's dS through the float32
    buffer and torch; a full bias's gradient is the same bf16 rounding of the same floats."""
    q, k, v = _qkv(2, 150, 133, 4, 2, 64, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(q)
    grads = []
    for direct in (True, False):
        monkeypatch.setattr(bias_mod._ext, "DBIAS_DIRECT", direct)
        leaf = bias.clone().requires_grad_()
        out = flashattn2.flash_attn_func(q, k, v, causal=True, attn_bias=leaf)
        grads.append(torch.autograd.grad(out, leaf, dout)[0])
    if len(shape) == 4:
        assert torch.equal(grads[0], grads[1])
    else:  # (float32 sums in another order, then one bf16 rounding)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-2, atol=1e-3)


@gpu
@needs_bias
@pytest.mark.parametrize("shape", [(2, 4, 150, 264), (4, 150, 264), (2, 1, 1, 264)])
@pytest.mark.parametrize("mask", [dict(causal=False), dict(causal=True),
                                  dict(window_size=(60, 20))])  # fmt: skip
@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("seqlen_k", [264, 261])
def test_staged_bias_matches_the_per_score_loads(monkeypatch, shape, mask, headdim, seqlen_k):
    """A bias with 16-byte aligned rows (264 keys: a partial last key tile; 261: the first
    261 of 264, a partial last 16-byte chunk; 150 queries: a partial last query tile; a
    broadcast row) is staged in shared memory by the mma.sync backward;
    FLASHATTN2_BWD_BIAS_STAGED=0 reads it per score. The same values reach the same
    arithmetic: every gradient is bitwise equal (deterministic mode: dq in a fixed order,
    dbias by stores)."""
    q, k, v = _qkv(2, 150, seqlen_k, 4, 2, headdim, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(shape, device="cuda", dtype=torch.bfloat16)[..., :seqlen_k]
    dout = torch.randn_like(q)
    runs = []
    monkeypatch.setattr(bias_mod._ext, "SM90_DBIAS", False)  # (the mma.sync backward's)
    for staged in (True, False):
        monkeypatch.setattr(bias_mod._ext, "BWD_BIAS_STAGED", staged)
        leaves = [t.detach().requires_grad_() for t in (q, k, v, bias)]  # (bias: a view)
        out = flashattn2.flash_attn_func(*leaves[:3], attn_bias=leaves[3], deterministic=True,
                                         **mask)  # fmt: skip
        runs.append(torch.autograd.grad(out, leaves, dout))
        assert bias_mod._ext.last_bwd_arch == 80
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@gpu
@needs_bias
def test_deterministic_dbias_of_a_broadcast_bias_is_bitwise_reproducible():
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        q, k, v = _qkv(2, 300, 301, 4, 2, 64, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(300, 301, device="cuda", requires_grad=True)
        out = flashattn2.flash_attn_func(q, k, v, attn_bias=bias, deterministic=True)
        out.backward(torch.randn_like(out))
        runs.append(bias.grad)
    assert torch.equal(runs[0], runs[1])
