"""Small datasets for examples and tests (MNIST), loaded offline-first."""
