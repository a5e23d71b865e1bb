import copy
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The device the suite runs on: CRATE_TEST_DEVICE=cuda (or cuda:N) runs the tests that take the ``device`` fixture
# on that GPU and skips the others (CPU tests: bitwise resumes, CPU thread policies, faked GPUs), saying so.  The
# default, cpu, hides the GPUs of the machine, so every run the suite starts (``crate train`` with its default
# --device auto included) stays on the CPU, as in CI.
TEST_DEVICE = os.environ.get("CRATE_TEST_DEVICE", "cpu").strip().lower()
if TEST_DEVICE == "cpu":
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """pyproject's ``addopts`` spread the run over the cores with pytest-xdist (the ``dev`` extra).  Where it is not
    installed (a GPU image's python, ``-p no:xdist``) the three options ``addopts`` gives are taken and ignored, so
    the same command runs every test in one process instead of failing on them; the session's last lines say so."""
    if pluginmanager.hasplugin("xdist"):
        return
    group = parser.getgroup("xdist absent", "pytest-xdist's options, ignored: it is not installed")
    group.addoption("--numprocesses", dest="numprocesses", default=None, help="ignored (no pytest-xdist)")
    group.addoption("--maxprocesses", dest="maxprocesses", default=None, help="ignored (no pytest-xdist)")
    group.addoption("--dist", dest="dist", default="no", help="ignored (no pytest-xdist)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: runs on CRATE_TEST_DEVICE without taking the device fixture")
    if TEST_DEVICE != "cpu" and TEST_DEVICE != "cuda" and not TEST_DEVICE.startswith("cuda:"):
        raise pytest.UsageError(f"CRATE_TEST_DEVICE={TEST_DEVICE!r}: use cpu (the default), cuda or cuda:N")
    if TEST_DEVICE != "cpu" and not torch.cuda.is_available():
        raise pytest.UsageError(f"CRATE_TEST_DEVICE={TEST_DEVICE}, but torch sees no CUDA GPU; unset it for the CPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if TEST_DEVICE == "cpu":
        return
    skip = pytest.mark.skip(reason=f"a CPU test: CRATE_TEST_DEVICE={TEST_DEVICE} runs the tests that take `device`")
    for item in items:
        if "device" not in getattr(item, "fixturenames", ()) and item.get_closest_marker("gpu") is None:
            item.add_marker(skip)


@pytest.fixture
def device() -> torch.device:
    """The device under test (``CRATE_TEST_DEVICE``, default cpu); compare with :func:`tolerances.tol`."""
    return torch.device(TEST_DEVICE)


def pytest_terminal_summary(terminalreporter):
    """The last lines of every session name what was not tested here and why (a missing Chromium, an extra not
    installed), grouped by reason, even under ``-q``: a skipped browser test is never mistaken for a passed one."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    config = terminalreporter.config
    if config.getoption("numprocesses", None) not in (None, 0, "0") and not config.pluginmanager.hasplugin("xdist"):
        terminalreporter.write_line("one process: pytest-xdist is not installed (pip install -e '.[dev]')", yellow=True)
    if reasons:
        terminalreporter.write_sep("=", "not tested on this machine", yellow=True, bold=True)
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"{n} skipped: {reason}", yellow=True)


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


@pytest.fixture(autouse=True)
def _shared_configs_unchanged():
    """The configurations in ``tests/tiny.py`` are shared module globals: a test that changed one in place would
    change every test after it, so that is an error of the test that did it."""
    import tiny

    before = {k: copy.deepcopy(v) for k, v in vars(tiny).items() if k.isupper()}
    yield
    after = {k: v for k, v in vars(tiny).items() if k.isupper()}
    assert after == before, "this test changed a configuration of tests/tiny.py in place; copy it ({**tiny.X, ...})"


@pytest.fixture
def torchrun():
    """``torchrun(*argv)`` starts ``crate ARGV`` as two gloo processes (one thread each) under
    ``torch.distributed.run`` and returns the ``Popen`` (text stdout / stderr pipes)."""

    def start(*argv: object) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "crate_transformer.cli", *argv]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        pipe = subprocess.PIPE
        return subprocess.Popen([str(a) for a in cmd], env=env, text=True, stdout=pipe, stderr=pipe)

    return start


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face Hub cache in ``tmp_path``, offline (fill it with ``hubcache.put_in_hub_cache``):
    ``HF_HUB_CACHE`` points there (for subprocesses) and huggingface_hub's resolved setting is repointed
    (it reads the variable once, at import)."""
    import huggingface_hub.constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty ``datasets`` cache with the Hub off, as an offline machine has it (and a fresh token cache);
    fill it with ``hfcache.put_in_datasets_cache``."""
    datasets = pytest.importorskip("datasets", reason="the optional 'hf' extra (datasets) is not installed")
    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path / "tokens"))
    return cache


@pytest.fixture
def without_file_checksums():
    """``without_file_checksums(folder)`` rewrites a ``save_pretrained`` folder's weights with the metadata saves
    had before ``config.json`` / ``tokenizer.json`` were checksummed, so those files may be edited as an old
    version wrote them (the weights' own checksum stays)."""
    from safetensors.torch import save_file

    from crate_transformer.io import load_safetensors

    def rewrite(folder):
        tensors, meta = load_safetensors(folder / "model.safetensors")
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt", "sha256": meta["sha256"]})
        return folder

    return rewrite
