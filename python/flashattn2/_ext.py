"""Loads the compiled module ``flashattn2._C`` and caches what the per-call path asks of it.

``_C`` takes no torch types: device pointers, sizes and strides are plain ints. Everything
torch-specific (the current stream, device properties) is looked up here.
"""
import contextlib
import importlib
import os

import torch

try:
    _C = importlib.import_module(__package__ + "._C")
except ImportError as exc:
    if isinstance(exc, ModuleNotFoundError) and exc.name == __package__ + "._C":
        raise ImportError(
            "flashattn2._C is not built; install with pip install . "
            "(importing flashattn2 from a source tree that was never built gives this too)"
        ) from exc
    raise ImportError(
        f"flashattn2._C is installed but failed to load ({exc}); reinstall with pip install ."
    ) from exc

__version__ = _C.__version__


def _env_flag(name, default):
    """A switch read at import: the environment variable ``name`` (``default`` if unset); ""
    and "0" are off."""
    return os.environ.get(name, default) not in ("", "0")


# Builds whose FLASHATTN2_HEAD_DIMS has 16 (not the default) run head dims 1-16 on the d16
# mma.sync kernels; FLASHATTN2_NATIVE_D16=0 at import, or the native_d16(False) context
# manager, sends them to the next larger kernel (d32, zero-filled columns) as builds without
# it do: an A/B switch (process-wide, _C.set_native_d16). Without the kernel it does nothing.
NATIVE_D16 = _env_flag("FLASHATTN2_NATIVE_D16", "1")
_C.set_native_d16(NATIVE_D16)


def _kernel_head_dims():
    return tuple(_C.kernel_head_dim(d) if d else -1 for d in range(257))


# KERNEL_HEAD_DIM[d]: the compiled kernel head dim that runs head dim d (0 < d <= 256), or -1.
KERNEL_HEAD_DIM = _kernel_head_dims()
# Largest head dim the backward supports in this build (0 if none).
BWD_MAX_HEAD_DIM = _C.bwd_max_head_dim()
_BUILD = dict(_C.build_info())  # (read once, at import)
# FLASHATTN2_EXPERIMENTAL features built in ("bias"), read once: the per-call checks (traced
# by torch.compile, which cannot call into _C) only look at this set.
EXPERIMENTAL = frozenset(_BUILD.get("experimental", ()))
# Kernel head dims of the float32 kernels (FLASHATTN2_EXPERIMENTAL=fp32 builds; () without).
FP32_HEAD_DIMS = tuple(_BUILD.get("fp32_head_dims", ()))
# Whether the float32 backward is built (build_info "fp32_bwd").
FP32_BWD = bool(_BUILD.get("fp32_bwd", False))

# On Hopper (sm_90) GPUs the forward and backward run the wgmma / TMA kernels of cpp/sm90 for
# what they support; True sends every call to the mma.sync kernels of cpp/sm80 instead (set by
# FLASHATTN2_FORCE_SM80=1 at import, or by the force_sm80() context manager).
FORCE_SM80 = _env_flag("FLASHATTN2_FORCE_SM80", "0")
# How the Hopper forward walks causal / windowed / varlen tiles: "counter" (persistent CTAs
# take them from a tile counter, sm90/fwd_config.h) or "blocks" (one CTA per tile); for A/B.
SM90_TILE_WALK = os.environ.get("FLASHATTN2_SM90_TILE_WALK", "counter") or "counter"
if SM90_TILE_WALK not in ("counter", "blocks"):
    raise ValueError("FLASHATTN2_SM90_TILE_WALK must be counter or blocks, got "
                     f"{SM90_TILE_WALK!r}")
