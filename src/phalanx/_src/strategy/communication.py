"""TF's cross-device and communication objects, accepted where TF accepts them.

`tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())` and
`MultiWorkerMirroredStrategy(communication_options=CommunicationOptions(implementation=
CommunicationImplementation.NCCL))` choose how TF's runtime all-reduces. phalanx compiles
each step with XLA, and XLA chooses the collective for the platform and topology on every
platform: NCCL on GPUs, the ICI on TPUs, Gloo across CPU processes, shared memory within
one. So these objects are validated and kept (`strategy.cross_device_ops`,
`strategy.communication_options`) and no argument value changes a number or a collective:
`num_packs`, `reduce_to_device`, `accumulation_fn`, `bytes_per_pack`, `timeout_seconds`
and `implementation` are accepted for TF code only. An object of another kind is an error
naming the accepted ones.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

_TF_CROSS_DEVICE_OPS = frozenset(
    {"NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice", "CrossDeviceOps"}
)


def _check_packs(name: str, num_packs: Any) -> None:
    if isinstance(num_packs, bool) or not isinstance(num_packs, int) or num_packs < 0:
        raise ValueError(
            f"{name}(num_packs={num_packs!r}): num_packs is a count of gradient packs, an "
            f"int >= 0 (TF's default is 1); e.g. {name}(num_packs=1). XLA chooses how the "
            "all-reduce is packed, so the value changes nothing"
        )


class CrossDeviceOps:
    """Base of the cross-device objects TF's `MirroredStrategy(cross_device_ops=...)` takes.

    XLA chooses the collective on every platform; see the module doc.
    """

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"phalanx.{type(self).__name__}({fields})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), tuple(sorted(vars(self).items(), key=repr))))


class NcclAllReduce(CrossDeviceOps):
    """`tf.distribute.NcclAllReduce`: accepted; XLA uses NCCL on GPUs by itself.

    Args:
      num_packs: TF's number of gradient packs (an int >= 0); changes nothing.

    Raises:
      ValueError: `num_packs` is not an int >= 0.

    Example:
      >>> strategy = phalanx.Strategy(cross_device_ops=phalanx.NcclAllReduce())
    """

    def __init__(self, num_packs: int = 1) -> None:
        _check_packs("NcclAllReduce", num_packs)
        self.num_packs = num_packs


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """`tf.distribute.HierarchicalCopyAllReduce`: accepted; XLA chooses the collective.

    Args:
      num_packs: TF's number of gradient packs (an int >= 0); changes nothing.

    Raises:
      ValueError: `num_packs` is not an int >= 0.

    Example:
      >>> strategy = phalanx.Strategy(
      ...     cross_device_ops=phalanx.HierarchicalCopyAllReduce(num_packs=2))
    """

    def __init__(self, num_packs: int = 1) -> None:
        _check_packs("HierarchicalCopyAllReduce", num_packs)
        self.num_packs = num_packs


class ReductionToOneDevice(CrossDeviceOps):
    """`tf.distribute.ReductionToOneDevice`: accepted; XLA all-reduces instead.

    Args:
      reduce_to_device: TF's intermediate device (a string or None); changes nothing.
      accumulation_fn: TF's accumulation function (a callable or None); changes nothing:
        `strategy.reduce` sums or averages as its `ReduceOp` says.

    Raises:
      ValueError: `reduce_to_device` is not a string or None, or `accumulation_fn` is not
        callable.

    Example:
      >>> strategy = phalanx.Strategy(cross_device_ops=phalanx.ReductionToOneDevice())
    """

    def __init__(self, reduce_to_device: str | None = None, accumulation_fn: Any = None) -> None:
        if reduce_to_device is not None and not isinstance(reduce_to_device, str):
            raise ValueError(
                f"ReductionToOneDevice(reduce_to_device={reduce_to_device!r}): give a device "
                "string such as '/cpu:0', or None"
            )
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise ValueError(
                f"ReductionToOneDevice(accumulation_fn={accumulation_fn!r}): give a function "
                "that sums a list of arrays, or None"
            )
        self.reduce_to_device = reduce_to_device
        self.accumulation_fn = accumulation_fn


class CommunicationImplementation(enum.Enum):
    """`tf.distribute.experimental.CommunicationImplementation`: AUTO, RING or NCCL.

    Accepted in `CommunicationOptions(implementation=...)`; XLA chooses the collective.

    Example:
      >>> phalanx.experimental.CommunicationImplementation.NCCL
      <CommunicationImplementation.NCCL: 'NCCL'>
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


