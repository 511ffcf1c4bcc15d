import os
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
HAS_CUDA = torch.cuda.is_available()


def pytest_configure(config):
    from cpu_watch import register  # which processes used the CPU during each test (timing flakes in CI)

    register(config)


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


def run_story(run_dir) -> str:
    """An optimize run's candidates and confirmations in a few lines: what a failed assertion about its outcome
    should show (a timing flake and a real regression read differently)."""
    from kernelcraft.search.rundb import RunDB

    db = RunDB(Path(run_dir))
    lines = [f"#{r.id} {r.status} {r.speedup} ci=[{r.ci_low}, {r.ci_high}] {(r.message or '')[:100]}"
             for r in db.rows()]
    lines += [f"confirm #{i} {c['status']} {c['speedup']} ci=[{c['ci_low']}, {c['ci_high']}]"
              for i, c in db.confirmations().items()]
    return "\n".join(lines)
