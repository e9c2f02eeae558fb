"""benchmarks/bench.py without a GPU: its options and the attention its reference impls
compute (so a GPU session does not spend device time on a broken benchmark)."""
import os
import sys

import pytest
import torch
from reference import attention_ref

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import bench  # noqa: E402


def test_grid_flag_sets_issue_21s_grid_and_explicit_options_win():
    a = bench.parse_args(["--grid"])
    assert a.seqlens == [128 << i for i in range(10)] and a.seqlens[-1] == 65536
    assert (a.headdims, a.dtypes, a.causal, a.tokens) == ([16, 32, 64, 128], ["bf16", "fp32"],
                                                          "true", 0)  # fmt: skip
    assert a.modes == ["fwd", "bwd", "fwd_bwd"] and "torch_eager" in a.impls
    assert bench.parse_args(["--grid", "--dtypes", "bf16", "--impls", "flashattn2"]).dtypes == [
        "bf16"]
    default = bench.parse_args([])
    assert default.dtypes == ["bf16", "fp16"] and default.tokens == 16384
    assert default.modes == ["fwd"] and default.impls == ["flashattn2", "sdpa_flash", "sdpa_cudnn"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--impls", "nope"])


def test_timer_option_picks_the_timer():
    assert bench.parse_args([]).timer == "do_bench"
    timer, name = bench.make_timer(1, 1, bench.parse_args(["--timer", "events"]).timer)
    assert "no L2 flush" in name and callable(timer)
    with pytest.raises(SystemExit):
        bench.parse_args(["--timer", "nope"])


def test_fp32_precision_flag_sets_torchs_setting_and_the_meta_records_it():
    """--fp32-precision ieee|tf32 (default: torch's setting left alone) sets float32 matmuls'
    precision for the whole run; the meta records the flag and the effective setting."""
    assert bench.parse_args([]).fp32_precision is None
    assert bench.parse_args(["--fp32-precision", "tf32"]).fp32_precision == "tf32"
    with pytest.raises(SystemExit):
        bench.parse_args(["--fp32-precision", "high"])
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    saved = getattr(matmul, name)
    try:
        bench.set_fp32_precision("tf32")
        assert bench.fp32_tf32() is True
        bench.set_fp32_precision(None)  # (left alone)
        assert bench.fp32_tf32() is True
        meta = bench.build_meta(bench.parse_args(["--fp32-precision", "tf32"]), "cpu", "timer")
        assert (meta["fp32_precision"], meta["fp32_tf32"]) == ("tf32", True)
        bench.set_fp32_precision("ieee")
        assert bench.fp32_tf32() is False
        meta = bench.build_meta(bench.parse_args([]), "cpu", "timer")
        assert (meta["fp32_precision"], meta["fp32_tf32"]) == (None, False)
    finally:
        setattr(matmul, name, saved)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_eager_and_sdpa_rows_compute_attention(causal, heads):
    nheads, nheads_k = heads
    q = torch.randn(2, 9, nheads, 16)
    k, v = torch.randn(2, 2, 9, nheads_k, 16)
    expected, _ = attention_ref(q, k, v, causal=causal)
    torch.testing.assert_close(bench.eager_attention(q, k, v, causal), expected)
    _, fn = bench.make_call("torch_eager", q, k, v, causal)
    torch.testing.assert_close(fn(), expected)
    if nheads == nheads_k:  # (SDPA's enable_gqa needs torch >= 2.5; CI also runs 2.4)
        ctx, fn = bench.make_call("sdpa_math", q, k, v, causal)
        with ctx:
            torch.testing.assert_close(fn(), expected, atol=1e-5, rtol=1e-5)


def test_bias_rows_fold_the_causal_mask_into_the_others_bias():
    q, k, v = torch.randn(3, 1, 7, 2, 16)
    full = torch.randn(1, 2, 7, 7)
    others = full.masked_fill(bench.causal_hidden(7, 7, full.device), float("-inf"))
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.25 + others
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v)
    for impl in ("torch_eager", "sdpa_math"):
        ctx, fn = bench.make_call(impl, q, k, v, True, "bias", (full, others))
        with ctx:
            torch.testing.assert_close(fn(), expected, atol=1e-5, rtol=1e-5)
    assert bench.variants(bench.parse_args(["--bias"])) == ["plain", "bias"]


