"""flashattn2: FlashAttention-2 CUDA kernels for PyTorch, with the flash-attn (v2) API.

    import flashattn2
    out = flashattn2.flash_attn_func(q, k, v, causal=True)  # q (b, sq, h, d), k/v (b, sk, h_k, d)

``python -m flashattn2`` prints what this build contains, checks the GPU and runs a short
correctness check and benchmark.
"""
from ._ext import __version__, build_info
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func

__all__ = [
    "__version__",
    "build_info",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
]
