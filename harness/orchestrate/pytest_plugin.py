"""pytest plugin (loaded by the root conftest.py).

- Scenario cells as test items: ``pytest scenarios/ -m cpu`` collects every cell of
  ``--refit-scenario`` (default ``default``) from the scenario module that defines it,
  e.g. ``reload_weights[tiny-qwen3-eager-tp1]``. A cell group's engines run once, for all
  its items; a failing item prints its verdict reasons, not a traceback. At session end
  the scenario report is written to ``--refit-out``, or beside ``--junitxml``.
- ``cpu``/``gpu`` markers; ``gpu`` items are skipped with a reason where there is no GPU, and
  ``cpu`` items (real engines judged with the CPU backend's expectations) where there is one.
- ``--refit-fresh-reference``: reference reuse is on under pytest unless this is given.

The harness's own test helpers (``run_cli``, ``run_oracle``) live in ``tests/``.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from harness.device import cuda_available


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("refit", "refit-harness scenario items")
    group.addoption("--refit-scenario", default="default", help="scenario whose cells become items")
    group.addoption("--refit-model", default=None, help="checkpoint directory replacing the scenario's model")
    group.addoption("--refit-out", default=None, help="where the scenario report goes")
    group.addoption(
        "--refit-fresh-reference",
        action="store_true",
        help="cold-start every reference and noise arm (default in tests: reuse them from the "
        "content-addressed cache when nothing they depend on changed)",
    )


def pytest_configure(config: pytest.Config) -> None:
    from harness.settings import REUSE_ENV

    # Reference reuse is on in tests (every CLI subprocess they start inherits it) unless asked
    # otherwise here or by REFIT_HARNESS_REUSE_REFERENCE=0 (the nightly sets that).
    if config.getoption("--refit-fresh-reference"):
        os.environ[REUSE_ENV] = "0"
    else:
        os.environ.setdefault(REUSE_ENV, "1")
    config.addinivalue_line("markers", "cpu: runs a real vLLM engine on the CPU")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped with a reason elsewhere")


NO_GPU = "needs a CUDA GPU (none here; set HARNESS_DEVICE=gpu on a GPU host)"
CPU_EXPECTATIONS = (
    "a CPU engine test: its expected verdicts, known issues and refusals are the CPU backend's, and on this "
    "CUDA host vLLM would run CUDA kernels (the GPU's checks are the gpu-nightly scenario and the gpu tests)"
)


def device_skip(keywords, cuda: bool) -> str | None:
    """Why an item marked ``cpu`` or ``gpu`` cannot run on this host, or None."""
    if cuda and "cpu" in keywords:
        return CPU_EXPECTATIONS
    if not cuda and "gpu" in keywords:
        return NO_GPU
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = cuda_available()
    for item in items:
        if why := device_skip(item.keywords, cuda):
            item.add_marker(pytest.mark.skip(reason=why))


class RefitFailure(Exception):
    """A cell's verdict was not PASS; carries the verdict for ``repr_failure``."""


class ScenarioFile(pytest.File):
    def collect(self):
        from harness.paths import PATHS
        from harness.spec.scenario import expand
        from scenarios import SCENARIOS

        name = self.config.getoption("--refit-scenario")
        module = SCENARIOS.target(name).partition(":")[0]
        if module.rsplit(".", 1)[-1] != self.path.stem:
            return
        scenario = SCENARIOS.get(name)()
        from dataclasses import replace

        from harness.cpu_isa import NATIVE, override_from_env

        if override_from_env() != NATIVE:  # REFIT_HARNESS_CPU_ISA, as for the CLI
            scenario = replace(scenario, cpu_isa=override_from_env())
        for group in expand(scenario):
            for path in group.spec.paths:
                marker = "gpu" if scenario.device == "cuda" or PATHS.get(path).device == "cuda" else "cpu"
                item = CellItem.from_parent(self, name=f"{path}[{group.id}]", group=group, path_name=path)
                item.add_marker(getattr(pytest.mark, marker))
                yield item


