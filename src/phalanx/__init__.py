"""phalanx: tf.distribute's programming model on JAX."""
