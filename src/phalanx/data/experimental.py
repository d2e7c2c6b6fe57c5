"""tf.data.experimental's names that phalanx has (`AUTOTUNE`, `AutoShardPolicy`,
`DistributeOptions`, `assert_cardinality`), and sequence packing for transformers
(`pack_sequences`, `segment_attention_mask`).

Example:
  >>> options = phalanx.data.Options()
  >>> options.experimental_distribute.auto_shard_policy = (
  ...     phalanx.data.experimental.AutoShardPolicy.DATA)
  >>> packed = phalanx.data.experimental.pack_sequences(token_ds, 128).batch(32)
"""

from phalanx._src.data.dataset_sequence import assert_cardinality as assert_cardinality
from phalanx._src.data.executors import AUTOTUNE as AUTOTUNE
from phalanx._src.data.options import AutoShardPolicy as AutoShardPolicy
from phalanx._src.data.options import DistributeOptions as DistributeOptions
from phalanx._src.data.packing import pack_sequences as pack_sequences
from phalanx._src.data.packing import segment_attention_mask as segment_attention_mask

__all__ = [
    "AUTOTUNE",
    "AutoShardPolicy",
    "DistributeOptions",
    "assert_cardinality",
    "pack_sequences",
    "segment_attention_mask",
]
