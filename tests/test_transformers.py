"""The transformers integration on the CPU: registration, argument mapping, and whole tiny
models whose attention runs through ``flashattn2_attention_forward`` with the kernels
replaced by the float32 reference (hf_models.ReferenceKernels), against the same weights
with ``attn_implementation="eager"``: padding on either side, packed sequences, sliding
windows, softcap, generation through the KV cache and gradients. test_transformers_gpu.py
runs the real kernels.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")
try:
    from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
except ImportError:
    pytest.skip("the integration needs transformers >= 4.53", allow_module_level=True)

import flashattn2.integrations.transformers as integ  # noqa: E402
from hf_models import (  # noqa: E402
    ReferenceKernels,
    build,
    configs,
    padded_batch,
    positions,
)

MODELS = list(configs())
TOL = dict(atol=2e-4, rtol=1e-4)


@pytest.fixture
def kernels(monkeypatch):
    return ReferenceKernels().install(monkeypatch, integ)


def pair(name):
    """(eager model, flashattn2 model) of config ``name`` with the same weights."""
    config = configs()[name]
    eager = build(config, "eager")
    return eager, build(config, integ.NAME, state=eager.state_dict())


def test_registered():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert AttentionInterface()[integ.NAME] is integ.flashattn2_attention_forward
    assert integ.NAME in AttentionMaskInterface._global_mapping
    model = build(configs()["llama"], integ.NAME)
    assert model.config._attn_implementation == integ.NAME
    integ.register()  # again: harmless
    integ.register("flashattn2_alias")
    assert AttentionInterface()["flashattn2_alias"] is integ.flashattn2_attention_forward
    build(configs()["llama"], "flashattn2_alias")


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(batch=2, seqlen=6, kv_len=6, dtype=torch.float32):
    q = torch.randn(batch, 4, seqlen, 64, dtype=dtype)
    k = torch.randn(batch, 2, kv_len, 64, dtype=dtype)
    return q, k, torch.randn_like(k)


def test_argument_mapping(kernels, monkeypatch):
    q, k, v = _qkv()
    out, weights = integ.flashattn2_attention_forward(_Module(), q, k, v, None, dropout=0.0,
                                                      scaling=0.3, sliding_window=4,
                                                      softcap=7.0)
    assert weights is None and out.shape == (2, 6, 4, 64)
    assert kernels.calls["flash_attn_func"] == 1
    assert kernels.last_kwargs == dict(dropout_p=0.0, softmax_scale=0.3, causal=True,
                                       window_size=(3, 3), softcap=7.0, deterministic=False)
    ref = kernels.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                     softmax_scale=0.3, causal=True, window_size=(3, 3),
                                     softcap=7.0)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)

    integ.flashattn2_attention_forward(_Module(), q, k, v, None, is_causal=False)
    assert kernels.last_kwargs == dict(dropout_p=0.0, softmax_scale=None, causal=False,
                                       window_size=(-1, -1), softcap=0.0, deterministic=False)
    monkeypatch.setenv("FLASH_ATTENTION_DETERMINISTIC", "1")
    integ.flashattn2_attention_forward(_Module(), q, k, v, None)
    assert kernels.last_kwargs["deterministic"] is True
    integ.flashattn2_attention_forward(_Module(), q, k, v, None, deterministic=False)
    assert kernels.last_kwargs["deterministic"] is False


def test_dropout_passes_through(monkeypatch):
    seen = {}

    def fake(q, k, v, **opts):
        seen.update(opts)
        return q

    monkeypatch.setattr(integ, "flash_attn_func", fake)
    q, k, v = _qkv()
    integ.flashattn2_attention_forward(_Module(), q, k, v, None, dropout=0.25)
    assert seen["dropout_p"] == 0.25


def test_value_head_dim_smaller(kernels):
    q, k, v = _qkv()
    v = v[..., :48]
    out, _ = integ.flashattn2_attention_forward(_Module(), q, k, v, None)
    ref = kernels.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2),
                                     torch.nn.functional.pad(v, (0, 16)).transpose(1, 2),
                                     causal=True)
    assert out.shape == (2, 6, 4, 48)
    torch.testing.assert_close(out, ref[..., :48], atol=0, rtol=0)


def test_refusals(kernels):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="2-D padding mask"):
        integ.flashattn2_attention_forward(_Module(), q, k, v, torch.zeros(2, 1, 6, 6))
    with pytest.raises(ValueError, match="output_attentions"):
        integ.flashattn2_attention_forward(_Module(), q, k, v, None, output_attentions=True)
    with pytest.raises(NotImplementedError, match="s_aux"):
        integ.flashattn2_attention_forward(_Module(), q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(ValueError, match="covers 8 keys"):
        integ.flashattn2_attention_forward(_Module(), q, k, v, torch.ones(2, 8, dtype=torch.bool))


def test_padding_mask_unpads(kernels):
    """Queries and keys of a left-padded batch are packed; padding rows come back as 0 and a
    static-cache tail beyond the mask is ignored."""
    q, k, v = _qkv(batch=2, seqlen=5, kv_len=7)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]], dtype=torch.bool)
    out, _ = integ.flashattn2_attention_forward(_Module(), q, k, v, mask)
    assert kernels.calls["flash_attn_varlen_func"] == 1
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for b, n in enumerate((5, 3)):
        ref = kernels.flash_attn_func(qt[b:b + 1, 5 - n:], kt[b:b + 1, 7 - n:],
                                         vt[b:b + 1, 7 - n:], causal=True)
        torch.testing.assert_close(out[b:b + 1, 5 - n:], ref, atol=0, rtol=0)
        assert (out[b, :5 - n] == 0).all()
    # a static cache: keys beyond the mask's length are not read
    k_long = torch.cat([k, torch.full_like(k[:, :, :3], float("nan"))], dim=2)
    out_long, _ = integ.flashattn2_attention_forward(_Module(), q, k_long,
                                                     torch.cat([v, v[:, :, :3]], dim=2), mask)
    torch.testing.assert_close(out_long, out, atol=0, rtol=0)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_logits_match_eager(name, side, kernels):
    eager, ours = pair(name)
    ids, mask = padded_batch([12, 9, 5], 12, left=side == "left")
    with torch.no_grad():
        expected = eager(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        got = ours(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    assert kernels.calls["flash_attn_varlen_func"] >= 2  # every layer took the padded path
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_unpadded_logits_match_eager(name, kernels):
    eager, ours = pair(name)
    ids = torch.randint(3, 128, (2, 11))
    with torch.no_grad():
        expected = eager(input_ids=ids).logits
        got = ours(input_ids=ids).logits
    assert kernels.calls["flash_attn_varlen_func"] == 0 and kernels.calls["flash_attn_func"] >= 2
    torch.testing.assert_close(got, expected, **TOL)


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_packed_sequences(name, kernels):
    """Sequences packed into one row (position_ids restarting at 0, or cu_seq_lens kwargs)
    give each sequence's own logits."""
    eager, ours = pair(name)
    lengths = [5, 9, 3]
    seqs = [torch.randint(3, 128, (1, n)) for n in lengths]
    packed = torch.cat(seqs, dim=1)
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        expected = torch.cat([eager(input_ids=s).logits for s in seqs], dim=1)
        got = ours(input_ids=packed, position_ids=pos).logits
        assert kernels.calls["flash_attn_varlen_func"] == 2
        torch.testing.assert_close(got, expected, **TOL)
        cu = torch.tensor([0, 5, 14, 17], dtype=torch.int64)
        got_cu = ours(input_ids=packed, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                      max_length_q=9, max_length_k=9).logits
        torch.testing.assert_close(got_cu, expected, **TOL)


@pytest.mark.parametrize("name", MODELS)
def test_generate_left_padded(name, kernels):
    """Greedy generation with left padding through the KV cache: same tokens and per-step
    scores as eager."""
    eager, ours = pair(name)
    ids, mask = padded_batch([10, 7, 4], 10, left=True)
    opts = dict(max_new_tokens=5, do_sample=False, output_scores=True,
                return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    expected = eager.generate(input_ids=ids, attention_mask=mask, **opts)
    got = ours.generate(input_ids=ids, attention_mask=mask, **opts)
    # prefill and each decoding step, per layer (Mistral's window slides past the padding:
    # its later steps need no mask and run dense)
    assert kernels.calls["flash_attn_varlen_func"] >= 2
    assert sum(kernels.calls.values()) >= 2 * 5
    assert torch.equal(got.sequences, expected.sequences)
    for s_got, s_exp in zip(got.scores, expected.scores):
        torch.testing.assert_close(s_got, s_exp, **TOL)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_gradients_match_eager(name, kernels):
    eager, ours = pair(name)
    eager.train()
    ours.train()
    ids, mask = padded_batch([12, 8], 12, left=False)
    weights = torch.randn(2, 12, 128)
    for model in (eager, ours):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
        (logits * weights * mask[..., None]).sum().backward()
    for (pname, p_exp), p_got in zip(eager.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_got.grad, p_exp.grad, atol=1e-3, rtol=1e-3,
                                   msg=lambda m: f"{pname}: {m}")


def test_mask_read_once_per_forward(kernels, monkeypatch):
    """Every layer gets the same mask tensor; its metadata (a host sync) is computed once."""
    count = [0]
    original = integ._mask_metadata

    def counted(kept):
        count[0] += 1
        return original(kept)

    monkeypatch.setattr(integ, "_mask_metadata", counted)
    _, ours = pair("llama")
    ids, mask = padded_batch([12, 9, 5], 12, left=True)
    with torch.no_grad():
        ours(input_ids=ids, attention_mask=mask)
        assert count[0] == 1
        mask[0, 0] = 1  # changed in place: read again
        ours(input_ids=ids, attention_mask=mask)
    assert count[0] == 2
