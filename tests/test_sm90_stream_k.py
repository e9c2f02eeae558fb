"""The Hopper forward's stream-K tail (cpp/sm90/fwd_config.h sm90_fwd_stream_k): a dense forward
without a window, in one split, whose tiles overrun the SMs by part of a wave shares its last
waves' key blocks evenly between the persistent CTAs. A tile split between two CTAs is merged
through a float32 workspace: the first of its pieces to finish leaves its O accumulators and
softmax state there, the second folds them in and stores the tile (cpp/sm90/fwd_epilogue.cuh).

GPU tests, on shapes sized to this GPU's SM count (one wave and a bit, two and a half): results
against the float32 reference under test_fwd.py's rule (out and lse NaN-poisoned) at kernel head
dims 64 and 128 (a padded head dim too), with query tails (a warpgroup with no row), key tails,
16 key blocks (the fewest it takes), cross attention, GQA, softcap, ALiBi and an attention bias
(full and broadcast); the same bits on every run and with the pieces' roles swapped by timing;
the flags left zero for the next launch; a CUDA graph replayed; and the switch, which keeps the
static walk. Without a part-wave tail, under 16 key blocks, or at d192 / d256, no workspace is asked
for.
"""
import math

import pytest
import torch
from flashattn2 import _ext, _launch, flash_attn_func
from reference import attention_ref
from test_fwd import ATOL, check_output, dtype_id, make_qkv, run_kernel
from test_sm90 import SM90_HEAD_DIMS, require_sm90

pytestmark = pytest.mark.gpu
_C = _ext._C


def _sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


def _block_m(headdim):
    """Query rows per Hopper forward tile (cpp/sm90/fwd_config.h sm90_fwd_tile)."""
    return 192 if _ext.KERNEL_HEAD_DIM[headdim + (-headdim % 8)] <= 64 else 128


def _batch_for(waves, seqlen_q, nheads, headdim):
    """The smallest batch whose tiles fill `waves` waves of the SMs, not a whole number."""
    per_batch = math.ceil(seqlen_q / _block_m(headdim)) * nheads
    batch = max(1, math.ceil(waves * _sms() / per_batch))
    while batch * per_batch % _sms() == 0 or batch * per_batch <= _sms():
        batch += 1
    return batch


def _floats(q, k):
    batch, seqlen_q, nheads, headdim = q.shape
    return _C.sm90_fwd_stream_k_floats(q.device.index, batch, nheads, seqlen_q, k.shape[1],
                                       headdim + (-headdim % 8))


def _make(waves, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype):
    require_sm90(headdim)
    if _ext.FORCE_SM80:
        pytest.skip("FLASHATTN2_FORCE_SM80: the mma.sync kernels have no stream-K tail")
    batch = _batch_for(waves, seqlen_q, nheads, headdim)
    q, k, v = make_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype)
    assert _floats(q, k) > 0, "the shape must take the stream-K tail"
    return q, k, v


def _flags_zero():
    torch.cuda.synchronize()
    return all(not counter.any() for counter in _launch._TILE_COUNTERS.values())


# (seqlen_q, seqlen_k, nheads, nheads_k, headdim): kernel head dims 64 and 128 (d192 / d256 take
# no tail: sm90_fwd_stream_k), from 16 key blocks of 128 (2048 keys) on; 320 rows leave
# warpgroup 1 of the last 128-row tile without a row; key tails; d80 is padded to the d128
# kernel.
CASES = [(1000, 2048, 6, 2, 128), (320, 2100, 4, 4, 128), (500, 2048, 8, 8, 64),
         (300, 2500, 4, 1, 80)]  # fmt: skip


@pytest.mark.parametrize("waves", [1.3, 2.5])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_matches_reference(dtype, case, waves):
    q, k, v = _make(waves, *case, dtype)
    out, lse = run_kernel(q, k, v)
    assert _ext.last_fwd_kernel == "sm90"
    check_output(out, lse, q, k, v)
    assert _flags_zero(), "the second piece of each split tile must clear its flag"
    out2, lse2 = run_kernel(q, k, v)
    assert torch.equal(out, out2) and torch.equal(lse, lse2), "stream-K must be deterministic"


