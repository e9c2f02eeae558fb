"""Where each rank's rows sit in the full sequence, and which key rows a block of query rows
can see.

A layout cuts a sequence of ``world_size * seqlen_local`` rows into per-rank shards:

- ``"contiguous"``: rank r holds rows ``[r * seqlen_local, (r + 1) * seqlen_local)``;
- ``"zigzag"``: the sequence is cut into ``2 * world_size`` chunks of ``seqlen_local / 2``
  rows and rank r holds chunks r and ``2 * world_size - 1 - r`` (in that order). With a
  causal mask every rank then attends to the same number of (query, key) pairs.

A rank's shard is a list of *segments* ``(local_start, global_start, length)``. Attention
between a segment of queries and a segment of keys is planned by ``block_plan``: which
query rows see any key, which key rows any of them sees, and the (left, right) window of
that sub-block in the bottom-right aligned convention of the kernels, so that the same
kernel (or the fp32 reference) computes it exactly.
"""
import torch

LAYOUTS = ("zigzag", "contiguous")


def check_layout(layout, seqlen_local, world_size):
    """ValueError unless ``layout`` is known and ``seqlen_local`` can be cut that way."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if layout == "zigzag" and world_size > 1 and seqlen_local % 2:
        raise ValueError(
            f"the zigzag layout needs an even local sequence length (two chunks per rank); "
            f"got seqlen_local = {seqlen_local} (layout='contiguous' takes any length)"
        )


def segments(layout, rank, world_size, seqlen_local):
    """The ``(local_start, global_start, length)`` segments of ``rank``'s shard."""
    if layout == "contiguous" or world_size == 1:
        return [(0, rank * seqlen_local, seqlen_local)]
    chunk = seqlen_local // 2
    return [(0, rank * chunk, chunk), (chunk, (2 * world_size - 1 - rank) * chunk, chunk)]


def shard_sequence(x, rank, world_size, layout="zigzag", dim=1):
    """``rank``'s shard of the full sequence ``x`` (length along ``dim`` a multiple of
    ``world_size``, of ``2 * world_size`` for zigzag): a new contiguous tensor."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size = {world_size}); got {rank}")
    total = x.shape[dim]
    parts = 2 * world_size if layout == "zigzag" else world_size
    if layout in LAYOUTS and total % parts:
        raise ValueError(
            f"a {layout} shard needs a sequence length (dim {dim}) divisible by {parts}; "
            f"got {total}"
        )
    seqlen_local = total // world_size
    check_layout(layout, seqlen_local, world_size)
    pieces = [x.narrow(dim, start, length)
              for _, start, length in segments(layout, rank, world_size, seqlen_local)]
    return torch.cat(pieces, dim=dim)


def unshard_sequence(shards, layout="zigzag", dim=1):
    """The full sequence from the list of every rank's shard (inverse of ``shard_sequence``)."""
    world_size = len(shards)
    if world_size == 0:
        raise ValueError("unshard_sequence needs the shards of at least one rank")
    seqlen_local = shards[0].shape[dim]
    if any(s.shape != shards[0].shape for s in shards):
        raise ValueError(
            f"all shards must have one shape; got {[tuple(s.shape) for s in shards]}"
        )
    check_layout(layout, seqlen_local, world_size)
    placed = []
    for rank, shard in enumerate(shards):
        for local, start, length in segments(layout, rank, world_size, seqlen_local):
            placed.append((start, shard.narrow(dim, local, length)))
    placed.sort(key=lambda item: item[0])
    return torch.cat([piece for _, piece in placed], dim=dim)


def block_plan(q_start, q_len, k_start, k_len, left, right):
    """How query rows ``[q_start, q_start + q_len)`` attend to key rows ``[k_start, k_start +
    k_len)`` (global positions) when key j is visible to query p iff ``p - left <= j <= p +
    right`` (a bound of -1 is unbounded; causal is right = 0).

    Returns None if no query sees any key, else ``(q0, q1, k0, k1, left', right')``: the rows
    ``[q0, q1)`` and keys ``[k0, k1)`` (relative to the two starts) that take part, and the
    window of that sub-block in the kernels' bottom-right aligned convention (-1 where
    every row of the sub-block sees up to that edge). Rows outside ``[q0, q1)`` see nothing
    in this key range; keys outside ``[k0, k1)`` are seen by no row.
    """
    if q_len <= 0 or k_len <= 0:
        return None
    k_last = k_start + k_len - 1
    p_first, p_last = q_start, q_start + q_len - 1
    if right >= 0:
        p_first = max(p_first, k_start - right)  # sees at least key k_start
    if left >= 0:
        p_last = min(p_last, k_last + left)  # sees at least key k_last
    if p_first > p_last:
        return None
    j_first = k_start if left < 0 else max(k_start, p_first - left)
    j_last = k_last if right < 0 else min(k_last, p_last + right)
    rows, cols = p_last - p_first + 1, j_last - j_first + 1
    # The band j in [p - left, p + right], bottom-right aligned in the sub-block: the last
    # row p_last sees up to key j_last + right', from key j_last - left'.
    new_right = -1 if right < 0 else right + p_last - j_last
    new_left = -1 if left < 0 else left + j_last - p_last
    if new_right >= rows - 1:
        new_right = -1  # every row sees up to the last key of the sub-block
    if new_left >= cols - 1:
        new_left = -1  # every row sees from the first key of the sub-block
    return (p_first - q_start, p_last + 1 - q_start, j_first - k_start, j_last + 1 - k_start,
            new_left, new_right)


def local_blocks(q_segments, k_segments, left, right):
    """The kernel calls for a rank's queries against a shard of keys: a list of ``(q0, q1,
    k0, k1, left', right')`` in local row coordinates (``block_plan`` for every pair of
    segments, with fully visible neighbours joined into one call)."""
    blocks = []
    for q_local, q_start, q_len in q_segments:
        for k_local, k_start, k_len in k_segments:
            plan = block_plan(q_start, q_len, k_start, k_len, left, right)
            if plan is not None:
                q0, q1, k0, k1, wl, wr = plan
                blocks.append((q_local + q0, q_local + q1, k_local + k0, k_local + k1, wl, wr))
    joined = True
    while joined:  # join two full blocks that share one range and abut in the other
        joined = False
        for i, a in enumerate(blocks):
            for j in range(i + 1, len(blocks)):
                b = blocks[j]
                if a[4:] != (-1, -1) or b[4:] != (-1, -1):
                    continue
                if a[:2] == b[:2] and (a[3] == b[2] or b[3] == a[2]):
                    blocks[i] = (a[0], a[1], min(a[2], b[2]), max(a[3], b[3]), -1, -1)
                elif a[2:4] == b[2:4] and (a[1] == b[0] or b[1] == a[0]):
                    blocks[i] = (min(a[0], b[0]), max(a[1], b[1]), a[2], a[3], -1, -1)
                else:
                    continue
                del blocks[j]
                joined = True
                break
            if joined:
                break
    return blocks
