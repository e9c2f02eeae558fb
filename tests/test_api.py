"""The Python layer: signatures, build info, argument checks and their order, the tensor
preparation rules, and (on a GPU) what happens around the launch.

Checks run in the order the interface documents: unimplemented arguments and window_size,
then rank, dtype and shape, then device. So every rank/dtype/shape error is tested here
with CPU tensors, which also proves that the CPU-tensor check does not mask them.
"""
import inspect
import os
import subprocess
import sys

import flashattn2
import pytest
import torch
from flashattn2 import _checks, _ext, _launch, flash_attn_interface
from reference import attention_ref

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


# ---- argument checks (CPU tensors) ------------------------------------------------------------


def qkv_cpu(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_k=2, headdim=16, dtype=None):
    dtype = dtype or torch.bfloat16
    return (
        torch.randn(batch, seqlen_q, nheads, headdim).to(dtype),
        torch.randn(batch, seqlen_k, nheads_k, headdim).to(dtype),
        torch.randn(batch, seqlen_k, nheads_k, headdim).to(dtype),
    )


def test_cpu_tensors_are_rejected_by_name():
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="flashattn2 needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_func(q, k, v)
    meta = [t.to("meta") for t in (q, k, v)]
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on meta"):
        flashattn2.flash_attn_func(*meta)


def _dtype(q, k, v, dtype):
    return q.to(dtype), k.to(dtype), v.to(dtype)


# name -> (transform of (q, k, v), error message pattern); all are ValueError.
BAD_INPUTS = {
    # (float32 runs in builds with FLASHATTN2_EXPERIMENTAL=fp32; its refusal: test_fp32.py)
    "float64": (lambda q, k, v: _dtype(q, k, v, torch.float64),
                "FlashAttention only supports fp16 and bf16 data type; got q torch.float64"),
    "int8": (lambda q, k, v: _dtype(q, k, v, torch.int8), "only supports fp16 and bf16"),
    "k dtype": (lambda q, k, v: (q, k.half(), v), "query and key must have the same dtype"),
    "v dtype": (lambda q, k, v: (q, k, v.half()), "query and value must have the same dtype"),
    "q rank 3": (lambda q, k, v: (q[0], k, v), r"q must have shape \(batch, seqlen_q, nheads"),
    "k rank 5": (lambda q, k, v: (q, k[None], v), r"k must have shape \(batch, seqlen_k"),
    "v rank 3": (lambda q, k, v: (q, k, v[0]), r"v must have shape \(batch, seqlen_k"),
    "headdim 0": (lambda q, k, v: (q[..., :0], k[..., :0], v[..., :0]), "head dimension"),
    "headdim 264": (lambda q, k, v: tuple(t.new_zeros(*t.shape[:3], 264) for t in (q, k, v)),
                    "only supports head dimension at most 256"),
    "k batch": (lambda q, k, v: (q, k[:1], v[:1]), r"k must have shape \(batch=2, seqlen_k"),
    "k headdim": (lambda q, k, v: (q, k[..., :8], v[..., :8]), r"headdim=16\); got \(2, 7, 2, 8\)"),
    "v seqlen": (lambda q, k, v: (q, k, v[:, :6]), r"v must have the shape of k \(2, 7, 2, 16\)"),
    "v heads": (lambda q, k, v: (q, k, v[:, :, :1]), "v must have the shape of k"),
    "v headdim": (lambda q, k, v: (q, k, v[..., :8]), "v must have the shape of k"),
    "h % h_k": (lambda q, k, v: (q[:, :, :3], k, v),
                "Number of heads in key/value must divide number of heads in query"),
    "h_k > h": (lambda q, k, v: (q[:, :, :1], k, v), "must divide number of heads in query"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_are_named_before_the_device_check(case):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(*transform(*qkv_cpu()))


def test_dtype_is_checked_before_shapes():
    q, k, v = qkv_cpu(dtype=torch.float64)
    with pytest.raises(ValueError, match="only supports fp16 and bf16"):
        flashattn2.flash_attn_func(q, k[:1], v[:, :, :1])


def test_unbuilt_head_dim_is_named():
    head_dims = flashattn2.build_info()["head_dims"]
    missing = [d for d in (32, 64, 96, 128, 192, 256) if d > head_dims[-1]]
    if not missing:
        pytest.skip("this build has every head dim up to 256")
    q, k, v = qkv_cpu(headdim=missing[0])
    with pytest.raises(ValueError, match=f"head dim {missing[0]} needs a kernel head dim"):
        flashattn2.flash_attn_func(q, k, v)


# ---- score modifiers: softcap, alibi_slopes, dropout_p (CPU tensors) ---------------------------


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(dropout_p=1.0), r"dropout_p must be in \[0, 1\); got 1.0"),
        (dict(dropout_p=-0.1), r"dropout_p must be in \[0, 1\); got -0.1"),
        (dict(dropout_p=float("nan")), r"dropout_p must be in \[0, 1\)"),
        (dict(dropout_p="0.1"), "dropout_p must be a real number; got '0.1'"),
        (dict(dropout_p=None), "dropout_p must be a real number; got None"),
        (dict(dropout_p=True), "dropout_p must be a real number; got True"),
        (dict(softcap=-1.0), r"softcap must be >= 0 and finite \(0 disables it\); got -1.0"),
        (dict(softcap=float("inf")), "softcap must be >= 0 and finite"),
        (dict(softcap=None), "softcap must be a real number; got None"),
    ],
)
def test_bad_modifier_values_raise_first(kwargs, message):
    q, k, v = qkv_cpu(dtype=torch.float32)  # not checked: the value is reported first
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kwargs)
    with pytest.raises(ValueError, match=message):
        flashattn2.forward(q, k, v, **kwargs)


