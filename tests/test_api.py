"""The Python layer: signatures, build info, the workspace and shared-memory rules, and the
switches read at import. The argument checks and the tensor preparation: test_checks.py;
what happens around the launch (GPU): test_launch.py.
"""
import inspect
import os
import subprocess
import sys

import flashattn2
import pytest
import torch
from flashattn2 import _checks, _ext, _launch, flash_attn_interface

gpu = pytest.mark.gpu

FLAGS = dict(
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
)


@pytest.mark.parametrize(
    "func,tensors",
    [
        (flashattn2.flash_attn_func, ["q", "k", "v"]),
        (flashattn2.flash_attn_qkvpacked_func, ["qkv"]),
        (flashattn2.flash_attn_kvpacked_func, ["q", "kv"]),
    ],
)
def test_signature_matches_flash_attn(func, tensors):
    """flash-attn's parameters in its order; ours (attn_bias) only after them, keyword-only."""
    params = list(inspect.signature(func).parameters.values())
    extra = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert [p.name for p in extra] == (["attn_bias"] if func is flashattn2.flash_attn_func else [])
    assert all(p.default is None for p in extra)
    params = [p for p in params if p not in extra]
    assert [p.name for p in params] == tensors + list(FLAGS)
    assert all(p.default is inspect.Parameter.empty for p in params[: len(tensors)])
    assert {p.name: p.default for p in params[len(tensors) :]} == FLAGS


@pytest.mark.parametrize(
    "func,params",
    [
        (flashattn2.forward, "q k v causal=False softmax_scale=None softcap=0.0 "
         "alibi_slopes=None dropout_p=0.0 rng_state=None"),
        (flashattn2.forward_with_stats, "q k v causal=False softmax_scale=None softcap=0.0 "
         "alibi_slopes=None dropout_p=0.0 rng_state=None"),
        (flashattn2.backward, "q k v o lse dout causal=False softmax_scale=None "
         "deterministic=False softcap=0.0 alibi_slopes=None dropout_p=0.0 rng_state=None"),
    ],
)
def test_low_level_signatures(func, params):
    got = [
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(func).parameters.values()
    ]
    assert got == params.split()
    assert func.__doc__ and func.__name__ in flashattn2.__all__


def test_flash_attn_interface_module_reexports():
    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func"):
        assert getattr(flash_attn_interface, name) is getattr(flashattn2, name)


def test_build_info_and_version():
    info = flashattn2.build_info()
    assert set(info) >= {"version", "cuda_version", "archs", "ptx_archs", "head_dims"}
    assert flashattn2.__version__ == info["version"] == _ext._C.__version__
    assert isinstance(info["version"], str) and info["version"]
    assert isinstance(info["cuda_version"], int) and info["cuda_version"] >= 12000
    assert info["archs"] or info["ptx_archs"]
    assert all(isinstance(a, int) and a >= 80 for a in info["archs"] + info["ptx_archs"])
    head_dims = info["head_dims"]
    assert head_dims == sorted(head_dims) and set(head_dims) <= {16, 32, 64, 96, 128, 192, 256}
    # The backward is built for every kernel head dim.
    assert info["bwd_head_dims"] == head_dims
    assert _ext.BWD_MAX_HEAD_DIM == _ext._C.bwd_max_head_dim() == max(
        info["bwd_head_dims"], default=0
    )
    # The Hopper backward: kernel head dims 128 and (d64 / d256 of
    # FLASHATTN2_SM90_BWD_EXPERIMENTAL) 64, 256.
    assert set(info["sm90_bwd_head_dims"]) <= {64, 128, 256} & set(head_dims)
    if info["sm90_bwd_head_dims"]:
        assert 90 in info["archs"]
    # Unvalidated extensions appear only in development builds that ask for them.
    assert set(info["sm90_bwd_experimental"]) <= {"d64", "window", "varlen", "mods", "dq_bulk",
                                                  "d256", "dq_warp"}
    for d in (64, 256):
        if d in info["sm90_bwd_head_dims"]:
            assert f"d{d}" in info["sm90_bwd_experimental"]
    assert set(info["experimental"]) <= {"bias", "fp32", "decode", "fp32wg"}
    assert info["fp32_head_dims"] == ([32, 64, 128] if "fp32" in info["experimental"] else [])
    for d in range(1, 257):
        larger = [h for h in head_dims if h >= d and (h != 16 or _ext.NATIVE_D16)]
        expected = larger[0] if larger else -1
        assert _ext._C.kernel_head_dim(d) == _ext.KERNEL_HEAD_DIM[d] == expected


