"""``python -m flashattn2``: what this build contains, whether it runs on this GPU, a short
correctness check of the forward and the backward against a float32 PyTorch reference (and
which kernels ran: sm90 = the Hopper ones, sm80 = the mma.sync ones) and a short benchmark
of both against PyTorch SDPA. Exits non-zero if the GPU cannot run this build or the
correctness check fails."""
import argparse
import ctypes
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

import flashattn2

from . import _ext
from ._checks import _check_backward
from ._reference import attention_ref

# Same rule as tests/test_fwd.py / test_bwd.py: error <= 2 * PyTorch's own same-dtype error
# + ATOL, for the output and for each gradient.
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


def _reference_grads(q, k, v, dout, causal, upcast):
    """(out, lse, (dq, dk, dv)) of the reference: float32 on upcast inputs, or in q's dtype."""
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    leaves = [cast(t).requires_grad_() for t in (q, k, v)]
    out, lse = attention_ref(*leaves, causal=causal, upcast=upcast)
    return out.detach(), lse, torch.autograd.grad(out, leaves, cast(dout))


def _backward_runs(device, d):
    try:
        _check_backward(d, device)
    except NotImplementedError:
        return False
    return True


def _correctness_check(device, head_dims):
    print("correctness (max |x - fp32 reference| over out and dq, dk, dv, vs PyTorch's own "
          "error in the same dtype; the kernels that ran):")
    ok = True
    for batch, seqlen_q, seqlen_k, nheads, nheads_k, d, causal, dtype in _check_cases(head_dims):
        q = torch.randn(batch, seqlen_q, nheads, d, device=device, dtype=dtype)
        k = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        v = torch.randn(batch, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        backward = _backward_runs(device, d)
        leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
        out, lse, _ = flashattn2.flash_attn_func(*leaves, causal=causal, return_attn_probs=True)
        fwd_arch = _ext.last_fwd_arch
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, leaves, dout) if backward else ()
        bwd_arch = _ext.last_bwd_arch if backward else None
        out_ref, lse_ref, grads_ref = _reference_grads(q, k, v, dout, causal, True)
        out_pt, _, grads_pt = _reference_grads(q, k, v, dout, causal, False)
        passed = torch.allclose(lse, lse_ref, rtol=LSE_RTOL, atol=LSE_ATOL)
        worst = None  # (name, error, PyTorch's error) with the least margin
        for name, x, ref, pt in zip(("out", "dq", "dk", "dv"), (out, *grads),
                                    (out_ref, *grads_ref), (out_pt, *grads_pt)):  # fmt: skip
            err = (x.float() - ref.float()).abs().max().item()
            err_pt = (pt.float() - ref.float()).abs().max().item()
            bound = 2 * err_pt + ATOL[dtype]
            passed &= err <= bound
            if worst is None or err / bound > worst[1] / worst[3]:
                worst = (name, err, err_pt, bound)
        ok &= passed
        lse_err = (lse - lse_ref).nan_to_num(posinf=0.0).abs().max().item()
        kernels = f"fwd sm{fwd_arch}" + (f", bwd sm{bwd_arch}" if backward else ", no bwd")
        name = str(dtype).removeprefix("torch.")
        print(
            f"  {name:8} b={batch} sq={seqlen_q:<4} sk={seqlen_k:<4} h={nheads}/{nheads_k} "
            f"d={d:<3} causal={causal!s:5}  {worst[0]} {worst[1]:.2e} (PyTorch "
            f"{worst[2]:.2e})  lse {lse_err:.2e}  {kernels}  {'ok' if passed else 'FAILED'}"
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
    print("  (median of 20 runs timed with CUDA events; TFLOP/s = 4*b*s*s*h*d, halved if causal, "
          "x3.5 for fwd+bwd)")
    q, k, v = (
        torch.randn(batch, seqlen, nheads, d, device=device, dtype=dtype) for _ in range(3)
    )
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def sdpa(backend, causal):
        def run():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        return run

    def fwd_bwd(attend):
        """forward + backward of attend(q, k, v) on leaves that require grad."""
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        dout = torch.randn_like(q)

        def run():
            torch.autograd.grad(attend(*leaves), leaves, dout)

        return run

    def sdpa_attend(backend, causal):
        """SDPA on BSHD tensors (transposed views in, the output transposed back)."""
        def attend(q, k, v):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                     v.transpose(1, 2), is_causal=causal)
            return out.transpose(1, 2)

        return attend

    # (name, FLOPs / the forward's: fwd+bwd 3.5x as flash-attn counts them, timed function)
    impls = (
        ("flashattn2 fwd", 1.0,
         lambda causal: lambda: flashattn2.flash_attn_func(q, k, v, causal=causal)),
        ("sdpa-flash fwd", 1.0, lambda causal: sdpa(SDPBackend.FLASH_ATTENTION, causal)),
        ("sdpa-cudnn fwd", 1.0, lambda causal: sdpa(SDPBackend.CUDNN_ATTENTION, causal)),
    )  # fmt: skip
    if _backward_runs(device, d):
        impls += (
            ("flashattn2 fwd+bwd", 3.5, lambda causal: fwd_bwd(
                lambda q, k, v: flashattn2.flash_attn_func(q, k, v, causal=causal))),
            ("sdpa-flash fwd+bwd", 3.5,
             lambda causal: fwd_bwd(sdpa_attend(SDPBackend.FLASH_ATTENTION, causal))),
            ("sdpa-cudnn fwd+bwd", 3.5,
             lambda causal: fwd_bwd(sdpa_attend(SDPBackend.CUDNN_ATTENTION, causal))),
        )  # fmt: skip
    print(f"  {'':22}{'non-causal':>28}{'causal':>28}")
    for label, factor, make in impls:
        cells = []
        for causal in (False, True):
            flops = factor * 4 * batch * seqlen * seqlen * nheads * d / (2 if causal else 1)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ms = _median_ms(make(causal))
                cells.append(f"{ms:9.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s")
            except RuntimeError:
                cells.append("n/a")
        print(f"  {label:22}{cells[0]:>28}{cells[1]:>28}")


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
