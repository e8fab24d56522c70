"""The digests (issue 24, part 2): each algorithm is what its name says, independent of the
tensor's layout and of how it is chunked; the device digest's CPU twin agrees with a
recomputation from the bytes; digests of different algorithms are never compared."""

from __future__ import annotations

import dataclasses

import blake3
import pytest
import torch
import xxhash

from harness.errors import CompareError
from harness.judge.diff import one_digest
from harness.worker import digest as digests
from harness.worker.census import tensor_digest
from harness.worker.device_digest import ALGORITHM as DEVICE
from harness.worker.device_digest import device_digest, reference_digest
from tests.records import B, arm, obs

XXH3, BLAKE3 = digests.XXH3, digests.BLAKE3


def row_major(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return bytes((t.reshape(1) if t.dim() == 0 else t).reshape(-1).view(torch.uint8).numpy())


def xxh3_tree(raw: bytes, leaf: int) -> str:
    """xxh3-128-tree from its definition, with nothing of the harness's code."""
    if len(raw) <= leaf:
        return xxhash.xxh3_128_hexdigest(raw)
    leaves = b"".join(xxhash.xxh3_128_digest(raw[i : i + leaf]) for i in range(0, len(raw), leaf))
    return xxhash.xxh3_128_hexdigest(leaves, seed=len(raw))


def layouts(t: torch.Tensor) -> list[torch.Tensor]:
    """The same values in other memory layouts."""
    return [t, t.t().contiguous().t(), t.clone()[::1]]


@pytest.fixture()
def small_leaves(monkeypatch):
    # Leaves of 1000 bytes and host chunks of 1700 (no multiple of a leaf): leaves split between chunks.
    monkeypatch.setattr(digests, "LEAF_BYTES", 1000)
    monkeypatch.setattr(digests, "_HOST_CHUNK_BYTES", 1700)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_xxh3_is_its_tree_definition_for_every_layout_chunking_and_thread_count(small_leaves, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t = torch.randn(64, 48, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)  # 6144 bytes
        expected = xxh3_tree(row_major(t), 1000)
        assert not layouts(t)[1].is_contiguous()
        assert {tensor_digest(x, XXH3) for x in layouts(t)} == {expected}
        small = t[:4]  # 384 bytes, one leaf: the plain xxh3-128 of the bytes
        assert tensor_digest(small, XXH3) == xxhash.xxh3_128_hexdigest(row_major(small))
    finally:
        torch.set_num_threads(before)


def test_xxh3_at_its_real_leaf_size_and_of_edge_tensors():
    t = torch.randn(3 * (1 << 20) + 5, generator=torch.Generator().manual_seed(1))  # 3 leaves and a bit
    assert tensor_digest(t) == xxh3_tree(row_major(t), 4 << 20)
    assert tensor_digest(torch.empty(0)) == xxhash.xxh3_128_hexdigest(b"")
    assert tensor_digest(torch.tensor(3.0)) == xxhash.xxh3_128_hexdigest(row_major(torch.tensor(3.0)))
    assert tensor_digest(torch.tensor([[True, False], [False, True]])) == xxhash.xxh3_128_hexdigest(bytes([1, 0, 0, 1]))
    assert tensor_digest(t[::2]) == xxh3_tree(row_major(t[::2]), 4 << 20)  # a strided view: the values it shows


def test_blake3_is_blake3_of_the_row_major_bytes(small_leaves):
    t = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    expected = blake3.blake3(row_major(t)).hexdigest(length=16)
    assert {tensor_digest(x, BLAKE3) for x in layouts(t)} == {expected}
    assert tensor_digest(torch.empty(0), BLAKE3) == blake3.blake3(b"").hexdigest(length=16)


@pytest.mark.parametrize("algorithm", [XXH3, BLAKE3, DEVICE])
def test_one_flipped_bit_changes_the_digest(algorithm):
    t = torch.randn(300, 70, generator=torch.Generator().manual_seed(2))
    for where in (0, 1234, t.numel() - 1):
        bumped = t.clone()
        bumped.view(-1).view(torch.int32)[where] ^= 1
        assert tensor_digest(bumped, algorithm) != tensor_digest(t, algorithm), where
    assert tensor_digest(t.clone(), algorithm) == tensor_digest(t, algorithm)


class Unreadable(torch.Tensor):
    def data_ptr(self):
        raise RuntimeError("no storage here")


def census_like() -> list[torch.Tensor]:
    """What a census meets, at leaves of 1000 bytes: small tensors, one of exactly a leaf, trees of
    different leaf counts (a leaf digest given to the wrong tensor shows), views, edge tensors."""
    g = torch.Generator().manual_seed(5)
    return [
        torch.randn(7, generator=g),
        torch.randn(250, generator=g),  # exactly one leaf
        torch.randn(1201, generator=g),  # 4804 bytes: 4 leaves and a part
        torch.randn(64, 48, generator=g).to(torch.bfloat16),  # 6144 bytes
        torch.randn(64, 48, generator=g).t(),  # not contiguous, above a leaf
        torch.randn(30, generator=g)[::3],  # not contiguous, small
        torch.tensor(3.0),
        torch.empty(0),
        torch.tensor([True, False, True]),
        torch.randn(4, generator=g)[1:],  # an offset into its storage
        torch.randn(300, generator=g).as_subclass(Unreadable),
        torch.empty(4000, device="meta"),
        torch.randn(3000, generator=g),  # 12000 bytes: 12 leaves
    ]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("algorithm", [XXH3, BLAKE3])
def test_digest_many_gives_each_tensor_its_own_digest_and_a_failure_its_place(small_leaves, threads, algorithm):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tensors = census_like()
        found = digests.digest_many(tensors, algorithm)
    finally:
        torch.set_num_threads(before)
    assert len(found) == len(tensors)
    for t, got in zip(tensors, found):
        if isinstance(t, Unreadable):
            assert isinstance(got, RuntimeError) and str(got) == "no storage here"
        elif t.device.type == "meta":
            assert got == "meta"
        elif algorithm == XXH3:
            assert got == xxh3_tree(row_major(t), 1000), t.shape
        else:
            assert got == blake3.blake3(row_major(t)).hexdigest(length=16), t.shape
    assert digests.digest_many([], algorithm) == []


@pytest.mark.parametrize("numel", [1 << 20, (1 << 20) + 1])  # one leaf; a tree of leaves
@pytest.mark.parametrize("batched", [False, True])
def test_a_contiguous_tensor_is_hashed_in_place(monkeypatch, numel, batched):
    t = torch.ones(numel)
    seen = []
    real = digests._in_place
    monkeypatch.setattr(digests, "_in_place", lambda d, n: seen.append(d.data_ptr()) or real(d, n))
    monkeypatch.setattr(digests, "_bytes_view", lambda d: pytest.fail("copied to the host"))
    assert (digests.digest_many([t]) if batched else [tensor_digest(t)]) == [xxh3_tree(row_major(t), 4 << 20)]
    if not (batched and numel <= 1 << 20):  # the batch reads a small tensor's address inline
        assert seen == [t.data_ptr()]


def _device_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(3, 5, generator=g),
        torch.randn(7, generator=g).to(torch.bfloat16),  # 14 bytes
        torch.tensor(3.5),
        torch.zeros(0),
        torch.randint(-128, 127, (13,), generator=g, dtype=torch.int8),  # an odd byte count
        torch.randn(30, 700, generator=g).t(),  # not contiguous
        torch.tensor([True, False, True]),
        torch.randn(70001, generator=g)[1:],  # an odd offset into its storage, over two blocks
        torch.randint(0, 255, (3 * 65536 * 2 + 5,), generator=g, dtype=torch.uint8)[1:],  # an odd byte offset
    ]


@pytest.mark.parametrize("case", range(len(_device_cases())))
def test_the_device_digests_cpu_twin_agrees_with_the_digest_of_the_bytes(case):
    t = _device_cases()[case]
    assert device_digest(t) == reference_digest(row_major(t))


def test_the_device_digest_streams_rows_and_carries_partial_blocks(monkeypatch):
    from harness.worker import device_digest as dd

    t = torch.randn(50, 3001, generator=torch.Generator().manual_seed(4)).t()  # not contiguous
    whole = device_digest(t)
    monkeypatch.setattr(dd, "_CHUNK_BYTES", 7 * 1000 + 2)  # chunks that split blocks and rows
    assert device_digest(t) == whole == reference_digest(row_major(t))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", range(len(_device_cases())))
def test_the_device_digest_on_cuda_equals_its_cpu_twin(case):
    t = _device_cases()[case]
    on_gpu = t.cuda()
    assert device_digest(on_gpu) == device_digest(t)
    assert tensor_digest(on_gpu, DEVICE) == tensor_digest(t, DEVICE)


def test_auto_means_xxh3_without_cuda_and_names_are_checked():
    if not torch.cuda.is_available():
        assert digests.resolve("auto") == XXH3
    assert digests.resolve("blake3") == BLAKE3 and digests.resolve("device") == DEVICE
    with pytest.raises(ValueError, match="unknown digest 'md5'"):
        digests.resolve("md5")
    with pytest.raises(ValueError, match="unknown digest algorithm"):
        tensor_digest(torch.ones(2), "md5-128")


def with_digest(result, algorithm: str):
    return dataclasses.replace(result, environment=(*result.environment, ("digest", algorithm)))


def test_digests_of_different_algorithms_are_refused():
    ref, subject = arm("reference", "reference", obs("cold_B", B)), arm("subject", "subject", obs("cold_B", B))
    assert one_digest([with_digest(ref, XXH3), with_digest(subject, XXH3)], "run") == XXH3
    assert one_digest([with_digest(ref, XXH3), subject], "run") == XXH3  # an arm that recorded none digested nothing
    with pytest.raises(CompareError, match="different algorithms .*reference: xxh3-128-tree4M, subject: blake3-128"):
        one_digest([with_digest(ref, XXH3), with_digest(subject, BLAKE3)], "run")


def stamp_digests(out, algorithm_of) -> None:
    """Record a digest algorithm in every arm result of a run directory (``algorithm_of(arm)``)."""
    from harness import store
    from harness.records import ArmResult

    for f in (out / "arms").glob("*.result.json"):
        result = store.load(ArmResult, f, "arm_result")
        store.dump(with_digest(result, algorithm_of(result.arm)), f, "arm_result")


def test_a_run_whose_arms_used_different_digests_is_refused_and_its_records_kept(tmp_path):
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS
    from tests.unit.run_dirs import write_run

    write_run(tmp_path / "same")
    stamp_digests(tmp_path / "same", lambda name: BLAKE3)
    same = evaluate(tmp_path / "same", PATHS.get)
    assert all(v.status.value == "PASS" for v in same.verdicts)  # one algorithm: judged
    write_run(tmp_path / "mixed")
    stamp_digests(tmp_path / "mixed", lambda name: BLAKE3 if name == "reference" else XXH3)
    before = {f.name: f.read_bytes() for f in (tmp_path / "mixed" / "arms").iterdir()}
    with pytest.raises(CompareError, match="cannot be compared"):
        evaluate(tmp_path / "mixed", PATHS.get)
    assert {f.name: f.read_bytes() for f in (tmp_path / "mixed" / "arms").iterdir()} == before


def test_builds_digested_with_different_algorithms_are_not_compared(tmp_path):
    from harness.judge.crossbuild import compare_builds
    from harness.judge.evaluate import evaluate
    from harness.paths import PATHS
    from tests.unit.run_dirs import write_run

    for name, algorithm in (("base", XXH3), ("pr", BLAKE3), ("pr2", XXH3)):
        write_run(tmp_path / name)
        stamp_digests(tmp_path / name, lambda arm_name, a=algorithm: a)
    base, pr, pr2 = (evaluate(tmp_path / n, PATHS.get) for n in ("base", "pr", "pr2"))
    assert compare_builds(base, pr2).builds  # one algorithm: compared
    with pytest.raises(CompareError, match="base, pr: the arms digested tensors with different algorithms"):
        compare_builds(base, pr)


def test_the_digest_flag_reaches_every_arm_and_a_wrong_one_is_refused():
    from harness.cli import build_parser
    from harness.cli.run import spec_from_args
    from harness.plan import PathNeeds, make_plan
    from harness.spec.checkpoint_set import CheckpointSet
    from harness.spec.requirements import EngineRequirements

    args = build_parser().parse_args(["run", "--model", "/m", "--digest", "blake3"])
    spec = spec_from_args(args)
    cs = CheckpointSet(a="/a", b="/b", b_control="/c", control_tensor="w")
    plan = make_plan(spec, cs, {"reload_weights": PathNeeds(EngineRequirements(), ("B",))}, {})
    assert spec.digest == "blake3" and {a.digest for a in plan.arms} == {"blake3"}
    assert spec_from_args(build_parser().parse_args(["run", "--model", "/m"])).digest == "auto"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["run", "--digest", "md5"])
    assert exit_info.value.code == 2
