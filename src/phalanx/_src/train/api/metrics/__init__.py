"""Metrics: Keras's API, Flax NNX state made of sums, additive merge across replicas."""