# The Hopper forward at d192 / d256 (one Q buffer) stages each warpgroup's O in the K or V
# buffer of the tile's last stage instead of the Q buffer, which is then free after the
# tile's last S (the next tile's Q loads under the last P V and the epilogue): always for
# dense full attention (measured faster); FLASHATTN2_SM90_STAGE_O=1 at import, or the
# sm90_stage_o() context manager, for causal / windowed / varlen tiles too (measured
# 0.96-1.02x with the tile counter's earlier claim at each tile's start: an A/B switch, off
# by default). Plain attention only (softcap, ALiBi and a bias keep theirs).
SM90_STAGE_O = _env_flag("FLASHATTN2_SM90_STAGE_O", "0")
# The Hopper forward, plain attention: a warpgroup that sees only the first 32 or 64 keys of
# its first key block (the causal diagonal: warpgroup 0 of every d128 tile, half the d64
# warpgroups, 4 of 5 at d256; right windows, key tails) runs that step on those keys (fewer
# S and P V MMAs, the softmax over their columns). On by default for causal, windowed and
# varlen tiles at kernel head dims other than 128 (H100, causal s512-2k: d64 +3-5 %, d256
# +2-4 %, d128 -2 % at 2k, so d128 keeps the plain instance; dense full attention keeps its
# instances; cpp/sm90/fwd_launch.cuh). FLASHATTN2_SM90_NARROW_STEP=0 at import, or the
# sm90_narrow_step() context manager, turns it off (for A/B comparisons).
SM90_NARROW_STEP = _env_flag("FLASHATTN2_SM90_NARROW_STEP", "1")
# The Hopper forward of plain dense full attention (no causal / window / varlen / softcap /
# ALiBi / bias, one split) at kernel head dim 256 (head dims 193-256) from 2048 keys takes FA3's
# step order there: the two consumer warpgroups issue their MMAs without the ping-pong turn, and
# a step rescales O right after issuing its S, before its P V (cpp/sm90/fwd_config.h
# sm90_fwd_fa3_order; H100 bf16, time vs the old order: 2k 1.00x, 8k 0.95x, 16k 0.94x; 512
# keys 1.02x, so shorter keys keep the old order). FLASHATTN2_SM90_FA3_ORDER=0 at import, or
# the sm90_fa3_order(False) context manager, never takes it (for A/B comparisons).
SM90_FA3_ORDER = _env_flag("FLASHATTN2_SM90_FA3_ORDER", "1")
# The Hopper forward of dense attention without a window, in one split, whose tiles overrun
# the SMs by part of a wave: the last waves' key blocks are shared out evenly between the
# persistent CTAs (stream-K; a tile split between two CTAs is merged through a float32
# workspace: cpp/sm90/fwd_config.h sm90_fwd_stream_k). FLASHATTN2_SM90_STREAM_K=0 at import,
# or the sm90_stream_k(False) context manager, keeps the static walk (for A/B comparisons).
SM90_STREAM_K = _env_flag("FLASHATTN2_SM90_STREAM_K", "1")
# The generation of the kernel the last forward launch ran: 90 or 80 (None before any).
last_fwd_arch = None
# Which forward kernel the last launch ran: "sm90" (cpp/sm90), "sm80" (the mma.sync kernels)
# or "decode" (cpp/sm80/decode_kernel.cuh, whose generation is 80); None before any.
last_fwd_kernel = None
# _C.fwd's return code -> (last_fwd_arch, last_fwd_kernel); 81 is flash_api.h kFwdKernelDecode,
# 91 kFwdKernelFp32Wg (the Hopper float32 forward, "fp32wg", 3xTF32), 93 kFwdKernelFp32WgTf32
# (its single-TF32 instance, "fp32wg_tf32": when fp32_tf32() holds, below).
FWD_KERNELS = {90: (90, "sm90"), 80: (80, "sm80"), 81: (80, "decode"), 91: (90, "fp32wg"),
               93: (90, "fp32wg_tf32")}
