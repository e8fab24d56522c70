"""The version adapter (``harness.worker.vllm_compat``): every vLLM name the harness uses resolves
against the installed vLLM, and each fork picks the side the installed vLLM has."""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod

import pytest

from harness.errors import VllmApiError
from harness.worker import vllm_compat


def test_every_vllm_name_the_harness_uses_resolves_here():
    checked = vllm_compat.api_check()
    missing = vllm_compat.missing(checked)
    assert not missing, "the installed vLLM lacks: " + ", ".join(f"{n.name} (used in {n.used_in})" for n in missing)
    # the scan saw the harness's imports, and the moved names were resolved
    assert len(checked) > 40
    assert {"check_enough_kv_cache_memory", "FrontendArgs"} <= {n.name for n in checked}


def test_a_name_the_installed_vllm_lacks_is_listed(tmp_path):
    pkg = tmp_path / "harness" / "arm"
    pkg.mkdir(parents=True)
    (pkg / "planted.py").write_text("from vllm.distributed.weight_transfer.no_such_module import Gone\n")
    (pkg / "ok.py").write_text("from vllm.sampling_params import SamplingParams\n")
    missing = vllm_compat.missing(vllm_compat.api_check(tmp_path / "harness"))
    assert [n.name for n in missing] == ["vllm.distributed.weight_transfer.no_such_module:Gone"]
    assert missing[0].used_in == "harness.arm.planted"


def test_a_moved_name_resolves_from_any_of_its_homes(monkeypatch):
    monkeypatch.setitem(
        vllm_compat.MOVED,
        "environment_variables",
        vllm_compat.MovedName("environment_variables", ("vllm.no_such_module", "vllm.envs"), "test"),
    )
    assert vllm_compat.locate("environment_variables") == "vllm.envs"
    import vllm.envs

    assert vllm_compat.resolve("environment_variables") is vllm.envs.environment_variables


def test_a_moved_name_found_nowhere_names_where_it_looked(monkeypatch):
    monkeypatch.setitem(
        vllm_compat.MOVED, "Gone", vllm_compat.MovedName("Gone", ("vllm.no_such_module", "vllm.envs"), "test")
    )
    with pytest.raises(VllmApiError, match=r"no Gone \(looked in vllm.no_such_module, vllm.envs\)"):
        vllm_compat.resolve("Gone")


def test_module_exists_never_raises_for_a_missing_parent():
    assert vllm_compat.module_exists("vllm.entrypoints")
    assert not vllm_compat.module_exists("vllm.no_such_package.cli_args")


class _WeightSource033(ABC):
    """vLLM 0.33's rule, as its ``WeightSource`` states it: ``metadata`` must be a
    ``functools.cached_property`` (checked at class creation), iteration is ``iter_full``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        metadata = cls.__dict__.get("metadata")
        if metadata is not None and not isinstance(metadata, functools.cached_property):
            raise TypeError(f"{cls.__name__}.metadata must be a functools.cached_property")

    @property
    @abstractmethod
    def metadata(self): ...

    def iter_full(self):
        raise NotImplementedError

    def iter_local(self):
        raise NotImplementedError


def _source_class(monkeypatch, weight_source):
    import vllm.distributed.weight_transfer.base as base

    monkeypatch.setattr(base, "WeightSource", weight_source)
    vllm_compat.weight_source_base.cache_clear()
    try:
        parent = vllm_compat.weight_source_base()
    finally:
        vllm_compat.weight_source_base.cache_clear()

    class Pairs(parent):
        def __init__(self, pairs):
            self.pairs = pairs
            self.asked = 0

        def param_metas(self):
            self.asked += 1
            return [name for name, _ in self.pairs]

        def tensors(self):
            return iter(self.pairs)

    return Pairs


def test_sources_follow_the_033_protocol(monkeypatch):
    pairs = _source_class(monkeypatch, _WeightSource033)([("a", 1), ("b", 2)])
    monkeypatch.setattr(vllm_compat, "weight_source_api", lambda: "full-local")
    assert isinstance(inspect.getattr_static(type(pairs), "metadata"), functools.cached_property)
    assert pairs.metadata == ["a", "b"] and pairs.metadata == ["a", "b"] and pairs.asked == 1  # cached
    assert list(pairs.iter_full()) == list(pairs.iter_local()) == [("a", 1), ("b", 2)]
    assert vllm_compat.source_metadata(pairs) == ["a", "b"]
    assert list(vllm_compat.source_tensors(pairs)) == [("a", 1), ("b", 2)]


def test_a_plain_metadata_method_fails_033s_rule():
    """The planted twin: the 0.32 shape of a source is refused by 0.33's class check."""
    with pytest.raises(TypeError, match="cached_property"):

        class Old(_WeightSource033):
            def metadata(self):
                return []


def test_sources_follow_the_installed_protocol():
    import torch

    from harness.machinery.transfer import TensorSource

    w = torch.ones(2)
    source = TensorSource([("w", w)])
    if vllm_compat.weight_source_api() == "iterable":
        assert source.metadata()[0].name == "w" and list(source) == [("w", w)]
    else:
        assert source.metadata[0].name == "w" and list(source.iter_full()) == [("w", w)]
    assert [m.name for m in vllm_compat.source_metadata(source)] == ["w"]


def test_reload_modes_and_lifecycle_follow_the_installed_vllm():
    import vllm.envs

    has_mode = "VLLM_RELOAD_MODE" in vllm.envs.environment_variables
    assert vllm_compat.supported_reload_modes() == (("layerwise", "direct") if has_mode else ("layerwise",))
    assert (vllm_compat.locate("start_reload") is not None) == has_mode
