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
from phalanx._src.data.records.array_record import ArrayRecordDataset as ArrayRecordDataset
from phalanx._src.data.records.example import FixedLenFeature as FixedLenFeature
from phalanx._src.data.records.example import SparseTensorValue as SparseTensorValue
from phalanx._src.data.records.example import VarLenFeature as VarLenFeature
from phalanx._src.data.records.example import make_example as make_example
from phalanx._src.data.records.example import parse_example as parse_example
from phalanx._src.data.records.example import parse_single_example as parse_single_example
from phalanx._src.data.records.example import string as string
from phalanx._src.data.records.tfrecord_dataset import TFRecordDataset as TFRecordDataset
from phalanx._src.data.records.tfrecord_io import DataLossError as DataLossError
from phalanx._src.data.records.tfrecord_io import TFRecordWriter as TFRecordWriter
from phalanx._src.data.stream_checks import DroppedElementsWarning as DroppedElementsWarning
from phalanx._src.data.wait import InputBoundWarning as InputBoundWarning
from phalanx._src.data.wait import InputWaitMeter as InputWaitMeter
from phalanx._src.data.workers import RemoteTraceback as RemoteTraceback
from phalanx.data import experimental as experimental

__all__ = [
    "AUTOTUNE",
    "ArrayRecordDataset",
    "BatchIterator",
    "Batches",
    "DataLossError",
    "Dataset",
    "DatasetIterator",
    "DevicePrefetcher",
    "DroppedElementsWarning",
    "FixedLenFeature",
    "InputBoundWarning",
    "InputWaitMeter",
    "Optional",
    "Options",
    "RemoteTraceback",
    "SparseTensorValue",
    "TFRecordDataset",
    "TFRecordWriter",
    "TensorSpec",
    "UNKNOWN_CARDINALITY",
    "VarLenFeature",
    "as_batches",
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "experimental",
    "image_dataset_from_directory",
    "make_example",
    "parse_example",
    "parse_single_example",
    "read_file",
    "string",
]