# Builds with FLASHATTN2_EXPERIMENTAL=decode run forwards of at most 16 packed query rows
# (decoding) on the decode kernel where it supports them (cpp/sm80/decode_config.h);
# FLASHATTN2_DECODE_KERNEL=0 at import, or the decode_kernel(False) context manager, sends
# them to the KV kernel as before (for A/B comparisons). Without the build item it does
# nothing.
DECODE_KERNEL = _env_flag("FLASHATTN2_DECODE_KERNEL", "1")
# Builds with fp32wg in FLASHATTN2_EXPERIMENTAL (the default) run the float32
# forwards it supports on sm_90 GPUs (dense, full or causal, kernel head dims 64 / 128) on the
# tf32 wgmma kernel (cpp/fp32/wg_kernel.cuh; last_fwd_kernel "fp32wg"); FLASHATTN2_FP32WG=0
# at import, the fp32wg(False) context manager or force_sm80() keep them on the mma.sync
# float32 kernels (for A/B comparisons). Without the build item it does nothing.
FP32WG = _env_flag("FLASHATTN2_FP32WG", "1")
# Builds with FLASHATTN2_EXPERIMENTAL=fp32wg: True runs the float32 backwards it supports on
# sm_90 GPUs (dense, full or causal, kernel head dim 64, MHA / GQA, not deterministic) on the
# Hopper float32 backward (cpp/fp32/wg_bwd_kernel.cuh; last_bwd_kernel "fp32wg"; the default:
# measured 1.8-2.0x the mma.sync backward, 1.75-2.19x SDPA-efficient, H100, tenth session);
# False keeps every float32 backward on the mma.sync kernels. FLASHATTN2_FP32WG_BWD=0 at
# import, or the fp32wg_bwd() context manager (A/B comparisons); FLASHATTN2_FP32WG=0 /
# fp32wg(False) and force_sm80() turn it off as well.
FP32WG_BWD = _env_flag("FLASHATTN2_FP32WG_BWD", "1")
# The same for float32 backwards at kernel head dim 128 (head dims 65-128): True runs those
# it supports (as FP32WG_BWD's) on the d128 Hopper float32 backward
# (cpp/fp32/wg_bwd128_kernel.cuh; last_bwd_kernel "fp32wg128"; the default: on an H100
# 1.56-1.81x the mma.sync float32 backward); False on the mma.sync kernels.
# FLASHATTN2_FP32WG_BWD128=0 at import, or the fp32wg_bwd128(False) context manager (A/B
# comparisons); FP32WG / force_sm80() turn it off as well.
FP32WG_BWD128 = _env_flag("FLASHATTN2_FP32WG_BWD128", "1")
# torch >= 2.9's TF32 setting (torch.backends.cuda.matmul's __getattr__ raises AttributeError
# for a name it does not know, so hasattr reads nothing else).
_HAS_FP32_PRECISION = hasattr(torch.backends.cuda.matmul, "fp32_precision")


# float32 attention runs 3xTF32 (x = hi + lo, three tf32 products per multiply: float32-accurate)
# unless PyTorch's own setting lets float32 matmuls run in TF32 (fp32_tf32(), read at each
# call as PyTorch reads it for its matmuls): then the Hopper float32 kernels above (FP32WG,
# FP32WG_BWD, FP32WG_BWD128: kernel head dims 64 / 128, dense full / causal, sm_90) run one
# tf32 product per multiply (inputs rounded to tf32, float32 accumulation), as cuBLAS runs
# PyTorch's float32 matmuls under that setting: last_fwd_kernel "fp32wg_tf32", last_bwd_kernel
# "fp32wg_tf32" / "fp32wg128_tf32" (issue 21). Every other float32 call stays 3xTF32 (the
# mma.sync float32 kernels take no single-TF32 mode).
def fp32_tf32():
    """Whether PyTorch's current setting allows TF32 for float32 matmuls on CUDA:
    ``torch.backends.cuda.matmul.fp32_precision == "tf32"`` (torch >= 2.9; its "none" defers
    to ``torch.backends.fp32_precision``, and where that is "none" or absent, TF32 is off),
    else ``torch.backends.cuda.matmul.allow_tf32``. ``torch.set_float32_matmul_precision``
    ("high" / "medium" on, "highest" off) sets either. Reads only, no warning: the older
    ``allow_tf32`` (deprecated from torch 2.9) is read only where ``fp32_precision`` does not
    exist."""
    matmul = torch.backends.cuda.matmul
    if not _HAS_FP32_PRECISION:
        return bool(matmul.allow_tf32)
    precision = matmul.fp32_precision
    if precision == "none":
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