# name -> (alibi_slopes for q (2, 5, 4, 16), error message pattern); all are ValueError.
BAD_ALIBI = {
    "float16": (torch.ones(4).half(), "alibi_slopes must be float32; got torch.float16"),
    "float64": (torch.ones(4).double(), "alibi_slopes must be float32; got torch.float64"),
    "kv heads": (torch.ones(2), r"alibi_slopes must have shape \(nheads,\) = \(4,\) or "
                                r"\(batch, nheads\) = \(2, 4\); got \(2,\)"),
    "transposed": (torch.ones(4, 2), r"must have shape .*; got \(4, 2\)"),
    "rank 3": (torch.ones(1, 2, 4), r"must have shape .*; got \(1, 2, 4\)"),
    "scalar": (torch.tensor(1.0), r"must have shape .*; got \(\)"),
}  # fmt: skip  (a list: TypeError, tests/test_bad_input.py)


@pytest.mark.parametrize("case", list(BAD_ALIBI))
def test_bad_alibi_slopes_are_named_before_the_device_check(case):
    slopes, message = BAD_ALIBI[case]
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2), alibi_slopes=slopes)
    with pytest.raises(ValueError, match=message):
        flashattn2.forward_with_stats(q, k, v, alibi_slopes=slopes)


def test_alibi_shape_is_checked_after_qkv_shapes():
    q, k, v = qkv_cpu(dtype=torch.float64)
    with pytest.raises(ValueError, match="only supports fp16 and bf16"):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=torch.ones(3).half())


@pytest.mark.parametrize(
    "kwargs",
    [dict(softcap=30.0), dict(softcap=5), dict(alibi_slopes=torch.ones(4)),
     dict(alibi_slopes=torch.ones(2, 4)), dict(alibi_slopes=torch.ones(4, 2).t()),
     dict(dropout_p=0.1), dict(dropout_p=0),
     dict(softcap=10.0, alibi_slopes=torch.ones(4), dropout_p=0.5, causal=True,
          window_size=(3, 0))],
)  # fmt: skip
def test_good_modifiers_reach_the_device_check(kwargs):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kwargs)


