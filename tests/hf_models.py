"""Tiny randomly initialised transformers models for the integration tests (no downloads),
and float32 stand-ins for the flashattn2 kernels so that a whole model runs on the CPU.

Every config has head dim 64, GQA (4 query heads, 2 key/value heads) and two layers;
``initializer_range`` is raised so that attention is far from uniform and a wrong mask,
window or scale changes the logits.
"""
import copy

import torch
from reference import attention_ref

transformers = __import__("transformers")

VOCAB = 128


def configs():
    """name -> config: Llama (GQA), Mistral (sliding window 4), Qwen2, Gemma2 (softcap,
    sliding window 4 on every other layer, query_pre_attn_scalar scaling)."""
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return {
        "llama": transformers.LlamaConfig(**common),
        "mistral": transformers.MistralConfig(sliding_window=4, **common),
        "qwen2": transformers.Qwen2Config(**common),
        "gemma2": transformers.Gemma2Config(head_dim=64, sliding_window=4,
                                            attn_logit_softcapping=5.0,
                                            final_logit_softcapping=30.0,
                                            query_pre_attn_scalar=32, **common),
    }


def build(config, attn, dtype=torch.float32, device="cpu", state=None):
    """A causal LM of ``config`` with ``attn_implementation=attn`` in eval mode; weights from
    ``state`` (a state dict) when given, so that several implementations share them."""
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config),
                                                          attn_implementation=attn)
    if state is not None:
        model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval()


def padded_batch(lengths, seqlen, left, device="cpu", generator=None):
    """``(input_ids, attention_mask)`` of random tokens (never the pad id 0) with
    ``lengths[b]`` real tokens per row, padded on the left or the right."""
    ids = torch.randint(3, VOCAB, (len(lengths), seqlen), generator=generator)
    mask = torch.zeros(len(lengths), seqlen, dtype=torch.long)
    for b, n in enumerate(lengths):
        if left:
            mask[b, seqlen - n:] = 1
        else:
            mask[b, :n] = 1
    ids = ids.masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device)


def positions(mask):
    """transformers' generation position ids for a padded mask: count of real tokens - 1."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


# ---- float32 stand-ins for the kernels (CPU tests) ----


class ReferenceKernels:
    """``flash_attn_func`` / ``flash_attn_varlen_func`` computed by the float32 reference,
    counting calls (``calls[name]``); dropout is refused (it cannot match eager)."""

    def __init__(self):
        self.calls = {"flash_attn_func": 0, "flash_attn_varlen_func": 0}
        self.last_kwargs = None

    def flash_attn_func(self, q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, deterministic=False):
        self.calls["flash_attn_func"] += 1
        self.last_kwargs = dict(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap,
                                deterministic=deterministic)
        assert dropout_p == 0.0
        out, _ = attention_ref(q, k, v, causal=causal, window_size=window_size,
                               softmax_scale=softmax_scale, softcap=softcap)
        return out

    def flash_attn_varlen_func(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, **opts):
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int)
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        assert len(cq) == len(ck) and cq[-1] == q.shape[0] and ck[-1] == k.shape[0]
        outs = []
        for b in range(len(cq) - 1):
            assert cq[b + 1] - cq[b] <= max_seqlen_q and ck[b + 1] - ck[b] <= max_seqlen_k
            qs, ks, vs = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
            outs.append(self.flash_attn_func(qs[None], ks[None], vs[None], **opts)[0])
            self.calls["flash_attn_func"] -= 1
        self.calls["flash_attn_varlen_func"] += 1
        return torch.cat(outs)

    def install(self, monkeypatch, module):
        monkeypatch.setattr(module, "flash_attn_func", self.flash_attn_func)
        monkeypatch.setattr(module, "flash_attn_varlen_func", self.flash_attn_varlen_func)
        return self
