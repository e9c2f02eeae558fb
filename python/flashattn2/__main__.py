"""``python -m flashattn2``: what this build contains, whether it runs on this GPU, a short
correctness check against a float32 PyTorch reference and a short benchmark against PyTorch
SDPA. Exits non-zero if the GPU cannot run this build or the correctness check fails."""
import argparse
import ctypes
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

import flashattn2

from . import _ext
from ._reference import attention_ref

# Same rule as tests/test_fwd.py: error <= 2 * PyTorch's own same-dtype error + ATOL.
ATOL = {torch.float16: 1e-3, torch.bfloat16: 4e-3}
LSE_ATOL, LSE_RTOL = 1e-4, 1e-5


def _cuda_version_text(version):
    """12080 -> '12.8'."""
    if not version:
        return "none"
    return f"{version // 1000}.{version % 1000 // 10}"


def _driver_text():
    """The NVIDIA driver release and the CUDA version it supports, or 'not found'."""
    parts = []
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() == 0:
            buf = ctypes.create_string_buffer(96)
            if nvml.nvmlSystemGetDriverVersion(buf, len(buf)) == 0:
                parts.append(buf.value.decode())
            nvml.nvmlShutdown()
    except (OSError, AttributeError):
        pass
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            parts.append(f"supports CUDA {_cuda_version_text(version.value)}")
    except (OSError, AttributeError):
        pass
    return ", ".join(parts) if parts else "not found"


def _print_versions(info):
    print(f"flashattn2 {flashattn2.__version__} ({flashattn2.__path__[0]})")
    print(f"torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none (CPU only)'}")
    print(f"flashattn2._C built with CUDA {_cuda_version_text(info['cuda_version'])}")
    print(f"NVIDIA driver: {_driver_text()}")
    sass = ", ".join(f"sm_{a}" for a in info["archs"]) or "none"
    ptx = ", ".join(f"compute_{a}" for a in info["ptx_archs"]) or "none"
    print(f"build: SASS {sass}; PTX {ptx}; head dims {', '.join(map(str, info['head_dims']))}")


def _check_cases(head_dims):
    """(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, causal, dtype): one per built
    kernel head dim, alternating dtype and causal, with GQA, seqlen_q != seqlen_k and a
    head dim that is not a multiple of 8 among them."""
    dtypes = (torch.bfloat16, torch.float16)
    seqlens = ((128, 128), (113, 203), (1, 512), (257, 255))
    heads = ((4, 4), (6, 2), (8, 1))
    cases = []
    for i, d in enumerate(head_dims):
        seqlen_q, seqlen_k = seqlens[i % len(seqlens)]
        nheads, nheads_k = heads[i % len(heads)]
        cases.append((2, seqlen_q, seqlen_k, nheads, nheads_k, d, i % 2 == 0, dtypes[i % 2]))
    cases.append((1, 77, 77, 4, 2, head_dims[0] - 3, True, torch.float16))
    return cases


def _correctness_check(device, head_dims):
    print("correctness (max |out - fp32 reference|, vs PyTorch's own error in the same dtype):")
    ok = True
    for batch, seqlen_q, seqlen_k, nheads, nheads_k, d, causal, dtype in _check_cases(head_dims):
        q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=dtype)
        k = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        v = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        out_ref, lse_ref = attention_ref(q, k, v, causal=causal)
        out_pt, _ = attention_ref(q, k, v, causal=causal, upcast=False)
        err = (out.float() - out_ref.float()).abs().max().item()
        err_pt = (out_pt.float() - out_ref.float()).abs().max().item()
        lse_err = (lse - lse_ref).nan_to_num(posinf=0.0).abs().max().item()
        passed = err <= 2 * err_pt + ATOL[dtype] and torch.allclose(
            lse, lse_ref, rtol=LSE_RTOL, atol=LSE_ATOL
        )
        ok &= passed
        name = str(dtype).removeprefix("torch.")
        print(
            f"  {name:8} b={batch} sq={seqlen_q:<4} sk={seqlen_k:<4} h={nheads}/{nheads_k} "
            f"d={d:<3} causal={causal!s:5}  out {err:.2e} (PyTorch {err_pt:.2e})  "
            f"lse {lse_err:.2e}  {'ok' if passed else 'FAILED'}"
        )
    return ok


def _median_ms(fn, warmup=3, iters=20):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def _benchmark(device, d):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, nheads, seqlen, dtype = 4, 16, 2048, torch.bfloat16
    print(f"benchmark: bf16, batch {batch}, heads {nheads}, seqlen {seqlen}, head dim {d}")
    print("  (median of 20 runs timed with CUDA events; TFLOP/s = 4*b*s*s*h*d, halved if causal)")
    q, k, v = (
        torch.randn(batch, seqlen, nheads, d, device=device, dtype=dtype) for _ in range(3)
    )
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def sdpa(backend, causal):
        def run():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        return run

    impls = (
        ("flashattn2", lambda causal: lambda: flashattn2.flash_attn_func(q, k, v, causal=causal)),
        ("sdpa-flash", lambda causal: sdpa(SDPBackend.FLASH_ATTENTION, causal)),
        ("sdpa-cudnn", lambda causal: sdpa(SDPBackend.CUDNN_ATTENTION, causal)),
    )
    print(f"  {'':12}{'non-causal':>28}{'causal':>28}")
    for name, make in impls:
        cells = []
        for causal in (False, True):
            flops = 4 * batch * seqlen * seqlen * nheads * d / (2 if causal else 1)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ms = _median_ms(make(causal))
                cells.append(f"{ms:9.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
            except RuntimeError:
                cells.append("n/a")
        print(f"  {name:12}{cells[0]:>28}{cells[1]:>28}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m flashattn2", description=__doc__)
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    args = parser.parse_args(argv)

    info = flashattn2.build_info()
    _print_versions(info)
    if not torch.cuda.is_available():
        print(
            "no CUDA GPU is visible to torch: nothing to check "
            "(flashattn2 runs on NVIDIA GPUs of compute capability 8.0 or newer)"
        )
        return 0

    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        try:
            _ext.check_device(index)
            status = "this build has code for it"
        except RuntimeError as exc:
            status = f"NOT SUPPORTED: {exc}"
        print(f"GPU {index}: {torch.cuda.get_device_name(index)}, sm_{major}{minor}: {status}")

    device = torch.device("cuda", torch.cuda.current_device())
    try:
        _ext.check_device(device.index)
    except RuntimeError:
        print(f"the current GPU ({device}) cannot run this build")
        return 1

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False  # a float32 reference, not a TF32 one
    head_dims = info["head_dims"]
    ok = True
    if not args.no_check:
        ok = _correctness_check(device, head_dims)
    if not args.no_bench:
        _benchmark(device, 128 if _ext.KERNEL_HEAD_DIM[128] > 0 else head_dims[-1])
    if not ok:
        print("correctness check FAILED")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