def test_low_level_dropout_needs_an_rng_state():
    inputs = backward_inputs_cpu()
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    with pytest.raises(ValueError, match="dropout_p > 0 needs rng_state"):
        flashattn2.forward_with_stats(q, k, v, dropout_p=0.1)
    with pytest.raises(ValueError, match="dropout_p > 0 needs rng_state"):
        flashattn2.backward(**inputs, dropout_p=0.1)
    with pytest.raises(ValueError, match=r"rng_state must be int64 of shape \(2,\)"):
        flashattn2.backward(**inputs, dropout_p=0.1, rng_state=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"rng_state must be int64 of shape \(2,\)"):
        flashattn2.forward_with_stats(q, k, v, dropout_p=0.1,
                                      rng_state=torch.zeros(3, dtype=torch.int64))
    rng_state = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.backward(**inputs, dropout_p=0.1, rng_state=rng_state)
    # forward draws its own rng_state (after the checks: a CPU q is still reported).
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.forward(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize(
    "window_size",
    [(1,), (1, 2, 3), "ab", None, 5, (1.5, 0), (0, "1"), (True, 0), (-2, 0), (0, -3)],
)
def test_bad_window_size(window_size):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="window_size"):
        flashattn2.flash_attn_func(q, k, v, window_size=window_size)


@pytest.mark.parametrize("window_size", [(-1, -1), [4, 0], (0, 0), (3, -1), (100, 100)])
def test_good_window_size_reaches_the_device_check(window_size):
    q, k, v = qkv_cpu()
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        flashattn2.flash_attn_func(q, k, v, window_size=window_size, deterministic=True)


def test_window_and_causal():
    assert _checks._window((-1, -1), False) == (-1, -1)
    assert _checks._window((-1, -1), True) == (-1, 0)
    assert _checks._window((16, 4), True) == (16, 0)  # flash-attn: causal keeps the left bound
    assert _checks._window([3, 5], False) == (3, 5)


def test_packed_shapes_are_checked():
    q, k, v = qkv_cpu(nheads=2)
    with pytest.raises(ValueError, match=r"qkv must have shape \(batch, seqlen, 3, nheads"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q], 2))
    with pytest.raises(ValueError, match="qkv must have shape"):
        flashattn2.flash_attn_qkvpacked_func(q)
    with pytest.raises(ValueError, match=r"kv must have shape \(batch, seqlen_k, 2, nheads_k"):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v, v], 2))
    with pytest.raises(ValueError, match="kv must have shape"):
        flashattn2.flash_attn_kvpacked_func(q, k)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_qkvpacked_func(torch.stack([q, q, q], 2))
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2))


@pytest.mark.parametrize(
    "case,message",
    [
        ("qkv float64", "only supports fp16 and bf16 data type; got q torch.float64"),
        ("qkv headdim 264", "only supports head dimension at most 256"),
        ("kv float16", "query and key must have the same dtype"),
        ("kv heads 3", "Number of heads in key/value must divide number of heads in query"),
        ("kv batch 1", r"k must have shape \(batch=2, seqlen_k"),
    ],
)
def test_packed_inputs_are_checked_like_unpacked(case, message):
    q, k, v = qkv_cpu()
    packed = {
        "qkv float64": lambda: flashattn2.flash_attn_qkvpacked_func(
            torch.stack([q, q, q], 2).double()),
        "qkv headdim 264": lambda: flashattn2.flash_attn_qkvpacked_func(
            q.new_zeros(2, 5, 3, 4, 264)),
        "kv float16": lambda: flashattn2.flash_attn_kvpacked_func(
            q, torch.stack([k, v], 2).half()),
        "kv heads 3": lambda: flashattn2.flash_attn_kvpacked_func(
            q, torch.randn(2, 7, 2, 3, 16).bfloat16()),
        "kv batch 1": lambda: flashattn2.flash_attn_kvpacked_func(q, torch.stack([k, v], 2)[:1]),
    }  # fmt: skip
    with pytest.raises(ValueError, match=message):
        packed[case]()


# ---- the low-level entry points (CPU tensors: every check comes before the device check) -----