@pytest.mark.parametrize("enabled", [True, False])
def test_native_d16_switch_maps_head_dims_and_restores(enabled):
    """native_d16(False) sends head dims 1-16 to the next larger kernel, as builds without
    the d16 kernel (FLASHATTN2_HEAD_DIMS without 16) do; it changes nothing else, and the
    previous mapping comes back after the block, in Python and in _C alike."""
    head_dims = flashattn2.build_info()["head_dims"]
    before, native = _ext.KERNEL_HEAD_DIM, _ext.NATIVE_D16
    with _ext.native_d16(enabled):
        assert _ext.NATIVE_D16 is enabled
        dims = [h for h in head_dims if h != 16 or enabled]
        for d in range(1, 257):
            larger = [h for h in dims if h >= d]
            expected = larger[0] if larger else -1
            assert _ext.KERNEL_HEAD_DIM[d] == _ext._C.kernel_head_dim(d) == expected
        if 16 in head_dims:
            assert (_ext.KERNEL_HEAD_DIM[8] == 16) is enabled
        else:  # the switch does nothing without the kernel
            assert _ext.KERNEL_HEAD_DIM == before
        assert _ext.KERNEL_HEAD_DIM[17:] == before[17:]
    assert _ext.KERNEL_HEAD_DIM == before and _ext.NATIVE_D16 is native
    assert all(_ext._C.kernel_head_dim(d) == before[d] for d in range(1, 257))


@pytest.mark.parametrize(
    "sizes",
    [(1, 1, 1, 8), (2, 6, 113, 72), (3, 4, 1025, 128), (1, 32, 2**20, 128), (65535, 16, 4096, 128)],
)
@pytest.mark.parametrize("chains", [1, 4])
def test_bwd_workspace_floats(sizes, chains):
    batch, nheads, seqlen_q, headdim = sizes
    dq_accum, dsum = _ext._C.bwd_workspace_floats(batch, nheads, seqlen_q, headdim,
                                                  dq_chains=chains)
    assert type(dq_accum) is int and type(dsum) is int
    # At least one float per element of dq (the f32 dQ accumulator, once per chain) and per
    # query row (rowsum(dO * O)); at most that for rows padded to a tile of 256 and head dims
    # padded to 256, twice over. Exact ints: the large sizes overflow 32 bits.
    rows = batch * nheads * seqlen_q
    padded_rows = batch * nheads * (seqlen_q + 256)
    assert chains * rows * headdim <= dq_accum <= 2 * chains * padded_rows * 256
    assert rows <= dsum <= 2 * chains * padded_rows


def test_bwd_dq_chains():
    # One chain unless deterministic without a right window bound. Full attention that the
    # kernels walk in rotated order (at most as many K/V tiles as query tiles, and no more
    # than the SMs) keeps one up to 8k keys, then 2, and 4 from 16k keys (the rotated ring's
    # slack); otherwise, and with a left window only, 4 chains from 1024 keys on. Powers of
    # two up to 4 accepted.
    chains = _ext._C.bwd_dq_chains
    for d in _ext.build_info()["bwd_head_dims"]:
        assert chains(4096, 4096, d, False, -1, -1, 132) == 1
        assert chains(4096, 4096, d, True, -1, 0, 132) == 1
        assert chains(16384, 16384, d, True, -1, 0, 132) == 1  # causal: descending
        assert chains(16384, 16384, d, False, -1, -1, 132) == 1
        assert chains(4096, 4096, d, True, -1, -1, 132) == 1  # rotated
        assert chains(8191, 8191, d, True, -1, -1, 132) == 1
        assert chains(8192, 8192, d, True, -1, -1, 132) == 2  # rotated, longer rings
        assert chains(16384, 16384, d, True, -1, -1, 132) == 4
        assert chains(4096, 4096, d, True, -1, -1, 16) == 4  # more K/V tiles than SMs
        assert chains(512, 4096, d, True, -1, -1, 132) == 4  # more K/V than query tiles
        assert chains(65536, 65536, d, True, -1, -1, 132) == 4
        assert chains(4096, 4096, d, True, 256, -1, 132) == 4  # left window: no rotation
        assert chains(4096, 1024, d, True, 256, -1, 132) == 4
        assert chains(4096, 1023, d, True, 256, -1, 132) == 1
        assert chains(0, 0, d, True, -1, -1, 132) == 1
    for bad in (0, 3, 8):
        with pytest.raises(ValueError, match="dq_chains"):
            _ext._C.bwd_workspace_floats(1, 1, 64, 64, dq_chains=bad)


