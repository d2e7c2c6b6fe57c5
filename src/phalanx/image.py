"""tf.image's functions on NumPy arrays, for input pipelines: decode, crop, resize, jitter.

A TF preprocessing function ports with renames (`tf.image.resize` -> `image.resize`,
`tf.io.decode_jpeg` -> `image.decode_jpeg`). JPEGs decode with libjpeg-turbo through
simplejpeg (the GIL released; Pillow where simplejpeg is missing), the bilinear resize
runs in OpenCV where it is installed, and `decode_crop_resize_flip` /
`decode_random_resized_crop` do TF's ResNet training crop in one native call into uint8;
`backends()` says which library computes each path's pixels.
Random ops inside `Dataset.map` are reproducible: they draw from a stream keyed by the
element's position.

Example:
  >>> from phalanx import data, image
  >>> def preprocess(record):
  ...     pixels = image.decode_random_resized_crop(record["image/encoded"], (224, 224))
  ...     return pixels, record["image/class/label"]
  >>> ds = records.map(preprocess, num_parallel_calls=data.AUTOTUNE).batch(64)
"""

from phalanx._src.image.backends import backends as backends
from phalanx._src.image.boxes import sample_distorted_bounding_box as sample_distorted_bounding_box
from phalanx._src.image.boxes import (
    stateless_sample_distorted_bounding_box as stateless_sample_distorted_bounding_box,
)
from phalanx._src.image.color import adjust_brightness as adjust_brightness
from phalanx._src.image.color import adjust_contrast as adjust_contrast
from phalanx._src.image.color import adjust_hue as adjust_hue
from phalanx._src.image.color import adjust_saturation as adjust_saturation
from phalanx._src.image.color import convert_image_dtype as convert_image_dtype
from phalanx._src.image.color import hsv_to_rgb as hsv_to_rgb
from phalanx._src.image.color import per_image_standardization as per_image_standardization
from phalanx._src.image.color import random_brightness as random_brightness
from phalanx._src.image.color import random_contrast as random_contrast
from phalanx._src.image.color import random_hue as random_hue
from phalanx._src.image.color import random_saturation as random_saturation
from phalanx._src.image.color import rgb_to_hsv as rgb_to_hsv
from phalanx._src.image.color import stateless_random_brightness as stateless_random_brightness
from phalanx._src.image.color import stateless_random_contrast as stateless_random_contrast
from phalanx._src.image.color import stateless_random_hue as stateless_random_hue
from phalanx._src.image.color import stateless_random_saturation as stateless_random_saturation
from phalanx._src.image.decode import decode_and_crop_jpeg as decode_and_crop_jpeg
from phalanx._src.image.decode import decode_image as decode_image
from phalanx._src.image.decode import decode_jpeg as decode_jpeg
from phalanx._src.image.decode import decode_png as decode_png
from phalanx._src.image.decode import extract_jpeg_shape as extract_jpeg_shape
from phalanx._src.image.fused import decode_crop_resize_flip as decode_crop_resize_flip
from phalanx._src.image.fused import decode_random_resized_crop as decode_random_resized_crop
from phalanx._src.image.geometry import central_crop as central_crop
from phalanx._src.image.geometry import crop_to_bounding_box as crop_to_bounding_box
from phalanx._src.image.geometry import flip_left_right as flip_left_right
from phalanx._src.image.geometry import flip_up_down as flip_up_down
from phalanx._src.image.geometry import random_crop as random_crop
from phalanx._src.image.geometry import random_flip_left_right as random_flip_left_right
from phalanx._src.image.geometry import random_flip_up_down as random_flip_up_down
from phalanx._src.image.geometry import stateless_random_crop as stateless_random_crop
from phalanx._src.image.geometry import (
    stateless_random_flip_left_right as stateless_random_flip_left_right,
)
from phalanx._src.image.geometry import (
    stateless_random_flip_up_down as stateless_random_flip_up_down,
)
from phalanx._src.image.resize import ResizeMethod as ResizeMethod
from phalanx._src.image.resize import resize as resize

__all__ = [
    "ResizeMethod",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_hue",
    "adjust_saturation",
    "backends",
    "central_crop",
    "convert_image_dtype",
    "crop_to_bounding_box",
    "decode_and_crop_jpeg",
    "decode_crop_resize_flip",
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "decode_random_resized_crop",
    "extract_jpeg_shape",
    "flip_left_right",
    "flip_up_down",
    "hsv_to_rgb",
    "per_image_standardization",
    "random_brightness",
    "random_contrast",
    "random_crop",
    "random_flip_left_right",
    "random_flip_up_down",
    "random_hue",
    "random_saturation",
    "resize",
    "rgb_to_hsv",
    "sample_distorted_bounding_box",
    "stateless_random_brightness",
    "stateless_random_contrast",
    "stateless_random_crop",
    "stateless_random_flip_left_right",
    "stateless_random_flip_up_down",
    "stateless_random_hue",
    "stateless_random_saturation",
    "stateless_sample_distorted_bounding_box",
]
