"""The configurations of test_fuzz.py: plain Python values drawn from a seeded random.Random,
so that a seed names a case (``sample(family, seed)``) on any machine, GPU or not.
"""
import os
import random

from flashattn2 import _ext

# Three divergences from flash-attn have fixes under way (issue 19). Until they are merged the
# sampler leaves them out; set this True once they are:
#   - flash_attn_with_kvcache with a head dim that is not a multiple of 8;
#   - rotary embedding with cache_leftpad (flash-attn rotates new token i of entry b at
#     cache_seqlens[b] + i, the left padding not subtracted);
#   - flash_attn_varlen_func with block_table on inputs that require grad (the forward must
#     run; the backward may raise NotImplementedError).
PENDING_PARITY_FIXES_MERGED = True
SAMPLE_PENDING = PENDING_PARITY_FIXES_MERGED or os.environ.get("FLASHATTN2_FUZZ_PENDING") == "1"

DTYPES = ("float16", "bfloat16")
# Memory layouts of one (..., seqlen, heads, d) tensor: transposed = heads before seqlen in
# memory; padded = a slice of rows 3 elements wider (strides not multiples of 8); offset =
# the same starting one element in (a data pointer that is not 16-byte aligned).
LAYOUTS = ("contiguous", "transposed", "padded", "offset")
KERNEL_HEAD_DIMS = tuple(_ext.build_info()["head_dims"])


def sample_len(rng, hi=256):
    """A sequence length in [0, hi]: 0 and 1, tile boundaries, short, or anything."""
    r = rng.random()
    if r < 0.15:
        n = rng.choice([0, 1])
    elif r < 0.35:
        n = rng.choice([15, 16, 17, 63, 64, 65, 127, 128, 129])
    elif r < 0.7:
        n = rng.randint(2, 32)
    else:
        n = rng.randint(1, hi)
    return min(n, hi)


def sample_headdim(rng, multiple_of_8=False):
    """A head dim in [1, 256] that this build has a kernel for: a kernel head dim, a multiple
    of 8, or anything."""
    while True:
        r = rng.random()
        if r < 0.4:
            d = rng.choice(KERNEL_HEAD_DIMS)
        elif r < 0.7:
            d = 8 * rng.randint(1, 32)
        else:
            d = rng.randint(1, 256)
        if (not multiple_of_8 or d % 8 == 0) and _ext.KERNEL_HEAD_DIM[d + (-d % 8)] >= 0:
            return d


def sample_heads(rng):
    nheads_k = rng.choice([1, 1, 2, 3, 4])
    return nheads_k * rng.choice([1, 1, 2, 3, 4]), nheads_k


def sample_mods(rng, seqlen_k, dropout):
    """causal, window_size (bounds up to a little past seqlen_k), softcap, ALiBi (per head
    or per batch entry and head), dropout_p, softmax_scale."""
    window = (-1, -1)
    if rng.random() < 0.3:
        hi = seqlen_k + 4
        window = (rng.choice([-1, rng.randint(0, hi)]), rng.choice([-1, rng.randint(0, hi)]))
    softcap = 0.0
    if rng.random() < 0.3:
        softcap = round(rng.uniform(0.5, 5.0) if rng.random() < 0.5 else rng.uniform(5.0, 60.0), 3)
    return dict(
        causal=rng.random() < 0.35,
        window_size=window,
        softcap=softcap,
        alibi=rng.choice([None] * 6 + ["h", "bh"]),
        dropout_p=round(rng.uniform(0.05, 0.5), 3) if dropout and rng.random() < 0.25 else 0.0,
        softmax_scale=None if rng.random() < 0.6 else round(rng.uniform(0.02, 1.0), 4),
    )


def sample_layouts(rng, api, same_lengths):
    """Where q, k, v live: per tensor (api "func"), one buffer split along the heads (api
    "func" with equal q / k lengths), or the packed tensor of the packed APIs."""
    dout = rng.choice(["contiguous", "transposed"])
    if api == "qkvpacked":
        return dict(qkv=rng.choice(["contiguous", "padded"]), dout=dout)
    if api == "kvpacked":
        return dict(q=rng.choice(LAYOUTS), kv=rng.choice(["contiguous", "padded"]), dout=dout)
    if same_lengths and rng.random() < 0.2:
        return dict(qkv="split-heads", dout=dout)
    return dict(q=rng.choice(LAYOUTS), k=rng.choice(LAYOUTS), v=rng.choice(LAYOUTS), dout=dout)


def sample_dense(rng):
    c = dict(dtype=rng.choice(DTYPES), headdim=sample_headdim(rng), batch=rng.randint(1, 3))
    c["seqlen_q"] = sample_len(rng)
    c["seqlen_k"] = c["seqlen_q"] if rng.random() < 0.3 else sample_len(rng)
    c["nheads"], c["nheads_k"] = sample_heads(rng)
    same = c["seqlen_q"] == c["seqlen_k"]
    apis = ["func"] * 3 + ["kvpacked"]
    if same and c["nheads"] == c["nheads_k"]:
        apis.append("qkvpacked")
    c["api"] = rng.choice(apis)
    c["layout"] = sample_layouts(rng, c["api"], same)
    c.update(sample_mods(rng, c["seqlen_k"], dropout=True))
    c["grad"] = rng.random() < 0.7
    c["deterministic"] = rng.random() < 0.2
    return c


