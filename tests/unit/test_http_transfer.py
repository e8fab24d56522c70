"""http_weight_transfer without an engine: what the in-flight record holds, how the judge
reads it, and how the path asks for its server."""

from __future__ import annotations

import json
from dataclasses import replace

from harness.judge.diff import compare_path
from harness.judge.verdict import VerdictStatus, in_flight_reasons, judge
from harness.machinery.in_flight import InFlight
from harness.records import InFlightRequest
from harness.spec.run import JudgePolicy
from tests.records import EXPECTED, B, arm, obs, output, subject

OK = InFlightRequest(
    prompt=0,
    tokens_before_pause=(5, 6),
    tokens_while_paused=0,
    tokens_after_resume=(7, 8, 9),
    finish_reason="length",
    error=None,
    fresh_divergence=None,
    fresh_max_logprob_diff=0.0,
)


def _compared(in_flight, made_b=None):
    """The path ``p`` with ``in_flight`` recorded after its refit to B; ``made_b``: cold B's and the
    refit's greedy outputs (default: the cold-A tokens ``tests.records.obs`` gives every side)."""
    subj = subject(outputs_b=made_b)
    observations = tuple(
        replace(o, in_flight=in_flight) if o.label.stage == "warm_B" and o.label.path == "p" else o
        for o in subj.observations
    )
    c = compare_path(
        "p",
        replace(subj, observations=observations),
        arm("reference", "reference", obs("cold_B", B, made_b)),
        arm("noise", "noise", obs("cold_B", B, made_b)),
        "q_proj.weight",
        1e-4,
        EXPECTED,
    )
    assert c.in_flight == in_flight
    return c


def _verdict(in_flight):
    return judge(_compared(in_flight), JudgePolicy(), False)


def test_requests_that_run_through_the_paused_refit_pass_and_say_they_match_b():
    v = _verdict((OK, replace(OK, prompt=1)))
    assert v.status is VerdictStatus.PASS, v.reasons
    assert any("2 generating across the paused refit" in r and "all 2 match B" in r for r in v.reasons)


def test_an_in_flight_request_that_errors_or_is_cut_short_fails_the_path():
    broken = replace(OK, error="RemoteDisconnected: stream closed", finish_reason=None)
    assert _verdict((OK, broken)).status is VerdictStatus.FAIL
    aborted = replace(OK, finish_reason="abort")
    v = _verdict((aborted,))
    assert v.status is VerdictStatus.FAIL and any("'abort', not 'length'" in r for r in v.reasons)


def test_tokens_streamed_while_paused_fail_keep_mode():
    failing, _ = in_flight_reasons((replace(OK, tokens_while_paused=3),))
    assert failing == ["in-flight request 0 streamed 3 token(s) while the engine was paused"]


def test_resumed_tokens_that_differ_from_b_are_shown_not_failed():
    failing, notes = in_flight_reasons((replace(OK, fresh_divergence=4, fresh_max_logprob_diff=0.02),))
    assert failing == [] and "1 diverge from B on the same prefix" in notes[0] and "at token 4" in notes[0]
    assert in_flight_reasons(()) == ([], [])


# ---- a gated refit (http_dp_reload): /pause?mode=wait drains requests and queues new ones ----

A_TOKENS, B_TOKENS = (1, 2, 3), (4, 5, 6)
DRAINED = replace(OK, tokens_before_pause=A_TOKENS, tokens_after_resume=(), pause_mode="wait", rank=0)
QUEUED = replace(OK, tokens_before_pause=(), tokens_after_resume=B_TOKENS, pause_mode="wait", rank=1)


def _gated_verdict(in_flight):
    c = _compared(in_flight, made_b=[output(0, B_TOKENS)])  # cold A made A_TOKENS (``tests.records.obs``)
    return c, judge(c, JudgePolicy(), False)


def test_a_gated_refit_passes_when_every_request_is_wholly_a_or_wholly_b():
    c, v = _gated_verdict((DRAINED, QUEUED, OK))  # a keep-mode request is not a gated one
    assert c.in_flight_sources == ("A", "B") and v.status is VerdictStatus.PASS, v.reasons
    assert "gated refit (/pause?mode=wait): 2 requests, 1 made cold A's tokens, 1 cold B's" in v.reasons[0]


