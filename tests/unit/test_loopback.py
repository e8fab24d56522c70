"""The gloo group of the weight-transfer path listens on loopback only (it used to listen
on every interface: the TCPStore on ``*:PORT``, gloo's pairs on the host's address)."""

from __future__ import annotations

import ipaddress
import threading

import pytest


def _listening_addresses() -> set[str]:
    import psutil

    return {c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_gloo_transfer_group_listens_on_loopback_only():
    pytest.importorskip("vllm")
    import torch

    from harness.loopback import free_port
    from harness.machinery.transfer import _broadcast, _gloo_group

    before = _listening_addresses()
    port, groups, errors = free_port(), {}, []

    def join(rank: int) -> None:
        try:
            groups[rank] = _gloo_group("127.0.0.1", port, rank, 2)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(groups) == 2, errors
    opened = _listening_addresses() - before
    assert opened, "the group opened no listening socket at all?"
    assert all(ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback for ip in opened), opened

    sent, received = torch.arange(6, dtype=torch.float32), torch.zeros(6)
    senders = [
        threading.Thread(target=_broadcast, args=(groups[0], sent)),
        threading.Thread(target=_broadcast, args=(groups[1], received)),
    ]
    for t in senders:
        t.start()
    for t in senders:
        t.join(timeout=60)
    assert torch.equal(sent, received)  # still a working group


class _JoiningClient:
    """The engine's side of the rendezvous, as vLLM's weight-sync client would drive it:
    rank 1 joins the gloo group at the address the trainer hands over."""

    def __init__(self) -> None:
        self.joined_port = None
        self.group = None

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        from harness.machinery.transfer import _gloo_group

        self.joined_port = init_info["master_port"]
        self.group = _gloo_group(
            init_info["master_address"], init_info["master_port"], init_info["rank_offset"], init_info["world_size"]
        )


def test_a_port_taken_by_another_process_cannot_fail_the_gloo_transfer(monkeypatch, tmp_path):
    """Another process takes the port the harness would have picked, between the pick and the
    trainer's bind (here: before it, so the race always loses). The trainer binds port 0 and
    hands the kernel's pick to the workers, so the group still forms and carries tensors; with
    a picked port the bind raised EADDRINUSE and the path was ERROR."""
    pytest.importorskip("vllm")
    import socket

    import torch
    from vllm.plugins import load_general_plugins

    from harness import loopback
    from harness.machinery.transfer import CheckpointSource, _broadcast, trainer_init_info
    from harness.paths import PATHS
    from harness.worker.vllm_private import trainer_engine_class
    from tests.unit.test_transfer_contracts import CHECKPOINTS

    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    monkeypatch.setattr(loopback, "free_port", lambda: taken)
    try:
        load_general_plugins()  # registers the gloo trainer engine
        fields = PATHS.get("transfer_gloo")(CHECKPOINTS).trainer_fields(world_size=2)
        client = _JoiningClient()
        trainer = trainer_engine_class("gloo").trainer_init(
            trainer_init_info("gloo", fields), client=client, source=CheckpointSource(tmp_path)
        )
        assert client.joined_port not in (None, 0, taken)
        sent, received = torch.arange(4, dtype=torch.float32), torch.zeros(4)
        threads = [
            threading.Thread(target=_broadcast, args=(trainer.group, sent)),
            threading.Thread(target=_broadcast, args=(client.group, received)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert torch.equal(sent, received)
    finally:
        squatter.close()


def test_local_ray_keeps_clusters_disabled_only_while_it_starts(monkeypatch):
    """The switch that keeps Ray on loopback is inherited by Ray's daemons, and must not stay
    in our environment: a later ``ray start --address`` from this process (a test's second
    node) would refuse to join ("Multi-node Ray clusters are not supported")."""
    ray = pytest.importorskip("ray")
    import os

    from harness.ray_local import init_local_ray

    seen = []
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", raising=False)
    monkeypatch.setattr(
        ray,
        "init",
        lambda **options: seen.append(
            (os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), options["_node_ip_address"], options["num_cpus"])
        ),
    )
    init_local_ray(ray, num_cpus=1)
    assert seen == [("0", "127.0.0.1", 1)]
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ


def test_free_ports_are_distinct_loopback_ports_left_unbound():
    """The one port picker: n ports at once never repeat (each socket is held until all are
    picked), and none is left bound, so the caller can bind each one itself."""
    import socket

    from harness.loopback import free_port, free_ports

    ports = free_ports(8)
    assert len(set(ports)) == 8 and all(1024 <= p < 65536 for p in ports), ports
    for port in [*ports, free_port()]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # raises EADDRINUSE if the picker kept it


class _ReceivingClient(_JoiningClient):
    """The engine's side of a whole update round trip. ``refuse_at``: the index of the tensor
    whose load raises, as vLLM's ``load_weights`` does mid-stream (the AMX MLA error on
    DeepSeek-V2); None receives every tensor."""

    def __init__(self, refuse_at: int | None) -> None:
        import threading

        super().__init__()
        self.refuse_at = refuse_at
        self.received: list = []
        # Set by the sender's source when it hands over tensor ``refuse_at``: only then is the
        # sender past its previous broadcast and bound to start this one, which the test
        # completes afterwards. Refusing earlier can fail the sender on the previous tensor,
        # whose broadcast then leaves nothing to complete (measured in CI: a 300 s gloo timeout).
        self.sender_reached_refusal = threading.Event()

    def start_weight_update(self) -> None:
        pass

    def update_weights(self, update_info: dict) -> None:
        import torch

        from harness.machinery.transfer import _broadcast

        for i, (dtype, shape) in enumerate(zip(update_info["dtype_names"], update_info["shapes"])):
            if i == self.refuse_at:
                assert self.sender_reached_refusal.wait(timeout=30), "the sender never reached the refused tensor"
                raise RuntimeError(f"the engine refused tensor {i}")
            weight = torch.empty(shape, dtype=getattr(torch, dtype))
            _broadcast(self.group, weight, root=0)
            self.received.append(weight)

    def finish_weight_update(self) -> None:
        pass


@pytest.mark.parametrize("refuse_at", [None, 1], ids=["receives-all", "refuses-mid-stream"])
def test_the_gloo_sender_reports_its_receivers_error_at_once(refuse_at):
    """A receiver that raises mid-stream: the trainer's send raises the receiver's own error
    within seconds. Before, it waited out the group's 300 s timeout and reported gloo's "Timed
    out waiting ... for send operation", hiding vLLM's words. The twin receives every tensor."""
    pytest.importorskip("vllm")
    import time

    import torch
    from vllm.plugins import load_general_plugins

    from harness.machinery.transfer import TensorSource, _broadcast, trainer_init_info
    from harness.paths import PATHS
    from harness.worker.vllm_private import trainer_engine_class
    from tests.unit.test_transfer_contracts import CHECKPOINTS

    load_general_plugins()
    tensors = [(f"w{i}", torch.full((3,), float(i))) for i in range(3)]
    client = _ReceivingClient(refuse_at)

    class SignallingSource(TensorSource):
        def tensors(self):
            for i, pair in enumerate(self.pairs):
                if i == refuse_at:
                    client.sender_reached_refusal.set()
                yield pair

    fields = PATHS.get("transfer_gloo")(CHECKPOINTS).trainer_fields(world_size=2)
    trainer = trainer_engine_class("gloo").trainer_init(
        trainer_init_info("gloo", fields), client=client, source=SignallingSource(tensors)
    )
    started = time.monotonic()
    if refuse_at is None:
        trainer.send_weights()
        assert [w.tolist() for w in client.received] == [t.tolist() for _, t in tensors]
        return
    with pytest.raises(RuntimeError, match=f"the engine refused tensor {refuse_at}"):
        trainer.send_weights()
    assert time.monotonic() - started < 30
    # Complete the sender's orphaned broadcast, so no gloo work outlives the test.
    _broadcast(client.group, torch.empty(3), root=0)