# True (the default) lets the backward run the Hopper backward (cpp/sm90/bwd_kernel.cuh) on
# sm_90 GPUs for what it supports (d 97-128, and 33-64 where built; dense or varlen, any
# window, softcap / ALiBi, MHA / GQA, fp16 / bf16, deterministic mode, a bias without its
# gradient, with it under SM90_DBIAS; not dropout: the mma.sync backward).
# FLASHATTN2_SM90_BWD=0 at import turns it off;
# force_sm80() / FLASHATTN2_FORCE_SM80 turn off both Hopper kernels.
SM90_BWD = _env_flag("FLASHATTN2_SM90_BWD", "1")
# Where the build has the Hopper backward of kernel head dim 64 (build_info
# "sm90_bwd_head_dims"), True (the default) runs head dims 33-64 on it; False sends them to the
# mma.sync backward, the rest unchanged (for A/B comparisons). FLASHATTN2_SM90_BWD_D64=0 at
# import, or the sm90_bwd_d64(False) context manager.
SM90_BWD_D64 = _env_flag("FLASHATTN2_SM90_BWD_D64", "1")
# True (the default): the bias gradient goes straight into the gradient in the bias's dtype,
# or by float32 atomics into a buffer without the broadcast batch / head dims
# (bias.dbias_target); FLASHATTN2_DBIAS_DIRECT=0 at import keeps the float32
# (b, h, sq, sk) buffer and torch's sum and cast for every bias (for A/B comparisons).
DBIAS_DIRECT = _env_flag("FLASHATTN2_DBIAS_DIRECT", "1")
# True (the default): the mma.sync backward copies each step's tile of a bias with 16-byte
# aligned rows (unit key stride) into shared memory by cp.async, where the GPU's blocks have
# room (cpp/sm80/bwd_launch.cuh); FLASHATTN2_BWD_BIAS_STAGED=0 at import keeps one global
# load per score (for A/B comparisons).
BWD_BIAS_STAGED = _env_flag("FLASHATTN2_BWD_BIAS_STAGED", "1")
# True (the default): a bias's gradient (dbias) may run the Hopper backward
# (cpp/sm90/bwd_kernel.cuh kDbias: d 33-64 / 97-128 where built, the bias's rows 16-byte
# aligned, no softcap, dbias in q's dtype or float32; else the mma.sync one; measured 1.35-1.48x
# the mma.sync dbias on an H100). FLASHATTN2_SM90_DBIAS=0 at import, or the sm90_dbias(False)
# context manager, keeps every dbias on the mma.sync backward (for A/B comparisons);
# last_bwd_arch says which one ran.
SM90_DBIAS = _env_flag("FLASHATTN2_SM90_DBIAS", "1")
# Builds whose FLASHATTN2_SM90_BWD_EXPERIMENTAL has dq_warp (build_info
# "sm90_bwd_experimental"): True (the default) runs Hopper backwards without softcap / ALiBi /
# a bias on its kernel instances (a producer warp issues the dQ reduces and, deterministic,
# waits for the dQ turns); FLASHATTN2_SM90_DQ_WARP=0 at import, or the sm90_dq_warp(False)
# context manager, keeps them on the consumer warps (for A/B comparisons; deterministic: the
# same dq bits). The d256 Hopper backward always adds its dQ from its producer warp where
# built (it has no other instance then; the switch does not apply there).
# Without the build item it does nothing.
SM90_DQ_WARP = _env_flag("FLASHATTN2_SM90_DQ_WARP", "1")
# True (the default): the Hopper backward launches its main kernel and its dQ convert as
# programmatic dependents of the kernel before each (PDL, sm_90), so that each one's launch and
# prologue (K / V / Q / dO loads) overlap the previous kernel's tail; FLASHATTN2_BWD_PDL=0 at
# import, or the bwd_pdl(False) context manager, launches them one after the other (for A/B
# comparisons; the same results, bit for bit in deterministic mode).
BWD_PDL = _env_flag("FLASHATTN2_BWD_PDL", "1")
# False (the default): backwards convert the float32 dQ accumulator with the kernel that loads,
# transposes and stores it a 16-byte slot at a time; FLASHATTN2_BWD_CONVERT_LEAN=1 at import, or
# the bwd_convert_lean() context manager, runs the one that has all of a tile's loads in flight
# at once (cpp/sm80/bwd_kernel.cuh bwd_convert_dq_lean_kernel; the same dq bits; for A/B).
BWD_CONVERT_LEAN = _env_flag("FLASHATTN2_BWD_CONVERT_LEAN", "0")
# True (the default): the first visitor of each query tile stores its dQ into the float32
# accumulator instead of adding (a per-tile ticket; deterministic: the first in the order),
# so the preprocess does not zero it, where it applies: dense Hopper backwards of d64 / d128
# without softcap / ALiBi / a bias in dq_warp builds (cpp/sm90/bwd_producer.cuh
# dq_order_warp; with the lean convert). H100, bf16: d128 s512-1k +2-14 %, d128 geomean
# 0.958 -> 0.997x cuDNN, d64 4k-16k -1 %. FLASHATTN2_BWD_DQ_FIRST_STORE=0 at import, or the
# bwd_dq_first_store() context manager: the preprocess zeroes it (for A/B comparisons).
BWD_DQ_FIRST_STORE = _env_flag("FLASHATTN2_BWD_DQ_FIRST_STORE", "1")
# The generation of the kernel the last backward launch ran: 90 or 80 (None before any).
last_bwd_arch = None
# Which backward kernel the last launch ran: "sm90", "sm80", "fp32wg" (the Hopper float32
# backward, whose generation is 90), "fp32wg128" (its d128 one), or "fp32wg_tf32" /
# "fp32wg128_tf32" (their single-TF32 instances: when fp32_tf32() holds); None before any.
last_bwd_kernel = None
# _C.bwd's return code -> (last_bwd_arch, last_bwd_kernel); 91 / 92 are flash_api.h
# kBwdKernelFp32Wg / kBwdKernelFp32Wg128 (3xTF32), 93 / 94 kBwdKernelFp32WgTf32 /
# kBwdKernelFp32Wg128Tf32 (single TF32).
BWD_KERNELS = {90: (90, "sm90"), 80: (80, "sm80"), 91: (90, "fp32wg"), 92: (90, "fp32wg128"),
               93: (90, "fp32wg_tf32"), 94: (90, "fp32wg128_tf32")}
