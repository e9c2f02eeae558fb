"""Context parallelism on 2 GPUs of one host, and on 4 (8 where the host has them), by
NCCL: bf16, 8k-128k tokens in all, ring / all-gather / Ulysses, causal and not, GQA. Each rank's output and gradients are held to the
2x rule: ``max|ours - ref| <= 2 * max(max|flash - ref|, max|torch - ref|) + ATOL`` with
``ref`` the float32 reference, ``flash`` single-GPU flash_attn_func and ``torch`` plain
PyTorch in bf16 on the full sequence (ATOL 4e-3, as test_fwd / test_bwd for bf16); the LSE
within float32 rounding of the reference. Past 16k tokens the references run by query
chunks (distributed_cases._reference; the 32k-128k cases have not run on a GPU yet).

On 4 or more GPUs (marker gpu4) the same checks run at world size 4 (8 on an 8-GPU host),
and cases marked ``vs_world2`` must also agree with the 2-GPU result of the same sequence
(ranks 0 and 1 as a 2-rank group) within the 2x rule's bound.

Run: ``pytest tests/test_distributed_gpu.py`` on a machine with >= 2 GPUs (marker gpu2;
the processes are spawned here and meet through a file, no network).
"""
import os

import pytest
import torch

from distributed_cases import case_name, run_world

pytestmark = [pytest.mark.gpu, pytest.mark.gpu2]


def _cases():
    base = dict(world_size=2, batch=1, headdim=128, seqlen_local=4096, nheads=8)
    cases = []
    for variant, layout in [("ring", "zigzag"), ("ring", "contiguous"), ("gather", "zigzag"),
                            ("ulysses", "zigzag")]:
        for causal in (False, True):
            for nheads_k in (8, 2):
                cases.append(dict(base, variant=variant, layout=layout, causal=causal,
                                  nheads_k=nheads_k))
    cases += [
        dict(base, variant="ring", causal=True, nheads_k=2, window=(1500, 0)),
        dict(base, variant="ring", causal=True, nheads_k=2, softcap=20.0),
        dict(base, variant="ring", causal=True, nheads_k=2, deterministic=True),
        dict(base, variant="gather", causal=True, nheads_k=2, window=(1500, 0)),
        dict(base, variant="ring", causal=True, seqlen_local=8192, nheads=4, nheads_k=1),
        dict(base, variant="ring", causal=False, seqlen_local=8192, nheads=4, nheads_k=4),
        # 32k-128k tokens in all: references by query chunks (distributed_cases._reference)
        dict(base, variant="ulysses", causal=False, seqlen_local=16384, nheads_k=8),
        dict(base, variant="gather", causal=True, seqlen_local=32768, nheads_k=2),
        dict(base, variant="ring", causal=True, seqlen_local=65536, nheads_k=2),
        dict(base, error="mismatched", match="differ across ranks"),
        dict(base, error="cpu_tensors", match="NCCL, which needs CUDA tensors"),
    ]
    return cases


_RESULTS = {}


@pytest.mark.parametrize("variant", ["ring", "gather", "ulysses"])
def test_one_rank_group_runs_flash_attn_func(variant):
    """A one-rank NCCL group: the functions fall through to flash_attn_func (same result)."""
    case = dict(world_size=1, batch=1, headdim=128, seqlen_local=2048, nheads=8, nheads_k=2,
                variant=variant, causal=True)
    results = run_world(1, "nccl", [case])
    assert not any(results.values()), results


@pytest.mark.parametrize("name", [case_name(c) for c in _cases()])
def test_two_gpus(name):
    if "results" not in _RESULTS:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        _RESULTS["results"] = run_world(2, "nccl", _cases())
    error = _RESULTS["results"][name]
    assert not error, error


# the larger world: 8 on an 8-GPU host, else 4 (the gpu4 tests skip below 4 GPUs)
_WORLD = 8 if torch.cuda.is_available() and torch.cuda.device_count() >= 8 else 4


def _many_gpu_cases():
    """Every scheme and layout at 2k tokens a rank; nheads_k 8 (MHA) or _WORLD // 2 (GQA,
    Ulysses needs nheads_k % world == 0: 8 only); a long ring (16k a rank); and the
    vs_world2 cases, compared with a 2-rank run of the same sequence."""
    base = dict(world_size=_WORLD, batch=1, headdim=128, seqlen_local=2048, nheads=8)
    gqa = max(2, _WORLD // 2)
    cases = []
    for variant, layout in [("ring", "zigzag"), ("ring", "contiguous"), ("gather", "zigzag")]:
        for causal in (False, True):
            cases.append(dict(base, variant=variant, layout=layout, causal=causal,
                              nheads_k=gqa if causal else 8))
    cases += [
        dict(base, variant="ulysses", causal=True, nheads_k=8),
        dict(base, variant="ulysses", causal=False, nheads_k=8, nheads=16),
        dict(base, variant="ring", causal=True, nheads_k=2, window=(1500, 0)),
        dict(base, variant="ring", causal=True, nheads_k=2, deterministic=True),
        dict(base, variant="ring", causal=True, seqlen_local=16384, nheads=4, nheads_k=1),
        dict(base, variant="ring", causal=True, nheads_k=2, vs_world2=True),
        dict(base, variant="ring", causal=False, nheads_k=8, vs_world2=True),
        dict(base, variant="gather", causal=True, nheads_k=2, vs_world2=True),
        dict(base, variant="ulysses", causal=True, nheads_k=8, vs_world2=True),
    ]
    return cases


@pytest.mark.gpu4
@pytest.mark.parametrize("name", [case_name(c) for c in _many_gpu_cases()])
def test_many_gpus(name):
    if "many" not in _RESULTS:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        _RESULTS["many"] = run_world(_WORLD, "nccl", _many_gpu_cases())
    error = _RESULTS["many"][name]
    assert not error, error