def test_dq_chains_switch(monkeypatch):
    # FLASHATTN2_DQ_CHAINS / _ext.dq_chains(n): deterministic backwards get that many
    # accumulators, sized by bwd_workspace_floats; others keep bwd_dq_chains's choice.
    class Recorder:
        def __init__(self, real):
            self.real, self.bwd_chains = real, []

        def __getattr__(self, name):
            return getattr(self.real, name)

        def bwd_workspace_floats(self, *args):
            self.workspace_chains = args[-1]
            return 16, 16

        def bwd(self, *args, **kwargs):
            self.bwd_chains.append(kwargs["dq_chains"])
            return 80

    fake = Recorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", fake)
    monkeypatch.setattr(_ext, "current_stream", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("P", (), {"multi_processor_count": 132}))
    q, k, v, out, dout = (torch.zeros(1, 2048, 2, 64, dtype=torch.float16) for _ in range(5))
    lse = torch.zeros(1, 2, 2048)
    monkeypatch.setattr(q, "get_device", lambda: 0)

    def launch(deterministic, window=(-1, -1)):
        _launch._launch_bwd(dout, q, k, v, out, lse, q, k, v, lse.stride()[:2], 1, 2048,
                            2048, 2, 2, 64, 0.125, *window, deterministic)
        assert fake.workspace_chains == fake.bwd_chains[-1]
        return fake.bwd_chains[-1]

    assert launch(True) == 1 and launch(True, (256, -1)) == 4  # rotated; ascending
    for forced in (1, 2, 4):
        with _ext.dq_chains(forced):
            assert launch(True) == forced and launch(True, (256, -1)) == forced
            assert launch(False) == 1
    assert _ext.DQ_CHAINS is None and launch(True) == 1
    with pytest.raises(ValueError, match="dq_chains"):
        with _ext.dq_chains(3):
            pass


def test_bwd_shared_memory_per_block():
    # sK, sV (n keys x d), sP, sdS (n x m) in 2-byte elements, and per query-tile stage sQ,
    # sdO (m x d) and LSE, dsum (m f32), for the smallest tile of the head dim: n = 128 keys,
    # m = 64 queries and 2 stages up to d64, else 64 keys and 1 stage (d128 also has a
    # 128-key 2-stage tile, used where it fits); d16: m = 128 queries, 1 stage, and rows of
    # 32 columns in shared memory (a 32-column segment, half used). Up to d128 within the
    # 99 KiB a block gets on sm_86 / sm_89, above within sm_80's 163 KiB.
    for d in _ext.build_info()["bwd_head_dims"]:
        smem = _ext._C.bwd_smem_per_block(d)
        n, m, stages = (128, 128, 1) if d == 16 else (128, 64, 2) if d <= 64 else (64, 64, 1)
        cols = max(d, 32)
        assert smem == 2 * (2 * n * cols + 2 * n * m) + stages * m * (4 * cols + 8), d
        assert (smem <= 99 * 1024) == (d <= 128) and smem <= 163 * 1024, d
    assert _ext._C.bwd_smem_per_block(_ext.BWD_MAX_HEAD_DIM + 8) == 0


