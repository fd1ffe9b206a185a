"""Make the repository root (tests `import bench`) and tests/ (shared helpers such as
`torch_models` and `mugraph_examples`) importable; keep results caches in tmp; leave
optimize's compile check (seconds per candidate, sm_90a builds) to the tests that ask for it
with ``compile_check=True``; run in strict mode (``EQSAT_MIRAGE_STRICT=1``), where an
unexpected internal error propagates instead of being recorded as a failed candidate."""

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
for path in (str(TESTS.parent), str(TESTS)):
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.fixture(scope="session", autouse=True)
def _session_results_cache(tmp_path_factory):
    """Keep every test, session- and module-scoped fixtures included, off the user's cache
    and key."""
    made = {"EQSAT_MIRAGE_CACHE_DIR": str(tmp_path_factory.mktemp("results-cache")),
            "EQSAT_MIRAGE_CONFIG_DIR": str(tmp_path_factory.mktemp("config")),  # the tag key
            "EQSAT_MIRAGE_COMPILE_CHECK": "0",
            "EQSAT_MIRAGE_STRICT": "1"}  # a bug raises (ir.errors.strict), never "no speedup"
    old = {k: os.environ.get(k) for k in made}
    os.environ.update(made)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _results_cache(tmp_path_factory, monkeypatch):
    """Each test gets its own empty results cache (``em.optimize`` caches by default); the
    project's environment variables are as they were after each test (a docs block that set
    ``EQSAT_MIRAGE_MEMORY_BUDGET=256M`` in os.environ once refused the verification of
    every test that ran after it)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("EQSAT_MIRAGE_")}
    monkeypatch.setenv("EQSAT_MIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield
    for k in [k for k in os.environ if k.startswith("EQSAT_MIRAGE_") and k not in before]:
        del os.environ[k]
    os.environ.update(before)


def pytest_terminal_summary(terminalreporter, config):
    """Name pytest-randomly's seed at the end of the run (``-q`` hides the header line that
    shows it), so a failure in one shuffled order can be replayed."""
    if config.pluginmanager.hasplugin("randomly"):
        seed = config.getoption("randomly_seed")
        order = "a shuffled order" if config.getoption("randomly_reorganize") else "file order"
        terminalreporter.write_line(f"tests ran in {order} with random seed {seed}: replay "
                                    f"with -p randomly --randomly-seed={seed}")
