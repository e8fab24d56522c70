import pytest

from tests.helpers import cli


@pytest.mark.parametrize(
    "args, message",
    [
        (("run", "--model", "/no/such/dir", "--out", "{tmp}/o"), "checkpoint directory not found: /no/such/dir"),
        (("run", "--paths", "nope", "--out", "{tmp}/o"), "unknown reload path 'nope'. Available: ["),
        (("run", "--tp", "x"), "argument --tp: invalid int value"),
        (("report", "{tmp}"), "holds no run (run.json), scenario"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = cli(*(a.format(tmp=tmp_path) for a in args))
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_paths_lists_reload_weights():
    proc = cli("paths")
    assert proc.returncode == 0 and proc.stdout.startswith("reload_weights")


def _checkpoint(d, tensors):
    import json

    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    save_file({k: torch.zeros(*shape) for k, shape in tensors.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"vocab_size": 512}))
    return d


def test_a_mismatched_target_or_a_missing_control_tensor_is_exit_2_before_any_engine(tmp_path):
    a = _checkpoint(tmp_path / "A", {"model.layers.0.input_layernorm.weight": (8,), "w": (8, 4)})
    b = _checkpoint(tmp_path / "B", {"model.layers.0.input_layernorm.weight": (8,), "w": (8, 5)})
    env_cache = {"REFIT_HARNESS_CACHE": str(tmp_path / "cache")}
    for args, message in (
        (("--target", str(b)), "--target " + str(b) + ": tensor 'w' is F32 [8, 5], A's is F32 [8, 4]"),
        (("--control-tensor", "model.norm.weight"), "positive-control tensor 'model.norm.weight' is not in"),
    ):
        proc = cli(
            "run", "--model", a, *args, "--executor", "local", "--out", tmp_path / "o", extra_env=env_cache, timeout=120
        )
        assert proc.returncode == 2, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("refit-harness: error:")]
        assert len(errors) == 1 and message in errors[0], proc.stderr
        assert not (tmp_path / "o" / "arms").exists()  # no engine arm was planned to run
