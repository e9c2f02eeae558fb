"""The kernels as torch.library operators: torch.compile, CUDA graphs, fake tensors, opcheck.

Eager calls launch the kernels directly; traced code (torch.compile, make_fx, anything under
a dispatch mode such as FakeTensorMode) sees the operators ``flashattn2::fwd`` and
``flashattn2::bwd`` of ``flashattn2/_ops.py`` instead. The CPU tests check the operators'
schemas and fake implementations, and trace with fake CUDA tensors (no GPU needed); the GPU
tests compile forward + loss + backward with ``fullgraph=True`` (any graph break is an
error) and compare with eager, capture forward + backward in a CUDA graph, and run
``torch.library.opcheck`` on both operators.
"""
import pytest
import torch
from flashattn2 import (
    _ext,
    _launch,
    backward,
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    forward,
    forward_with_stats,
)
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

gpu = pytest.mark.gpu

MODS_SCHEMA = (
    "float softcap=0., Tensor? alibi_slopes=None, float dropout_p=0., Tensor? rng_state=None"
)
FWD_SCHEMA = (
    "flashattn2::fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, int window_left, "
    f"int window_right, {MODS_SCHEMA}) -> (Tensor, Tensor)"
)
BWD_SCHEMA = (
    "flashattn2::bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    f"float softmax_scale, int window_left, int window_right, bool deterministic=False, "
    f"{MODS_SCHEMA}) -> (Tensor, Tensor, Tensor)"
)
DROPOUT_MASK_SCHEMA = (
    "flashattn2::dropout_mask(Tensor rng_state, int batch, int nheads, int seqlen_q, "
    "int seqlen_k, float dropout_p) -> Tensor"
)


class NoLaunch:
    """Stands in for ``_launch._C`` where nothing may launch."""

    def __init__(self, module):
        self._module = module

    def fwd(self, *args):
        raise AssertionError("flashattn2 launched a forward kernel while tracing")

    def bwd(self, *args):
        raise AssertionError("flashattn2 launched a backward kernel while tracing")

    def __getattr__(self, name):
        return getattr(self._module, name)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no cached graphs, no recompile limit reached)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_launch(monkeypatch):
    monkeypatch.setattr(_launch, "_C", NoLaunch(_launch._C))


def contiguous_strides(shape):
    return torch.empty(shape, device="meta").stride()


# ---- CPU: schemas, fake implementations, tracing with fake CUDA tensors -----------------------


def test_operator_schemas():
    assert str(torch.ops.flashattn2.fwd.default._schema) == FWD_SCHEMA
    assert str(torch.ops.flashattn2.bwd.default._schema) == BWD_SCHEMA
    assert str(torch.ops.flashattn2.dropout_mask.default._schema) == DROPOUT_MASK_SCHEMA


