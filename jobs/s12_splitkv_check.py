"""Twelfth session, run 4: split-KV forwards with batch 3 and 3 splits on the Hopper path (the
TILE_PUBLISH probe packs batch and split into one word; no suite test runs split-KV with batch > 1
there), checked against the float32 reference."""
import sys

import torch

sys.path.insert(0, "tests")
from test_fwd import check_output, make_qkv  # noqa: E402

from flashattn2 import _ext, _launch  # noqa: E402

for d in (64, 128, 256):
    for causal in (False, True):
        q, k, v = make_qkv(3, 700, 3000, 4, 2, d, torch.bfloat16)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((3, 4, 700), float("nan"), device="cuda")
        _launch._flash_attn_forward(q, k, v, d ** -0.5, -1, 0 if causal else -1, out, lse,
                                    num_splits=3)
        assert _ext.last_fwd_arch == 90, _ext.last_fwd_arch
        check_output(out, lse, q, k, v, causal=causal)
        print(f"split-KV b3 x 3 splits d{d} causal={causal}: ok")
