"""How the suite runs on two pytest workers (``make test``: ``-n 2``, pytest-xdist).

An engine run keeps at most two arms going and leaves a core idle between and around them
(checkpoint writing, the zygote's preload, a last arm alone, the report): 38 % of the CPU was
idle during the quantized fixture with one pytest process. Two workers fill it. Each worker
takes whole modules (their module-scoped runs are started once), and the modules that share a
session-scoped run take one worker together (``SHARED_RUNS``), so no run is made twice.
"""

from __future__ import annotations

import pytest

# Modules that ask ``run_oracle`` for the same runs ("stock", "registry", ``fixed_twin_runs``).
SHARED_RUNS = {
    f"tests/integration/{name}.py": "tests/integration: the stock and fixed-twin runs"
    for name in ("test_oracle_reload", "test_reference_reuse", "test_builds", "test_report_browser")
}
# The longest modules first (fresh-clone CI durations), so neither worker is left with one at the end.
LONGEST_FIRST = (
    "tests/integration/test_zoo.py",
    "tests/integration/test_quantized.py",
    "tests/integration/test_oracle_reload.py",
    "tests/integration/test_regressions.py",
    "tests/integration/test_matrix.py",
    "tests/integration/test_faults.py",
)


def scope_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SHARED_RUNS.get(module, module)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {scope_of(m): i for i, m in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(scope_of(item.nodeid), len(rank)))  # stable: the rest keep their order


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        """Whole modules to a worker, the modules of ``SHARED_RUNS`` as one."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return SharedRunScheduling(config, log)
