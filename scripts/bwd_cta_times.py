"""Where a float32 Hopper backward CTA's time goes (d64, fp32/wg_bwd_kernel.cuh), from a probe
build: -DFLASHATTN2_PROBE_TIMES in CMAKE_CUDA_FLAGS (each CTA writes clock64 / %globaltimer
stamps, fp32wg::bwd_probe, through bwd's dq_accum argument: a buffer of this script's; such a
build fails anywhere else, e.g. in bench.py, where no dq_accum is passed). Per CTA the prologue
(entry to K / V in shared memory; where a probe stamps slot 3, entry to the consumers' K / V
fragments in registers), the first step's fill (entry to the producer's step 0 ready), the walk
and epilogue (step 0 ready to exit), with a least-squares fit of the CTA's cycles against its
steps (the intercept: the fixed cost a CTA, in steps); per SM the gaps between one CTA's exit
and the next one's entry and the idle tail before the kernel's last exit.

    PYTHONPATH=/tmp/probe python3 scripts/bwd_cta_times.py [--seqlens 1024,8192] [--causal 1]
        [--fp32-precision ieee|tf32]

bench.py's shapes (hidden 2048: 32 heads at d64; batch 16384 // seqlen). Without a probe
build the stamps are garbage: the script refuses when they do not look like times.
"""
import argparse

import torch

import flashattn2  # noqa: F401 (loads the extension)
from flashattn2 import _ext, _launch


class _StampsInto:
    """_C with bwd's dq_accum argument (positional 9; unused by the Hopper float32 backwards
    outside probe builds, 0 where the host does not allocate it) replaced by ws."""

    def __init__(self, c, ws):
        self._c, self._ws = c, ws

    def __getattr__(self, name):
        return getattr(self._c, name)

    def bwd(self, *args, **kwargs):
        args = list(args)
        args[9] = self._ws.data_ptr()
        return self._c.bwd(*args, **kwargs)


def stamped_backward(q, k, v, dout, causal, n_ctas):
    """The forward, then one backward whose CTAs stamp into a fresh zeroed buffer (returned)."""
    out, lse = _launch._flash_attn_forward(q, k, v, q.shape[-1]**-0.5, -1, 0 if causal else -1)
    ws = torch.zeros(16 * n_ctas, dtype=torch.float32, device=q.device)
    real = _launch._C
    _launch._C = _StampsInto(real, ws)
    try:
        _launch._flash_attn_backward(dout, q, k, v, out, lse, q.shape[-1]**-0.5, -1,
                                     0 if causal else -1)
    finally:
        _launch._C = real
    torch.cuda.synchronize()
    assert _ext.last_bwd_kernel in ("fp32wg", "fp32wg_tf32"), _ext.last_bwd_kernel
    return ws


def report(ws, n_ctas, label):
    s = ws[: 16 * n_ctas].view(torch.int64).view(n_ctas, 8).cpu()
    start, kv, fill, frag, end = s[:, 0], s[:, 1], s[:, 2], s[:, 3], s[:, 4]
    sm, steps = s[:, 5] & 0xFFFFFFFF, s[:, 5] >> 32
    g0, g1 = s[:, 6], s[:, 7]
    ok = (end > start).all() and (g1 >= g0).all() and (sm < 1024).all() and (steps < 1 << 20).all()
    if not ok:
        raise SystemExit(f"{label}: the stamps are not times "
                         "(not a -DFLASHATTN2_PROBE_TIMES build?)")
    cycles = (end - start).double()
    ns = (g1 - g0).double()
    ghz = (cycles.sum() / ns.sum()).item()  # (SM clock, from the two timers)
    us = lambda c: c / ghz / 1e3
    # least squares: cycles = a + b * steps
    x = steps.double()
    A = torch.stack([torch.ones_like(x), x], 1)
    a, b = torch.linalg.lstsq(A, cycles.unsqueeze(1)).solution.squeeze(1).tolist()
    span = (g1.max() - g0.min()).item() / 1e3
    print(f"{label}: {n_ctas} CTAs, {sm.unique().numel()} SMs, kernel span {span:.1f} us, "
          f"SM clock {ghz:.2f} GHz, steps a CTA {x.min():.0f}-{x.max():.0f} (mean {x.mean():.1f})")
    med = lambda t: t.double().median().item()
    print(f"  per CTA (median): prologue (entry -> K / V in smem) {us(med(kv - start)):.2f} us, "
          + (f"K / V fragments in registers {us(med(frag - start)):.2f} us, "
             if (frag > 0).all() else "") +
          f"fill (entry -> step 0 ready) {us(med(fill - start)):.2f} us, "
          f"whole CTA {us(med(end - start)):.2f} us")
    print(f"  fit cycles = a + b steps: a {us(a):.2f} us = {a / b:.2f} steps, "
          f"b {us(b):.3f} us a step")
    # per SM: the gaps between consecutive CTAs (exit -> next entry), the idle tail.
    gaps, tails, busy = [], [], 0.0
    last = g1.max().item()
    for m in sm.unique().tolist():
        idx = (sm == m).nonzero().squeeze(1)
        order = idx[g0[idx].argsort()]
        t0, t1 = g0[order], g1[order]
        if len(order) > 1:
            gaps.append((t0[1:] - t1[:-1]).double())
        tails.append((last - t1.max()).item())
        busy += (t1 - t0).sum().item()
    gaps = torch.cat(gaps) if gaps else torch.zeros(1)
    sms = sm.unique().numel()
    print(f"  per SM: gap exit -> next entry median {gaps.median().item() / 1e3:.2f} us "
          f"(p90 {gaps.quantile(0.9).item() / 1e3:.2f}), "
          f"total gaps {gaps.sum().item() / 1e3 / sms:.1f} "
          f"us an SM; idle tail mean {sum(tails) / len(tails) / 1e3:.1f} us; CTAs busy "
          f"{100 * busy / (sms * span * 1e3):.1f} % of SMs x span")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="1024,8192")
    ap.add_argument("--causal", default="1", help="comma list of 0 / 1")
    ap.add_argument("--fp32-precision", choices=["ieee", "tf32"], default="ieee")
    args = ap.parse_args()
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        matmul.fp32_precision = args.fp32_precision
    else:
        matmul.allow_tf32 = args.fp32_precision == "tf32"
    d, h = 64, 32
    for s in map(int, args.seqlens.split(",")):
        for causal in (c == "1" for c in args.causal.split(",")):
            b = max(1, 16384 // s)
            q, k, v, dout = (torch.randn(b, s, h, d, device="cuda") for _ in range(4))
            n_ctas = b * h * ((s + 127) // 128)  # (kBlockN 128 at d64)
            with _ext.fp32wg_bwd(True):
                stamped_backward(q, k, v, dout, causal, n_ctas)  # (warm-up)
                ws = stamped_backward(q, k, v, dout, causal, n_ctas)
            report(ws, n_ctas, f"d{d} s{s} b{b} h{h} causal={int(causal)} {args.fp32_precision}")


if __name__ == "__main__":
    main()