# The dQ accumulator chains of deterministic backwards (BwdParams::dq_chains,
# cpp/common/dq_order.cuh): None (the default) takes _C.bwd_dq_chains's choice; 1, 2 or 4
# force that many, for A/B comparisons and tests (FLASHATTN2_DQ_CHAINS=1|2|4 at import, or
# the dq_chains() context manager). Backwards without deterministic=True keep one.
_DQ_CHAINS_ENV = os.environ.get("FLASHATTN2_DQ_CHAINS", "auto") or "auto"
if _DQ_CHAINS_ENV not in ("auto", "1", "2", "4"):
    raise ValueError(f"FLASHATTN2_DQ_CHAINS must be auto, 1, 2 or 4, got {_DQ_CHAINS_ENV!r}")
DQ_CHAINS = None if _DQ_CHAINS_ENV == "auto" else int(_DQ_CHAINS_ENV)


def _switch(flag, doc):
    """A context manager setting the module switch ``flag`` (one of the flags above) inside its
    block (``enabled``, default True) and restoring it after: for A/B comparisons and tests;
    not thread-safe. A CUDA graph keeps the choice of its capture."""

    @contextlib.contextmanager
    def switch(enabled=True):
        previous = globals()[flag]
        globals()[flag] = bool(enabled)
        try:
            yield
        finally:
            globals()[flag] = previous

    switch.__doc__ = doc
    return switch