def backward_inputs_cpu():
    """Consistent (q, k, v, o, lse, dout) for flashattn2.backward: q (2, 5, 4, 16)."""
    q, k, v = qkv_cpu()
    return dict(q=q, k=k, v=v, o=torch.randn_like(q), lse=torch.randn(2, 4, 5),
                dout=torch.randn_like(q))  # fmt: skip


# name -> (changes to backward_inputs_cpu(), error message pattern); all are ValueError.
BAD_BACKWARD_INPUTS = {
    "o shape": (dict(o=lambda t: t[:, :4]),
                r"o must have shape \(2, 5, 4, 16\) \(the shape of q\); got \(2, 4, 4, 16\)"),
    "o rank 3": (dict(o=lambda t: t[0]), r"o must have shape \(2, 5, 4, 16\)"),
    "o dtype": (dict(o=lambda t: t.half()),
                r"o must have the dtype of q \(torch.bfloat16\); got torch.float16"),
    "dout shape": (dict(dout=lambda t: t[..., :8]), r"dout must have shape \(2, 5, 4, 16\)"),
    "dout dtype": (dict(dout=lambda t: t.float()), "dout must have the dtype of q"),
    "lse dtype": (dict(lse=lambda t: t.bfloat16()),
                  r"lse must be float32 \(the lse of forward_with_stats\); got torch.bfloat16"),
    "lse transposed": (dict(lse=lambda t: t.transpose(1, 2)),
                       r"lse must have shape \(batch, nheads, seqlen_q\) = \(2, 4, 5\); "
                       r"got \(2, 5, 4\)"),
    "lse rank 2": (dict(lse=lambda t: t[0]), "lse must have shape"),
    "lse of kv heads": (dict(lse=lambda t: t[:, :2]), "lse must have shape"),
    "q float64": (dict(q=lambda t: t.double()), "only supports fp16 and bf16"),
    "h % h_k": (dict(q=lambda t: t[:, :, :3]), "must divide number of heads in query"),
    "v seqlen": (dict(v=lambda t: t[:, :6]), "v must have the shape of k"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_BACKWARD_INPUTS))
def test_bad_backward_inputs_are_named_before_the_device_check(case):
    changes, message = BAD_BACKWARD_INPUTS[case]
    inputs = backward_inputs_cpu()
    for name, change in changes.items():
        inputs[name] = change(inputs[name])
    with pytest.raises(ValueError, match=message):
        flashattn2.backward(**inputs, causal=True)


def test_good_backward_inputs_reach_the_device_check():
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        flashattn2.backward(**backward_inputs_cpu())


@pytest.mark.parametrize("func", [flashattn2.forward, flashattn2.forward_with_stats])
@pytest.mark.parametrize("case", ["float64", "k rank 5", "headdim 264", "v heads", "h % h_k"])
def test_low_level_forward_checks_like_flash_attn_func(func, case):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        func(*transform(*qkv_cpu()), causal=True)
    with pytest.raises(ValueError, match="needs CUDA tensors; got q on cpu"):
        func(*qkv_cpu())


# ---- tensor preparation (CPU tensors; the rules do not depend on the device) -----------------


def test_kernel_ready_passes_views_through():
    qkv = torch.randn(2, 9, 3, 4, 64).bfloat16()
    for t in qkv.unbind(2):
        assert _launch._kernel_ready(t, 0) is t
    x = torch.randn(2, 4, 9, 64).half()
    transposed = x.transpose(1, 2)  # (b, s, h, d) view of a (b, h, s, d) tensor
    assert _launch._kernel_ready(transposed, 0) is transposed
    wide = torch.randn(2, 9, 4, 96).half()
    for t in (wide[..., :64], wide[..., 32:]):  # row stride 384, head stride 96, 64 B offset
        assert _launch._kernel_ready(t, 0) is t


@pytest.mark.parametrize(
    "name,make",
    [
        ("last dim strided", lambda x: x[..., ::2]),
        ("misaligned pointer", lambda x: x.flatten()[4 : 4 + 2 * 9 * 4 * 16].view(2, 9, 4, 16)),
        ("row stride 68", lambda x: torch.randn(2, 9, 1, 68).bfloat16()[..., :64]),
        ("head stride 20", lambda x: x.flatten().as_strided((2, 9, 4, 16), (9 * 80, 80, 20, 1))),
    ],
)
def test_kernel_ready_copies_what_the_kernel_cannot_read(name, make):
    t = make(torch.randn(2, 9, 4, 32).bfloat16())
    ready = _launch._kernel_ready(t, 0)
    assert ready.data_ptr() != t.data_ptr()
    assert torch.equal(ready, t)
    assert ready.is_contiguous() and ready.data_ptr() % 16 == 0
    assert all(s % 8 == 0 for s in ready.stride()[:3]) and ready.stride(3) == 1


def test_kernel_ready_pads_head_dim_with_zeros():
    t = torch.randn(2, 5, 3, 100).half()
    ready = _launch._kernel_ready(t, -100 % 8)
    assert ready.shape == (2, 5, 3, 104) and ready.is_contiguous()
    assert torch.equal(ready[..., :100], t) and (ready[..., 100:] == 0).all()


# ---- around the launch (GPU) ------------------------------------------------------------------


class LaunchRecorder:
    """Stands in for ``_launch._C``: counts fwd and bwd launches, forwards everything."""

    def __init__(self, module):
        self._module = module
        self.launches = 0
        self.bwd_launches = 0

    def fwd(self, *args, **kwargs):
        self.launches += 1
        return self._module.fwd(*args, **kwargs)

    def bwd(self, *args, **kwargs):
        self.bwd_launches += 1
        return self._module.bwd(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


@pytest.fixture
def launches(monkeypatch):
    recorder = LaunchRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    return recorder


def qkv_gpu(batch=2, seqlen_q=33, seqlen_k=47, nheads=4, nheads_k=2, headdim=64,
            dtype=torch.bfloat16, device="cuda"):  # fmt: skip
    return tuple(t.to(device) for t in qkv_cpu(batch, seqlen_q, seqlen_k, nheads, nheads_k,
                                               headdim, dtype))


@gpu
def test_launch_recorder_sees_a_launch(launches):
    out = flashattn2.flash_attn_func(*qkv_gpu())
    torch.cuda.synchronize()
    assert launches.launches == 1 and out.shape == (2, 33, 4, 64)


@gpu
@pytest.mark.parametrize("case", ["h % h_k", "v heads", "float64", "headdim 264"])
def test_bad_inputs_never_launch(case, launches):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(*transform(*qkv_gpu()))
    assert launches.launches == 0


@gpu
@pytest.mark.parametrize(
    "shape", [(0, 33, 47, 4, 2), (2, 0, 47, 4, 2), (2, 33, 47, 0, 2), (0, 0, 0, 4, 2)]
)
def test_empty_problems_return_empty_without_launch(shape, launches):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q, k, v = qkv_gpu(batch, seqlen_q, seqlen_k, nheads, nheads_k, 64)
    out, lse, probs = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    assert probs is None and launches.launches == 0


@gpu
@pytest.mark.parametrize("headdim", [64, 20])
def test_empty_keys_give_zeros_and_inf_without_launch(headdim, launches):
    q, k, v = qkv_gpu(seqlen_k=0, headdim=headdim)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 4, 33) and lse.isposinf().all()
    assert launches.launches == 0


@gpu
def test_return_values_and_devices():
    q, k, v = qkv_gpu(headdim=40)
    out = flashattn2.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)
    out2, lse, probs = flashattn2.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, out2) and probs is None
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32 and lse.is_contiguous()


@gpu
@pytest.mark.parametrize("headdim", [64, 20])
def test_autograd_graph_and_gradients(headdim, launches):
    q, k, v = (t.requires_grad_() for t in qkv_gpu(headdim=headdim))
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad and out.shape == q.shape
    out.float().sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype and t.grad.isfinite().all()
    assert launches.launches == 1 and launches.bwd_launches == 1
    with torch.no_grad():
        assert flashattn2.flash_attn_func(q, k, v).grad_fn is None
    assert flashattn2.forward(q, k, v).grad_fn is None  # the low-level functions never record


