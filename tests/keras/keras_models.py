"""Small Keras models and data shared by the Keras tests (imported after conftest.py has
set KERAS_BACKEND=jax)."""

import keras
import numpy as np

import phalanx


def mlp(hidden: int = 32, din: int = 784, classes: int = 10) -> keras.Model:
    """The seeds' first model (784 -> relu -> softmax), narrower so tests stay fast."""
    return keras.Sequential(
        [
            keras.layers.Input(shape=(din,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )


def mnist_subset(path, n: int):
    """The seeds' preprocessing on the first `n` MNIST training images: flat, /255, one-hot."""
    with np.load(path) as data:
        x, y = data["x_train"][:n], data["y_train"][:n]
    return x.reshape(n, 784).astype(np.float32) / 255.0, np.eye(10, dtype=np.float32)[y]


def twin(build, strategy=None, seed: int = 0):
    """Two Keras models with the same initial weights: one for Keras's own fit (built
    outside any strategy) and one built in `strategy.scope()` and wrapped by phalanx."""
    keras.utils.set_random_seed(seed)
    reference = build()
    strategy = strategy or phalanx.Strategy()
    with strategy.scope():
        mine = build()
        mine.set_weights(reference.get_weights())
        model = phalanx.Model(mine)
    return reference, mine, model


# ---- the families of issue 21: each must give Keras's own fit / evaluate numbers ----------
# A family is (build, data, compile arguments, rows): `build()` makes the Keras model
# (called once per run, given the same initial weights), `data(rows)` returns `(x, y)` or
# `(x, y, sample_weight)`. Tiny on purpose (see FAMILIES for the row counts).

L2 = keras.regularizers.L2


def _classes(n, features=12, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    return x, (np.abs(x[:, :4]).argmax(1)).astype(np.int32)


def same_initial_state(model, reference):
    """`model` gets `reference`'s weights and its RNG seed states (Dropout's), which
    `get_weights` leaves out; then both draw the same dropout masks."""
    model.set_weights(reference.get_weights())
    pairs = zip(model.non_trainable_variables, reference.non_trainable_variables, strict=True)
    for mine, theirs in pairs:
        mine.assign(np.array(theirs.value))  # a copy: Keras donates its buffers


def regularized_dense():
    """Regularizers on a Dense layer's kernel, bias and output, and Dropout (whose masks on
    the padded last batch equal Keras's on the real rows)."""
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(
                16,
                activation="relu",
                kernel_regularizer=L2(0.01),
                bias_regularizer=keras.regularizers.L1(0.01),
                activity_regularizer=keras.regularizers.L1(1e-3),
            ),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(4, kernel_regularizer=keras.regularizers.L1L2(1e-3, 1e-2)),
        ]
    )


def regularized_conv():
    return keras.Sequential(
        [
            keras.Input((6, 6, 1)),
            keras.layers.Conv2D(3, 3, activation="relu", kernel_regularizer=L2(0.02)),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )


def images(n):
    x, y = _classes(n, 36)
    return x.reshape(n, 6, 6, 1), y


def regularized_embedding():
    return keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(20, 6, embeddings_regularizer=L2(0.05)),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(4),
        ]
    )


def tokens(n):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(n, 5)).astype(np.int32)
    return x, (x[:, 0] % 4).astype(np.int32)


class PenaltyLayer(keras.layers.Layer):
    """Adds 0.1 * mean(|x|) with `add_loss` (inputs of the batch, real rows only in Keras)."""

    def call(self, x):
        self.add_loss(0.1 * keras.ops.mean(keras.ops.abs(x)))
        return x


def with_add_loss():
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(8, activation="tanh"),
            PenaltyLayer(),
            keras.layers.Dense(4),
        ]
    )


class Distiller(keras.Model):
    """keras.io's knowledge distillation (examples/vision/knowledge_distillation.py)."""

    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(
        self,
        optimizer,
        metrics,
        student_loss_fn,
        distillation_loss_fn,
        alpha=0.1,
        temperature=3,
    ):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)
        distillation_loss = self.distillation_loss_fn(
            keras.ops.softmax(teacher_pred / self.temperature, axis=1),
            keras.ops.softmax(y_pred / self.temperature, axis=1),
        ) * (self.temperature**2)
        return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

    def call(self, x):
        return self.student(x)


def distiller():
    teacher = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]
    )
    student = keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )
    model = Distiller(student=student, teacher=teacher)
    model(np.zeros((1, 12), np.float32))  # builds the variables
    return model


def distiller_compile():
    return dict(
        optimizer=keras.optimizers.Adam(1e-2),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )


def named_inputs():
    """A Functional model with two named inputs, trained with sample weights."""
    price = keras.Input((3,), name="price")
    kind = keras.Input((4,), name="kind")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([price, kind]))
    return keras.Model({"price": price, "kind": kind}, keras.layers.Dense(4)(hidden))


def tabular(n):
    x, y = _classes(n, 7)
    weights = np.random.default_rng(1).uniform(0.0, 3.0, n).astype(np.float32)
    return {"price": x[:, :3], "kind": x[:, 3:]}, y, weights


def bidirectional_lstm():
    return keras.Sequential(
        [
            keras.Input((5,), dtype="int32"),
            keras.layers.Embedding(20, 4),
            keras.layers.Bidirectional(keras.layers.LSTM(4)),
            keras.layers.Dense(4),
        ]
    )


