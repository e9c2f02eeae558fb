"""Around the launch (GPU): what reaches the kernels (bad input never does, empty problems
return without a launch), return values, devices, autograd, and a smoke test against the
reference. The input tables are test_checks.py's.
"""
import flashattn2
import pytest
import torch
from flashattn2 import _ext, _launch
from reference import attention_ref
from test_checks import BAD_BACKWARD_INPUTS, BAD_INPUTS, backward_inputs_cpu, qkv_cpu

gpu = pytest.mark.gpu

# ---- around the launch (GPU) ------------------------------------------------------------------


class LaunchRecorder:
    """Stands in for ``_launch._C``: counts fwd and bwd launches, forwards everything."""

    def __init__(self, module):
        self._module = module
        self.launches = 0
        self.bwd_launches = 0

    def fwd(self, *args, **kwargs):
        self.launches += 1
        return self._module.fwd(*args, **kwargs)

    def bwd(self, *args, **kwargs):
        self.bwd_launches += 1
        return self._module.bwd(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)


@pytest.fixture
def launches(monkeypatch):
    recorder = LaunchRecorder(_launch._C)
    monkeypatch.setattr(_launch, "_C", recorder)
    return recorder


def qkv_gpu(batch=2, seqlen_q=33, seqlen_k=47, nheads=4, nheads_k=2, headdim=64,
            dtype=torch.bfloat16, device="cuda"):  # fmt: skip
    return tuple(t.to(device) for t in qkv_cpu(batch, seqlen_q, seqlen_k, nheads, nheads_k,
                                               headdim, dtype))


@gpu
def test_launch_recorder_sees_a_launch(launches):
    out = flashattn2.flash_attn_func(*qkv_gpu())
    torch.cuda.synchronize()
    assert launches.launches == 1 and out.shape == (2, 33, 4, 64)


@gpu
@pytest.mark.parametrize("case", ["h % h_k", "v heads", "float64", "headdim 264"])
def test_bad_inputs_never_launch(case, launches):
    transform, message = BAD_INPUTS[case]
    with pytest.raises(ValueError, match=message):
        flashattn2.flash_attn_func(*transform(*qkv_gpu()))
    assert launches.launches == 0


@gpu
@pytest.mark.parametrize(
    "shape", [(0, 33, 47, 4, 2), (2, 0, 47, 4, 2), (2, 33, 47, 0, 2), (0, 0, 0, 4, 2)]
)
def test_empty_problems_return_empty_without_launch(shape, launches):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q, k, v = qkv_gpu(batch, seqlen_q, seqlen_k, nheads, nheads_k, 64)
    out, lse, probs = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (batch, nheads, seqlen_q) and lse.dtype == torch.float32
    assert probs is None and launches.launches == 0


@gpu
@pytest.mark.parametrize("headdim", [64, 20])
def test_empty_keys_give_zeros_and_inf_without_launch(headdim, launches):
    q, k, v = qkv_gpu(seqlen_k=0, headdim=headdim)
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 4, 33) and lse.isposinf().all()
    assert launches.launches == 0


@gpu
def test_return_values_and_devices():
    q, k, v = qkv_gpu(headdim=40)
    out = flashattn2.flash_attn_func(q, k, v)
    assert isinstance(out, torch.Tensor)
    out2, lse, probs = flashattn2.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, out2) and probs is None
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32 and lse.is_contiguous()


@gpu
@pytest.mark.parametrize("headdim", [64, 20])
def test_autograd_graph_and_gradients(headdim, launches):
    q, k, v = (t.requires_grad_() for t in qkv_gpu(headdim=headdim))
    out, lse, _ = flashattn2.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad and out.shape == q.shape
    out.float().sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype and t.grad.isfinite().all()
    assert launches.launches == 1 and launches.bwd_launches == 1
    with torch.no_grad():
        assert flashattn2.flash_attn_func(q, k, v).grad_fn is None
    assert flashattn2.forward(q, k, v).grad_fn is None  # the low-level functions never record


@gpu
@pytest.mark.parametrize("case", ["lse transposed", "o dtype", "h % h_k"])
def test_bad_backward_inputs_never_launch(case, launches):
    changes, message = BAD_BACKWARD_INPUTS[case]
    inputs = {name: t.cuda() for name, t in backward_inputs_cpu().items()}
    for name, change in changes.items():
        inputs[name] = change(inputs[name])
    with pytest.raises(ValueError, match=message):
        flashattn2.backward(**inputs)
    assert launches.bwd_launches == 0


@gpu
def test_low_level_backward_names_the_tensor_on_another_device():
    inputs = {name: t.cuda() for name, t in backward_inputs_cpu().items()}
    with pytest.raises(ValueError, match="needs CUDA tensors; got lse on cpu"):
        flashattn2.backward(**dict(inputs, lse=inputs["lse"].cpu()))
    with pytest.raises(ValueError, match="needs CUDA tensors; got dout on cpu"):
        flashattn2.backward(**dict(inputs, dout=inputs["dout"].cpu()))


@gpu
@pytest.mark.parametrize(
    "shape", [(0, 33, 47, 4, 2), (2, 0, 47, 4, 2), (2, 33, 0, 4, 2), (2, 33, 47, 0, 2)]
)
def test_empty_problems_give_zero_gradients_without_launch(shape, launches):
    batch, seqlen_q, seqlen_k, nheads, nheads_k = shape
    q, k, v = (t.requires_grad_() for t in qkv_gpu(batch, seqlen_q, seqlen_k, nheads, nheads_k))
    out = flashattn2.flash_attn_func(q, k, v, causal=True)
    out.backward(torch.randn_like(out))
    for t in (q, k, v):
        assert t.grad.shape == t.shape and (t.grad == 0).all()
    assert launches.bwd_launches == 0


@gpu
def test_no_grad_path_matches_autograd_path():
    q, k, v = qkv_gpu(headdim=100)
    plain = flashattn2.flash_attn_func(q, k, v, causal=True)
    tracked = flashattn2.flash_attn_func(*(t.requires_grad_() for t in (q, k, v)), causal=True)
    assert torch.equal(plain, tracked.detach())


@gpu
def test_unsupported_device_message_is_cached(monkeypatch):
    device = torch.cuda.current_device()
    monkeypatch.setattr(_ext, "_supported_devices", set())
    monkeypatch.setattr(_ext, "_unsupported_reason", {device: "this build has code for sm_1"})
    with pytest.raises(RuntimeError, match="flashattn2: this build has code for sm_1"):
        flashattn2.flash_attn_func(*qkv_gpu(device=f"cuda:{device}"))


@gpu
def test_mismatched_devices():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="must be on the same device"):
        flashattn2.flash_attn_func(q, k.to("cuda:1"), v)
    with pytest.raises(ValueError, match="must be on the same device"):
        flashattn2.flash_attn_func(q, k, v.to("cuda:1"))


@gpu
def test_cpu_tensor_next_to_gpu_tensors():
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got v on cpu"):
        flashattn2.flash_attn_func(q, k, v.cpu())


@gpu
def test_alibi_slopes_on_the_cpu_are_named(launches):
    q, k, v = qkv_gpu()
    with pytest.raises(ValueError, match="needs CUDA tensors; got alibi_slopes on cpu"):
        flashattn2.flash_attn_func(q, k, v, alibi_slopes=torch.ones(4))
    assert launches.launches == 0


@gpu
def test_gpu_result_matches_reference_smoke():
    q, k, v = qkv_gpu(headdim=64)
    out = flashattn2.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention_ref(q, k, v, causal=True)
    assert (out.float() - ref.float()).abs().max().item() < 0.05