def test_backward_refused_where_its_shared_memory_does_not_fit(monkeypatch):
    # An sm_86 / sm_89 GPU gives a block 99 KiB: the d > 128 backward kernels do not fit.
    # (No GPU needed: the device's limit is replaced.)
    asked = []

    def limit_99k(device_index):
        asked.append(device_index)
        return 99 * 1024

    monkeypatch.setattr(_ext, "smem_per_block", limit_99k)
    monkeypatch.setattr(_ext, "_bwd_smem", {})
    device = torch.device("cuda", 0)
    for small in (128, 20):  # d <= 128 kernels fit every GPU: not even asked
        if small + (-small % 8) <= _ext.BWD_MAX_HEAD_DIM:  # built (else another error)
            _checks._check_backward(small, device)
    if _ext.KERNEL_HEAD_DIM[128] == 128:
        assert asked == []
    large = [d for d in (130, 200, 256) if _ext.KERNEL_HEAD_DIM[d + (-d % 8)] > 128]
    if not large:
        pytest.skip("this build has no head dim above 128")
    for headdim in large:
        need = _ext._C.bwd_smem_per_block(headdim + (-headdim % 8))
        message = (rf"backward pass for head dim {headdim} needs {need} bytes .* of shared "
                   rf"memory per block; GPU 0 allows {99 * 1024} \(99.0 KiB\)")  # fmt: skip
        with pytest.raises(NotImplementedError, match=message):
            _checks._check_backward(headdim, device)
    # Cached per (device, head dim): the limit is not asked again.
    calls = len(asked)
    with pytest.raises(NotImplementedError):
        _checks._check_backward(large[0], device)
    assert len(asked) == calls
    # An H100 gives 227 KiB: no error.
    monkeypatch.setattr(_ext, "smem_per_block", lambda device_index: 227 * 1024)
    monkeypatch.setattr(_ext, "_bwd_smem", {})
    for headdim in large:
        _checks._check_backward(headdim, device)


def test_unbuilt_backward_head_dim_is_named(monkeypatch):
    monkeypatch.setattr(_ext, "BWD_MAX_HEAD_DIM", 128)
    message = "the backward pass for head dim 136 is not built; this build supports head dims up to 128"
    with pytest.raises(NotImplementedError, match=message):
        _checks._check_backward(136, torch.device("cuda", 0))


@pytest.mark.parametrize("value,native", [("0", False), ("1", True), ("", False)])
def test_native_d16_environment_switch(value, native):
    """FLASHATTN2_NATIVE_D16 is read at import (\"\" and \"0\" are off) and reaches _C."""
    code = ("from flashattn2 import _ext; print(_ext.NATIVE_D16, _ext.KERNEL_HEAD_DIM[8], "
            "_ext._C.kernel_head_dim(8))")
    env = dict(os.environ, FLASHATTN2_NATIVE_D16=value)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    flag, kd, kd_c = result.stdout.split()
    head_dims = [h for h in flashattn2.build_info()["head_dims"] if h != 16 or native]
    assert flag == str(native) and int(kd) == int(kd_c) == min(head_dims)


def test_import_without_C_says_how_to_build():
    code = "import sys; sys.modules['flashattn2._C'] = None; import flashattn2"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode != 0
    assert "ImportError: flashattn2._C is not built; install with pip install ." in result.stderr