class CellItem(pytest.Item):
    def __init__(self, *, group, path_name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.group = group
        self.path_name = path_name

    def runtest(self) -> None:
        evaluation = _group_evaluation(self.config, self.group)
        # A trainer path gives one verdict per optimizer step (``<path>@T<k>``): the first that
        # is not a PASS decides the item.
        own = [v for v in evaluation.verdicts if v.path == self.path_name or v.path.startswith(self.path_name + "@")]
        verdict = next((v for v in own if v.status.value != "PASS"), own[0])
        if verdict.status.value == "SKIPPED":
            pytest.skip(verdict.reasons[0] if verdict.reasons else "skipped")
        if verdict.status.value == "XFAIL":
            pytest.xfail(verdict.reasons[0])
        if verdict.status.value != "PASS":
            raise RefitFailure(verdict)

    def repr_failure(self, excinfo, style=None):
        if not isinstance(excinfo.value, RefitFailure):
            return super().repr_failure(excinfo)
        v = excinfo.value.args[0]
        lines = [f"{v.path}: {v.status.value}"]
        if v.first_divergent_kernel_input:
            lines.append(f"  first divergent kernel input: {v.first_divergent_kernel_input}")
        if v.first_divergent_tensor:
            lines.append(f"  first divergent tensor: {v.first_divergent_tensor}")
        lines += [f"  - {r}" for r in v.reasons]
        return "\n".join(lines)

    def reportinfo(self):
        return self.path, None, f"refit cell {self.name}"


def _scenario_out(config: pytest.Config) -> Path:
    import time

    if config.getoption("--refit-out"):
        return Path(config.getoption("--refit-out"))
    xml = getattr(config.option, "xmlpath", None)
    base = Path(xml).parent if xml else Path("reports")
    return base / f"refit-{config.getoption('--refit-scenario')}-{time.strftime('%Y%m%d-%H%M%S')}"


def _group_evaluation(config: pytest.Config, group):
    """Run a cell group's engines once per session (as processes on a CPU, on Ray with CUDA), and keep its evaluation."""
    from harness.orchestrate.fanout import FanoutSpec
    from harness.orchestrate.matrix import run_group
    from harness.orchestrate.reference import reuse_by_default

    cache = config.stash.setdefault(_RESULTS, {})
    if group.id not in cache:
        out = config.stash.setdefault(_OUT, _scenario_out(config)) / group.id
        selected = config.stash.get(_SELECTED, {}).get(group.id, group.spec.paths)
        group = replace(group, spec=replace(group.spec, paths=selected))  # run only what -k/-m kept
        cache[group.id] = run_group(
            group,
            out,
            lambda m: None,
            fan=FanoutSpec(ray=cuda_available()),  # as the CLI's --executor auto: no Ray to start on a CPU
            model=config.getoption("--refit-model"),
            reuse_reference=reuse_by_default(),
        )
    return cache[group.id][1]


_RESULTS = pytest.StashKey[dict]()
_OUT = pytest.StashKey[Path]()
_SELECTED = pytest.StashKey[dict]()


def pytest_collection_finish(session: pytest.Session) -> None:
    selected: dict[str, tuple[str, ...]] = {}
    for item in session.items:
        if isinstance(item, CellItem):
            selected[item.group.id] = selected.get(item.group.id, ()) + (item.path_name,)
    session.config.stash[_SELECTED] = selected


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".py" and file_path.parent.name == "scenarios" and file_path.name != "__init__.py":
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def pytest_sessionfinish(session: pytest.Session) -> None:
    results = session.config.stash.get(_RESULTS, {})
    if not results:
        return
    from harness.report.matrix import matrix_summary, write_matrix

    out = session.config.stash[_OUT]
    index = write_matrix(out, matrix_summary(session.config.getoption("--refit-scenario"), list(results.values())))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(f"refit-harness scenario report: {index.resolve()}")