@pytest.mark.parametrize("mods", ["softcap", "alibi"])
def test_score_mods(mods):
    q, k, v = _make(1.5, 600, 2048, 8, 2, 128, torch.bfloat16)
    kwargs = {"softcap": 15.0} if mods == "softcap" else {
        "alibi_slopes": torch.rand(q.shape[2], device="cuda") * 0.3}
    out = flash_attn_func(q, k, v, **kwargs)
    out_ref, _ = attention_ref(q, k, v, **kwargs)
    out_pt, _ = attention_ref(q, k, v, upcast=False, **kwargs)
    err = (out.float() - out_ref.float()).abs().max().item()
    err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
    assert err <= 2 * err_pt + ATOL[q.dtype], (err, err_pt)
    assert _flags_zero()


@pytest.mark.parametrize("kind", ["full", "keys"])
def test_attention_bias(kind):
    """The bias instances (a full bias staged in shared memory; a broadcast one read per
    score) through the tail, forward, under test_bias.py's rule."""
    from flashattn2 import bias as bias_mod
    from test_bias import _check, _make_bias, _reference

    if not bias_mod.bias_built():
        pytest.skip("build without FLASHATTN2_EXPERIMENTAL=bias")
    q, k, v = _make(1.3, 600, 2048, 8, 2, 128, torch.bfloat16)
    batch, seqlen_q, nheads, _ = q.shape
    bias = _make_bias(kind, batch, nheads, seqlen_q, k.shape[1], torch.bfloat16)
    out = flash_attn_func(q, k, v, attn_bias=bias)
    assert _ext.last_fwd_kernel == "sm90"
    full = bias.expand(batch, nheads, seqlen_q, k.shape[1])
    _check(out, _reference(q, k, v, full, True), _reference(q, k, v, full, False), "out", 4e-3)
    assert _flags_zero()


def test_same_bits_whichever_piece_merges():
    """The pieces' merge is symmetric (both products rounded, then one add), so the result does
    not depend on which piece finishes first; a busy stream beside it shifts the timing."""
    q, k, v = _make(1.3, 1000, 2048, 4, 4, 128, torch.bfloat16)
    first = run_kernel(q, k, v)
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        with torch.cuda.stream(side):
            big @ big
        again = run_kernel(q, k, v)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    torch.cuda.synchronize()


def test_cuda_graph():
    q, k, v = _make(2.5, 1000, 2048, 4, 2, 128, torch.float16)
    eager = flash_attn_func(q, k, v)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v)  # (warm-up on the capture stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = flash_attn_func(q, k, v)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_switch_keeps_the_static_walk():
    q, k, v = _make(1.3, 1000, 2048, 4, 4, 128, torch.bfloat16)
    calls = []
    real = _launch._C

    class Recorder:
        def __getattr__(self, name):
            return getattr(real, name)

        def sm90_fwd_stream_k_floats(self, *args):
            calls.append(args)
            return real.sm90_fwd_stream_k_floats(*args)

    try:
        _launch._C = Recorder()
        with _ext.sm90_stream_k(False):
            out_off, lse_off = run_kernel(q, k, v)
        assert not calls
        out_on, lse_on = run_kernel(q, k, v)
        assert len(calls) == 1
    finally:
        _launch._C = real
    check_output(out_off, lse_off, q, k, v)
    check_output(out_on, lse_on, q, k, v)


def test_workspace_only_for_the_tail():
    require_sm90(128)
    sms = _sms()
    dev = torch.cuda.current_device()
    # (batch, nheads, seqlen_q, seqlen_k, headdim): tiles of 128 rows at d128
    assert _C.sm90_fwd_stream_k_floats(dev, 1, sms, 128, 4096, 128) == 0  # one whole wave
    assert _C.sm90_fwd_stream_k_floats(dev, 1, sms - 1, 128, 4096, 128) == 0  # under one
    assert _C.sm90_fwd_stream_k_floats(dev, 2, sms, 128, 4096, 128) == 0  # two whole waves
    assert _C.sm90_fwd_stream_k_floats(dev, 1, sms + 1, 128, 1920, 128) == 0  # 15 key blocks
    assert _C.sm90_fwd_stream_k_floats(dev, 1, sms + 1, 64, 4096, 128) == 0  # decoding-sized
    for headdim in (192, 256):  # (one Q buffer: pieces cost more than they win)
        if _ext.KERNEL_HEAD_DIM[headdim] in SM90_HEAD_DIMS:
            assert _C.sm90_fwd_stream_k_floats(dev, 1, sms + 1, 128, 16384, headdim) == 0
    floats = _C.sm90_fwd_stream_k_floats(dev, 1, sms + 1, 128, 2048, 128)
    # per slot (one per SM) and consumer warpgroup: 128 threads x (d / 8 + 1) float4
    assert floats == sms * 2 * 128 * 4 * (128 // 8 + 1)
