"""flashattn2.bert_padding against plain boolean-mask indexing (CPU): values, the return
conventions of flash_attn.bert_padding (five values from unpad_input, as flash-attn >= 2.6),
gradients, and argument errors."""
import pytest
import torch
from flashattn2.bert_padding import (
    index_first_axis,
    index_first_axis_residual,
    index_put_first_axis,
    pad_input,
    unpad_input,
    unpad_input_for_concatenated_sequences,
)


def _mask(lengths, seqlen, left=False):
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.int32)
    for b, n in enumerate(lengths):
        if left:
            mask[b, seqlen - n:] = 1
        else:
            mask[b, :n] = 1
    return mask


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("mask_dtype", [torch.int32, torch.bool, torch.int64])
def test_unpad_pad_roundtrip(left, mask_dtype):
    lengths = [5, 0, 7, 2]
    x = torch.randn(4, 7, 3, 8, requires_grad=True)
    mask = _mask(lengths, 7, left).to(mask_dtype)
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask)
    keep = mask.bool()
    torch.testing.assert_close(x_unpad, x[keep], atol=0, rtol=0)
    assert indices.dtype == torch.int64
    assert indices.tolist() == keep.flatten().nonzero().flatten().tolist()
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 5, 5, 12, 14]
    assert isinstance(max_seqlen, int) and max_seqlen == 7
    assert seqused.dtype == torch.int32 and seqused.tolist() == lengths
    padded = pad_input(x_unpad, indices, 4, 7)
    assert padded.shape == x.shape
    torch.testing.assert_close(padded, x * keep[:, :, None, None], atol=0, rtol=0)
    grad = torch.randn_like(padded)
    padded.backward(grad)
    torch.testing.assert_close(x.grad, grad * keep[:, :, None, None], atol=0, rtol=0)


def test_unpad_unused_mask():
    """Slots marked unused are kept in the packed rows and cu_seqlens, not in seqused."""
    x = torch.randn(2, 6, 4)
    mask = _mask([3, 2], 6)
    unused = torch.zeros_like(mask)
    unused[0, 3:5] = 1
    unused[1, 2] = 1
    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask, unused)
    keep = (mask + unused).bool()
    torch.testing.assert_close(x_unpad, x[keep], atol=0, rtol=0)
    assert cu_seqlens.tolist() == [0, 5, 8] and max_seqlen == 5
    assert seqused.tolist() == [3, 2]
    assert indices.tolist() == keep.flatten().nonzero().flatten().tolist()


def test_index_first_axis_gradients():
    x = torch.randn(10, 3, 2, requires_grad=True)
    indices = torch.tensor([7, 0, 3, 9])
    out = index_first_axis(x, indices)
    torch.testing.assert_close(out, x[indices], atol=0, rtol=0)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected = torch.zeros_like(x)
    expected[indices] = grad
    torch.testing.assert_close(x.grad, expected, atol=0, rtol=0)

    values = torch.randn(4, 5, requires_grad=True)
    put = index_put_first_axis(values, indices, 10)
    assert put.shape == (10, 5)
    torch.testing.assert_close(put[indices], values, atol=0, rtol=0)
    others = torch.ones(10, dtype=torch.bool)
    others[indices] = False
    assert (put[others] == 0).all()
    g = torch.randn(10, 5)
    put.backward(g)
    torch.testing.assert_close(values.grad, g[indices], atol=0, rtol=0)


def test_index_first_axis_residual():
    x = torch.randn(6, 4, requires_grad=True)
    indices = torch.tensor([1, 4])
    out, residual = index_first_axis_residual(x, indices)
    torch.testing.assert_close(out, x[indices], atol=0, rtol=0)
    torch.testing.assert_close(residual, x, atol=0, rtol=0)
    g_out, g_res = torch.randn(2, 4), torch.randn(6, 4)
    torch.autograd.backward([out, residual], [g_out, g_res])
    expected = g_res.clone()
    expected[indices] += g_out
    torch.testing.assert_close(x.grad, expected, atol=0, rtol=0)


def test_unpad_concatenated_sequences():
    x = torch.randn(3, 6, 5)
    lengths = torch.tensor([[2, 3, 0, 0, 0, 0], [3, 2, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    x_unpad, indices, cu_seqlens, max_seqlen = unpad_input_for_concatenated_sequences(x, lengths)
    keep = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1] * 6]).bool()
    torch.testing.assert_close(x_unpad, x[keep], atol=0, rtol=0)
    assert indices.tolist() == keep.flatten().nonzero().flatten().tolist()
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == [0, 2, 5, 8, 10, 16]
    assert max_seqlen == 6


def test_bad_arguments():
    x = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="hidden_states must be a torch.Tensor"):
        unpad_input(None, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(batch, seqlen\)"):
        unpad_input(x, torch.ones(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="bool or integer"):
        unpad_input(x, torch.ones(2, 4))
    with pytest.raises(ValueError, match="indices must be a 1-D int64"):
        index_first_axis(x.flatten(0, 1), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="indices must be a 1-D int64"):
        pad_input(x.flatten(0, 1), torch.tensor([0.0, 1.0]), 2, 4)
    with pytest.raises(ValueError, match="as many rows"):
        index_put_first_axis(torch.randn(3, 2), torch.tensor([0, 1]), 5)
    with pytest.raises(ValueError, match="input must be a torch.Tensor"):
        index_first_axis([1, 2], torch.tensor([0]))
