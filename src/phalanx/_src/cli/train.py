"""`phalanx train`: the main job. MNIST (or the embedded digits, or your own model and data)
on the resolved strategy; reports test metrics, the FLOP rate, and saves the curves."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from phalanx._src.cli import sources

HELP = "train a model (MNIST's MLP by default) on every device found, and report test metrics"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add train's arguments to its subparser."""
    parser.add_argument("--epochs", type=int, default=5, help="epochs to train (default 5)")
    parser.add_argument(
        "--batch-size-per-replica",
        type=_positive_int,
        default=None,
        help="examples per replica per step; the global batch is this x replicas (default "
        "128; 16 on the small digits dataset)",
    )
    parser.add_argument(
        "--find-batch-size",
        action="store_true",
        help="use the largest per-replica batch that fits in device memory "
        "(phalanx.tune.find_batch_size) instead of --batch-size-per-replica, capped so that "
        "an epoch has at least 20 steps",
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
        "scaling rule; 1e-2 x on the digits), reached after one epoch of warm-up and "
        "cosine-decayed to 0",
    )
    parser.add_argument(
        "--model",
        default="mlp",
        help="'mlp' (the seed's 784-128-10 MLP), 'cnn', or package.module:factory, a function "
        "returning a Flax NNX module or a Keras 3 model (called with seed= if it takes one)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="'mnist', 'digits' (the 1,797 8x8 UCI digits shipped with phalanx), or "
        "package.module:loader returning ((x_train, y_train), (x_test, y_test)) or "
        "(train_dataset, test_dataset). Default: MNIST, else the digits when offline",
    )
    parser.add_argument(
        "--loss",
        default="sparse_categorical_crossentropy",
        help="a Keras loss name (default sparse_categorical_crossentropy)",
    )
    parser.add_argument(
        "--metrics",
        default=None,
        help="comma-separated Keras metric names (default: accuracy for cross-entropy losses)",
    )
    parser.add_argument(
        "--from-logits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the model outputs logits (default: yes for the built-in models, no for "
        "--model module:factory, as Keras's losses assume)",
    )
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


def _positive_int(value: str) -> int:
    """An argparse type: an int >= 1, else an error naming the value (argparse exits 2)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int (e.g. 128), got {value!r}")
    return number


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


def learning_rate(
    value: str,
    global_batch: int,
    steps_per_epoch: int | None,
    epochs: int,
    base: float = 2e-3,
) -> Any:
    """A float, or for 'auto' the seeds' linear scaling rule with warm-up and cosine decay.

    Large global batches need a proportionally larger learning rate (the second seed's
    "linear scaling rule"); one epoch of warm-up keeps the first steps stable and the cosine
    decay to zero settles the last ones. `base` is the rate at a global batch of 128. Without
    a known epoch length the peak rate is used throughout.
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
    peak = base * global_batch / 128
    if not steps_per_epoch:
        return peak
    total = steps_per_epoch * epochs
    return optax.warmup_cosine_decay_schedule(0.0, peak, min(steps_per_epoch, total - 1), total)


def _metrics(args: argparse.Namespace) -> list[str]:
    if args.metrics is not None:
        return [m.strip() for m in args.metrics.split(",") if m.strip()]
    return ["accuracy"] if "crossentropy" in args.loss else []


def _load(args: argparse.Namespace) -> sources.TrainData:
    if args.data is None or args.data in sources.BUILTIN_DATA:
        return sources.load_builtin(args.data, args.data_dir)
    return sources.load_user(args.data, args.seed)


def _save_curves(history: Any, run_dir: Path, title: str) -> str | None:
    """Saves the curves as PNG in the run directory (process 0 only, as for the other logs);
    None (with a note) without matplotlib."""
    import jax

    if jax.process_index() != 0:
        return None
    try:
        figure = history.plot(title=title)
    except ImportError as error:
        print(f"no curves picture: {error}")
        return None
    path = run_dir / "curves.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return str(path)