# TF's older name, still in its guides: `CollectiveCommunication.NCCL`.
CollectiveCommunication = CommunicationImplementation


def _implementation(value: Any) -> CommunicationImplementation:
    if isinstance(value, CommunicationImplementation):
        return value
    name = getattr(value, "name", value)  # TF's own enum member has the same names
    if isinstance(name, str) and name.upper() in CommunicationImplementation.__members__:
        return CommunicationImplementation[name.upper()]
    raise ValueError(
        f"CommunicationOptions(implementation={value!r}): use one of "
        "phalanx.experimental.CommunicationImplementation.AUTO, .RING or .NCCL (or the "
        "strings 'auto', 'ring', 'nccl')"
    )


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """`tf.distribute.experimental.CommunicationOptions`: accepted, validated, kept.

    XLA chooses the collective on every platform (see the module doc), so no value changes
    a number; TF code that passes these options runs unchanged.

    Args:
      bytes_per_pack: TF's pack size in bytes (an int >= 0; 0: no packing).
      timeout_seconds: TF's collective timeout (a positive number or None).
      implementation: a `CommunicationImplementation` (or its name).

    Raises:
      ValueError: a value outside those ranges; the message names the accepted ones.

    Example:
      >>> options = phalanx.experimental.CommunicationOptions(
      ...     implementation=phalanx.experimental.CommunicationImplementation.NCCL)
      >>> strategy = phalanx.Strategy(communication_options=options)
    """

    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    implementation: Any = CommunicationImplementation.AUTO

    def __post_init__(self) -> None:
        packs = self.bytes_per_pack
        if isinstance(packs, bool) or not isinstance(packs, int) or packs < 0:
            raise ValueError(
                f"CommunicationOptions(bytes_per_pack={packs!r}): give an int >= 0 "
                "(0, TF's default, means no packing)"
            )
        timeout = self.timeout_seconds
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ValueError(
                f"CommunicationOptions(timeout_seconds={timeout!r}): give a positive number "
                "of seconds, or None (TF's default: no timeout)"
            )
        object.__setattr__(self, "implementation", _implementation(self.implementation))


def _is_tf(value: Any, names: frozenset[str]) -> bool:
    cls = type(value)
    return (cls.__module__ or "").split(".")[0] == "tensorflow" and any(
        c.__name__ in names for c in cls.__mro__
    )


def check_cross_device_ops(value: Any) -> Any:
    """`value` if it is None, a phalanx `CrossDeviceOps` or TF's own; else an error.

    Raises:
      TypeError: another object; the message names the accepted ones.
    """
    if value is None or isinstance(value, CrossDeviceOps) or _is_tf(value, _TF_CROSS_DEVICE_OPS):
        return value
    raise TypeError(
        f"Strategy(cross_device_ops={value!r}): expected None, phalanx.NcclAllReduce(), "
        "phalanx.HierarchicalCopyAllReduce(num_packs=...) or phalanx.ReductionToOneDevice() "
        "(TF's tf.distribute objects of those names are accepted too). XLA chooses the "
        "collective on every platform, so leaving it out changes nothing"
    )


def check_communication_options(value: Any) -> Any:
    """`value` as `CommunicationOptions` (None: the defaults); else an error.

    A bare `CommunicationImplementation` (TF's older `CollectiveCommunication.NCCL`
    argument) becomes `CommunicationOptions(implementation=value)`.

    Raises:
      TypeError: another object; the message names the accepted ones.
    """
    if value is None:
        return CommunicationOptions()
    if isinstance(value, CommunicationOptions):
        return value
    if isinstance(value, CommunicationImplementation):
        return CommunicationOptions(implementation=value)
    if _is_tf(value, frozenset({"Options", "CommunicationOptions"})):
        return CommunicationOptions(
            bytes_per_pack=value.bytes_per_pack,
            timeout_seconds=value.timeout_seconds,
            implementation=value.implementation,
        )
    raise TypeError(
        f"Strategy(communication_options={value!r}): expected None or "
        "phalanx.experimental.CommunicationOptions(implementation=phalanx.experimental."
        "CommunicationImplementation.AUTO | RING | NCCL). XLA chooses the collective on "
        "every platform, so leaving it out changes nothing"
    )