@pytest.mark.parametrize("headdim", [64, 20])
def test_fake_implementations(headdim):
    # Meta tensors run the fake implementations. q arrives as a (b, h, s, d) transpose: the
    # outputs are contiguous whatever the input strides, like the CUDA implementations'.
    q = torch.empty(2, 4, 33, headdim, device="meta", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.empty(2, 40, 2, headdim, device="meta", dtype=torch.bfloat16)
    v = torch.empty(2, 40, 2, 2 * headdim, device="meta", dtype=torch.bfloat16)[..., :headdim]
    out, lse = torch.ops.flashattn2.fwd(q, k, v, 0.125, -1, 0)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert out.stride() == contiguous_strides(q.shape)
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    assert lse.stride() == contiguous_strides((2, 4, 33))
    grads = torch.ops.flashattn2.bwd(out, q, k, v, out, lse, 0.125, -1, 0)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and g.device == t.device
        assert g.stride() == contiguous_strides(t.shape)


def fake_cuda_qkv(headdim=20, requires_grad=False):
    """Fake CUDA q (2, 33, 4, d), k / v (2, 40, 2, d); call inside a FakeTensorMode."""
    return tuple(
        torch.empty(2, s, h, headdim, device="cuda", dtype=torch.float16,
                    requires_grad=requires_grad)
        for s, h in ((33, 4), (40, 2), (40, 2))
    )  # fmt: skip


def test_fake_cuda_tensors_need_no_gpu(no_launch):
    with FakeTensorMode():
        q, k, v = fake_cuda_qkv()
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == q.shape and out.device == q.device and out.dtype == q.dtype
        assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
        out, lse = forward_with_stats(q, k, v, causal=True)
        assert forward(q, k, v).shape == q.shape
        dq, dk, dv = backward(q, k, v, out, lse, out, causal=True)
        assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
        assert flash_attn_qkvpacked_func(torch.stack([q, q, q], 2)).shape == q.shape
        assert flash_attn_kvpacked_func(q, torch.stack([k, v], 2)).shape == q.shape


def test_make_fx_records_the_operators(no_launch):
    def f(q, k, v):
        out, lse = forward_with_stats(q, k, v, causal=True)
        dq, dk, dv = backward(q, k, v, out, lse, out, causal=True)
        return flash_attn_func(q, k, v, window_size=(8, 0)), dq, dk, dv

    with FakeTensorMode():
        graph = make_fx(f)(*fake_cuda_qkv(headdim=64)).code
    assert graph.count("torch.ops.flashattn2.fwd.default(") == 2
    assert graph.count("torch.ops.flashattn2.bwd.default(") == 1
    assert "0.125, 8, 0)" in graph  # scale 64 ** -0.5 and the window reach the operator


def trace_with_modifiers(dropout_p, autograd):
    """make_fx graph code of flash_attn_func with softcap, ALiBi and ``dropout_p`` on fake CUDA
    tensors, after running it there (with ``autograd``, forward + backward: fake CUDA autograd
    needs a CUDA build of torch)."""

    def f(q, k, v, slopes):
        return flash_attn_func(q, k, v, dropout_p=dropout_p, softcap=5.0, alibi_slopes=slopes,
                               causal=True, return_attn_probs=True)  # fmt: skip

    with FakeTensorMode():
        q, k, v = fake_cuda_qkv(headdim=64)
        slopes = torch.empty(4, device="cuda")
        graph = make_fx(f)(q, k, v, slopes).code
        out, lse, probs = f(q, k, v, slopes)
        if dropout_p:
            assert probs.shape == (2, 4, 33, 40) and probs.dtype == q.dtype
        q, k, v = fake_cuda_qkv(headdim=64, requires_grad=autograd)
        out = flash_attn_func(q, k, v, dropout_p=dropout_p, softcap=5.0, alibi_slopes=slopes)
        if autograd and _ext.BWD_MAX_HEAD_DIM >= 64:
            out.sum().backward()
            assert q.grad.shape == q.shape
    assert graph.count("torch.ops.flashattn2.fwd.default(") == 1
    assert ", 5.0, " in graph  # the softcap reaches the operator
    return graph


def test_make_fx_with_softcap_and_alibi(no_launch):
    graph = trace_with_modifiers(0.0, autograd=False)
    assert "dropout_mask" not in graph and "randint" not in graph


@gpu  # a CPU-only torch cannot draw random numbers for (fake) CUDA tensors
def test_make_fx_with_dropout_records_rng_state_and_mask(no_launch):
    graph = trace_with_modifiers(0.1, autograd=True)
    assert graph.count("torch.ops.flashattn2.dropout_mask.default(") == 1
    assert "randint" in graph


# ---- GPU: torch.compile ----------------------------------------------------------------------


def make_inputs(batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, dtype=torch.bfloat16):
    q = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, headdim, device="cuda", dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, headdim, device="cuda", dtype=dtype)
    dout = torch.randn(batch, seqlen_q, nheads, headdim, device="cuda", dtype=dtype)
    return q, k, v, dout


def leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def assert_same_results(eager, compiled):
    """Outputs bitwise (the forward is deterministic); gradients within the rounding of the
    backward's f32 atomic dQ sums, whose order varies from run to run."""
    (out, *grads), (out_c, *grads_c) = eager, compiled
    assert torch.equal(out, out_c)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g, g_c)


def loss_fn(q, k, v, dout, **kwargs):
    out = flash_attn_func(q, k, v, **kwargs)
    return (out.float() * dout.float()).sum(), out


@gpu
@pytest.mark.parametrize(
    "headdim,kwargs",
    [(64, dict(causal=True)), (40, dict(window_size=(32, 8))), (128, dict(softmax_scale=0.3))],
    ids=["d64-causal", "d40-window", "d128-scale"],
)
def test_compile_fullgraph_forward_backward_matches_eager(headdim, kwargs):
    q, k, v, dout = make_inputs(2, 129, 257, 6, 2, headdim)
    results = []
    for fn in (loss_fn, torch.compile(loss_fn, fullgraph=True)):
        inputs = leaves(q, k, v)
        loss, out = fn(*inputs, dout, **kwargs)
        loss.backward()
        results.append([out] + [t.grad for t in inputs])
    assert_same_results(*results)


