"""Shared pytest setup.

Markers:
  gpu    needs a CUDA GPU of compute capability >= 8.0; skipped (with the reason) otherwise.
         A GPU that is new enough but that this build has no code for is NOT skipped: the
         tests then fail with the build's message, so a wrong-arch build cannot pass.
  large  allocates > 10 GB of GPU memory; runs by default, deselect with -m "not large".
  gpu2   needs 2 CUDA GPUs of one host (NCCL); skipped (with the reason) on fewer.
  gpu4   needs 4 CUDA GPUs of one host (NCCL); skipped (with the reason) on fewer.
"""
import pytest
import torch

_GPU_COUNT_MARKERS = (2, 4)  # gpuN markers: tests that need N GPUs of one host


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (sm_80 or newer)")
    config.addinivalue_line("markers", 'large: needs > 10 GB of GPU memory (-m "not large")')
    for count in _GPU_COUNT_MARKERS:
        config.addinivalue_line("markers", f"gpu{count}: needs {count} CUDA GPUs of one host (NCCL)")


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability(0)
    if major < 8:
        return f"needs a GPU of compute capability >= 8.0; GPU 0 is sm_{major}{minor}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if reason is not None and "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=reason))
            continue
        for count in _GPU_COUNT_MARKERS:
            if f"gpu{count}" in item.keywords and have < count:
                item.add_marker(pytest.mark.skip(
                    reason=f"needs {count} CUDA GPUs; this machine has {have}"))
                break


@pytest.fixture(autouse=True)
def seed():
    """Every test starts from the same random state (CPU and all GPUs)."""
    torch.manual_seed(0)
    return 0


@pytest.fixture(autouse=True, scope="session")
def float32_reference_matmuls():
    """The float32 reference must not silently run in TF32."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved
