"""The preflight's placement round waits for progress, not for a fixed time (the CI failure of
stop 27: on a loaded 2-core machine, three placeable stand-ins took over 5 s to start their Ray
worker processes, and the round called them unplaceable). Ray is replaced by a clock-driven
stand-in here: what is under test is the round's waiting, not Ray's placement."""

from __future__ import annotations

import time

from harness.arm.preflight import place_together


class _Remote:
    def __init__(self, fn) -> None:
        self.remote = fn


class _TricklingRay:
    """Stand-ins "arrive" at the given offsets (seconds) after their round opens; None: never."""

    def __init__(self, arrivals: dict[str, float | None]) -> None:
        self.arrivals, self.opened = arrivals, 0.0

    # What place_together calls: ray.get, ray.wait, ray.cancel, gate.*.remote, hold.options().remote
    def get(self, value):
        return value() if callable(value) else value

    def wait(self, refs, num_returns, timeout):
        return [], list(refs)

    def cancel(self, ref, force) -> None: ...

    def gate(self):
        def open_round():
            self.opened = time.monotonic()
            return 1

        def report():
            now = time.monotonic() - self.opened
            return {k: ["0"] for k, at in self.arrivals.items() if at is not None and at <= now}

        return type("Gate", (), {"open_round": _Remote(open_round), "report": _Remote(lambda: report)})()

    def hold(self):
        return type("Hold", (), {"options": lambda self, **_: _Remote(lambda *a: object())})()


def _round(arrivals: dict[str, float | None], timeout_s: float):
    ray = _TricklingRay(arrivals)
    started = time.monotonic()
    got = place_together(ray, ray.hold(), ray.gate(), {k: {} for k in arrivals}, timeout_s)
    return got, time.monotonic() - started


def test_stand_ins_arriving_slowly_but_steadily_are_all_placed():
    # Each arrives within the timeout of the one before, all of them well after it: a fixed
    # deadline (the code before the fix) would call the last two unplaceable.
    got, took = _round({"engine": 0.3, "trainer rank 0": 0.6, "trainer rank 1": 0.9}, timeout_s=0.45)
    assert isinstance(got, dict) and set(got) == {"engine", "trainer rank 0", "trainer rank 1"}, got
    assert took >= 0.9


def test_a_stand_in_that_never_arrives_is_named_once_progress_stops():
    got, took = _round({"engine": 0.3, "trainer rank 0": None}, timeout_s=0.4)
    assert got == "trainer rank 0"
    assert 0.7 <= took < 2.0  # the last arrival (0.3 s) plus one timeout
