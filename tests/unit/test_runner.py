from harness.orchestrate.runner import with_root_cause

GENERIC = (
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
)


def test_root_cause_is_the_first_exception_an_engine_process_logged(tmp_path):
    log = tmp_path / "arm.log"
    log.write_text(
        "(MainProcess pid=1) WARNING 11-30 03:46:05 [base.py:380] ValueError: Tokenizer not available\n"
        "(Worker pid=2) ERROR 11-30 03:46:22 [multiproc_executor.py:953]     raise ValueError(f'Missing keys')\n"
        "(Worker pid=2) ERROR 11-30 03:46:22 [multiproc_executor.py:953] ValueError: Missing keys ('w',) in loaded state!\n"
        "(EngineCore pid=3) ERROR 11-30 03:46:23 [core.py:1] RuntimeError: worker failed\n"
    )
    assert with_root_cause(GENERIC, log) == (
        GENERIC + "; root cause in the engine log: ValueError: Missing keys ('w',) in loaded state!"
    )


def test_errors_that_carry_their_cause_are_left_alone(tmp_path):
    log = tmp_path / "arm.log"
    log.write_text("(Worker pid=2) ERROR 11-30 [x.py:1] ValueError: unrelated\n")
    assert with_root_cause("timed out after 600 s", log) == "timed out after 600 s"
    assert with_root_cause(GENERIC, tmp_path / "missing.log") == GENERIC


def _server_that_prints(tmp_path, text: str):
    import subprocess
    import sys

    from harness.arm.engines import HTTPEngine

    server = object.__new__(HTTPEngine)  # only the start-up watch, no vLLM
    server._log = open(tmp_path / "server.log", "w")
    server._log.write("an earlier attempt: Address already in use\n")
    server._log.flush()
    server._log_start = (tmp_path / "server.log").stat().st_size
    server.base = "http://127.0.0.1:9"
    server.proc = subprocess.Popen([sys.executable, "-c", f"print({text!r})"], stdout=server._log)
    server.proc.wait()
    return server


def test_a_server_that_lost_its_port_is_retried_and_any_other_death_is_an_error(tmp_path):
    import pytest

    assert _server_that_prints(tmp_path, "OSError: [Errno 98] Address already in use")._wait_healthy(5) is False
    with pytest.raises(RuntimeError, match="exited with code 0 before becoming healthy"):
        _server_that_prints(tmp_path, "ValueError: bad model")._wait_healthy(5)