def test_bias_grad_rows_differentiate_each_impls_own_bias_leaf():
    """--bias-grad: the backward's inputs add the impl's bias (flashattn2's, or the others'
    with the causal mask folded in), whose gradient is that of softmax(scores + bias)."""
    assert bench.variants(bench.parse_args(["--bias", "--bias-grad"])) == [
        "plain", "bias", "bias_grad"]
    q, k, v = (t.requires_grad_() for t in torch.randn(3, 1, 7, 2, 16))
    full = torch.randn(1, 2, 7, 7)
    others = full.masked_fill(bench.causal_hidden(7, 7, full.device), float("-inf"))
    leaves = (full.requires_grad_(), others.requires_grad_())
    assert bench.grad_inputs("flashattn2", q, k, v, "bias_grad", leaves)[3] is full
    assert bench.grad_inputs("sdpa_math", q, k, v, "bias", leaves) == (q, k, v)
    dout = torch.randn(1, 7, 2, 16)
    ref = others.detach().clone().requires_grad_()
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * 0.25 + ref
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, -1), v)
    (expected_grad,) = torch.autograd.grad(expected, ref, dout)
    for impl in ("torch_eager", "sdpa_math"):
        ctx, fn = bench.make_call(impl, q, k, v, True, "bias_grad", leaves)
        inputs = bench.grad_inputs(impl, q, k, v, "bias_grad", leaves)
        with ctx:
            grads = torch.autograd.grad(fn(), inputs, dout)
        torch.testing.assert_close(grads[3], expected_grad, atol=1e-5, rtol=1e-5)


def test_bias_summary_reports_the_ratio_to_the_efficient_backend(capsys):
    def row(impl, tflops, variant, mode="bwd", seqlen=1024):
        return dict(gpu="g", impl=impl, mode=mode, dtype="bf16", headdim=64, causal=False,
                    seqlen_q=seqlen, deterministic=False, variant=variant, tflops=tflops)

    rows = [row("flashattn2", 300.0, "bias_grad"), row("sdpa_efficient", 100.0, "bias_grad"),
            row("flashattn2", 120.0, "bias_grad", seqlen=4096),
            row("sdpa_efficient", 100.0, "bias_grad", seqlen=4096),
            row("flashattn2", 200.0, "bias", "fwd"), row("sdpa_cudnn", 150.0, "bias", "fwd"),
            row("flashattn2", 250.0, "plain")]
    bench.print_bias_summary(rows)
    out = capsys.readouterr().out
    assert "bias_grad bwd     d64   min 1.20x geomean 1.90x (2 cfgs) MISSED" in out
    assert "bias      fwd     d64   n/a" in out and "plain" not in out


