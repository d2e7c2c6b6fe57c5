"""The Keras programs of docs/migration.md run, at test size (data, batch, epochs cut)."""

import re
from pathlib import Path

import numpy as np

import phalanx

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
MARK = "<!-- tested: tests/keras/test_migration_guide.py -->"
BLOCKS = re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", DOC.read_text(), re.S)

# The seeds' sizes, cut so the programs take seconds; every other line runs as written.
CUTS = {
    "PER_REPLICA_BATCH_SIZE = 128": "PER_REPLICA_BATCH_SIZE = 4",
    "EPOCHS = 5": "EPOCHS = 1",
    "STEPS_PER_EPOCH = 60000 // GLOBAL_BATCH_SIZE": "STEPS_PER_EPOCH = 3",
    ".shuffle(60000, seed=0)": ".shuffle(256, seed=0)",
    "phalanx.datasets.mnist.load_data()": "small_mnist()",
    "labels_dataset.batch(BATCH_SIZE)": "labels_dataset.take(2 * BATCH_SIZE).batch(BATCH_SIZE)",
}


def test_the_keras_programs_of_the_guide_run(mnist_path):
    assert len(BLOCKS) == 2
    code = "\n".join(BLOCKS)
    for seed_line, test_line in CUTS.items():
        assert seed_line in code, seed_line
        code = code.replace(seed_line, test_line)

    def small_mnist():
        (x, y), test = phalanx.datasets.mnist.load_data(path=mnist_path)
        return (x[:256], y[:256]), test

    namespace = {"small_mnist": small_mnist}
    exec(compile(code, str(DOC), "exec"), namespace)  # our own doc's code
    assert np.isfinite(namespace["history"].history["loss"]).all()
    assert 0.0 <= float(namespace["accuracy_metric"].result()) <= 1.0
    trained = namespace["model"].module.get_weights()
    assert not np.array_equal(trained[0], namespace["build_model"]().get_weights()[0])