def test_main_without_gpu_exits_zero():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [sys.executable, "-m", "flashattn2"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert f"flashattn2 {flashattn2.__version__}" in result.stdout
    assert f"torch {torch.__version__}" in result.stdout
    assert "head dims" in result.stdout
    assert "no CUDA GPU" in result.stdout


# Every switch read at import (_ext._env_flag), with its default: unset gives the default,
# "0" turns it off and "1" on.
_IMPORT_SWITCHES = [
    ("FLASHATTN2_FORCE_SM80", "FORCE_SM80", False),
    ("FLASHATTN2_DECODE_KERNEL", "DECODE_KERNEL", True),
    ("FLASHATTN2_SM90_BWD", "SM90_BWD", True),
    ("FLASHATTN2_SM90_BWD_D64", "SM90_BWD_D64", True),
    ("FLASHATTN2_DBIAS_DIRECT", "DBIAS_DIRECT", True),
    ("FLASHATTN2_BWD_BIAS_STAGED", "BWD_BIAS_STAGED", True),
    ("FLASHATTN2_SM90_DBIAS", "SM90_DBIAS", True),
    ("FLASHATTN2_SM90_DQ_WARP", "SM90_DQ_WARP", True),
    ("FLASHATTN2_BWD_PDL", "BWD_PDL", True),
    ("FLASHATTN2_BWD_CONVERT_LEAN", "BWD_CONVERT_LEAN", False),
    ("FLASHATTN2_BWD_DQ_FIRST_STORE", "BWD_DQ_FIRST_STORE", True),
    ("FLASHATTN2_SM90_NARROW_STEP", "SM90_NARROW_STEP", True),
    ("FLASHATTN2_SM90_FA3_ORDER", "SM90_FA3_ORDER", True),
    ("FLASHATTN2_FP32WG_BWD", "FP32WG_BWD", True),
    ("FLASHATTN2_FP32WG_BWD128", "FP32WG_BWD128", True),
]


@pytest.mark.parametrize("var, attr, default", _IMPORT_SWITCHES,
                         ids=[switch[1] for switch in _IMPORT_SWITCHES])
def test_switch_is_read_at_import(monkeypatch, var, attr, default):
    import importlib

    try:
        for value, expected in ((None, default), ("0", False), ("1", True)):
            if value is None:
                monkeypatch.delenv(var, raising=False)
            else:
                monkeypatch.setenv(var, value)
            assert getattr(importlib.reload(_ext), attr) is expected, (var, value)
    finally:
        monkeypatch.undo()
        importlib.reload(_ext)


@pytest.mark.parametrize("switch, attr", [("bwd_convert_lean", "BWD_CONVERT_LEAN"),
                                          ("bwd_dq_first_store", "BWD_DQ_FIRST_STORE")])
def test_backward_pass_switches(switch, attr):
    """The backward's dev switches (tests/test_bwd_convert.py on the GPU): context managers
    that set and restore the module flag, and binding arguments of the same name."""
    before = getattr(_ext, attr)
    with getattr(_ext, switch)(True):
        assert getattr(_ext, attr) is True
        with getattr(_ext, switch)(False):
            assert getattr(_ext, attr) is False
        assert getattr(_ext, attr) is True
    assert getattr(_ext, attr) is before
    doc = _ext._C.bwd.__doc__
    assert "convert_lean: bool = False" in doc and "dq_first_store: bool = False" in doc


def test_sm90_backward_switch_reaches_the_binding():
    """The Hopper backward's switch (FLASHATTN2_SM90_BWD, test_switch_is_read_at_import) is
    the binding's allow_sm90 argument."""
    assert "allow_sm90" in _ext._C.bwd.__doc__


def test_sm90_backward_d64_switch(monkeypatch):
    """FLASHATTN2_SM90_BWD_D64=0 at import (or _ext.sm90_bwd_d64(False)) keeps head dims 33-64
    (kernel head dim 64) off the Hopper backward and no other; on by default."""
    from flashattn2._launch import _allow_sm90_bwd

    monkeypatch.setattr(_ext, "SM90_BWD", True)
    monkeypatch.setattr(_ext, "FORCE_SM80", False)
    dims = [d for d in range(1, 257) if _ext.KERNEL_HEAD_DIM[d] > 0]
    assert all(_allow_sm90_bwd(d) for d in dims)
    with _ext.sm90_bwd_d64(False):
        assert [d for d in dims if not _allow_sm90_bwd(d)] == [
            d for d in dims if _ext.KERNEL_HEAD_DIM[d] == 64]
    assert _ext.SM90_BWD_D64 is True
    with _ext.force_sm80():
        assert not any(_allow_sm90_bwd(d) for d in dims)
    monkeypatch.setattr(_ext, "SM90_BWD", False)
    assert not any(_allow_sm90_bwd(d) for d in dims)
