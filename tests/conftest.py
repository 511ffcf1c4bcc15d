import os
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One kernelcraft cache for the whole test session (builds are reused across tests)."""
    d = tmp_path_factory.mktemp("kc-cache")
    os.environ["KERNELCRAFT_CACHE"] = str(d)
    return d


@pytest.fixture
def fixture_path():
    return lambda rel: FIXTURES / rel
