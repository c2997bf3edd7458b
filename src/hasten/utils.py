"""Split by subject in hasten 0.2; these names stay here for code written against hasten 0.1:
seeds in hasten.seeding, CPU features in hasten.hardware, device and precision rules in
hasten.runtime, batches in hasten.data.batches, sharded tensors in hasten.distributed.tensors."""
from .data.batches import (batch_size, forward, index_batch, inputs_targets, shard_batch, share_range,  # noqa: F401
                           split_batch, to_device)
from .distributed.tensors import gather_whole, is_dtensor, local_tensors, sharded_like  # noqa: F401
from .hardware import BF16_CPU_FLAGS, cpu_flags, cpu_has_bf16, cpu_name  # noqa: F401
from .runtime import resolve_device, resolve_precision  # noqa: F401
from .seeding import derive_seed, seed_everything  # noqa: F401