def test_decode_summary_reports_issue_20s_targets(capsys):
    import bench_decode as bd

    def row(**kw):
        r = dict.fromkeys(bd.COLUMNS)
        r.update(gpu="g", nheads=32, nheads_k=8, headdim=128, causal=False, **kw)
        return r

    rows = []
    for sq in (1, 4):
        rows.append(row(bench="decode", impl="flashattn2", layout="contiguous", num_splits=0,
                        batch=1, seqlen_q=sq, seqlen_k=8192, us=20.0 + sq))
        rows.append(row(bench="decode", impl="sdpa_cudnn", layout="contiguous", batch=1,
                        seqlen_q=sq, seqlen_k=8192, us=22.0))
    rows.append(row(bench="decode", impl="read_floor", layout="contiguous", batch=1, seqlen_q=0,
                    seqlen_k=8192, us=17.0))
    rows += [row(bench="host", impl=impl, layout="contiguous", batch=1, seqlen_q=1,
                 seqlen_k=1024, us=us) for impl, us in (("flashattn2", 9.0), ("sdpa_flash", 8.0))]
    assert "host time" in bd.line(rows[-1])
    bd.print_summary(rows, {"timer": "t", "skipped": []})
    out = capsys.readouterr().out
    assert "worst 0.92x (b1 sq4 8k), best 1.05x" in out  # 22 / 24, 22 / 21
    assert "sq1 21.0 us = 1.24x" in out and "1.2x the read floor" in out
    assert "sq4 within 10% of sq1: worst +14.3% (b1 sq4 8k), 1 cfgs -> MISSED" in out
    assert "flashattn2 9.0 us, sdpa_flash 8.0 us -> MISSED" in out
    assert bd.parse_args([]).parts == ["decode", "varlen", "host"]
    assert bd.parse_args([]).dtype == "bf16" and bd.parse_args(["--dtype", "fp16"]).dtype == "fp16"


def test_decode_ab_of_the_decode_kernel(capsys):
    """flashattn2_oldkv (the decode kernel switched off) is an impl of its own, not a
    baseline: the summary reports its time over flashattn2's per config."""
    import bench_decode as bd
    assert "flashattn2_oldkv" not in bd.parse_args([]).impls
    assert bd.parse_args(["--impls", "flashattn2,flashattn2_oldkv"]).impls[1] == "flashattn2_oldkv"

    def row(impl, us, sq):
        r = dict.fromkeys(bd.COLUMNS)
        r.update(gpu="g", bench="decode", impl=impl, layout="contiguous", num_splits=0, batch=1,
                 seqlen_q=sq, seqlen_k=8192, nheads=32, nheads_k=8, headdim=128, causal=False,
                 us=us)
        return r

    rows = [row("flashattn2", 16.0, 1), row("flashattn2_oldkv", 24.0, 1),
            row("flashattn2", 20.0, 4), row("flashattn2_oldkv", 25.0, 4)]
    bd.print_summary(rows, {"timer": "t", "skipped": []})
    out = capsys.readouterr().out
    assert "decode kernel vs KV kernel" in out and "worst 1.25x (b1 sq4 8k), best 1.50x" in out
    assert "flashattn2_oldkv" not in bd.parse_args([]).impls
    impls = ["flashattn2", "flashattn2_oldkv"]
    assert bd.parse_args(["--impls", ",".join(impls)]).impls == impls
    bhsd = dict(row("flashattn2", 12.0, 1), layout="bhsd")
    assert bd.parse_args(["--bhsd"]).bhsd and not bd.parse_args([]).bhsd
    bd.print_summary(rows[:1] + [bhsd], {"timer": "t", "skipped": []})
    assert "bhsd cache vs bshd (contiguous time / bhsd time): min 1.33x" in capsys.readouterr().out


def test_ab_compare_takes_each_specs_best_round_and_the_geomean(tmp_path, capsys):
    """scripts/ab_compare.py (gpu_job.sh's envab summary) on made-up rounds: a spec's best
    round against the baseline's, cuDNN's best over every run."""
    import json

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import ab_compare

    def row(impl, seqlen, tflops):
        return dict(impl=impl, mode="fwd", dtype="bf16", headdim=128, causal=True,
                    seqlen_q=seqlen, variant="plain", tflops=tflops)

    speeds = {("base", 1): (100, 200), ("base", 2): (110, 190), ("new", 1): (121, 180),
              ("new", 2): (99, 209)}
    for (spec, rnd), (a, b) in speeds.items():
        folder = tmp_path / f"envab1_{spec}_{rnd}"
        folder.mkdir()
        rows = [row("flashattn2", 512, a), row("flashattn2", 1024, b),
                row("sdpa_cudnn", 512, 100 + rnd), row("sdpa_cudnn", 1024, 200)]
        (folder / "results.json").write_text(json.dumps({"rows": rows}))
    ab_compare.main([str(tmp_path), "--specs", "base,new"])
    out = capsys.readouterr().out
    assert "(1.100)" in out and "(1.045)" in out  # 121 / 110 and 209 / 200
    assert "/cudnn 1.19" in out  # 121 / 102
    assert f"bf16 128 True: new {(1.1 * 1.045) ** 0.5:.4f}" in out