@gpu
def test_compiled_graphs_hold_both_operators():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {}

    def recorder(name):
        def compiler(graph_module, example_inputs):
            graphs[name] = graph_module.code
            return make_boxed_func(graph_module.forward)

        return compiler

    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"))
    q, k, v, dout = make_inputs(2, 65, 65, 4, 4, 64)
    loss, _ = torch.compile(loss_fn, fullgraph=True, backend=backend)(*leaves(q, k, v), dout)
    loss.backward()
    assert "flashattn2.fwd" in graphs["forward"] and "flashattn2.bwd" not in graphs["forward"]
    assert "flashattn2.bwd" in graphs["backward"]
    explanation = torch._dynamo.explain(loss_fn)(*leaves(q, k, v), dout)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


@gpu
def test_compile_with_dynamic_shapes():
    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=True)
    for seqlen_q, seqlen_k in ((65, 129), (100, 77)):
        q, k, v, dout = make_inputs(2, seqlen_q, seqlen_k, 4, 2, 64)
        results = []
        for fn in (loss_fn, compiled):
            inputs = leaves(q, k, v)
            loss, out = fn(*inputs, dout, causal=True)
            loss.backward()
            results.append([out] + [t.grad for t in inputs])
        assert_same_results(*results)


@gpu
def test_compile_packed_inputs():
    qkv = torch.randn(2, 129, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(2, 129, 4, 64, device="cuda", dtype=torch.bfloat16)

    def packed_loss(qkv, dout):
        return (flash_attn_qkvpacked_func(qkv, causal=True).float() * dout.float()).sum()

    grads = []
    for fn in (packed_loss, torch.compile(packed_loss, fullgraph=True)):
        (leaf,) = leaves(qkv)
        fn(leaf, dout).backward()
        grads.append(leaf.grad)
    torch.testing.assert_close(*grads)


@gpu
def test_compile_without_grad_and_low_level_functions():
    q, k, v, dout = make_inputs(2, 113, 203, 6, 2, 40, dtype=torch.float16)

    def f(q, k, v, dout):
        out, lse = forward_with_stats(q, k, v, causal=True)
        dq, dk, dv = backward(q, k, v, out, lse, dout, causal=True)
        with torch.no_grad():
            plain = flash_attn_func(q, k, v, window_size=(16, 0))
        return plain, out, lse, dq, dk, dv

    eager = f(q, k, v, dout)
    compiled = torch.compile(f, fullgraph=True)(q, k, v, dout)
    for e, c in zip(eager[:3], compiled[:3]):
        assert torch.equal(e, c)
    for e, c in zip(eager[3:], compiled[3:]):
        torch.testing.assert_close(e, c)


# ---- GPU: CUDA graphs, opcheck, fake tensors with autograd ----------------------------------


@gpu
def test_cuda_graph_capture_of_forward_and_backward():
    q, k, v, dout = make_inputs(2, 257, 383, 8, 2, 128)
    q, k, v = leaves(q, k, v)

    def step():
        out = flash_attn_func(q, k, v, causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, dout):
                t.copy_(torch.randn_like(t))
        graph.replay()
        expected = step()
        torch.cuda.synchronize()
        assert_same_results(expected, static)


@gpu
@pytest.mark.parametrize(
    "headdim,heads", [(64, (4, 4)), (128, (6, 2)), (20, (4, 1))], ids=["d64", "d128-gqa", "d20-mqa"]
)
def test_opcheck(headdim, heads):
    nheads, nheads_k = heads
    q, k, v, dout = make_inputs(2, 77, 130, nheads, nheads_k, headdim)
    args = (q, k, v, headdim**-0.5, -1, 0)
    torch.library.opcheck(torch.ops.flashattn2.fwd.default, args)
    out, lse = torch.ops.flashattn2.fwd(*args)
    expected, expected_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    torch.library.opcheck(torch.ops.flashattn2.bwd.default, (dout, q, k, v, out, lse, *args[3:]))


@gpu
def test_fake_tensor_mode_with_autograd(no_launch):
    if _ext.BWD_MAX_HEAD_DIM < 24:
        pytest.skip("this build has no backward kernel for head dim 20")
    with FakeTensorMode():
        q, k, v = fake_cuda_qkv(requires_grad=True)
        out = flash_attn_func(q, k, v, causal=True)
        out.sum().backward()
        for t in (q, k, v):
            assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