def test_a_request_that_mixed_the_weights_fails_the_gated_refit_naming_its_rank():
    mixed = replace(QUEUED, tokens_before_pause=A_TOKENS[:2], tokens_after_resume=B_TOKENS[2:])
    c, v = _gated_verdict((DRAINED, mixed))
    assert c.in_flight_sources == ("A", "neither") and v.status is VerdictStatus.FAIL
    assert (
        "request 0 on data-parallel rank 1, gated by the refit, made neither cold A's nor cold B's greedy tokens: "
        "it mixed the two weights"
    ) in v.reasons


class _Conn:
    """Stands in for one streaming HTTP connection; never used: the streams are filled by hand."""


def test_in_flight_splits_each_stream_at_the_pause_and_the_resume():
    flight = InFlight(_Conn, "m", ((1, 2), (3,)), max_tokens=5)
    a, b = flight.streams
    a.chunks = [(1.0, (10,), (-0.1,)), (2.0, (11,), (-0.2,)), (5.0, (12, 13), (-0.3, -0.4))]
    b.chunks = [(1.5, (20,), (-0.5,)), (3.5, (21,), (-0.6,)), (6.0, (22,), (-0.7,))]
    for s in flight.streams:
        s.finish_reason = "length"
        s.done.set()
    flight.paused_at, flight.resumed_at = 2.5, 4.0
    asked = []

    def fresh(ids, n):  # the refit server, asked for the same prefix from scratch
        asked.append((ids, n))
        return ((12, 99), (-0.3, -0.41)) if ids[0] == 1 else ((22,), (-0.7,))

    first, second = flight.records(fresh)
    assert asked == [((1, 2, 10, 11), 2), ((3, 20), 1)]
    assert first.tokens_before_pause == (10, 11) and first.tokens_after_resume == (12, 13)
    assert first.tokens_while_paused == 0 and first.fresh_divergence == 1
    assert abs(first.fresh_max_logprob_diff - 0.01) < 1e-9
    # A token that arrived between the pause answering and the resume: keep mode broke.
    assert second.tokens_while_paused == 1 and second.fresh_divergence is None and second.fresh_max_logprob_diff == 0.0
    # A NaN logprob from the refit server (a broken kernel) is a difference, wherever it falls.
    nan = float("nan")
    for lps in ((nan, -0.41), (-0.3, nan)):
        first, _ = flight.records(lambda ids, n, lps=lps: ((12, 13), lps) if ids[0] == 1 else ((22,), (-0.7,)))
        assert first.fresh_divergence is None and first.fresh_max_logprob_diff == float("inf"), lps


def test_the_path_is_registered_and_asks_for_a_served_engine_with_the_cpu_transfer_backend(monkeypatch):
    from harness.paths import PATHS
    from harness.paths.http_transfer import transfer_backend

    cls = PATHS.get("http_weight_transfer")
    assert cls.requirements.kind == "http" and cls.requirements.weight_transfer_backend == transfer_backend()
    assert cls.sabotage_evidence == "tensor" and "left out" in cls.sabotage
    monkeypatch.setenv("HARNESS_DEVICE", "gpu")
    assert transfer_backend() == "nccl"
    monkeypatch.setenv("HARNESS_DEVICE", "cpu")
    monkeypatch.setenv("PATH", "")
    assert transfer_backend() == "gloo"


def test_the_weight_sync_client_reaches_the_private_socket_through_requests_unixsocket():
    import requests_unixsocket

    from harness.arm.engines import HTTPEngine

    engine = HTTPEngine.__new__(HTTPEngine)  # the URL is a pure function of the socket path
    engine.socket_path = "/tmp/rh-serve-x/server0.sock"
    assert engine.unix_url == "http+unix://%2Ftmp%2Frh-serve-x%2Fserver0.sock"
    assert requests_unixsocket.DEFAULT_SCHEME == "http+unix://"


