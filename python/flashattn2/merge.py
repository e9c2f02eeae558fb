"""``merge``: combine two attention results over disjoint key sets by their log-sum-exp.

If ``(out_a, lse_a)`` is attention of some queries over key set A and ``(out_b, lse_b)``
over a disjoint key set B (same queries, same scale / score modifiers), attention over
A and B together is exactly::

    lse = log(exp(lse_a) + exp(lse_b))
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b

This is the split-KV combine of the decoding kernels, and the step that joins partial
results in ring attention (``flashattn2.distributed``), cascade attention and prefix
caching. On CUDA it runs one fused kernel (cpp/common/merge_kernel.cuh, sharing its
per-row math with the split-KV combine); on the CPU it runs the same math with torch in
float32.
"""
import torch

from . import _ext

_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}


def _check(out_a, lse_a, out_b, lse_b, out, lse):
    """Types, dtypes, shapes and devices; returns the output dtype."""
    named = [("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)]
    if out is not None:
        named.append(("out", out))
    if lse is not None:
        named.append(("lse", lse))
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor; got {type(t).__name__}")
    for name, t in named:
        if name.startswith("out") and t.dtype not in _DTYPE_CODE:
            raise ValueError(f"{name} must be float16, bfloat16 or float32; got {t.dtype}")
        if name.startswith("lse") and t.dtype is not torch.float32:
            raise ValueError(f"{name} must be float32 (a log-sum-exp); got {t.dtype}")
    if out_a.dim() != 4:
        raise ValueError(
            f"out_a must have shape (batch, seqlen, nheads, headdim); got {tuple(out_a.shape)}"
        )
    batch, seqlen, nheads, headdim = out_a.shape
    for name, t in named:
        expected = (batch, seqlen, nheads, headdim) if name.startswith("out") else (
            batch, nheads, seqlen)
        if tuple(t.shape) != expected:
            what = "the shape of out_a" if name.startswith("out") else (
                "(batch, nheads, seqlen) of out_a")
            raise ValueError(f"{name} must have shape {expected} ({what}); got {tuple(t.shape)}")
    device = out_a.device
    for name, t in named:
        if t.device != device:
            raise ValueError(
                "out_a, lse_a, out_b, lse_b (and out, lse) must be on one device; got "
                + ", ".join(f"{n} on {x.device}" for n, x in named)
            )
    out_dtype = torch.promote_types(out_a.dtype, out_b.dtype) if out is None else out.dtype
    return out_dtype


def merge(out_a, lse_a, out_b, lse_b, out=None, lse=None):
    """Attention over two disjoint key sets from the attention over each.

    Args:
        out_a, out_b: ``(batch, seqlen, nheads, headdim)``, float16, bfloat16 or float32
            (they may differ), the outputs over key sets A and B.
        lse_a, lse_b: float32 ``(batch, nheads, seqlen)``, their log-sum-exp (e.g.
            ``flash_attn_func(..., return_attn_probs=True)[1]``). A row whose LSE is -inf
            or +inf has no keys in that set (the kernels, like flash-attn, write +inf for
            such rows): it gets weight 0.
        out, lse: optional tensors to write (shapes as above; out of any of the three
            dtypes, lse float32). They may be ``out_a`` / ``lse_a`` themselves (or the b
            ones), to accumulate in place.

    Returns:
        ``(out, lse)``: out in ``out``'s dtype (default: the wider of out_a's and out_b's),
        lse float32. A row empty in both sets gets out = 0 and lse = -inf (the LSE of no
        keys, so that merging it further is exact).

    Any strides are accepted; on CUDA, vector loads are used when every tensor's last
    dimension is contiguous and 4-element aligned.
    """
    out_dtype = _check(out_a, lse_a, out_b, lse_b, out, lse)
    if out is None:
        out = torch.empty(out_a.shape, dtype=out_dtype, device=out_a.device)
    if lse is None:
        lse = torch.empty(lse_a.shape, dtype=torch.float32, device=out_a.device)
    if out.numel() == 0:
        return out, lse
    if out_a.is_cuda:
        _merge_cuda(out_a, lse_a, out_b, lse_b, out, lse)
    else:
        merged, merged_lse = merge_reference(out_a, lse_a, out_b, lse_b)
        out.copy_(merged)
        lse.copy_(merged_lse)
    return out, lse


def merge_reference(out_a, lse_a, out_b, lse_b):
    """``merge`` in float32 with torch (no checks): ``(out, lse)``, out float32."""
    empty = float("-inf")
    lse_a = torch.where(lse_a == float("inf"), empty, lse_a)
    lse_b = torch.where(lse_b == float("inf"), empty, lse_b)
    lse_max = torch.maximum(lse_a, lse_b)
    safe_max = torch.where(lse_max == empty, 0.0, lse_max)
    w_a, w_b = torch.exp(lse_a - safe_max), torch.exp(lse_b - safe_max)
    total = w_a + w_b
    lse = torch.where(total == 0, empty, safe_max + torch.log(total))
    inv = torch.where(total == 0, 0.0, 1.0 / total)
    scale_a = (w_a * inv).transpose(1, 2).unsqueeze(-1)  # (b, s, h, 1)
    scale_b = (w_b * inv).transpose(1, 2).unsqueeze(-1)
    # A weight-0 partial adds nothing, whatever its out holds (e.g. NaN in an empty row).
    part_a = torch.where(scale_a == 0, 0.0, scale_a * out_a.float())
    part_b = torch.where(scale_b == 0, 0.0, scale_b * out_b.float())
    return part_a + part_b, lse


def _merge_cuda(out_a, lse_a, out_b, lse_b, out, lse):
    device = out_a.get_device()
    _ext.check_device(device)
    batch, seqlen, nheads, headdim = out_a.shape
    _ext._C.merge(
        out_a.data_ptr(), lse_a.data_ptr(), out_b.data_ptr(), lse_b.data_ptr(),
        out.data_ptr(), lse.data_ptr(),
        list(out_a.stride()), list(lse_a.stride()), list(out_b.stride()),
        list(lse_b.stride()), list(out.stride()), list(lse.stride()),
        batch, seqlen, nheads, headdim,
        _DTYPE_CODE[out_a.dtype], _DTYPE_CODE[out_b.dtype], _DTYPE_CODE[out.dtype],
        device, _ext.current_stream(device),
    )  # fmt: skip