def attention():
    inputs = keras.Input((4, 6))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, use_bias=False)(
        inputs, inputs
    )
    pooled = keras.layers.GlobalAveragePooling1D()(attended + inputs)
    return keras.Model(inputs, keras.layers.Dense(4)(pooled))


def sequences(n):
    x, y = _classes(n, 24)
    return x.reshape(n, 4, 6), y


def batch_norm():
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(8, use_bias=False),  # a bias before BN gets no gradient
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(4),
        ]
    )


# keras.io's "Structured data learning with TabTransformer" (examples/structured_data/
# tabtransformer.py), built as the example builds it: the census's 5 numeric and 8
# categorical inputs (float indices into embeddings), transformer blocks of multi-head
# attention, a BatchNormalization + SELU MLP, a sigmoid, AdamW and sample weights.
# benchmarks/bench_tabular.py times it at the example's sizes.
CENSUS_NUMERIC = ["age", "education_num", "capital_gain", "capital_loss", "hours_per_week"]
CENSUS_VOCABULARY = {  # each categorical column's distinct values in the census's adult.data
    "workclass": 9,
    "education": 16,
    "marital_status": 7,
    "occupation": 15,
    "relationship": 6,
    "race": 5,
    "gender": 2,
    "native_country": 42,
}


def _mlp_block(units, dropout, activation, normalization, name=None):
    layers = []
    for width in units:
        layers += [
            normalization(),
            keras.layers.Dense(width, activation=activation),
            keras.layers.Dropout(dropout),
        ]
    return keras.Sequential(layers, name=name)


def tabtransformer(blocks: int = 3, heads: int = 4, dims: int = 16, dropout: float = 0.2):
    """keras.io's `create_tabtransformer_classifier` (its defaults are the example's)."""
    from functools import partial

    from keras import layers, ops

    names = CENSUS_NUMERIC + list(CENSUS_VOCABULARY)
    inputs = {name: layers.Input(name=name, shape=(), dtype="float32") for name in names}
    categorical = [
        layers.Embedding(input_dim=size, output_dim=dims)(inputs[name])
        for name, size in CENSUS_VOCABULARY.items()
    ]
    features = ops.stack(categorical, axis=1)
    numerical = layers.concatenate([ops.expand_dims(inputs[n], -1) for n in CENSUS_NUMERIC])
    norm = partial(layers.LayerNormalization, epsilon=1e-6)
    for i in range(blocks):
        attention = layers.MultiHeadAttention(num_heads=heads, key_dim=dims, dropout=dropout)
        x = norm(name=f"layer_norm1_{i}")(layers.Add()([attention(features, features), features]))
        forward = _mlp_block([dims], dropout, keras.activations.gelu, norm)(x)
        features = norm(name=f"layer_norm2_{i}")(layers.Add()([forward, x]))
    numerical = norm(name="numerical_norm")(numerical)
    features = layers.concatenate([layers.Flatten()(features), numerical])
    units = [factor * features.shape[-1] for factor in (2, 1)]
    selu = keras.activations.selu
    features = _mlp_block(units, dropout, selu, layers.BatchNormalization, name="MLP")(features)
    return keras.Model(inputs, layers.Dense(1, activation="sigmoid")(features))


def census(n: int, seed: int = 0):
    """`(x, y, sample_weight)`: `n` random rows with the census's columns and vocabularies
    (the example reads them from the UCI CSV files; the tests never download)."""
    rng = np.random.default_rng(seed)
    x = {name: rng.normal(size=n).astype(np.float32) for name in CENSUS_NUMERIC}
    for name, size in CENSUS_VOCABULARY.items():
        x[name] = rng.integers(0, size, n).astype(np.float32)
    y = rng.integers(0, 2, n).astype(np.float32)
    return x, y, rng.uniform(0.1, 2.0, n).astype(np.float32)


def census_compile():
    """The example's `run_experiment` compile arguments."""
    return dict(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=1e-4),
        loss=keras.losses.BinaryCrossentropy(),
        metrics=[keras.metrics.BinaryAccuracy(name="accuracy")],
    )


def _sparse_ce(**extra):
    return dict(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **extra,
    )


# name: (build, data, compile arguments (a function: fresh objects per model), rows).
# 44 rows in batches of 8 end in a padded partial batch; 48 rows (full batches only) where
# the partial batch adds nothing new (the layers' own tests cover it) and for `add_loss` of
# a batch statistic, which counts a padded batch's padding rows (docs/migration.md).
FAMILIES = {
    "dense_regularizers": (regularized_dense, _classes, _sparse_ce, 44),
    "conv_regularizer": (regularized_conv, images, _sparse_ce, 44),
    "embedding_regularizer": (regularized_embedding, tokens, _sparse_ce, 44),
    "add_loss": (with_add_loss, _classes, _sparse_ce, 48),
    "distiller": (distiller, _classes, distiller_compile, 44),
    "named_inputs_weighted": (
        named_inputs,
        tabular,
        lambda: _sparse_ce(weighted_metrics=["accuracy"]),
        44,
    ),
    "bidirectional_lstm": (bidirectional_lstm, tokens, _sparse_ce, 48),
    "multi_head_attention": (attention, sequences, _sparse_ce, 48),
    "batch_norm": (batch_norm, _classes, _sparse_ce, 48),
    "tabtransformer": (lambda: tabtransformer(1, 2, 4), census, census_compile, 48),
}
