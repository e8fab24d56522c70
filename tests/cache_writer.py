"""One real cache writer in a process of its own, for ``tests/unit/test_cache_concurrency.py``.

``python -m tests.cache_writer WRITER CACHE SOURCE [--hold]`` runs the harness's own writer
``WRITER`` (see ``WRITERS``) on the cache root ``CACHE`` and prints one JSON line per event:

- ``{"event": "staged"}`` (with ``--hold``): the variant is written in its staging directory
  and about to be renamed into place; the writer then waits for a line on stdin. The test
  holds it there to force the overlap, or kills it there.
- ``{"event": "waiting"}``: another process holds the key, and this one waits for it.
- ``{"event": "done", "path": ..., "reused": ...}``: the path the writer returned, and
  whether it found the variant made by another process instead of making it.

Nothing is mocked but that pause: every line of the writer is the harness's own.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from harness import cache


def emit(event: str, **fields) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def perturbed(root: Path, source: str) -> Path:
    from harness.checkpoints.derived import perturbed
    from harness.spec.run import PerturbSpec

    return perturbed(source, PerturbSpec(), cache=root)


def control(root: Path, source: str) -> Path:
    from harness.checkpoints.derived import with_control
    from harness.spec.run import ControlSpec

    return with_control(source, ControlSpec(tensor="norm.weight"), cache=root)


def without(root: Path, source: str) -> Path:
    from harness.checkpoints.derived import without_tensor

    return without_tensor(source, "norm.weight", cache=root)


def zoo(root: Path, source: str) -> Path:
    from harness.checkpoints.zoo import tiny_model

    return tiny_model(source, cache=root)


def reference(root: Path, source: str) -> Path:
    """A run's view of the reference cache: claim the key (waiting for a run that holds it),
    reuse what it stored, or else compute (here: copy ``source``'s result files) and store."""
    from harness.orchestrate import reference as ref

    key, results = "k" + "0" * 19, {role: Path(source) / f"{role}.result.json" for role in ref.CACHED_ROLES}
    with contextlib.ExitStack() as held:
        found = ref.claim(key, root, lambda message: emit("waiting") if "waiting" in message else None, held)
        if found is not None:
            return ref.cache_dir(key, root)
        return ref.save(key, {"test": True}, results, root)  # type: ignore[arg-type]


WRITERS = {"perturbed": perturbed, "control": control, "without": without, "zoo": zoo, "reference": reference}


def main(argv: list[str]) -> None:
    name, root, source = argv[:3]
    made = []
    publish = cache._publish

    def held_publish(staging: Path, dest: Path) -> None:
        made.append(dest)
        if "--hold" in argv:
            emit("staged")
            sys.stdin.readline()
        publish(staging, dest)

    cache._publish = held_publish
    cache._say = lambda message: emit("waiting") if message.startswith("waiting") else None
    path = WRITERS[name](Path(root), source)
    emit("done", path=str(path), reused=not made)


if __name__ == "__main__":
    main(sys.argv[1:])