def test_tile_overhead_recovers_a_made_up_fixed_cost(tmp_path, capsys):
    """scripts/tile_overhead.py on rows made from P n / (n + x) (P 600, x 1.25 key blocks),
    with a slower second round and causal / other head dim rows it must ignore."""
    import json

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import tile_overhead

    def row(seqlen, tflops, causal=False, headdim=128):
        return dict(impl="flashattn2", mode="fwd", dtype="bf16", headdim=headdim, causal=causal,
                    seqlen_q=seqlen, seqlen_k=seqlen, variant="plain", tflops=tflops)

    lens = [512, 1024, 2048, 4096, 8192]
    rows = [row(s, 600 * (s / 128) / (s / 128 + 1.25)) for s in lens]
    rows += [row(s, 100.0) for s in lens] + [row(1024, 999.0, causal=True), row(512, 1.0, headdim=64)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rows": rows}))
    tile_overhead.main([str(path)])
    out = capsys.readouterr().out
    assert "flashattn2 bf16 d128 fwd: P 600.0 TFLOP/s, fixed cost per tile 1.25 key blocks" in out
    tile_overhead.main([str(path), "--mode", "bwd"])  # (no bwd rows: nothing to fit)
    assert "P " not in capsys.readouterr().out


def test_plot_only_takes_each_impls_best_round():
    """A merged file with two rounds: one row per (config, impl), the faster."""
    def row(impl, tflops, run):
        return dict(impl=impl, mode="fwd", dtype="bf16", headdim=64, causal=False,
                    seqlen_q=512, deterministic=False, variant="plain", tflops=tflops, run=run)

    rows = [row("flashattn2", 300, "a"), row("flashattn2", 310, "b"),
            row("sdpa_cudnn", 320, "a"), row("sdpa_cudnn", 305, "b")]
    best = {r["impl"]: r["tflops"] for r in bench.best_rows(rows)}
    assert best == {"flashattn2": 310, "sdpa_cudnn": 320} and len(bench.best_rows(rows)) == 2


def test_latency_plot_has_a_panel_per_head_dim_dtype_and_mode(tmp_path):
    """latency.png (issue 21's grid view): one panel per head dim x (dtype, mode, causal)."""
    pytest.importorskip("matplotlib")

    def row(impl, dtype, mode, d, s, ms):
        return dict(gpu="g", impl=impl, mode=mode, dtype=dtype, headdim=d, causal=True,
                    seqlen_q=s, deterministic=False, variant="plain", ms=ms, tflops=None)

    rows = [row(impl, dtype, mode, d, s, 0.01 * s / 128 * (2 if impl == "torch_eager" else 1))
            for impl in ("flashattn2", "torch_eager") for dtype in ("bf16", "fp32")
            for mode in ("fwd", "bwd") for d in (16, 64) for s in (128, 256, 512)]
    path = bench.plot_latency(rows, str(tmp_path / "latency.png"))
    assert path and (tmp_path / "latency.png").stat().st_size > 0
    import matplotlib.image
    height, width = matplotlib.image.imread(path).shape[:2]
    assert width > height  # 2 rows of head dims, 4 columns of (dtype, mode)
    assert bench.plot_latency([], str(tmp_path / "none.png")) is None


def test_bench_power_reads_nvidia_smi_lines_and_takes_the_steady_half():
    """benchmarks/bench_power.py without a GPU: its nvidia-smi parsing and its steady-state
    summary (the last half of a run: throughput from the chunks, median clock / power from the
    samples, pJ per FLOP = W / (TFLOP/s))."""
    import datetime

    import bench_power as bp
    s = bp.parse_smi_line("2026/11/27 07:21:57.766, 1980 MHz, 134.56 W, 48, 0x0000000000000004")
    assert s["clock"] == 1980 and s["power"] == 134.56 and s["temp"] == 48
    assert s["reasons"] == "0x0000000000000004" and s["time"].microsecond == 766000
    assert bp.parse_smi_line("timestamp, clocks.current.sm [MHz], power.draw [W]") is None
    assert bp.parse_smi_line("2026/11/27 07:21:57.766, [N/A], 1 W, 48, 0x0") is None
    t0 = datetime.datetime(2026, 11, 27, 7, 0, 0)
    at = lambda sec: t0 + datetime.timedelta(seconds=sec)  # noqa: E731
    # 10 chunks of 1 s: 100 TFLOP each in the first half, 50 in the second (the GPU warmed).
    chunks = [(at(i + 1), 1.0, (100 if i < 5 else 50) * 1e12) for i in range(10)]
    samples = [dict(time=at(i + 0.5), clock=1980 if i < 5 else 1600 + i, power=700.0,
                    temp=60 + i, reasons="0x4") for i in range(10)]
    st = bp.steady(chunks, samples, t0, at(10))
    assert st["tflops"] == pytest.approx(50.0)
    assert st["clock_mhz"] == 1607 and st["power_w"] == 700 and st["temp_max"] == 69
    assert st["pj_per_flop"] == pytest.approx(14.0) and st["reasons"] == ["0x4"]
    assert bp.steady([], [], t0, at(1))["tflops"] is None
    a = bp.parse_args([])
    assert (a.modes, a.impls, a.seqlens) == (["bwd"], ["flashattn2", "sdpa_cudnn"], [8192])
    for bad in (["--modes", "fwdd"], ["--seconds", "0"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            bp.parse_args(bad)


def test_decode_block_table_orders():
    """--page-order: sequential reads the contiguous cache's own pages in order, shuffled a
    seeded permutation of all of them (each page once)."""
    import torch

    import bench_decode as bd
    seq = bd.block_table(2, 64, 16, "sequential", torch.Generator().manual_seed(0))
    assert seq.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuf = bd.block_table(2, 64, 16, "shuffled", torch.Generator().manual_seed(0))
    assert shuf.shape == (2, 4) and sorted(shuf.flatten().tolist()) == list(range(8))
    assert shuf.tolist() != seq.tolist()
    assert bd.parse_args(["--page-order", "sequential"]).page_order == "sequential"
    assert bd.parse_args([]).page_order == "shuffled"


def test_sass_load_use_finds_a_load_read_right_away():
    """scripts/sass_load_use.py on a made-up listing: the entry clamped at once is "near"; the
    one read only after the loop's back edge is counted through the branch; an overwritten one
    has no reader."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))
    import sass_load_use as slu
    listing = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E R4, desc[UR8][R2.64] ;
        /*0020*/                   VIMNMX R5, RZ, R4, !PT ;
        /*0030*/                   LDG.E R6, desc[UR8][R2.64+0x4] ;
        /*0040*/                   IADD3 R7, R8, 0x1, RZ ;
        /*0050*/                   LDG.E R9, desc[UR8][R2.64+0x8] ;
        /*0060*/                   MOV R9, RZ ;
        /*0070*/                   BRA 0x40 ;
        /*0080*/                   IMAD R10, R6, 0x2, RZ ;
    """
    (name, code), = slu.functions(listing).items()
    rows = {hex(a): (dist, near) for a, _, dist, _, near in slu.report(code, near=2)}
    assert name == "k"
    assert rows["0x10"] == (1, True)
    assert rows["0x30"] == (9, False)  # R6: read at 0x80, after one more pass of the loop
    assert rows["0x50"] == (None, False)  # overwritten by MOV R9 before any read