@gpu
@pytest.mark.parametrize("case", ["lse transposed", "o dtype", "h % h_k"])
def test_bad_backward_inputs_never_launch(case, launches):
    changes, message = BAD_BACKWARD_INPUTS[case]
    inputs = {name: t.cuda() for name, t in backward_inputs_cpu().items()}
    for name, change in changes.items():
        inputs[name] = change(inputs[name])
    with pytest.raises(ValueError, match=message):
        flashattn2.backward(**inputs)
    assert launches.bwd_launches == 0


@gpu
def test_low_level_backward_names_the_tensor_on_another_device():
    inputs = {name: t.cuda() for name, t in backward_inputs_cpu().items()}
    with pytest.raises(ValueError, match="needs CUDA tensors; got lse on cpu"):
        flashattn2.backward(**dict(inputs, lse=inputs["lse"].cpu()))
    with pytest.raises(ValueError, match="needs CUDA tensors; got dout on cpu"):
        flashattn2.backward(**dict(inputs, dout=inputs["dout"].cpu()))


@gpu
@pytest.mark.parametrize(
    "shape", [(0, 33, 47, 4, 2), (2, 0, 47, 4, 2), (2, 33, 0, 4, 2), (2, 33, 47, 0, 2)]
)
def test_empty_problems_give_zero_gradients_without_launch(shape, launches):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q, k, v = (t.requires_grad_() for t in qkv_gpu(batch, seqlen_q, seqlen_k, nheads, nheads_k))
    out = flashattn2.flash_attn_func(q, k, v, causal=True)
    out.backward(torch.randn_like(out))
    for t in (q, k, v):
        assert t.grad.shape == t.shape and (t.grad == 0).all()
    assert launches.bwd_launches == 0


@gpu
def test_no_grad_path_matches_autograd_path():
    q, k, v = qkv_gpu(headdim=100)
    plain = flashattn2.flash_attn_func(q, k, v, causal=True)
    tracked = flashattn2.flash_attn_func(*(t.requires_grad_() for t in (q, k, v)), causal=True)
    assert torch.equal(plain, tracked.detach())


@gpu
def test_unsupported_device_message_is_cached(monkeypatch):
    device = torch.cuda.current_device()
    monkeypatch.setattr(_ext, "_supported_devices", set())
    monkeypatch.setattr(_ext, "_unsupported_reason", {device: "this build has code for sm_1"})
    with pytest.raises(RuntimeError, match="flashattn2: this build has code for sm_1"):
        flashattn2.flash_attn_func(*qkv_gpu(device=f"cuda:{device}"))


@gpu
def test_mismatched_devices():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="must be on the same device"):
        flashattn2.flash_attn_func(q, k.to("cuda:1"), v)
    with pytest.raises(ValueError, match="must be on the same device"):
        flashattn2.flash_attn_func(q, k, v.to("cuda:1"))


@gpu
def test_cpu_tensor_next_to_gpu_tensors():
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got v on cpu"):
        flashattn2.flash_attn_func(q, k, v.cpu())


@gpu
def test_alibi_slopes_on_the_cpu_are_named(launches):
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got alibi_slopes on cpu"):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4))
    assert launches.launches == 0


@gpu
def test_gpu_result_matches_reference_smoke():
    q, k, v = qkv_gpu(headdim=64)
    out = flashattn2.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    assert (out.float() - ref.float()).abs().max().item() < 0.05


# Every switch read at import (_ext._env_flag), with its default: unset gives the default,
# "0" turns it off and "1" on.
_IMPORT_SWITCHES = [
    ("FLASHATTN2_FORCE_SM80", "FORCE_SM80", False),
    ("FLASHATTN2_DECODE_KERNEL", "DECODE_KERNEL", True),
    ("FLASHATTN2_DECODE_L2_PREFETCH", "DECODE_L2_PREFETCH", True),
    ("FLASHATTN2_DECODE_ISSUE_EARLY", "DECODE_ISSUE_EARLY", True),
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
