"""An arm's error names the exception a Ray task error carries, so vLLM's words are recorded."""

from __future__ import annotations

from harness.arm.process import root_cause


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
