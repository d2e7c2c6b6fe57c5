"""`phalanx train`: the main job. The first seed's MNIST model, on the resolved strategy."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HELP = "train the seed's MNIST model on every device found, and report test accuracy"
MODELS = ("mlp", "cnn")


def configure(parser: argparse.ArgumentParser) -> None:
    """Add train's arguments to its subparser."""
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument(
        "--batch-size-per-replica",
        type=int,
        default=128,
        help="examples per replica per step; the global batch is this x replicas (128)",
    )
    parser.add_argument(
        "--precision",
        default="float32",
        choices=("float32", "mixed_bfloat16", "mixed_float16"),
    )
    parser.add_argument(
        "--steps-per-execution",
        default="1",
        help="optimizer steps per compiled call: a positive int or 'auto' (default 1)",
    )
    parser.add_argument(
        "--learning-rate",
        default="auto",
        help="Adam's peak learning rate, or 'auto': 2e-3 x global batch / 128 (the linear "
        "scaling rule), reached after one epoch of warm-up and cosine-decayed to 0",
    )
    parser.add_argument("--model", default="mlp", choices=MODELS)
    parser.add_argument("--data-dir", default=None, help="folder holding mnist.npz")
    parser.add_argument("--logdir", default="runs", help="TensorBoard logs and checkpoints go here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--platform", default=None, help="force tpu, gpu or cpu")
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help="split the CPU into N devices (replicas), e.g. 8 to try data parallelism",
    )
    parser.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2))
    parser.add_argument("--json", action="store_true", help="end with one JSON line of results")


def _steps_per_execution(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise SystemExit(
            f"phalanx train: --steps-per-execution must be a positive int or 'auto', got {value!r}"
        )
    return number


def learning_rate(value: str, global_batch: int, steps_per_epoch: int, epochs: int) -> Any:
    """A float, or for 'auto' the seeds' linear scaling rule with warm-up and cosine decay.

    Large global batches need a proportionally larger learning rate (the second seed's
    "linear scaling rule"); one epoch of warm-up keeps the first steps stable and the cosine
    decay to zero settles the last ones. Base: 2e-3 at a global batch of 128.
    """
    import optax

    if value != "auto":
        try:
            rate = float(value)
        except ValueError:
            rate = 0.0
        if not rate > 0:
            raise SystemExit(f"phalanx train: --learning-rate must be > 0 or 'auto', got {value!r}")
        return rate
    peak = 2e-3 * global_batch / 128
    total = steps_per_epoch * epochs
    return optax.warmup_cosine_decay_schedule(0.0, peak, min(steps_per_epoch, total - 1), total)


def build_module(name: str, seed: int) -> Any:
    """The network: the seed's 784-128-10 MLP, or a small convnet."""
    import jax
    from flax import nnx

    rngs = nnx.Rngs(seed)

    class MLP(nnx.Module):
        def __init__(self) -> None:
            self.hidden = nnx.Linear(784, 128, rngs=rngs)
            self.out = nnx.Linear(128, 10, rngs=rngs)

        def __call__(self, x):
            return self.out(jax.nn.relu(self.hidden(x.reshape(x.shape[0], -1))))

    class CNN(nnx.Module):
        def __init__(self) -> None:
            self.conv1 = nnx.Conv(1, 32, (3, 3), rngs=rngs)
            self.conv2 = nnx.Conv(32, 64, (3, 3), rngs=rngs)
            self.out = nnx.Linear(7 * 7 * 64, 10, rngs=rngs)

        def __call__(self, x):
            x = x.reshape(x.shape[0], 28, 28, 1)
            x = nnx.max_pool(jax.nn.relu(self.conv1(x)), (2, 2), (2, 2))
            x = nnx.max_pool(jax.nn.relu(self.conv2(x)), (2, 2), (2, 2))
            return self.out(x.reshape(x.shape[0], -1))

    return MLP() if name == "mlp" else CNN()


def run(args: argparse.Namespace) -> int:
    """Train, evaluate, report; 0 on success."""
    steps_per_execution = _steps_per_execution(args.steps_per_execution)
    if args.epochs < 1 or args.batch_size_per_replica < 1:
        raise SystemExit("phalanx train: --epochs and --batch-size-per-replica must be >= 1")

    import numpy as np

    import phalanx

    # Data first: a missing file is one clear error before any device is touched.
    try:
        (x_train, y_train), (x_test, y_test) = phalanx.datasets.mnist.load_data(
            data_dir=args.data_dir
        )
    except (FileNotFoundError, ValueError) as error:
        print(f"phalanx train: {error}", file=sys.stderr)
        return 2
    topology = phalanx.cluster.resolve(args.platform, cpu_devices=args.cpu_devices)
    print(topology.summary())
    strategy = phalanx.Strategy()
    global_batch = args.batch_size_per_replica * strategy.num_replicas_in_sync
    print(
        f"replicas: {strategy.num_replicas_in_sync}  global batch: {global_batch} "
        f"({args.batch_size_per_replica} per replica)  model: {args.model}  "
        f"precision: {args.precision}"
    )

    def prepare(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return x.reshape(len(x), 784).astype(np.float32) / 255.0, y.astype(np.int32)

    train = phalanx.data.Dataset.from_tensor_slices(prepare(x_train, y_train))
    train = train.shuffle(len(x_train), seed=args.seed).batch(global_batch)
    test = phalanx.data.Dataset.from_tensor_slices(prepare(x_test, y_test)).batch(global_batch)

    run_dir = Path(args.logdir) / time.strftime("mnist-%Y%m%d-%H%M%S")
    rate = learning_rate(args.learning_rate, global_batch, len(train), args.epochs)
    with strategy.scope():
        model = phalanx.Model(build_module(args.model, args.seed))
        model.compile(
            optimizer=phalanx.optimizers.get("adam", learning_rate=rate),
            loss=phalanx.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
            precision=args.precision,
        )
    callbacks = [
        phalanx.callbacks.TensorBoard(str(run_dir / "tensorboard")),
        phalanx.callbacks.ModelCheckpoint(run_dir / "checkpoints", monitor="loss", max_to_keep=1),
    ]
    verbose = args.verbose if args.verbose is not None else (0 if args.json else 1)
    start = time.perf_counter()
    history = model.fit(train, epochs=args.epochs, callbacks=callbacks, verbose=verbose)
    seconds = time.perf_counter() - start
    results = model.evaluate(test, verbose=0, return_dict=True)
    throughput = history.history["examples_per_second"]
    report = {
        "test_accuracy": results["accuracy"],
        "test_loss": results["loss"],
        "examples_per_second": max(throughput),
        "train_seconds": seconds,
        "epochs": args.epochs,
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": global_batch,
        "model": args.model,
        "precision": args.precision,
        "run_dir": str(run_dir),
        "topology": topology.to_dict(),
    }
    print(f"logs and checkpoint: {run_dir}")
    print(
        f"examples/s {report['examples_per_second']:.0f} (best epoch)  train time {seconds:.1f} s"
    )
    print(f"test accuracy {results['accuracy']:.4f}  test loss {results['loss']:.4f}")
    if args.json:
        print(json.dumps(report, default=str))
    return 0
