import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CRITEO_SAMPLE = SHARED_DATA / "criteo_kaggle_head8k"


@pytest.fixture
def criteo_sample_dir() -> Path:
    """The real Criteo head sample, or a skip where ../shared/data is absent."""
    if not CRITEO_SAMPLE.is_dir():
        pytest.skip(f"real Criteo sample (the first 8,000 rows of Criteo's Kaggle 2014 log; docs/guide.md, "
                    f"'Install and tests') not present at {CRITEO_SAMPLE}")
    return CRITEO_SAMPLE


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available() and not os.environ.get("PICASSO_SKIP_GPU"):
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def shared_ranks(request):
    """Registered rank calls (tests/shared_ranks.py) of the collected modules, one group per world size."""
    from tests.shared_ranks import SharedRanks

    return SharedRanks({item.module.__name__ for item in request.session.items
                        if "shared_ranks" in getattr(item, "fixturenames", ())})
