import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "helpers"))
SHARED_DATA = HERE.parent.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _isolate_data_root(tmp_path, monkeypatch):
    """Tests never touch the user's data cache; a run in this process (hasten.cli.main) does
    not leave its thread count to the tests after it."""
    monkeypatch.setenv("HASTEN_DATA", str(tmp_path / "hasten-data"))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def cifar_zip():
    p = SHARED_DATA / "cifar10-jpeg.zip"
    if not p.is_file():
        pytest.skip("cifar10-jpeg.zip is not beside the project")
    return p
