"""The Hopper forward's narrow first step (cpp/sm90/fwd_kernel.cuh kNarrowStep; on by default
for causal, windowed and varlen tiles at kernel head dims 64, 192 and 256;
FLASHATTN2_SM90_NARROW_STEP=0 or ``_ext.sm90_narrow_step(False)`` turns it off): the plain
instance runs a warpgroup's first key step on the block's first 32 or 64 keys where the
warpgroup sees none of the block's others: the causal diagonal (warpgroup 0 of every d128
tile, every other warpgroup at d64 with its 192-row tiles, 4 of 5 at d256 with its 80-key
blocks), right windows, key tails.

The GPU tests turn the switch on and compare with the float32 reference under test_fwd.py's
rule (out and lse NaN-poisoned before the kernel writes them). Lengths put the step's width
at its edges: last key blocks of 32 / 33 / 64 / 65 keys (80 / 112-key blocks: 32, 64, 64, the
whole block; 128-key blocks, which have no 32-key step: 64, 64, 64, the whole block),
diagonals shifted by sq != sk (causal sq > sk: warpgroups that see no key), windows whose
right bound falls in either width, GQA, varlen, split-KV (a split whose first block is the
diagonal), and both tile walks over many tiles per persistent CTA. The first test runs
without a GPU.
"""
import pytest
import torch
from flashattn2 import _ext, flash_attn_func
from test_decode_kernel import fake_launch
from test_fwd import check_kernel, make_qkv
from test_sm90 import check_varlen, require_sm90
from test_sm90_fwd_protos import PLAIN, STAGED, _fwd_kernel_flags, check_split_kv

NARROW = (False, False, False, False, True)


@pytest.mark.parametrize("enabled", [False, True])
def test_switch_reaches_the_binding(monkeypatch, enabled):
    with _ext.sm90_narrow_step(enabled):
        (_, _), (_, fwd) = fake_launch(monkeypatch, code=80)
    assert fwd["sm90_narrow_step"] is enabled


@pytest.fixture
def narrow_step(monkeypatch):
    monkeypatch.setattr(_ext, "SM90_NARROW_STEP", True)


# (sq, sk): one partial tile; 128 / 192 rows exactly; key tails of 32 / 33 / 64 / 65 keys after
# one 128-key block (d64, d128) and one 80-key block (d192 / d256 tails differ: still a mix);
# sq > sk and sq < sk (shifted diagonals); many tiles.
SEQLENS = [(65, 65), (128, 128), (192, 192), (512, 512), (1111, 1111), (300, 1000),
           (1000, 300), (777, 833), (200, 160), (200, 161), (200, 192), (200, 193), (150, 112),
           (150, 113), (150, 144), (150, 145)]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("seqlens", SEQLENS, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 192, 256, 40, 200])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tile_boundaries(narrow_step, dtype, headdim, causal, seqlens):
    require_sm90(headdim)
    q, k, v = make_qkv(2, *seqlens, 6, 2, headdim, dtype)
    check_kernel(q, k, v, causal=causal)
    assert _ext.last_fwd_arch == 90


@pytest.mark.gpu
@pytest.mark.parametrize("window_size", [(0, 0), (100, 30), (-1, 31), (-1, 63), (-1, 64),
                                         (300, -1), (10, 10), (200, 0)], ids=str)  # fmt: skip
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_window(narrow_step, headdim, window_size):
    """Right window bounds in either width of a warpgroup's first block; left windows cut
    the narrow step's keys too."""
    require_sm90(headdim)
    q, k, v = make_qkv(2, 700, 900, 4, 4, headdim, torch.bfloat16)
    check_kernel(q, k, v, window_size=window_size)
    assert _ext.last_fwd_arch == 90


@pytest.mark.gpu
@pytest.mark.parametrize("walk", ["counter", "blocks"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_tile_walks(narrow_step, monkeypatch, headdim, walk):
    """More tiles than SMs (GQA 24 / 8 heads): stages and turns run on across tiles whose
    warpgroups open with a narrow step or not."""
    require_sm90(headdim)
    monkeypatch.setattr(_ext, "SM90_TILE_WALK", walk)
    q, k, v = make_qkv(3, 1000, 1000, 24, 8, headdim, torch.bfloat16)
    check_kernel(q, k, v, causal=True)
    assert _ext.last_fwd_arch == 90


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen(narrow_step, headdim, causal):
    """Packed sequences whose lengths put the diagonal and the key tail in either width."""
    require_sm90(headdim)
    check_varlen([70, 300, 129, 1, 511, 1000, 192], [200, 300, 81, 400, 64, 1000, 193], headdim,
                 causal)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_split_kv(narrow_step, headdim, causal):
    """Split-KV: only the split holding a warpgroup's diagonal (or the key tail) opens with a
    narrow step; the partials go to the combine."""
    check_split_kv(headdim, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("headdim", [256, 128, 64])
def test_the_narrow_step_instance_runs(headdim):
    """Causal forwards run the kNarrowStep instance with the switch only, and not at d128
    (measured slower there); dense full attention keeps the plain instance (d256: its staged-O
    one); softcap keeps its own instance. Each within the error rule."""
    require_sm90(headdim)
    q, k, v = make_qkv(2, 500, 500, 4, 4, headdim, torch.bfloat16)
    for enabled in (True, False):
        with _ext.sm90_narrow_step(enabled):
            ran = _fwd_kernel_flags(lambda: flash_attn_func(q, k, v, causal=True))
            check_kernel(q, k, v, causal=True)
            assert ran == [NARROW if enabled and headdim != 128 else PLAIN]
            ran = _fwd_kernel_flags(lambda: flash_attn_func(q, k, v))
            check_kernel(q, k, v)
            assert ran == [STAGED if headdim > 128 else PLAIN]
            ran = _fwd_kernel_flags(lambda: flash_attn_func(q, k, v, causal=True, softcap=20.0))
            assert len(ran) == 1 and ran[0][0] and not ran[0][4]
