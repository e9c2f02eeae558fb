# Thirty-fourth session: where a decode CTA's time goes (a build with
# -DFLASHATTN2_DECODE_PROBE_TIMES, jobs/s34_decode_times_probe.patch): thread 0's clock64 at
# entry (0), cache length known (1), prologue copies issued (2), Q + tile 0 landed (3), its
# warp's loop done (4), every warp done (5), the warps' states merged (6), O written (7);
# %globaltimer at the start and the end; %smid. Unsplit calls only (the stamps overwrite the
# CTA's first O row). bf16, GQA 32 / 8, d128, sq 1, contiguous cache with cache_seqlens.
#   python3 jobs/s34_decode_times.py [BATCH:CACHE ...]
import statistics
import sys

import torch

import flashattn2

cfgs = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:]] or [
    (16, 1024), (16, 8192), (64, 1024), (64, 8192), (32, 1024)]
names = ["len", "issue", "tile0", "loop", "allwarps", "merge", "store"]


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


for b, s in cfgs:
    q = torch.randn(b, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    seqlens = torch.full((b,), s, device="cuda", dtype=torch.int32)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for i in range(4):
        flush.zero_()  # (the caches cold, as in bench_decode's timing)
        out = flashattn2.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)
    torch.cuda.synchronize()
    words = out[:, 0, ::4, :].contiguous().view(torch.int64)[..., :11].reshape(-1, 11).cpu().tolist()
    ctas = []
    for w in words:
        clk = w[:8]
        ctas.append(dict(ph=[clk[i + 1] - clk[i] for i in range(7)], sm=w[8] & 0xFFFFFFFF,
                         tiles=w[8] >> 32, g0=w[9], g1=w[10], total=clk[7] - clk[0]))
    g_min = min(c["g0"] for c in ctas)
    per_sm = {}
    for c in ctas:
        per_sm[c["sm"]] = per_sm.get(c["sm"], 0) + 1
    print(f"\nb{b} cache {s}: {len(ctas)} CTAs on {len(per_sm)} SMs "
          f"(CTAs an SM: {sorted(set(per_sm.values()))}); tiles a warp {ctas[0]['tiles']}; "
          f"span {(max(c['g1'] for c in ctas) - g_min) / 1e3:.2f} us")
    print(f"  start (us after the first): p10 {pct([c['g0'] - g_min for c in ctas], .1) / 1e3:.2f} "
          f"p50 {pct([c['g0'] - g_min for c in ctas], .5) / 1e3:.2f} "
          f"max {max(c['g0'] - g_min for c in ctas) / 1e3:.2f}; end p10 "
          f"{pct([c['g1'] - g_min for c in ctas], .1) / 1e3:.2f} p50 "
          f"{pct([c['g1'] - g_min for c in ctas], .5) / 1e3:.2f} max "
          f"{max(c['g1'] - g_min for c in ctas) / 1e3:.2f}")
    print("  cycles   " + " ".join(f"{n:>9}" for n in names) + "     total")
    for q_ in (0.1, 0.5, 0.9):
        print(f"  p{int(q_ * 100):<2}      " + " ".join(f"{pct([c['ph'][i] for c in ctas], q_):9d}"
                                               for i in range(7))
              + f" {pct([c['total'] for c in ctas], q_):9d}")
    if len(set(per_sm.values())) > 1:
        for n in sorted(set(per_sm.values())):
            tot = [c["total"] for c in ctas if per_sm[c["sm"]] == n]
            print(f"  SMs with {n} CTAs: total cycles median {statistics.median(tot):.0f}")
