"""Third-party reload paths: the contract is checked as a path registers, and a path without a
sabotaged twin is refused in one line (built-in paths are held to the same contract)."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from harness.paths import BUILTIN_MODULES, PATHS, PathRefused, PathRegistry, contract_violation
from harness.paths.base import ReloadPath
from harness.spec.known_issues import Subject
from harness.spec.path_declaration import PathDeclaration
from tests.helpers import cli


class _Twinless(ReloadPath):
    name = "twinless"
    exercises = "reload_weights, with nothing to show that this path could fail"

    def refit(self, engine, checkpoint_dir, target):
        engine.rpc("reload_weights", {"weights_path": checkpoint_dir})


class _WithTwin(_Twinless):
    name = "with_twin"
    sabotage = "reload_weights from checkpoint A, the weights the engine already holds"

    def sabotaged_refit(self, engine, target):
        engine.rpc("reload_weights", {"weights_path": self.checkpoints.a})


def test_every_built_in_path_keeps_the_contract():
    # An empty registry would keep this loop green: the built-ins must be there to be checked.
    names = PATHS.names()
    assert names and BUILTIN_MODULES, "the reload-path registry is empty"
    assert len(names) >= len(BUILTIN_MODULES), names
    # Every built-in module registers at least one path.
    registered_by = {PATHS.get(name).__module__ for name in names}
    assert {f"harness.paths.{m}" for m in BUILTIN_MODULES} <= registered_by, registered_by
    for name in names:
        assert contract_violation(name, PATHS.get(name)) is None, name


def test_every_path_declares_what_the_judge_reads():
    """The judge reads each path through ``PathDeclaration`` (it never imports the paths): every
    registered class, and the base class a third-party path extends, is one; a class that
    declares less is not."""
    names = PATHS.names()
    assert names, "the reload-path registry is empty"
    for name in names:
        cls = PATHS.get(name)
        assert isinstance(cls, PathDeclaration), name
        assert isinstance(cls.trains, bool) and isinstance(cls.needs_cache_hits, bool), name
        assert isinstance(cls.known_issues_for(Subject("cpu (x86_64)")), tuple), name
    assert isinstance(_WithTwin, PathDeclaration) and _WithTwin.trains is False
    assert PATHS.get("trainer_steps").trains is True
    assert not isinstance(type("Undeclared", (), {"sabotage": "s", "refusals": ()}), PathDeclaration)


def test_a_path_without_a_sabotaged_twin_is_refused_in_one_line():
    registry = PathRegistry()
    with pytest.raises(PathRefused) as refused:
        registry.register_class("twinless", _Twinless)
    message = str(refused.value)
    assert "\n" not in message and "no sabotaged twin" in message and "'twinless'" in message
    assert "twinless" not in registry


def test_a_path_with_its_twin_registers_and_is_looked_up_by_name():
    registry = PathRegistry()
    registry.register_class("with_twin", _WithTwin)
    assert registry.get("with_twin") is _WithTwin and "with_twin" in registry.names()


@pytest.mark.parametrize(
    "name, cls, why",
    [
        ("other", _WithTwin, "registered as 'other'"),
        ("x", object, "not a subclass"),
        ("with_twin", type("NoWords", (_WithTwin,), {"exercises": " "}), "exercises"),
        ("with_twin", type("BadEvidence", (_WithTwin,), {"sabotage_evidence": "vibes"}), "sabotage_evidence"),
    ],
)
def test_each_broken_rule_is_named(name, cls, why):
    assert why in (contract_violation(name, cls) or "")


def test_an_installed_package_without_a_twin_is_refused_and_listed(tmp_path):
    """A real distribution on sys.path with a ``refit_harness.paths`` entry point (no pip, no venv
    change): the harness lists the twinless path as refused, and running it is exit 2 in one line."""
    pkg = tmp_path / "twinless_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from harness.paths.base import ReloadPath

            class Twinless(ReloadPath):
                name = "twinless_ep"
                exercises = "reload_weights, no twin"

                def refit(self, engine, checkpoint_dir, target):
                    engine.rpc("reload_weights", {"weights_path": checkpoint_dir})
            """
        )
    )
    info = tmp_path / "twinless_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: twinless-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[refit_harness.paths]\ntwinless_ep = twinless_pkg:Twinless\n")
    env_path = f"{tmp_path}"
    listing = cli("paths", env={**_env(), "PYTHONPATH": env_path}, timeout=120)
    assert listing.returncode == 0, listing.stderr
    refused = [line for line in listing.stdout.splitlines() if "twinless_ep" in line]
    assert refused and "refused" in refused[0] and "no sabotaged twin" in refused[0], listing.stdout
    run = cli(
        "run",
        "--paths",
        "twinless_ep",
        "--model",
        str(tmp_path),
        "--out",
        str(tmp_path / "out"),
        env={**_env(), "PYTHONPATH": env_path},
        timeout=300,
    )
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "no sabotaged twin" in lines[0], run.stderr


def test_a_path_named_in_the_environment_is_tried_without_installing(tmp_path):
    """``REFIT_HARNESS_PATHS=name=module:Class``: a module on PYTHONPATH, no distribution. The
    twinned class is listed as available and said to come from the variable; a twinless one is
    refused by the same contract; a malformed value is one line and exit 2."""
    (tmp_path / "my_paths.py").write_text(
        textwrap.dedent(
            """
            from harness.paths.base import ReloadPath

            class Mine(ReloadPath):
                name = "mine"
                exercises = "reload_weights, from a module tried in place"
                sabotage = "reload_weights from checkpoint A, the weights the engine already holds"

                def refit(self, engine, checkpoint_dir, target):
                    engine.rpc("reload_weights", {"weights_path": checkpoint_dir})

                def sabotaged_refit(self, engine, target):
                    engine.rpc("reload_weights", {"weights_path": self.checkpoints.a})

            class NoTwin(ReloadPath):
                name = "notwin"
                exercises = "reload_weights, no twin"

                def refit(self, engine, checkpoint_dir, target):
                    engine.rpc("reload_weights", {"weights_path": checkpoint_dir})
            """
        )
    )

    def paths(value: str) -> subprocess.CompletedProcess:
        env = {**_env(), "PYTHONPATH": str(tmp_path), "REFIT_HARNESS_PATHS": value}
        return cli("paths", env=env, timeout=120)

    listing = paths("mine=my_paths:Mine, notwin=my_paths:NoTwin, gone=my_paths:Missing")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("mine "))
    assert "available" in lines[at] and "from REFIT_HARNESS_PATHS (not installed)" in "\n".join(lines[at : at + 5])
    notwin = next(line for line in lines if line.startswith("notwin "))
    assert "refused" in notwin and "no sabotaged twin" in notwin and "(my_paths:NoTwin)" in notwin
    gone = next(line for line in lines if line.startswith("gone "))
    assert "importing it failed: AttributeError" in gone
    bad = paths("mine-my_paths")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "refit-harness: error: REFIT_HARNESS_PATHS: expected path=module:Class, got 'mine-my_paths'"
    ], bad.stderr


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
