"""Shared pytest setup.

Markers:
  gpu    needs a CUDA GPU of compute capability >= 8.0; skipped (with the reason) otherwise.
         A GPU that is new enough but that this build has no code for is NOT skipped: the
         tests then fail with the build's message, so a wrong-arch build cannot pass.
  large  allocates > 10 GB of GPU memory; runs by default, deselect with -m "not large".
"""
import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (sm_80 or newer)")
    config.addinivalue_line("markers", 'large: needs > 10 GB of GPU memory (-m "not large")')


def _gpu_skip_reason():
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    major, minor = torch.cuda.get_device_capability(0)
    if major < 8:
        return f"needs a GPU of compute capability >= 8.0; GPU 0 is sm_{major}{minor}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
