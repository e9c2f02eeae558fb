"""The transformers integration on the GPU: tiny random Llama (GQA), Mistral (sliding
window), Qwen2 and Gemma2 (softcap, scaling, alternating windows) run with
``attn_implementation="flashattn2"`` and with "sdpa" (Gemma2: "eager", it has no sdpa) in
fp16 / bf16, both against the same
weights in float32 with "eager" (the truth). The 2x rule of the kernel tests, on whole
models: flashattn2's error is at most twice sdpa's in the same dtype, plus a small atol.

Covered: logits with left / right / no padding, packed sequences, decoding through the KV
cache (teacher forced, and greedy ``generate`` with left padding), gradients of the
attention projections, and dropout in training. Needs kernels for head dim 64.
"""
import pytest
import torch

transformers = pytest.importorskip("transformers")
try:
    from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
except ImportError:
    pytest.skip("the integration needs transformers >= 4.53", allow_module_level=True)

from flashattn2.integrations.transformers import NAME  # noqa: E402
from hf_models import VOCAB, build, configs, padded_batch, positions  # noqa: E402

pytestmark = pytest.mark.gpu

MODELS = list(configs())
DTYPES = [torch.float16, torch.bfloat16]
LENGTHS = [70, 33, 1, 64]
SEQLEN = 70


def dtype_id(dtype):
    return str(dtype).replace("torch.", "")


def trio(name, dtype):
    """(truth: eager float32, baseline, flashattn2) on the GPU with the same weights; the
    baseline is sdpa in ``dtype``, or eager in ``dtype`` for models without sdpa (Gemma2:
    softcap)."""
    config = configs()[name]
    truth = build(config, "eager", torch.float32, "cuda")
    state = truth.state_dict()
    try:
        baseline = build(config, "sdpa", dtype, "cuda", state)
    except ValueError:
        baseline = build(config, "eager", dtype, "cuda", state)
    return truth, baseline, build(config, NAME, dtype, "cuda", state)


def check_2x(got, sdpa, truth, what, atol_rel=1e-3):
    """max |got - truth| <= 2 max |sdpa - truth| + atol_rel * max |truth|."""
    truth = truth.float()
    err = (got.float() - truth).abs().max().item()
    err_sdpa = (sdpa.float() - truth).abs().max().item()
    atol = atol_rel * truth.abs().max().item()
    assert err == err and err <= 2 * err_sdpa + atol, (
        f"{what}: flashattn2 error {err:.3g} > 2 x sdpa error {err_sdpa:.3g} + {atol:.3g}"
    )


def logits(model, ids, mask=None, position_ids=None):
    if position_ids is None and mask is not None:
        position_ids = positions(mask)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("padding", ["left", "right", "none"])
