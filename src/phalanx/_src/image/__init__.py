"""tf.image's functions on NumPy arrays (the public face is `phalanx.image`)."""
