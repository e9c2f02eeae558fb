# Thirty-fourth session: one decode call (bf16, GQA 32 / 8, d128, sq 1, contiguous cache) of
# flashattn2 or SDPA-cuDNN, its second call between cudaProfilerStart / Stop, for ncu.
#   python3 jobs/s34_ncu_decode.py IMPL BATCH CACHE   (IMPL: ours | cudnn)
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2

impl, b, s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
seqlens = torch.full((b,), s, device="cuda", dtype=torch.int32)
prof = torch.cuda.cudart()
for i in range(2):
    if i == 1:
        prof.cudaProfilerStart()
    if impl == "ours":
        out = flashattn2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    else:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                 v.transpose(1, 2), enable_gqa=True)
    torch.cuda.synchronize()
    if i == 1:
        prof.cudaProfilerStop()