@pytest.mark.parametrize("name", MODELS)
def test_logits(name, padding, dtype):
    truth, sdpa, ours = trio(name, dtype)
    if padding == "none":
        ids, mask = torch.randint(3, VOCAB, (3, SEQLEN), device="cuda"), None
        real = torch.ones(3, SEQLEN, dtype=torch.bool, device="cuda")
    else:
        ids, mask = padded_batch(LENGTHS, SEQLEN, padding == "left", "cuda")
        real = mask.bool()
    out = [logits(m, ids, mask)[real] for m in (ours, sdpa, truth)]
    check_2x(*out, f"{name} logits, padding {padding}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_packed_sequences(name, dtype):
    """Three sequences packed in one row (position_ids restart at 0) against each sequence's
    own float32 logits."""
    truth, sdpa, ours = trio(name, dtype)
    lengths = [40, 1, 77]
    seqs = [torch.randint(3, VOCAB, (1, n), device="cuda") for n in lengths]
    packed = torch.cat(seqs, dim=1)
    pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    expected = torch.cat([logits(truth, s) for s in seqs], dim=1)
    got = logits(ours, packed, position_ids=pos)
    sdpa_out = torch.cat([logits(sdpa, s) for s in seqs], dim=1)
    check_2x(got, sdpa_out, expected, f"{name} packed logits")


def decode(model, ids, mask, tokens):
    """Logits of the prompt's last position, then of each of ``tokens`` ``(b, n)`` fed one at a
    time through the KV cache (left-padded prompt): ``(b, n + 1, vocab)``."""
    steps = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask),
                    use_cache=True)
        steps.append(out.logits[:, -1])
        for i in range(tokens.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = model(input_ids=tokens[:, i:i + 1], attention_mask=mask,
                        position_ids=positions(mask)[:, -1:],
                        past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits[:, -1])
    return torch.stack(steps, dim=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", MODELS)
def test_decoding_through_cache(name, dtype):
    truth, sdpa, ours = trio(name, dtype)
    ids, mask = padded_batch(LENGTHS, SEQLEN, True, "cuda")
    tokens = torch.randint(3, VOCAB, (len(LENGTHS), 6), device="cuda")
    out = [decode(m, ids, mask, tokens) for m in (ours, sdpa, truth)]
    check_2x(*out, f"{name} teacher-forced decoding")

    # greedy generate with left padding: its per-step logits against the truth fed the same
    # generated tokens
    gen = ours.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                        output_logits=True, return_dict_in_generate=True, pad_token_id=0,
                        eos_token_id=None)
    new = gen.sequences[:, SEQLEN:]
    assert new.shape == (len(LENGTHS), 5)
    got = torch.stack(gen.logits, dim=1)
    check_2x(got, decode(sdpa, ids, mask, new[:, :-1]), decode(truth, ids, mask, new[:, :-1]),
             f"{name} generate")


def attention_grads(model, ids, mask, weights):
    model.zero_grad()
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    (out.float() * weights * mask[..., None]).sum().backward()
    return {n: p.grad.float() for n, p in model.named_parameters() if "self_attn" in n}


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("name", MODELS)
def test_gradients(name, dtype):
    """Right-padded training batch, a loss on the real positions: each attention projection's
    gradient, relative error in the Frobenius norm, under the 2x rule."""
    truth, sdpa, ours = trio(name, dtype)
    for m in (truth, sdpa, ours):
        m.train()  # attention_dropout is 0 in these configs
    ids, mask = padded_batch(LENGTHS, SEQLEN, False, "cuda")
    weights = torch.randn(len(LENGTHS), SEQLEN, VOCAB, device="cuda")
    g_truth, g_sdpa, g_ours = (attention_grads(m, ids, mask, weights)
                               for m in (truth, sdpa, ours))
    assert g_truth.keys() == g_ours.keys() and len(g_truth) >= 8
    for n, ref in g_truth.items():
        scale = ref.norm().item()
        err = (g_ours[n] - ref).norm().item() / scale
        err_sdpa = (g_sdpa[n] - ref).norm().item() / scale
        assert err <= 2 * err_sdpa + 2e-3, f"{n}: flashattn2 {err:.3g}, sdpa {err_sdpa:.3g}"


def test_dropout_in_training():
    """attention_dropout in train mode reaches the kernel: outputs differ from eval mode,
    repeat under the same seed, and the backward runs."""
    config = configs()["llama"]
    config.attention_dropout = 0.2
    model = build(config, NAME, torch.bfloat16, "cuda").train()
    ids, mask = padded_batch(LENGTHS, SEQLEN, False, "cuda")
    real = mask.bool()
    torch.manual_seed(1)
    first = model(input_ids=ids, attention_mask=mask).logits
    torch.manual_seed(1)
    again = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(first[real], again[real])
    with torch.no_grad():
        evaluated = model.eval()(input_ids=ids, attention_mask=mask).logits
    assert not torch.allclose(first[real], evaluated[real], atol=1e-2)
    first[real].float().sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if "self_attn" in n]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