def run(args: argparse.Namespace) -> int:
    """Train, evaluate, report; 0 on success."""
    steps_per_execution = _steps_per_execution(args.steps_per_execution)
    if args.epochs < 1:
        raise SystemExit(f"phalanx train: --epochs must be >= 1, got {args.epochs}")
    if args.batch_size_per_replica is not None and args.batch_size_per_replica < 1:
        raise SystemExit(
            "phalanx train: --batch-size-per-replica must be a positive int (e.g. 128), got "
            f"{args.batch_size_per_replica}"
        )

    # A Keras model from --model runs on Keras's JAX backend, which must be chosen before
    # the user's module first imports keras.
    os.environ.setdefault("KERAS_BACKEND", "jax")

    import phalanx
    from phalanx._src.report import memory
    from phalanx._src.train.api.callbacks.csv_logger import CSVLogger
    from phalanx._src.train.engine.flop_rate import MFU_KEY, TFLOPS_KEY

    # Data and model references first: a missing file or a bad reference is one clear error
    # before any device is touched.
    try:
        data = _load(args)
    except (FileNotFoundError, ValueError) as error:
        print(f"phalanx train: {error}", file=sys.stderr)
        return 2
    if data.note:
        print(data.note)
    topology = phalanx.cluster.resolve(args.platform, cpu_devices=args.cpu_devices)
    print(topology.summary())
    strategy = phalanx.Strategy()
    from_logits = args.from_logits
    try:
        with strategy.scope():
            module, builtin_logits = sources.build_model(args.model, data, args.seed)
            model = phalanx.Model(module)
        if from_logits is None:
            from_logits = builtin_logits
        loss = phalanx.losses.get(args.loss, **({"from_logits": True} if from_logits else {}))
    except (ValueError, TypeError) as error:
        print(f"phalanx train: {error}", file=sys.stderr)
        return 2

    def compile_model(rate: Any) -> None:
        model.compile(
            optimizer=phalanx.optimizers.get("adam", learning_rate=rate),
            loss=loss,
            metrics=_metrics(args),
            steps_per_execution=steps_per_execution,
            precision=args.precision,
        )

    per_replica = args.batch_size_per_replica or data.batch_per_replica
    if args.find_batch_size:
        if not data.arrays:
            print(
                f"phalanx train: --find-batch-size needs arrays, but --data {data.name} gives "
                "datasets that batch themselves; batch them by the size it finds, or return "
                "((x_train, y_train), (x_test, y_test)) arrays",
                file=sys.stderr,
            )
            return 2
        compile_model(data.base_learning_rate)  # the rate for a global batch of 128
        # Capped so that an epoch has at least 20 steps: a batch as large as the training
        # set learns little per epoch (the summary says when the cap chose the batch).
        found = phalanx.tune.find_batch_size(model, data.train, dataset_size=len(data.train[0]))
        print(found.summary())
        per_replica = found.per_replica_batch_size
    global_batch = per_replica * strategy.num_replicas_in_sync
    if data.arrays:
        train = phalanx.data.Dataset.from_tensor_slices(data.train)
        train = train.shuffle(len(data.train[0]), seed=args.seed).batch(global_batch)
        test = phalanx.data.Dataset.from_tensor_slices(data.test).batch(global_batch)
        steps_per_epoch: int | None = len(train)
        batch_text = f"{global_batch} ({per_replica} per replica)"
    else:
        # The loader's datasets batch themselves: their batch is the global batch.
        train, test = data.train, data.test
        steps_per_epoch = _length(train)
        own = getattr(train, "batch_size", None)
        global_batch = own if isinstance(own, int) else global_batch
        batch_text = f"{own if isinstance(own, int) else '?'} (the loader's)"
    print(
        f"replicas: {strategy.num_replicas_in_sync}  global batch: {batch_text}  "
        f"model: {args.model}  data: {data.name}  precision: {args.precision}"
    )

    name = data.name if data.name in sources.BUILTIN_DATA else "custom"
    run_dir = _new_run_dir(Path(args.logdir), name)
    rate = learning_rate(
        args.learning_rate, global_batch, steps_per_epoch, args.epochs, data.base_learning_rate
    )
    with strategy.scope():
        compile_model(rate)
    callbacks = [
        phalanx.callbacks.TensorBoard(str(run_dir / "tensorboard")),
        phalanx.callbacks.ModelCheckpoint(run_dir / "checkpoints", monitor="loss", max_to_keep=1),
        CSVLogger(run_dir / "history.csv"),
    ]
    verbose = args.verbose if args.verbose is not None else (0 if args.json else 1)
    start = time.perf_counter()
    # The held-out split is also the validation data, so the curves show both.
    history = model.fit(
        train, epochs=args.epochs, callbacks=callbacks, verbose=verbose, validation_data=test
    )
    seconds = time.perf_counter() - start
    results = model.evaluate(test, verbose=0, return_dict=True)
    logs = history.history
    report = {
        **{f"test_{k}": v for k, v in results.items()},
        "examples_per_second": max(logs["examples_per_second"]),
        # The last epoch's rate: the first one includes compilation.
        TFLOPS_KEY: logs[TFLOPS_KEY][-1] if TFLOPS_KEY in logs else None,
        MFU_KEY: logs[MFU_KEY][-1] if MFU_KEY in logs else None,
        "train_seconds": seconds,
        # Over the whole run so far; the device figure is None where it is not reported.
        "peak_host_mib": memory.peak_host_mib(),
        "peak_device_mib": memory.peak_device_mib(),
        "epochs": args.epochs,
        "replicas": strategy.num_replicas_in_sync,
        "global_batch": global_batch,
        "model": args.model,
        "data": data.name,
        "precision": args.precision,
        "run_dir": str(run_dir),
        "curves": _save_curves(history, run_dir, f"{args.model} on {data.name}"),
        "topology": topology.to_dict(),
    }
    print(f"logs and checkpoint: {run_dir}")
    if report["curves"]:
        print(f"training curves: {report['curves']}")
    speed = f"examples/s {report['examples_per_second']:.0f} (best epoch)"
    if report[TFLOPS_KEY] is not None:
        speed += f"  model TFLOP/s {report[TFLOPS_KEY]:.3g}"
    if report[MFU_KEY] is not None:
        speed += f"  MFU {100 * report[MFU_KEY]:.1f}%"
    print(f"{speed}  train time {seconds:.1f} s")
    print(memory.describe(report["peak_host_mib"], report["peak_device_mib"]))
    print(_results_line(results))
    if args.json:
        print(json.dumps(report, default=str))
    return 0


def _results_line(results: dict[str, float]) -> str:
    """'test accuracy 0.9750  test loss 0.0800' (accuracy first when there is one)."""
    keys = sorted(results, key=lambda k: (not re.search("acc", k), k != "loss", k))
    return "  ".join(f"test {k} {results[k]:.4f}" for k in keys)


def _length(data: Any) -> int | None:
    try:
        return len(data)
    except TypeError:
        return None


def _new_run_dir(logdir: Path, name: str) -> Path:
    """`logdir/<name>-<time>`, with a suffix when a run started in the same second."""
    stem = time.strftime(f"{name}-%Y%m%d-%H%M%S")
    run_dir, n = logdir / stem, 1
    while run_dir.exists():
        run_dir, n = logdir / f"{stem}-{n}", n + 1
    return run_dir
