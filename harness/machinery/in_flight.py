"""Requests in flight across a paused refit of a ``vllm serve`` engine.

``InFlight`` starts one streaming ``/v1/completions`` request per prompt, waits until every
one has streamed a token, and then lets the caller pause the server (``/pause?mode=keep``),
refit it and resume it. Each stream is read on its own thread and every chunk is stamped
with the moment it arrived, so the record can tell what came before the pause answered,
while paused, and after ``/resume``. Engine side only (it talks to the server the arm owns).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.records import InFlightRequest
from harness.spec.prompts import without_images
from harness.spec.requirements import DATA_PARALLEL_RANK_HEADER
from harness.spec.run import PromptSpec

STREAM_START_TIMEOUT_S = 120.0
"""How long the first token of every in-flight request may take."""


def in_flight_prompts(spec: PromptSpec | None) -> tuple[tuple[int, ...], ...]:
    """The token-id prompts of the in-flight requests: the run's prompts, with any image
    placeholder taken out. They stream from ``/v1/completions``, which takes no image; a
    vision-language model's images go through the fresh requests (``HTTPEngine.chat_with_image``).
    Empty without token-id prompts."""
    if spec is None or not spec.token_ids:
        return ()
    return spec.token_ids if spec.images is None else without_images(spec.token_ids)


@dataclass
class _Stream:
    prompt: int
    ids: tuple[int, ...]
    rank: int | None = None
    chunks: list[tuple[float, tuple[int, ...], tuple[float, ...]]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    first_token: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class InFlight:
    """Streaming requests, one per prompt, that run across a refit.

    ``connect`` opens an HTTP connection to the server (``http.client`` style, over its Unix
    socket); ``model`` is the served model's name; ``max_tokens`` is each request's budget,
    with ``ignore_eos`` so that it cannot end early and leave the refit with nothing in flight.
    ``ranks``: with a data-parallel server, the rank each prompt's request is pinned to
    (``X-data-parallel-rank``); ``pause_mode``: how the caller's ``/pause`` treats them (recorded).
    """

    def __init__(
        self,
        connect,
        model: str,
        prompts: tuple[tuple[int, ...], ...],
        max_tokens: int,
        ranks: tuple[int | None, ...] | None = None,
        pause_mode: str = "keep",
    ) -> None:
        self._connect = connect
        self._model = model
        self.max_tokens = max_tokens
        self.pause_mode = pause_mode
        self.streams = [_Stream(i, tuple(ids), ranks[i] if ranks else None) for i, ids in enumerate(prompts)]
        self.paused_at: float | None = None
        self.resumed_at: float | None = None
        self.finished_before_pause = 0
        """Requests that had already run to their end, without an error, when the pause answered:
        a refit that proves nothing about them (one that failed is an observation, recorded)."""

    def start(self, wait_for_first_token: bool = True) -> None:
        """Start every request and return once each has streamed its first token (or ended);
        without ``wait_for_first_token``, at once (requests sent to a paused server wait in its queue)."""
        for s in self.streams:
            threading.Thread(target=self._read, args=(s,), name=f"in-flight-{s.prompt}", daemon=True).start()
        if not wait_for_first_token:
            return
        deadline = time.monotonic() + STREAM_START_TIMEOUT_S
        for s in self.streams:
            if not s.first_token.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"in-flight request {s.prompt} streamed no token in {STREAM_START_TIMEOUT_S:.0f} s")

    def mark_paused(self) -> None:
        """Call right after ``/pause`` answered."""
        self.paused_at = time.monotonic()
        self.finished_before_pause = sum(s.done.is_set() and s.error is None for s in self.streams)

    def mark_resumed(self) -> None:
        """Call right before ``/resume`` is sent."""
        self.resumed_at = time.monotonic()

    def finish(self, timeout_s: float) -> None:
        """Wait for every request to end (after ``/resume``)."""
        deadline = time.monotonic() + timeout_s
        for s in self.streams:
            if not s.done.wait(max(0.0, deadline - time.monotonic())):
                s.error = s.error or f"did not end within {timeout_s:.0f} s of the resume"

    def records(self, fresh) -> tuple[InFlightRequest, ...]:
        """One record per request. ``fresh(ids, n)`` asks the (refit, resumed) server for ``n``
        greedy tokens of ``ids`` and returns ``(tokens, chosen-token logprobs)``: what the new
        weights compute for the same prefix from scratch."""
        assert self.paused_at is not None and self.resumed_at is not None
        out = []
        for s in self.streams:
            before = [t for at, toks, _ in s.chunks if at <= self.paused_at for t in toks]
            during = sum(len(toks) for at, toks, _ in s.chunks if self.paused_at < at <= self.resumed_at)
            after = [t for at, toks, _ in s.chunks if at > self.resumed_at for t in toks]
            after_lp = [lp for at, _, lps in s.chunks if at > self.resumed_at for lp in lps]
            divergence, worst = None, 0.0
            if after:
                tokens, logprobs = fresh(s.ids + tuple(before), len(after))
                divergence = next((i for i, (a, b) in enumerate(zip(after, tokens)) if a != b), None)
                if divergence is None and len(tokens) != len(after):
                    divergence = min(len(tokens), len(after))
                horizon = len(after) if divergence is None else divergence + 1
                diffs = (abs(a - b) for a, b in list(zip(after_lp, logprobs))[:horizon])
                worst = max((d if not math.isnan(d) else math.inf for d in diffs), default=0.0)  # NaN: a difference
            out.append(
                InFlightRequest(
                    prompt=s.prompt,
                    tokens_before_pause=tuple(before),
                    tokens_while_paused=during,
                    tokens_after_resume=tuple(after),
                    finish_reason=s.finish_reason,
                    error=s.error,
                    fresh_divergence=divergence,
                    fresh_max_logprob_diff=round(float(worst), 9),
                    pause_mode=self.pause_mode,
                    rank=s.rank,
                )
            )
        return tuple(out)

    def _body(self, s: _Stream) -> dict[str, Any]:
        return {
            "model": self._model,
            "prompt": list(s.ids),
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
            "stream": True,
            "ignore_eos": True,
            "logprobs": 1,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }

    def _read(self, s: _Stream) -> None:
        conn = self._connect()
        try:
            headers = {"Content-Type": "application/json"}
            if s.rank is not None:
                headers[DATA_PARALLEL_RANK_HEADER] = str(s.rank)
            conn.request("POST", "/v1/completions", body=json.dumps(self._body(s)), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                s.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
                return
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[len(b"data: ") :]
                if data == b"[DONE]":
                    break
                message = json.loads(data)
                if "error" in message:
                    s.error = str(message["error"])[:300]
                    break
                choice = message["choices"][0]
                logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
                s.chunks.append(
                    (
                        time.monotonic(),
                        tuple(int(t) for t in choice.get("token_ids") or ()),
                        # A NaN logprob streams as null (measured: the int8 engine after its refit).
                        tuple(math.nan if x is None else float(x) for x in logprobs),
                    )
                )
                s.first_token.set()
                if choice.get("finish_reason"):
                    s.finish_reason = choice["finish_reason"]
        except Exception as exc:  # a broken stream is what the record is for
            s.error = f"{type(exc).__name__}: {exc}"[:300]
        finally:
            conn.close()
            s.first_token.set()
            s.done.set()
