"""Padding helpers with the names and return values of ``flash_attn.bert_padding``.

They turn a padded batch ``(batch, seqlen, ...)`` plus a 0/1 ``attention_mask`` into the
packed ``(total, ...)`` layout of the varlen functions and back::

    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask)
    out_unpad = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_seqlens, cu_seqlens,
                                       max_seqlen, max_seqlen, causal=True)
    out = pad_input(out_unpad, indices, batch, seqlen)        # padding rows are 0

Indexing runs through small autograd functions: gathers and scatters of whole rows with
integer ``indices`` (never a boolean mask), whose backward is the matching scatter / gather.
``unpad_input`` reads the mask once on the host (``max_seqlen`` is a Python int, and the
number of kept rows decides the output shape), which synchronises with the GPU.
"""
import torch
import torch.nn.functional as F

__all__ = [
    "index_first_axis",
    "index_first_axis_residual",
    "index_put_first_axis",
    "pad_input",
    "unpad_input",
    "unpad_input_for_concatenated_sequences",
]


def _check_tensor(name, t, min_dim):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor; got {type(t).__name__}")
    if t.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dims; got shape {tuple(t.shape)}")


def _check_indices(indices, device):
    _check_tensor("indices", indices, 1)
    if indices.dim() != 1 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"indices must be a 1-D int64 (or int32) tensor; got {indices.dtype} of shape "
            f"{tuple(indices.shape)}"
        )
    if indices.device != device:
        raise ValueError(f"indices must be on {device}; got {indices.device}")


def _check_mask(attention_mask, hidden_states, name="attention_mask"):
    _check_tensor(name, attention_mask, 2)
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"{name} must have shape (batch, seqlen) = {tuple(hidden_states.shape[:2])}; got "
            f"{tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype.is_floating_point or attention_mask.dtype.is_complex:
        raise ValueError(f"{name} must be a bool or integer tensor; got {attention_mask.dtype}")
    if attention_mask.device != hidden_states.device:
        raise ValueError(
            f"{name} must be on the device of hidden_states ({hidden_states.device}); got "
            f"{attention_mask.device}"
        )


class _IndexFirstAxis(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        ctx.first_axis_dim = input.shape[0]
        return input.index_select(0, indices)

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        grad_input = grad_output.new_zeros((ctx.first_axis_dim,) + grad_output.shape[1:])
        grad_input.index_copy_(0, indices, grad_output)
        return grad_input, None


class _IndexPutFirstAxis(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, indices, first_axis_dim):
        ctx.save_for_backward(indices)
        output = values.new_zeros((first_axis_dim,) + values.shape[1:])
        output.index_copy_(0, indices, values)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        (indices,) = ctx.saved_tensors
        return grad_output.index_select(0, indices), None, None


class _IndexFirstAxisResidual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, indices):
        ctx.save_for_backward(indices)
        return input.index_select(0, indices), input.detach()

    @staticmethod
    def backward(ctx, grad_output, grad_residual):
        (indices,) = ctx.saved_tensors
        grad_input = grad_residual.clone()
        grad_input.index_add_(0, indices, grad_output)
        return grad_input, None


def index_first_axis(input, indices):
    """``input[indices]`` along the first axis: ``(n, ...)`` -> ``(len(indices), ...)``.

    The backward scatters the gradient back into zeros (``indices`` must not repeat)."""
    _check_tensor("input", input, 1)
    _check_indices(indices, input.device)
    return _IndexFirstAxis.apply(input, indices.long())


def index_put_first_axis(values, indices, first_axis_dim):
    """Zeros of shape ``(first_axis_dim, ...)`` with rows ``indices`` set to ``values``
    (``indices`` must not repeat)."""
    _check_tensor("values", values, 1)
    _check_indices(indices, values.device)
    if indices.shape[0] != values.shape[0]:
        raise ValueError(
            f"indices and values must have as many rows; got {indices.shape[0]} and "
            f"{values.shape[0]}"
        )
    return _IndexPutFirstAxis.apply(values, indices.long(), int(first_axis_dim))


def index_first_axis_residual(input, indices):
    """``(input[indices], input.detach())``; gradients reaching both outputs are summed into
    ``input``'s gradient (for a residual branch that keeps the padded tensor)."""
    _check_tensor("input", input, 1)
    _check_indices(indices, input.device)
    return _IndexFirstAxisResidual.apply(input, indices.long())


def _mask_metadata(kept):
    """``(indices, cu_seqlens, max_seqlen)`` of a bool ``(batch, seqlen)`` mask, as
    ``unpad_input`` returns them (one host synchronisation)."""
    seqlens = kept.sum(dim=-1, dtype=torch.int32)
    indices = kept.flatten().nonzero(as_tuple=False).flatten()
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    return indices, F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0)), max_seqlen


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Packs the tokens that ``attention_mask`` (or ``unused_mask``) selects.

    Args:
        hidden_states: ``(batch, seqlen, ...)``.
        attention_mask: bool / int ``(batch, seqlen)``, nonzero = a valid token.
        unused_mask: None, or bool / int ``(batch, seqlen)``, nonzero = a slot that is kept
            (allocated) but not used; ``attention_mask`` and ``unused_mask`` must not overlap.

    Returns:
        ``(hidden_states, indices, cu_seqlens, max_seqlen_in_batch, seqused)``:
        ``(total, ...)`` rows kept by either mask, in order; their int64 ``(total,)``
        positions in the flattened ``(batch * seqlen)`` input; int32 ``(batch + 1,)``
        cumulative counts of kept rows; the longest count as a Python int; int32
        ``(batch,)`` counts of valid (``attention_mask``) tokens only.
    """
    _check_tensor("hidden_states", hidden_states, 2)
    _check_mask(attention_mask, hidden_states)
    kept = attention_mask.bool()
    if unused_mask is not None:
        _check_mask(unused_mask, hidden_states, "unused_mask")
        kept = kept | unused_mask.bool()
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices, cu_seqlens, max_seqlen = _mask_metadata(kept)
    flat = hidden_states.reshape((-1,) + hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, seqused


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Packs batch rows that each hold several sequences back to back.

    ``attention_mask_in_length`` ``(batch, seqlen)`` int: row b lists the lengths of the
    sequences packed at the start of row b, then zeros (e.g. ``[2, 3, 0, 0, 0, 0]``: tokens
    0-1 and 2-4 are two sequences, token 5 is padding). Returns
    ``(hidden_states, indices, cu_seqlens, max_seqlen_in_batch)`` with one cu_seqlens entry
    per sequence (not per batch row).
    """
    _check_tensor("hidden_states", hidden_states, 2)
    _check_mask(attention_mask_in_length, hidden_states, "attention_mask_in_length")
    lengths = attention_mask_in_length
    seqlen = lengths.shape[1]
    used = lengths.sum(dim=-1)
    positions = torch.arange(seqlen, device=lengths.device)
    kept = positions.unsqueeze(0) < used.unsqueeze(1)
    flat_lengths = lengths.flatten()
    seqlens = flat_lengths[flat_lengths != 0].to(torch.int32)
    indices = kept.flatten().nonzero(as_tuple=False).flatten()
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    cu_seqlens = F.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape((-1,) + hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen


def pad_input(hidden_states, indices, batch, seqlen):
    """The inverse of ``unpad_input``: ``(total, ...)`` rows -> ``(batch, seqlen, ...)`` with
    zeros where no row was kept."""
    _check_tensor("hidden_states", hidden_states, 1)
    out = index_put_first_axis(hidden_states, indices, int(batch) * int(seqlen))
    return out.view((int(batch), int(seqlen)) + hidden_states.shape[1:])
