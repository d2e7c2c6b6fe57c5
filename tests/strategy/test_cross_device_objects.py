"""TF's cross-device objects, communication options and renamed names: accepted where TF
accepts them, validated, and refused with the accepted ones named."""

import jax
import numpy as np
import pytest

import phalanx


@pytest.mark.parametrize(
    "ops",
    [
        phalanx.NcclAllReduce(),
        phalanx.NcclAllReduce(num_packs=2),
        phalanx.HierarchicalCopyAllReduce(num_packs=0),
        phalanx.ReductionToOneDevice(reduce_to_device="/cpu:0", accumulation_fn=sum),
        None,
    ],
    ids=repr,
)
def test_cross_device_ops_are_kept_and_change_nothing(ops):
    strategy = phalanx.Strategy(devices=jax.devices()[:2], cross_device_ops=ops)
    assert strategy.cross_device_ops == ops
    total = strategy.reduce("sum", strategy.run(lambda: jax.numpy.float32(1.5)), axis=None)
    assert float(total) == 3.0


def test_communication_options_are_validated_and_kept():
    experimental = phalanx.experimental
    options = experimental.CommunicationOptions(
        implementation=experimental.CommunicationImplementation.NCCL
    )
    strategy = phalanx.Strategy(communication_options=options)
    assert (
        strategy.communication_options.implementation
        is experimental.CommunicationImplementation.NCCL
    )
    # TF's older name, and a bare implementation, as MultiWorkerMirroredStrategy took it.
    strategy = phalanx.Strategy(communication_options=experimental.CollectiveCommunication.RING)
    assert strategy.communication_options == experimental.CommunicationOptions(
        implementation="ring"
    )
    assert phalanx.Strategy().communication_options.implementation.name == "AUTO"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: phalanx.NcclAllReduce(num_packs=-1), r"num_packs=-1.*int >= 0"),
        (lambda: phalanx.HierarchicalCopyAllReduce(num_packs=1.5), r"num_packs=1.5"),
        (lambda: phalanx.ReductionToOneDevice(reduce_to_device=0), r"device string"),
        (
            lambda: phalanx.experimental.CommunicationOptions(implementation="mpi"),
            r"'mpi'.*AUTO, .RING or .NCCL",
        ),
        (lambda: phalanx.experimental.CommunicationOptions(bytes_per_pack=-4), r"-4"),
        (lambda: phalanx.experimental.CommunicationOptions(timeout_seconds=0), r"positive"),
    ],
)
def test_bad_arguments_name_the_legal_values(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unknown_objects_name_what_is_accepted():
    class AllReduce:
        pass

    with pytest.raises(TypeError, match=r"HierarchicalCopyAllReduce\(num_packs=\.\.\.\)"):
        phalanx.Strategy(cross_device_ops=AllReduce())
    with pytest.raises(TypeError, match=r"CommunicationOptions\(implementation="):
        phalanx.Strategy(communication_options="nccl")


def test_tensorflow_objects_are_accepted_too():
    tf = pytest.importorskip("tensorflow")
    strategy = phalanx.Strategy(
        cross_device_ops=tf.distribute.HierarchicalCopyAllReduce(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.NCCL
        ),
    )
    assert strategy.communication_options.implementation.name == "NCCL"


def test_train_face_is_the_top_level_checkpointing(tmp_path):
    assert phalanx.train.Checkpoint is phalanx.Checkpoint
    assert phalanx.train.CheckpointManager is phalanx.CheckpointManager
    assert phalanx.train.latest_checkpoint is phalanx.latest_checkpoint
    assert phalanx.train.latest_checkpoint(str(tmp_path)) is None


@pytest.mark.parametrize(
    ("reduction", "want"),
    [
        (phalanx.losses.Reduction.NONE, [1.0, 3.0]),
        (phalanx.losses.Reduction.SUM, 4.0),
        (phalanx.losses.Reduction.SUM_OVER_BATCH_SIZE, 2.0),
        (phalanx.losses.Reduction.AUTO, 2.0),  # TF's AUTO outside a strategy
    ],
)
def test_losses_take_tf_reduction_names(reduction, want):
    loss = phalanx.losses.MeanAbsoluteError(reduction=reduction)
    got = loss(np.zeros((2, 1), np.float32), np.array([[1.0], [3.0]], np.float32))
    np.testing.assert_allclose(np.asarray(got), want)
    assert phalanx.losses.Reduction.NONE == "none"