force_sm80 = _switch("FORCE_SM80", "Inside the block, forwards and backwards run the mma.sync "
                     "(sm80) kernels even on Hopper GPUs (enabled=False: the default choice).")
decode_kernel = _switch("DECODE_KERNEL", "Inside the block, forwards may run the decode kernel "
                        "(enabled, the default where built) or never do (the KV kernel).")
sm90_bwd_d64 = _switch("SM90_BWD_D64", "Inside the block, backwards of head dims 33-64 may run "
                       "the Hopper backward (enabled, the default where built) or never do.")
dbias_direct = _switch("DBIAS_DIRECT", "Inside the block, the bias gradient goes straight "
                       "into its target (enabled, the default) or through the float32 "
                       "(b, h, sq, sk) buffer and torch's sum.")
sm90_dq_warp = _switch("SM90_DQ_WARP", "Inside the block, Hopper backwards may run the "
                       "dq_warp instances where built (enabled, the default) or never do.")
bwd_pdl = _switch("BWD_PDL", "Inside the block, Hopper backwards chain their kernels by "
                  "programmatic dependent launch (enabled, the default) or launch them plainly.")
bwd_convert_lean = _switch("BWD_CONVERT_LEAN", "Inside the block, backwards convert dQ with "
                           "the kernel that keeps all of a tile's loads in flight (enabled) "
                           "or the default one.")
bwd_dq_first_store = _switch("BWD_DQ_FIRST_STORE", "Inside the block, Hopper backwards "
                             "store the first dQ of each query tile where they can, without "
                             "zeroing the accumulator (enabled, the default), or add every dQ.")
fp32wg = _switch("FP32WG", "Inside the block, float32 forwards may run the Hopper float32 "
                 "kernel of fp32wg builds (enabled, the default where built) or never do.")
fp32wg_bwd = _switch("FP32WG_BWD", "Inside the block, float32 backwards may run the Hopper "
                     "float32 backward of fp32wg builds (enabled, the default where built) "
                     "or never do.")
fp32wg_bwd128 = _switch("FP32WG_BWD128", "Inside the block, float32 backwards at kernel head "
                        "dim 128 may run the d128 Hopper float32 backward of fp32wg builds "
                        "(enabled, the default) or never do.")
sm90_stage_o = _switch("SM90_STAGE_O", "Inside the block, Hopper forwards at d192 / d256 stage "
                       "O in a K / V stage for causal, windowed and varlen tiles too "
                       "(enabled), or for dense full attention only (the default).")
sm90_narrow_step = _switch("SM90_NARROW_STEP", "Inside the block, Hopper forwards run a "
                           "warpgroup's first key step on the first 32 or 64 keys where it sees "
                           "no others (enabled, the default; causal, windowed and varlen tiles, "
                           "not at kernel head dim 128), or on the whole block.")
sm90_fa3_order = _switch("SM90_FA3_ORDER", "Inside the block, Hopper forwards of plain dense "
                        "full attention at kernel head dim 256 from 2048 keys take FA3's step "
                        "order (enabled, the default), or never do.")
sm90_stream_k = _switch("SM90_STREAM_K", "Inside the block, Hopper dense forwards (no window, "
                        "one split) share their last waves' key blocks between the CTAs "
                        "(enabled, the default), or walk whole tiles only.")