def test_non_finite_logprobs_over_http_are_observed_as_nan_not_an_arm_error():
    """A refit that breaks a kernel can make the engine's logprobs NaN; ``vllm serve`` then
    answers HTTP 400 (measured: the W8A8 int8 oneDNN finding on the HTTP paths, which were ERROR).
    The observation takes the same greedy tokens without logprobs and records each as NaN, as
    the in-process engine returns them; any other error still raises."""
    import math

    import pytest

    from harness.arm.engines import NON_FINITE_LOGPROBS, HTTPEngine, HTTPError
    from harness.spec.run import PromptSpec

    asked: list[dict] = []

    def post(route: str, body: dict, headers: dict | None = None) -> dict:
        asked.append(body)
        if body["logprobs"] is not None:
            raise HTTPError(f'POST {route} -> HTTP 400: b\'{{"error":{{"message":"{NON_FINITE_LOGPROBS}"}}}}\'')
        return {"choices": [{"token_ids": [0, 0, 7], "logprobs": None}], "usage": {}}

    engine = HTTPEngine.__new__(HTTPEngine)
    engine.post = post
    engine._model_name = lambda: "m"
    engine.data_parallel_size = 1
    (out,) = engine.generate(PromptSpec(token_ids=((1, 2, 3),), max_tokens=3))
    assert [b["logprobs"] for b in asked] == [5, None]
    assert out.token_ids == (0, 0, 7)
    assert [t for ((t, _),) in out.logprobs] == [0, 0, 7] and all(math.isnan(lp) for ((_, lp),) in out.logprobs)
    # And the chosen-token logprobs that the in-flight paths compare (asked during a refit).
    tokens, chosen = engine.complete((1, 2, 3), 3)
    assert tokens == (0, 0, 7) and all(map(math.isnan, chosen)) and len(chosen) == 3

    def refuses(route: str, body: dict, headers: dict | None = None) -> dict:
        raise HTTPError(f"POST {route} -> HTTP 400: b'prompt too long'")

    engine.post = refuses
    with pytest.raises(HTTPError, match="prompt too long"):
        engine.generate(PromptSpec(token_ids=((1,),)))


def test_paced_steps_wait_only_while_paced_and_only_when_tokens_are_scheduled(monkeypatch):
    import time

    from harness.worker.extension import pace_steps

    class Step:
        def __init__(self, tokens):
            self.total_num_scheduled_tokens = tokens

    class Worker:
        def execute_model(self, scheduler_output):
            return scheduler_output.total_num_scheduled_tokens

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    worker = Worker()
    pace_steps(worker, 0.1)
    assert worker.execute_model(Step(4)) == 4 and slept == [0.1]
    assert worker.execute_model(Step(0)) == 0 and slept == [0.1]  # an empty step is not held
    pace_steps(worker, 0.0)  # changed live, on the wrapper installed once
    assert worker.execute_model(Step(4)) == 4 and slept == [0.1]
    pace_steps(worker, 0.25)
    worker.execute_model(Step(1))
    assert slept == [0.1, 0.25]


class _StreamingConn:
    """One streaming ``/v1/completions`` response, as ``vllm serve`` writes its server-sent events."""

    def __init__(self, chunks):
        self._lines = [b"data: " + json.dumps(c).encode() + b"\n" for c in chunks] + [b"data: [DONE]\n"]

    def request(self, *args, **kwargs):
        pass

    def getresponse(self):
        conn = self

        class Response:
            status = 200

            def __iter__(self):
                return iter(conn._lines)

        return Response()

    def close(self):
        pass


def _chunk(token, logprob, finish=None):
    return {"choices": [{"token_ids": [token], "logprobs": {"token_logprobs": [logprob]}, "finish_reason": finish}]}


def test_a_stream_with_null_logprobs_is_read_to_its_end_with_nan_and_is_no_error():
    """A broken kernel's NaN logprobs stream as null (the int8 engine after its refit): the
    request is still generating, so it is read on, with NaN (a difference), not an error."""
    import math

    flight = InFlight(
        lambda: _StreamingConn([_chunk(5, -0.5), _chunk(6, None), _chunk(7, None, "length")]), "m", ((1,),), 3
    )
    (stream,) = flight.streams
    flight._read(stream)
    assert stream.error is None and stream.finish_reason == "length"
    assert [t for _, toks, _ in stream.chunks for t in toks] == [5, 6, 7]
    logprobs = [lp for _, _, lps in stream.chunks for lp in lps]
    assert logprobs[0] == -0.5 and all(math.isnan(x) for x in logprobs[1:])


def test_only_a_request_that_ran_to_its_end_before_the_pause_spoils_the_refit():
    flight = InFlight(_Conn, "m", ((1,), (2,), (3,)), max_tokens=4)
    finished, failed, live = flight.streams
    finished.done.set()
    failed.error = "HTTP 500"
    failed.done.set()
    flight.mark_paused()
    assert flight.finished_before_pause == 1
    finished.done.clear()
    flight.mark_paused()
    assert flight.finished_before_pause == 0  # an error is an observation the judge fails, not a spoiled refit
