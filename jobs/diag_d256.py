"""Diagnostic (tenth session): the d256 dense full-attention Hopper forward in ONE split (the
staged-O instance, FwdTraits<256>), which sanitize_subset.py never reaches (its small d256
dense case gets split-KV), under compute-sanitizer synccheck."""
import torch
from flashattn2 import _ext, _launch

for b, sq, sk, h, hk in ((1, 200, 2049, 8, 2), (2, 1024, 1024, 8, 8)):
    q = torch.randn(b, sq, h, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hk, 256, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    _launch._flash_attn_forward(q, k, v, 256**-0.5, -1, -1, out, lse, num_splits=1)
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float().repeat_interleave(h // hk, 1),
        v.transpose(1, 2).float().repeat_interleave(h // hk, 1)).transpose(1, 2)
    err = (out.float() - ref).abs().max().item()
    print(f"d256 b{b} sq{sq} sk{sk} one split: kernel {_ext.last_fwd_kernel}, nan "
          f"{out.isnan().any().item()}, max err {err:.2e}")
