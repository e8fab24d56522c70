"""Reload paths: one class per kind of refit, registered by name, imported on lookup."""

from harness.registry import Registry

PATHS: Registry = Registry("reload path")
for _name, _target in {
    "reload_weights": "reload_weights:ReloadWeightsFromDirectory",
    "reload_weights_iterator": "reload_weights:ReloadWeightsFromIterator",
    "reload_kernel_format": "reload_weights:ReloadKernelFormat",
    "discard_reload": "reload_weights:DiscardThenReload",
    "transfer_gloo": "weight_transfer:TransferGloo",
    "http_reload": "http_reload:HTTPReload",
    "sharded_state": "sharded_state:ShardedStateRoundTrip",
    "dummy_start": "engine_states:DummyStart",
    "prefix_cache": "engine_states:PrefixCacheCoherence",
    "compiled": "engine_states:CompiledReload",
    "sleep_level1": "engine_states:SleepLevel1",
    "sleep_level2": "engine_states:SleepLevel2",
    "transfer_nccl": "weight_transfer:TransferNccl",
    "transfer_ipc": "weight_transfer:TransferIpc",
    "transfer_sparse_nccl": "weight_transfer:TransferSparseNccl",
    "transfer_sharded_rdt": "weight_transfer:TransferShardedRdt",
    "transfer_nccl_m2n": "weight_transfer:TransferNcclM2n",
}.items():
    PATHS.register(_name, f"harness.paths.{_target}")
