"""An arm's error names the exception a Ray task error carries, or the one `vllm serve` logged for
an HTTP 500, so vLLM's words are recorded."""

from __future__ import annotations

from types import SimpleNamespace

from harness.arm.engines import server_error_cause
from harness.arm.process import root_cause, with_logged_error


class TaskError(Exception):
    """Ray's ``RayTaskError`` shape: the original exception in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("traceback of the remote task " * 200)  # longer than what is recorded
        self.cause = cause


def test_the_innermost_cause_through_every_actor_hop():
    vllm_error = RuntimeError("direct reload: post-load processing replaced the parameter object")
    assert root_cause(TaskError(TaskError(vllm_error))) is vllm_error


def test_an_exception_without_a_cause_is_its_own():
    plain = ValueError("not supported")
    assert root_cause(plain) is plain
    odd = TaskError(None)  # a cause that is not an exception is no cause
    assert root_cause(odd) is odd


SERVER_LOG = """\
INFO 12-06 08:00:00 [api_server.py] Starting vLLM API server
(EngineCore_DP0 pid=7) ERROR 12-06 08:01:02 [core.py] EngineCore encountered a fatal error.
(EngineCore_DP0 pid=7) Traceback (most recent call last):
(EngineCore_DP0 pid=7)     raise RuntimeError(f"Encoder cache miss for {mm_hash}.")
(EngineCore_DP0 pid=7) RuntimeError: Encoder cache miss for refit-harness-image-0.
(APIServer pid=5) ERROR 12-06 08:01:02 [serving.py] Error in chat completion
(APIServer pid=5) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace above.
"""


def test_a_server_error_is_named_by_the_exception_the_server_logged(tmp_path):
    log = tmp_path / "served.server.log"
    log.write_text("ValueError: an earlier attempt's error\n" + SERVER_LOG)
    assert server_error_cause(str(log), 0) == "RuntimeError: Encoder cache miss for refit-harness-image-0."
    # Only this attempt's part of the log counts, and the front end's EngineDeadError is no cause.
    start = len("ValueError: an earlier attempt's error\n")
    assert server_error_cause(str(log), start) == "RuntimeError: Encoder cache miss for refit-harness-image-0."
    log.write_text(SERVER_LOG.replace("RuntimeError: Encoder", "Encoder"))
    assert server_error_cause(str(log), 0) is None


def test_an_engine_process_death_carries_the_error_its_server_logged(tmp_path):
    """The arm's watchdog may see the engine core die before the HTTP 500 arrives: its error then
    names the cause too, so a known issue worded by vLLM's exception still matches."""
    log = tmp_path / "served.server.log"
    log.write_text(SERVER_LOG)
    served = SimpleNamespace(logged_error=lambda: server_error_cause(str(log), 0))
    died = "engine process 7 (EngineCore) died during the arm"
    assert (
        with_logged_error(died, served)
        == f"{died}; it logged: RuntimeError: Encoder cache miss for refit-harness-image-0."
    )
    assert with_logged_error(died, SimpleNamespace(logged_error=lambda: None)) == died
    assert with_logged_error(died, None) == died  # no engine built yet
