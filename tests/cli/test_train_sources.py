"""`phalanx train --model module:factory --data module:loader`: the user's own work."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from phalanx._src.cli import sources

USER_MODULE = textwrap.dedent(
    """
    import jax
    import numpy as np
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, seed):
            self.hidden = nnx.Linear(6, 32, rngs=nnx.Rngs(seed))
            self.out = nnx.Linear(32, 3, rngs=nnx.Rngs(seed))

        def __call__(self, x):
            return jax.nn.softmax(self.out(jax.nn.relu(self.hidden(x))))

    def build(seed):
        return Net(seed)

    def load():
        rng = np.random.default_rng(0)
        x = rng.normal(size=(600, 6)).astype(np.float32)
        y = np.abs(x[:, :3]).argmax(1).astype(np.int32)
        return (x[:480], y[:480]), (x[480:], y[480:])

    def build_keras():
        import keras  # the CLI has chosen Keras's JAX backend by now

        layers = [keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)]
        return keras.Sequential([keras.Input((6,)), *layers])

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "usermods_cli.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usermods_cli", raising=False)
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("factory", "activation"),
    [("build", "--no-from-logits"), ("build_keras", "--from-logits")],  # NNX, then Keras 3
)
def test_trains_the_users_model_on_the_users_data(child_env, user_module, factory, activation):
    env = {k: v for k, v in child_env.items() if k != "KERAS_BACKEND"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "phalanx._src.cli.main",
            "train",
            f"--model=usermods_cli:{factory}",
            activation,
            "--data=usermods_cli:load",
            "--loss=sparse_categorical_crossentropy",
            "--metrics=accuracy,sparse_top_k_categorical_accuracy",
            "--learning-rate=0.03",
            "--batch-size-per-replica=32",
            "--epochs=8",
            "--json",
            f"--logdir={user_module / 'runs'}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=user_module,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["model"] == f"usermods_cli:{factory}" and report["data"] == "usermods_cli:load"
    assert report["test_accuracy"] > 0.7  # 3 balanced classes: chance is 1/3
    assert 0 <= report["test_sparse_top_k_categorical_accuracy"] <= 1
    assert os.path.basename(report["run_dir"]).startswith("custom-")


def test_references_resolve_from_the_current_folder(user_module):
    assert sources.resolve_reference("usermods_cli:build", "--model")(seed=1) is not None
    data = sources.load_user("usermods_cli:load", seed=0)
    assert data.arrays and data.train[0].shape == (480, 6) and data.image_shape is None
    with pytest.raises(sources.SourceError, match="pass your own network too"):
        sources.build_model("mlp", data, seed=0)


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("usermods_cli", r"is not a reference; use package\.module:function"),
        ("no_such_module_xyz:build", r"cannot import module 'no_such_module_xyz'"),
        ("usermods_cli:biuld", r"module 'usermods_cli' has no attribute 'biuld'; it defines"),
        (
            "usermods_cli:NOT_A_FUNCTION",
            r"usermods_cli\.NOT_A_FUNCTION is not a function \(got int\)",
        ),
    ],
)
def test_bad_references_name_the_module_and_the_attribute(user_module, reference, message):
    with pytest.raises(sources.SourceError, match=message):
        sources.resolve_reference(reference, "--model")


def test_a_loader_must_return_two_splits(user_module, monkeypatch):
    module = pytest.importorskip("usermods_cli")
    monkeypatch.setattr(module, "load", lambda: (np.zeros((4, 2)), np.zeros(4), np.zeros(4)))
    with pytest.raises(sources.SourceError, match=r"returned tuple of length 3; return"):
        sources.load_user("usermods_cli:load", seed=0)
    monkeypatch.setattr(module, "load", lambda: ((np.zeros((4, 2)),), (np.zeros((4, 2)),)))
    with pytest.raises(sources.SourceError, match=r"the train split is a tuple of 1 item"):
        sources.load_user("usermods_cli:load", seed=0)


def test_a_bad_reference_fails_the_command_before_any_work(user_module, capsys, monkeypatch):
    from phalanx._src.cli.main import main

    monkeypatch.setenv("KERAS_BACKEND", "jax")  # what `phalanx train` sets when unset
    assert main(["train", "--data", "usermods_cli:nothing"]) == 2
    err = capsys.readouterr().err
    assert "--data usermods_cli:nothing: module 'usermods_cli' has no attribute" in err
