"""tf.data.experimental's names that phalanx has: `AUTOTUNE`, `AutoShardPolicy`,
`DistributeOptions`, `assert_cardinality`.

Example:
  >>> options = phalanx.data.Options()
  >>> options.experimental_distribute.auto_shard_policy = (
  ...     phalanx.data.experimental.AutoShardPolicy.DATA)
"""

from phalanx._src.data.dataset_sequence import assert_cardinality as assert_cardinality
from phalanx._src.data.executors import AUTOTUNE as AUTOTUNE
from phalanx._src.data.options import AutoShardPolicy as AutoShardPolicy
from phalanx._src.data.options import DistributeOptions as DistributeOptions

__all__ = [
    "AUTOTUNE",
    "AutoShardPolicy",
    "DistributeOptions",
    "assert_cardinality",
]
