"""Input pipelines: tf.data-style datasets, foreign-source adapters, device prefetch.

Example:
  >>> from phalanx import data
  >>> ds = data.Dataset.from_tensor_slices((x, y)).shuffle(60000, seed=0).batch(1024)
  >>> with data.DevicePrefetcher(ds.process_split(), put_fn) as batches:
  ...     for batch in batches:
  ...         ...
"""

from phalanx._src.data.adapters import Batches as Batches
from phalanx._src.data.adapters import BatchIterator as BatchIterator
from phalanx._src.data.adapters import as_batches as as_batches
from phalanx._src.data.dataset import AUTOTUNE as AUTOTUNE
from phalanx._src.data.dataset import Dataset as Dataset
from phalanx._src.data.dataset_ops import UNKNOWN_CARDINALITY as UNKNOWN_CARDINALITY
from phalanx._src.data.files import read_file as read_file
from phalanx._src.data.images import decode_image as decode_image
from phalanx._src.data.images import decode_jpeg as decode_jpeg
from phalanx._src.data.images import decode_png as decode_png
from phalanx._src.data.images import image_dataset_from_directory as image_dataset_from_directory
from phalanx._src.data.iterator import DatasetIterator as DatasetIterator
from phalanx._src.data.iterator import Optional as Optional
from phalanx._src.data.options import Options as Options
from phalanx._src.data.options import TensorSpec as TensorSpec
from phalanx._src.data.prefetch import DevicePrefetcher as DevicePrefetcher
from phalanx._src.data.wait import InputBoundWarning as InputBoundWarning
from phalanx._src.data.wait import InputWaitMeter as InputWaitMeter
from phalanx._src.data.workers import RemoteTraceback as RemoteTraceback
from phalanx.data import experimental as experimental

__all__ = [
    "AUTOTUNE",
    "BatchIterator",
    "Batches",
    "Dataset",
    "DatasetIterator",
    "DevicePrefetcher",
    "InputBoundWarning",
    "InputWaitMeter",
    "Optional",
    "Options",
    "RemoteTraceback",
    "TensorSpec",
    "UNKNOWN_CARDINALITY",
    "as_batches",
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "experimental",
    "image_dataset_from_directory",
    "read_file",
]
