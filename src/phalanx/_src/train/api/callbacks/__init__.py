"""Callbacks: Keras's hooks and built-in callbacks, cheap when unused."""
