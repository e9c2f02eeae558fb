#!/usr/bin/env python3
"""List-scheduling model of a causal float32 wgmma grid (cpp/fp32/wg_config.h, fp32wg_tile_major).

CTAs start in linear-index order on the first free SM (one CTA per SM: the 3xTF32 kernels'
shared memory). A tile's time is its steps plus a fixed cost per CTA (prologue, epilogue, the
pipeline's fill), in steps. Prints, per length, the makespan of the head-major grid (tiles along
x, heads along y) over the tile-major one (heads along x), and the head-major one's idle share.

  forward  (--pass fwd):  m block m of 128 rows walks (m + 1) * 128 / block_n key tiles
  backward (--pass bwd):  key block n of 128 keys walks (seqlen / 32 - 4 n) query steps

Example: python3 scripts/grid_order_sim.py --pass fwd --heads 16 --overhead 4
"""
import argparse
import heapq


def makespan(works, sms):
    free = [0.0] * sms
    for w in works:
        t = heapq.heappop(free)
        heapq.heappush(free, t + w)
    return max(free)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--heads", type=int, default=16, help="(KV) heads of the grid")
    ap.add_argument("--tokens", type=int, default=16384, help="batch = tokens // seqlen")
    ap.add_argument("--overhead", type=float, default=4.0, help="fixed cost per CTA, in steps")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--block-n", type=int, default=32, help="forward key tile")
    a = ap.parse_args()
    for seqlen in (1024, 2048, 4096, 8192):
        batch = max(1, a.tokens // seqlen)
        tiles = seqlen // 128
        if a.which == "fwd":
            work = [(m + 1) * 128 // a.block_n + a.overhead for m in reversed(range(tiles))]
        else:
            work = [seqlen // 32 - 4 * n + a.overhead for n in range(tiles)]
        head_major = [w for _ in range(batch * a.heads) for w in work]
        tile_major = [w for _ in range(batch) for w in work for _ in range(a.heads)]
        hm, tm = makespan(head_major, a.sms), makespan(tile_major, a.sms)
        ideal = sum(head_major) / a.sms
        print(f"{a.which} seqlen {seqlen:5d} batch {batch:2d}: head-major / tile-major "
              f"{hm / tm:.3f}, head-major idle {1 - ideal / hm:.1%}, tile-major idle "
              f"{1 - ideal / tm:.1%}")


if __name__ == "__main__":
    main()
