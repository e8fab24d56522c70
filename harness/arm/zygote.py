"""A warm interpreter that forks arms: ``python -m harness.arm.zygote SOCKET [NAME [POOL]]``.

Importing vLLM takes 9-12 s of one core on the 2-core CI machine, of an arm's 13 s with
the tiny models the suite runs (measured: ``from vllm import LLM`` alone, 11.8 s; a forked arm
of the embedded Qwen3, 4.3 s). The zygote imports vLLM, torch and the arm's modules once (the
parent keeps one per interpreter and environment, for all its runs), and then forks each arm
from that state. The forked arm is the same program as
``python -m harness.arm.process PLAN RESULT``: it leads a process group of its own, writes its
own log, takes the arm's environment (``RUN_MARKER`` included), and is named ``refit-arm``.

Per request (one JSON line on a connection of the Unix socket) the zygote forks a waiter,
which forks the arm, answers ``{"pid": ARM}`` once the arm leads its group and carries its
run's marker, and, when the arm ends, ``{"exit": CODE}``
(a negative code for a signal, as ``subprocess`` says it). The waiter kills the arm's group
when the connection closes without an answer being read (the parent died), and the zygote
ends when its parent does (``harness.orchestrate.forking`` says which arms it forks). A pooled
zygote (``POOL``, a pool's directory) ends when the pool's owner does or the directory goes, and
its arms write their run's marker over its placeholder (``stamp_marker``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from harness.settings import ARMS_LANE, FORKED_ARM_ENV, MARKER_PLACEHOLDER, POOL_OWNER_FILE, RUN_MARKER

_PRELOAD = ("torch", "vllm", "harness.arm.process", "harness.arm.engines", "harness.worker.extension")


def preload() -> None:
    import importlib

    for name in _PRELOAD:
        importlib.import_module(name)
    from vllm import LLM, SamplingParams  # noqa: F401  (vLLM's lazy top-level names load most of it)

    warm_compiler_facts()
    # vLLM collects and freezes the heap as its engine starts (``freeze_gc_heap``): frozen here,
    # that collection walks only what the arm made, not the 640,000 objects of this preload
    # (0.35 s of a core in every arm, measured on the AMX Xeon).
    gc.collect()
    gc.freeze()


def warm_compiler_facts() -> None:
    """What torch's compiler works out once per process, first needed at an arm's first
    request (vLLM's sampler gathers logprobs through ``torch.compile``): the hashes of torch's
    and Triton's sources, which key its caches, and the CPU's vector ISA, probed by building a
    test library. Worked out here, every forked arm inherits them (0.5 s of a core per arm,
    measured with py-spy on the AMX Xeon). Facts of the installed files and the CPU only: no
    compiled code is shared."""
    from torch._inductor import codecache, cpu_vec_isa

    codecache.torch_key()
    codecache.triton_key()
    cpu_vec_isa.pick_vec_isa()


def stamp_marker(old: str, new: str) -> bool:
    """Write ``RUN_MARKER=new`` over ``RUN_MARKER=old`` (the same length) in this process's
    environment block as it started, which is what ``/proc/PID/environ`` shows and where a
    cancelled run looks for its processes; ``os.environ`` is only a copy. False where the block
    has no such entry."""
    if len(old) != len(new):
        raise ValueError(f"a marker of {len(new)} characters cannot replace one of {len(old)}")
    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5), fields 50 and 51)
    entry = f"{RUN_MARKER}={old}".encode()
    with open("/proc/self/mem", "r+b", buffering=0) as memory:
        memory.seek(start)
        block = b"\0" + memory.read(end - start)
        at = block.find(b"\0" + entry + b"\0")
        if at < 0:
            return False
        memory.seek(start + at + len(entry) - len(old))
        memory.write(new.encode())
    return True


def _owner_alive(pool: Path, owner: int) -> bool:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return pool.is_dir()


def serve(path: str, lane: str, pool: Path | None = None) -> None:
    parent = os.getppid()
    owner = int((pool / POOL_OWNER_FILE).read_text()) if pool else 0
    if pool and not stamp_marker(MARKER_PLACEHOLDER, MARKER_PLACEHOLDER):
        # The pool's arms write their marker here: a zygote that cannot must not serve them.
        raise RuntimeError(f"{RUN_MARKER}={MARKER_PLACEHOLDER} is not in this process's environment block")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # ready: the parent connects once the name exists
    while _owner_alive(pool, owner) if pool else os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.5)
        if not ready:
            continue
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _wait_for_arm(conn, lane)  # never returns
        conn.close()


def _read_request(conn: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            os._exit(0)
        data += chunk
    return json.loads(data)


def _wait_for_arm(conn: socket.socket, lane: str) -> None:
    """The waiter: fork the arm, say its pid and then its exit code."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request = _read_request(conn)
    settled, settled_w = os.pipe()
    arm = os.fork()
    if arm == 0:
        conn.close()
        os.close(settled)
        _run_arm(request, lane, settled_w)  # never returns
    os.close(settled_w)
    # The pid is answered once the arm leads its own group and carries its run's marker: the
    # parent records it where a cancelled run looks for both (EOF too: an arm that died first).
    os.read(settled, 1)
    os.close(settled)
    conn.sendall(json.dumps({"pid": arm}).encode() + b"\n")
    while True:
        done, status = os.waitpid(arm, os.WNOHANG)
        if done:
            try:
                conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            finally:
                os._exit(0)
        readable, _, _ = select.select([conn], [], [], 0.2)
        if readable and not conn.recv(1):  # the parent is gone: so is its arm
            try:
                os.killpg(arm, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            os.waitpid(arm, 0)
            os._exit(0)


def _run_arm(request: dict, lane: str, settled: int) -> None:
    """The arm: what ``python -m harness.arm.process PLAN RESULT`` does, in this warm process.
    It writes to ``settled`` once it leads its group and carries its run's marker."""
    import atexit
    import traceback

    os.setsid()
    if RUN_MARKER in request["env"] and request["env"][RUN_MARKER] != MARKER_PLACEHOLDER:
        stamp_marker(MARKER_PLACEHOLDER, request["env"][RUN_MARKER])  # a pooled zygote's arm
    os.write(settled, b"1")
    os.close(settled)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    # The zygote's environment, as its interpreter (a build's launcher too) started it, and the
    # arm's own variables on top (harness.orchestrate.forking sends only those).
    os.environ.update(request["env"])
    os.environ[FORKED_ARM_ENV] = lane
    argv = [request["plan"], request["result"]]
    sys.argv = ["harness.arm.process", *argv]
    # Named in `ps -o comm` only: setproctitle would also blank /proc/PID/environ, where a
    # cancelled run finds its arms by their run marker (harness.orchestrate.runner.run_processes).
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text("refit-arm")
    code = 1
    try:
        from harness.arm.process import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def main(argv: list[str]) -> int:
    started = time.monotonic()
    preload()
    print(f"refit-harness zygote: preloaded in {time.monotonic() - started:.1f} s", flush=True)
    serve(argv[0], argv[1] if len(argv) > 1 else ARMS_LANE, Path(argv[2]) if len(argv) > 2 else None)
    # Frozen objects outlive the interpreter's teardown, and Triton's bindings report them as leaks.
    gc.unfreeze()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
