import os

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """The suite's tensors are small: one intra-op thread, since OpenMP spin-waits on a shared
    2-core machine cost far more than a second thread gains (10-100x slowdowns measured here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
