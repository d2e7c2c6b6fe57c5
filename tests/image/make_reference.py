"""Writes reference.npz: TF's outputs on image_cases' inputs (run once, with TensorFlow).

python tests/image/make_reference.py
"""

from __future__ import annotations

import numpy as np
from image_cases import REFERENCE, STORED_BYTES, all_inputs, cases

if __name__ == "__main__":
    import tensorflow as tf

    values = all_inputs()
    arrays = {
        "input_jpeg": np.frombuffer(values["jpeg"], np.uint8),
        "input_png": np.frombuffer(values["png"], np.uint8),
    }
    for name, _, tf_fn, _ in cases():
        output = np.asarray(tf_fn(tf, values))
        if output.nbytes <= STORED_BYTES:  # keeps the file a few KB
            arrays[name] = output
    np.savez_compressed(REFERENCE, **arrays)
    print(f"wrote {REFERENCE}: {len(arrays)} arrays")
