"""flash-attn's module path: ``from flashattn2.flash_attn_interface import flash_attn_func``
ports code written for ``flash_attn.flash_attn_interface`` by changing one word."""
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func
from .kvcache import flash_attn_with_kvcache
from .varlen import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]
