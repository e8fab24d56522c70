import functools

import pytest
import torch
from torch import nn

from harness.worker.census import probe_linear_kernels, tensor_digest, walk_model


class KernelObject:
    def __init__(self, scale):
        self.scale = scale
        self.strides = [torch.tensor([1, 2]), torch.tensor([3])]


class QuantMethod:
    def __init__(self):
        self.workspace = torch.zeros(3)
        self.kernel = KernelObject(torch.ones(2))

    def apply(self, layer, x, bias=None):
        return x @ layer.packed.t()


class Hidden(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("buf", torch.zeros(4))
        self.copy = self.weight.detach().clone()
        object.__setattr__(self, "sneaky", torch.ones(4))
        self.listed = [torch.ones(1), (torch.zeros(1),)]
        self.keyed = {"a": torch.ones(2)}
        self.quant_method = QuantMethod()
        self.bound = functools.partial(torch.add, torch.full((2,), 7.0))
        packed = torch.full((3,), 5.0)
        self.kernel_fn = lambda x: x @ packed  # a weight reachable only through a closure
        self.kv_cache = torch.zeros(8)  # per-step state: never part of the census
        self.input_size_per_partition = 4
        self.params_dtype = torch.float32
        self.packed = torch.randn(3, 4)


def test_walk_reaches_hidden_tensors():
    model = nn.Sequential(Hidden())
    names = {e.name: e.kind for e in walk_model(model)}
    expected = {
        "0.weight": "parameter",
        "0.buf": "buffer",
        "0.copy": "attribute",
        "0.sneaky": "attribute",
        "0.listed[0]": "attribute",
        "0.listed[1][0]": "attribute",
        "0.keyed['a']": "attribute",
        "0.quant_method.workspace": "object",
        "0.quant_method.kernel.scale": "object",
        "0.quant_method.kernel.strides[0]": "object",
        "0.bound<partial>.args[0]": "closure",
        "0.kernel_fn<closure>.packed": "closure",
        "0.packed": "attribute",
    }
    for name, kind in expected.items():
        assert names.get(name) == kind, (name, names.get(name))
    assert not any("kv_cache" in n for n in names)


def test_excluded_storage_is_left_out():
    model = nn.Sequential(Hidden())
    kv = model[0].copy
    names = {e.name for e in walk_model(model, frozenset({kv.untyped_storage().data_ptr()}))}
    assert "0.copy" not in names and "0.weight" in names


def test_digest_is_exact_and_layout_independent():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_digest(t.t().contiguous()) == tensor_digest(t.t())
    bumped = t.clone()
    bumped[1, 1] = torch.nextafter(bumped[1, 1], torch.tensor(100.0))
    assert tensor_digest(bumped) != tensor_digest(t)


# The digest algorithms themselves (each one's definition, chunking, the device twin): test_digest.py.


def test_kernel_probe_sees_weights_only_the_kernel_holds():
    model = nn.Sequential(Hidden())
    before = {e.name: tensor_digest(e.tensor) for e in probe_linear_kernels(model)}
    assert list(before) == ["0.<kernel-output>"]
    again = {e.name: tensor_digest(e.tensor) for e in probe_linear_kernels(model)}
    assert again == before  # fixed probe input: deterministic
    with torch.no_grad():
        model[0].packed.mul_(1.01)  # the weight the kernel reads, not a registered parameter
    after = {e.name: tensor_digest(e.tensor) for e in probe_linear_kernels(model)}
    assert after != before


class NoKernelMethod:
    """Like vLLM's CPU unquantized method on an SSM projection: apply needs ``layer.cpu_linear``."""

    def apply(self, layer, x, bias=None):
        return layer.cpu_linear(x, layer.weight, bias)


class SSMProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.quant_method = NoKernelMethod()
        self.input_size_per_partition = 4
        self.params_dtype = torch.float32


def test_a_kernel_that_cannot_be_probed_is_unobserved_and_the_probe_goes_on():
    from harness.records import UnobservedRecord

    model = nn.Sequential(SSMProjection(), Hidden())
    unobserved: list[UnobservedRecord] = []
    entries = probe_linear_kernels(model, unobserved)
    assert [e.name for e in entries] == ["1.<kernel-output>"]  # the layer after it is still probed
    assert len(unobserved) == 1 and unobserved[0].name == "0.<kernel-output>" and unobserved[0].kind == "kernel"
    assert unobserved[0].reason.startswith("AttributeError: ") and "cpu_linear" in unobserved[0].reason
    with pytest.raises(AttributeError):  # without a list to report into, nothing is hidden either: just skipped
        NoKernelMethod().apply(model[0], torch.zeros(1, 4))
    assert [e.name for e in probe_linear_kernels(model)] == ["1.<kernel-output>"]


def test_a_tensor_that_cannot_be_digested_is_unobserved():
    from harness.records import TensorRecord, UnobservedRecord
    from harness.worker.census import CensusEntry, observe_entries, observe_entry

    class NoStorage(torch.Tensor):
        def data_ptr(self):
            raise RuntimeError("no storage here")

    ok = observe_entry(CensusEntry("w", "parameter", torch.ones(2)), rank=1)
    assert isinstance(ok, TensorRecord) and ok.digest == tensor_digest(torch.ones(2))
    assert (ok.name, ok.rank, ok.shape, ok.dtype) == ("w", 1, (2,), "float32")
    bad = observe_entry(CensusEntry("odd", "attribute", torch.ones(2).as_subclass(NoStorage)), rank=1)
    assert isinstance(bad, UnobservedRecord) and bad.reason == "RuntimeError: no storage here" and bad.rank == 1
    # The census's batched call: the same records, in order, and one bad tensor spoils no other.
    entries = [
        CensusEntry("w", "parameter", torch.ones(2)),
        CensusEntry("odd", "attribute", torch.ones(2).as_subclass(NoStorage)),
        CensusEntry("big", "parameter", torch.arange(3 << 20, dtype=torch.float32)),  # a tree of leaves
    ]
    assert observe_entries(entries, rank=1) == [observe_entry(e, rank=1) for e in entries]
    assert [type(r).__name__ for r in observe_entries(entries, rank=1)] == [
        "TensorRecord",
        "UnobservedRecord",
        "TensorRecord",
    ]


def test_checkpoint_names_are_mapped_with_vllms_own_weights_mapper():
    from harness.worker.extension import _vllm_names

    class Mapper:  # vLLM's WeightsMapper(orig_to_new_prefix={"backbone": "model", "mtp": None})
        def map_name(self, key):
            return None if key.startswith("mtp") else key.replace("backbone", "model", 1)

    class NemotronLike(nn.Module):
        hf_to_vllm_mapper = Mapper()

    names = ["backbone.layers.0.norm.weight", "lm_head.weight", "mtp.x"]
    assert _vllm_names(NemotronLike(), names) == {"backbone.layers.0.norm.weight": "model.layers.0.norm.weight"}
    assert _vllm_names(nn.Linear(1, 1), names) == {}  # no mapper: names stay as they are


def _stats_by_definition(t: torch.Tensor) -> tuple[int, float]:
    """NaN count and the largest |value| as float32 with NaN as 0 and an infinity as float32's
    largest, computed the long way (every element, copies and all)."""
    if t.numel() == 0:
        return 0, 0.0
    if t.is_floating_point() or t.is_complex():
        return int(torch.isnan(t).sum()), float(torch.nan_to_num(t.abs().float(), nan=0.0).max())
    return 0, float(t.abs().max()) if t.dtype != torch.bool else 0.0


def _stats_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    cases = [torch.arange(-5, 3), torch.tensor([True, False]), torch.randn(4, dtype=torch.complex64), torch.tensor(2.5)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = torch.randn(1000, generator=g).to(dtype)
        cases += [x, torch.full((5,), -0.0, dtype=dtype)]
        for bad in ({3: "nan"}, {7: "inf"}, {7: "-inf", 9: "nan"}):
            y = x.clone()
            for i, v in bad.items():
                y[i] = float(v)
            cases.append(y)
    cases.append(torch.randn(8, generator=g, dtype=torch.float64) * 1e300)  # beyond float32: its largest
    cases.append(torch.empty(0))
    return cases


@pytest.mark.parametrize("case", range(len(_stats_cases())))
def test_cheap_tensor_stats_equal_their_definition(case):
    from harness.worker.census import nan_count, tensor_stats

    t = _stats_cases()[case]
    assert tensor_stats(t) == _stats_by_definition(t)
    assert nan_count(t) == _stats_by_definition(t)[0]


# --- numbers derived from tensors: the census records them, the judge judges them ------------


class _Kind(__import__("enum").Enum):
    DECODER = "decoder"


class AttentionLike(nn.Module):
    """vLLM's attention layer keeps Python floats taken from its KV-scale tensors at load."""

    def __init__(self, k: float, v: float):
        super().__init__()
        self.register_buffer("_k_scale", torch.tensor(k))
        self._k_scale_float = k
        self._v_scale_float = v
        self._num_blocks_cached = 3  # a private int: derived state, recorded
        self.num_heads = 4  # a public int: configuration, not recorded
        self.use_fp8 = True  # a bool: a flag, never a number
        self.sizes = [1.5, 2.5]  # numbers in a container: configuration, not recorded
        self.impl = KernelObject(torch.ones(1))
        self.impl.softmax_scale = 0.125  # on an object the layer holds: recorded
        self.attn_type = _Kind.DECODER  # an enum member's own ints (_sort_order_) are no state


def test_the_census_records_numeric_attributes_of_modules_and_their_objects():
    from harness.worker.census import walk_numbers

    model = nn.Sequential(AttentionLike(0.05, 0.04))
    got = {e.name: e.value for e in walk_numbers(model)}
    assert got == {
        "0._k_scale_float": 0.05,
        "0._v_scale_float": 0.04,
        "0._num_blocks_cached": 3,
        "0.impl.softmax_scale": 0.125,
    }
    # Tensors stay the tensor walk's: the numbers are records of their own kind.
    assert "0._k_scale" in {e.name for e in walk_model(model)}


def _number_records(k: float):
    from harness.worker.census import observe_number, walk_numbers

    return {r.name: r for r in map(observe_number, walk_numbers(nn.Sequential(AttentionLike(k, 0.04))))}


def test_a_number_is_judged_like_a_tensor_stale_corrupt_and_nan():
    from harness.judge.diff import TensorStatus, classify

    cold_a, cold_b = _number_records(0.05)["0._k_scale_float"], _number_records(0.09)["0._k_scale_float"]
    assert (cold_a.kind, cold_a.dtype, cold_a.shape, cold_a.value) == ("number", "float", (), 0.05)
    assert classify(cold_b, cold_b, cold_a) is TensorStatus.OK
    assert classify(cold_a, cold_b, cold_a) is TensorStatus.STALE  # the refit never reached it
    assert classify(_number_records(0.07)["0._k_scale_float"], cold_b, cold_a) is TensorStatus.CORRUPT
    # The same value to the last bit only: 0.09 and 0.09 + 1 ulp differ.
    assert classify(_number_records(float.fromhex((0.09).hex()[:-1] + "1"))["0._k_scale_float"], cold_b) is (
        TensorStatus.CORRUPT
    )
    nan = _number_records(float("nan"))["0._k_scale_float"]
    assert nan.nan_count == 1 and nan.value is None
    assert classify(nan, nan, cold_a) is TensorStatus.CORRUPT  # a NaN is a difference, even against a NaN
    assert classify(cold_a, cold_a, cold_a) is TensorStatus.UNJUDGEABLE  # equal in A and B: could not be STALE


def test_a_number_record_round_trips_through_the_store(tmp_path):
    from harness import store
    from harness.records import TensorRecord

    record = _number_records(0.05)["0._num_blocks_cached"]
    store.dump(record, tmp_path / "n.json", "tensor")
    back = store.load(TensorRecord, tmp_path / "n.json", "tensor")
    assert back == record and isinstance(back.value, int)


class HeadMethod:
    def apply(self, layer, x, bias=None):
        return x @ layer.packed.t()  # a kernel copy of the weight, as vLLM's CPU head keeps one


class TiedHead(nn.Module):
    """vLLM's ParallelLMHead: no ``input_size_per_partition``, but ``embedding_dim`` and ``tie_weights``."""

    def __init__(self, embedding: nn.Parameter):
        super().__init__()
        self.weight = embedding
        self.embedding_dim = embedding.shape[1]
        self.params_dtype = torch.float32
        self.quant_method = HeadMethod()
        self.packed = embedding.detach().clone()

    def tie_weights(self, embed):
        return self


def test_a_tied_heads_kernel_copy_is_probed():
    embed = nn.Parameter(torch.randn(6, 4))
    model = nn.Sequential(TiedHead(embed))
    (probe,) = probe_linear_kernels(model)
    assert probe.name == "0.<kernel-output>" and probe.tensor.shape == (3, 6)
    model[0].packed.mul_(2.0)  # a stale or fresh copy: the probe's output follows the kernel's copy
    assert tensor_digest(probe_linear_kernels(model)[0].tensor) != tensor_digest(probe.tensor)