def sample_varlen(rng):
    batch = rng.randint(1, 5)
    c = dict(dtype=rng.choice(DTYPES), headdim=sample_headdim(rng))
    c["lengths_q"] = [sample_len(rng, 160) for _ in range(batch)]
    c["lengths_k"] = (list(c["lengths_q"]) if rng.random() < 0.3
                      else [sample_len(rng, 160) for _ in range(batch)])  # fmt: skip
    # max_seqlen_* only need to be at least the longest sequence.
    c["max_seqlen_q"] = max(c["lengths_q"]) + rng.choice([0, 0, 0, rng.randint(1, 9)])
    c["max_seqlen_k"] = max(c["lengths_k"]) + rng.choice([0, 0, 0, rng.randint(1, 9)])
    c["nheads"], c["nheads_k"] = sample_heads(rng)
    c["page_size"] = rng.choice([16, 32, 64]) if rng.random() < 0.2 else 0
    same = c["lengths_q"] == c["lengths_k"] and c["max_seqlen_q"] == c["max_seqlen_k"]
    apis = ["func"] * 3
    if not c["page_size"]:
        apis += ["kvpacked"] + (["qkvpacked"] if same and c["nheads"] == c["nheads_k"] else [])
    c["api"] = rng.choice(apis)
    c["layout"] = sample_layouts(rng, c["api"], same and not c["page_size"])
    # Dropout does not run with paged K/V (it raises).
    c.update(sample_mods(rng, c["max_seqlen_k"], dropout=not c["page_size"]))
    c["grad"] = rng.random() < 0.7 and (not c["page_size"] or SAMPLE_PENDING)
    c["deterministic"] = rng.random() < 0.2
    return c


def sample_kvcache(rng):
    c = dict(dtype=rng.choice(DTYPES), headdim=sample_headdim(rng, not SAMPLE_PENDING))
    c["batch"] = batch = rng.randint(1, 4)
    c["nheads"], c["nheads_k"] = sample_heads(rng)
    c["page_size"] = rng.choice([16, 32, 64, 128]) if rng.random() < 0.4 else 0
    if c["page_size"]:
        c["pages_per_seq"] = rng.randint(1, 4)
        c["spare_pages"] = rng.randint(0, 3)
        capacity = c["page_size"] * c["pages_per_seq"]
    else:
        capacity = max(1, sample_len(rng, 300))
        c["cache_batch"] = batch + rng.choice([0, 0, 2]) if rng.random() < 0.3 else None
    c["capacity"] = capacity
    c["seqlen_q"] = rng.choice([1] * 5 + [rng.randint(2, 8)] * 3 + [rng.randint(9, 64)] * 2)
    new = 0 if rng.random() < 0.3 else rng.choice([c["seqlen_q"], rng.randint(1, 8)])
    c["seqlen_new"] = new = min(new, capacity)
    kinds = ["tensor"] * 8 + ["int"] + ([] if new else ["none"])
    c["cache_seqlens"] = kind = rng.choice(kinds)
    if kind == "tensor":
        c["seqlens"] = [rng.randint(0, capacity - new) for _ in range(batch)]
    elif kind == "int":
        c["seqlens"] = [rng.randint(0, capacity - new)] * batch
    else:
        c["seqlens"] = [capacity] * batch
    c["rotary"] = None
    if new and c["headdim"] >= 2 and rng.random() < 0.3:
        half = c["headdim"] // 2
        c["rotary"] = rng.choice(["interleaved", "neox"])
        c["rotary_dim"] = 2 * rng.choice([half, rng.randint(1, half)])
        # A cos / sin row for every cache position and for every query row's position.
        c["seqlen_ro"] = max(capacity, max(c["seqlens"]) + c["seqlen_q"]) + rng.randint(0, 8)
    c["leftpad"] = None
    if kind == "tensor" and rng.random() < 0.25 and (c["rotary"] is None or SAMPLE_PENDING):
        c["leftpad"] = [rng.randint(0, n) for n in c["seqlens"]]
    c["num_splits"] = rng.choice([0, 0, 1, rng.randint(2, 16)])
    c.update(sample_mods(rng, capacity, dropout=False))
    c["layout"] = dict(q=rng.choice(LAYOUTS), k=rng.choice(LAYOUTS), v=rng.choice(LAYOUTS),
                       cache=rng.choice(["contiguous", "transposed"]) if c["headdim"] % 8 == 0
                       else "contiguous")  # fmt: skip
    return c


SAMPLERS = {"dense": sample_dense, "varlen": sample_varlen, "kvcache": sample_kvcache}


def sample(family, seed):
    """The configuration of case ``seed`` of ``family`` (a key of SAMPLERS)."""
    return SAMPLERS[family](random.Random(f"{family}:{seed}"))
