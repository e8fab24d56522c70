import subprocess
import sys

import pytest


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


@pytest.mark.parametrize("args, message", [
    (("run", "--model", "/no/such/dir", "--out", "{tmp}/o"), "checkpoint directory not found: /no/such/dir"),
    (("run", "--paths", "nope", "--out", "{tmp}/o"), "unknown reload path 'nope'. Available: ["),
    (("run", "--tp", "x"), "argument --tp: invalid int value"),
    (("report", "{tmp}"), "is not a report directory"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = cli(*(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_paths_lists_reload_weights():
    proc = cli("paths")
    assert proc.returncode == 0 and proc.stdout.startswith("reload_weights")
