# Thirty-seventh session: host time per eager call of flash_attn_func (forward, and forward +
# backward through autograd) against SDPA's flash and memory-efficient backends, batch 1,
# causal, hidden 2048 (issue 21's grid shapes). The calls are issued while the stream waits
# behind a GPU sleep, so the time per call is host work only (median of 5 rounds). Run on the
# device after a build was installed (run 6):  cd /tmp && python3 jobs/s37_host_fwd.py
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashattn2


def host_us(fn, calls=150):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        torch.cuda._sleep(200_000_000)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[len(rounds) // 2]


for dt in (torch.bfloat16, torch.float32):
    for s, d in ((128, 128), (1024, 64)):
        h = 2048 // d
        q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=dt, requires_grad=True)
                   for _ in range(3))
        qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        g = torch.randn(1, s, h, d, device="cuda", dtype=dt)
        gt = g.transpose(1, 2).contiguous()
        res = {"fa2 fwd": host_us(lambda: flashattn2.flash_attn_func(
            q.detach(), k.detach(), v.detach(), causal=True))}
        res["fa2 fwd+bwd"] = host_us(
            lambda: flashattn2.flash_attn_func(q, k, v, causal=True).backward(g), 60)
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                         ("eff", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    res[f"sdpa_{name} fwd"] = host_us(lambda: F.scaled_dot_product_attention(
                        qt.detach(), kt.detach(), vt.detach(), is_causal=True))
                    res[f"sdpa_{name} fwd+bwd"] = host_us(lambda: F.scaled_dot_product_attention(
                        qt, kt, vt, is_causal=True).backward(gt), 60)
            except Exception as e:  # (flash refuses float32)
                res[f"sdpa_{name}"] = str(e)[:40]
        print(dt, s, d, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in res.items()},
              flush=True)