sm90_dbias = _switch("SM90_DBIAS", "Inside the block, a bias's gradient may run the Hopper "
                     "backward where it supports it (enabled, the default), or always the "
                     "mma.sync one.")
bwd_bias_staged = _switch("BWD_BIAS_STAGED", "Inside the block, the mma.sync backward may stage "
                          "an aligned bias in shared memory (enabled, the default) or loads "
                          "it per score.")


@contextlib.contextmanager
def native_d16(enabled=True):
    """Inside the block, head dims 1-16 run the d16 kernels where built (enabled, the default)
    or the next larger kernel (for A/B comparisons and tests); not thread-safe."""
    global NATIVE_D16, KERNEL_HEAD_DIM
    previous = NATIVE_D16
    NATIVE_D16 = bool(enabled)
    _C.set_native_d16(NATIVE_D16)
    KERNEL_HEAD_DIM = _kernel_head_dims()
    try:
        yield
    finally:
        NATIVE_D16 = previous
        _C.set_native_d16(previous)
        KERNEL_HEAD_DIM = _kernel_head_dims()


@contextlib.contextmanager
def dq_chains(chains):
    """Inside the block, deterministic backwards use ``chains`` dQ accumulators (1, 2 or 4;
    None: the default choice). For A/B comparisons and tests; not thread-safe."""
    global DQ_CHAINS
    if chains not in (None, 1, 2, 4):
        raise ValueError(f"dq_chains must be None, 1, 2 or 4, got {chains!r}")
    previous, DQ_CHAINS = DQ_CHAINS, chains
    try:
        yield
    finally:
        DQ_CHAINS = previous


def build_info():
    """What this build contains: version, CUDA runtime version, SASS/PTX archs, head dims
    (forward and backward)."""
    return dict(_C.build_info())


try:
    current_stream = torch._C._cuda_getCurrentRawStream  # (device index) -> cudaStream_t as int
except AttributeError:  # torch without this private binding (or without CUDA)

    def current_stream(device_index):
        return torch.cuda.current_stream(device_index).cuda_stream


_supported_devices = set()  # device indices known to run this build's kernels
_unsupported_reason = {}  # device index -> message


def check_device(device_index):
    """Raises RuntimeError unless GPU ``device_index`` can run this build; caches the answer."""
    if device_index in _supported_devices:
        return
    reason = _unsupported_reason.get(device_index)
    if reason is None:
        major, minor = torch.cuda.get_device_capability(device_index)
        if major < 8:
            name = torch.cuda.get_device_name(device_index)
            reason = (
                f"FlashAttention only supports Ampere GPUs or newer; GPU {device_index} "
                f"({name}) is sm_{major}{minor}"
            )
        else:
            reason = _C.device_unsupported_reason(device_index)
        if not reason:
            _supported_devices.add(device_index)
            return
        _unsupported_reason[device_index] = reason
    raise RuntimeError(reason if reason.startswith("FlashAttention") else "flashattn2: " + reason)


_smem_per_block = {}  # device index -> the most shared memory a block may use, bytes
_bwd_smem = {}  # (device index, head dim) -> None, or (needed, limit) bytes if it does not fit


def smem_per_block(device_index):
    """The most shared memory a block may use on GPU ``device_index`` (opt-in limit; cached)."""
    limit = _smem_per_block.get(device_index)
    if limit is None:
        limit = _smem_per_block[device_index] = _C.max_smem_per_block(device_index)
    return limit


def backward_smem_shortfall(device_index, headdim):
    """None if the backward kernel for ``headdim`` (a multiple of 8) fits the shared memory a
    block may use on GPU ``device_index``, else ``(needed, limit)`` in bytes (cached). The
    d > 128 kernels need more than sm_86 / sm_89 GPUs give a block."""
    key = (device_index, headdim)
    if key not in _bwd_smem:
        need, limit = _C.bwd_smem_per_block(headdim), smem_per_block(device_index)
        _bwd_smem[key] = (need, limit) if need > limit else None
    return _bwd_smem[key]
