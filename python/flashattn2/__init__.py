"""flashattn2: FlashAttention-2 CUDA kernels for PyTorch, with the flash-attn (v2) API.

    import flashattn2
    out = flashattn2.flash_attn_func(q, k, v, causal=True)  # q (b, sq, h, d), k/v (b, sk, h_k, d)
    out.sum().backward()                                     # autograd: dq, dk, dv

Low-level entry points without autograd, for code that runs the backward itself:
``forward``, ``forward_with_stats`` (out and the softmax log-sum-exp) and ``backward``.

``scaled_dot_product_attention`` takes torch's SDPA arguments instead (BHSD layout, top-left
aligned ``is_causal``, ``enable_gqa``, a bool or float ``attn_mask``; float16, bfloat16 and
float32).

On Hopper GPUs the forward runs wgmma / TMA kernels (cpp/sm90) where they apply;
``with flashattn2.force_sm80():`` (or FLASHATTN2_FORCE_SM80=1) selects the mma.sync kernels.

``merge`` joins two attention results over disjoint key sets by their LSE (one fused
kernel); ``flashattn2.distributed`` runs one attention over a sequence sharded across ranks
(ring, all-gather K/V, Ulysses).

``python -m flashattn2`` prints what this build contains, checks the GPU and runs a short
correctness check and benchmark.
"""
from . import _ops  # noqa: F401  (registers the flashattn2::fwd / ::bwd operators)
from ._ext import __version__, build_info, force_sm80
from .kvcache import flash_attn_with_kvcache
from .merge import merge
from .sdpa import scaled_dot_product_attention
from .varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from .interface import (
    backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    forward,
    forward_with_stats,
)

__all__ = [
    "__version__",
    "backward",
    "build_info",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "force_sm80",
    "forward",
    "forward_with_stats",
    "merge",
    "scaled_dot_product_attention",
]
