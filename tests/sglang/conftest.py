"""SGLang's tests run in SGLang's environment (`scripts/setup_sglang_env.sh`); elsewhere they are not collected,
unless PD_REQUIRE_SGLANG=1 says they must run (then a missing SGLang fails them)."""

import importlib.util
import os
from collections.abc import Iterator

import pytest

if os.environ.get("PD_REQUIRE_SGLANG") != "1" and importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def cpu_engine_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment SGLang's offline engine needs on a CPU (`scripts.sglang_server.cpu_env`)."""
    from scripts.sglang_server import cpu_env

    for name, value in cpu_env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def module_engine_env() -> Iterator[None]:
    """`cpu_engine_env` for a whole module (a module's AR reference is computed once)."""
    from scripts.sglang_server import cpu_env

    with pytest.MonkeyPatch.context() as patch:
        for name, value in cpu_env().items():
            patch.setenv(name, value)
        yield
