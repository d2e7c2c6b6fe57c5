"""Which platform to run on: TPU > GPU > CPU, or the one forced, with a graceful fallback.

Like TensorFlow's `try: TPUClusterResolver() except ValueError: print("TPU not found...")`,
a missing accelerator is never an error: the choice falls back to what is available and
`PlatformChoice.fallback` holds the one line that says so. The choice is a pure function of
the request and the available platforms, so it is tested without any hardware.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from phalanx._src.cluster.env_values import read_str

PLATFORM_ENV = "PHALANX_PLATFORM"
AUTO = "auto"
# Preference order when nothing is forced; JAX's own default backend follows the same order.
PLATFORMS = ("tpu", "gpu", "cpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def normalize_platform(value: str | None, *, origin: str = "platform") -> str | None:
    """Return the canonical platform name for `value`, or None for automatic choice.

    Args:
      value: "tpu", "gpu" (or "cuda"/"rocm"), "cpu", "auto" or None; case-insensitive.
      origin: where the value came from, for the error message (argument or variable name).

    Returns:
      "tpu", "gpu", "cpu", or None for "auto"/None.

    Raises:
      ValueError: the value is not a known platform; the message lists the legal values.

    Example:
      >>> normalize_platform("CUDA")
      'gpu'
    """
    if value is None:
        return None
    name = value.strip().lower()
    name = _ALIASES.get(name, name)
    if name == AUTO:
        return None
    if name not in PLATFORMS:
        legal = ", ".join(repr(p) for p in (*PLATFORMS, AUTO))
        raise ValueError(
            f"{origin}={value!r} is not a platform phalanx knows; use one of {legal} "
            f"(e.g. {origin}='cpu'), or leave it unset to pick TPU > GPU > CPU"
        )
    return name


def requested_platform(platform: str | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """Return the forced platform (or None) and where the request came from.

    The argument wins over the PHALANX_PLATFORM variable.

    Args:
      platform: the `platform` argument of `resolve()`, or None.
      environ: the environment holding PHALANX_PLATFORM.

    Returns:
      (platform or None, source), source being "argument", "PHALANX_PLATFORM" or "auto".

    Raises:
      ValueError: either value is not a known platform.

    Example:
      >>> requested_platform(None, {"PHALANX_PLATFORM": "tpu"})
      ('tpu', 'PHALANX_PLATFORM')
    """
    if platform is not None:
        return normalize_platform(platform), "argument"
    from_env = read_str(environ, PLATFORM_ENV)
    if from_env is not None:
        return normalize_platform(from_env, origin=PLATFORM_ENV), PLATFORM_ENV
    return None, AUTO


@dataclasses.dataclass(frozen=True)
class PlatformChoice:
    """The platform picked, and why.

    Attributes:
      platform: the platform used: "tpu", "gpu" or "cpu".
      requested: the forced platform, or None when chosen automatically.
      source: "argument", "PHALANX_PLATFORM" or "auto".
      available: platforms with at least one device, in preference order.
      fallback: the one line announcing a fallback (request or preference not met), else None.
    """

    platform: str
    requested: str | None
    source: str
    available: tuple[str, ...]
    fallback: str | None

    @property
    def reason(self) -> str:
        """One phrase saying why `platform` was picked."""
        how = "the platform argument" if self.source == "argument" else self.source
        if self.requested == self.platform:
            return f"forced by {how}"
        if self.requested is not None:
            return (
                f"{how} asked for {self.requested.upper()}, which is not available; "
                "best available instead"
            )
        return "automatic: the best available in the order TPU > GPU > CPU"

    def to_dict(self) -> dict[str, object]:
        """Return the choice as JSON-ready values, `reason` included."""
        return {
            **dataclasses.asdict(self),
            "available": list(self.available),
            "reason": self.reason,
        }


def choose_platform(
    requested: str | None,
    available: Sequence[str],
    *,
    source: str = "argument",
    jax_platforms: str | None = None,
) -> PlatformChoice:
    """Pick the platform: the requested one if available, else the best available.

    Args:
      requested: "tpu", "gpu", "cpu", or None for automatic (TPU > GPU > CPU).
      available: platforms that have devices (any order).
      source: where the request came from, echoed in the fallback line.
      jax_platforms: JAX's platform restriction (JAX_PLATFORMS), if any, named in the
        fallback line because it, not the hardware, may be why a platform is missing.

    Returns:
      A `PlatformChoice`; its `fallback` is set when the request (or, automatically, any
      accelerator) was not found.

    Raises:
      ValueError: `requested` or an entry of `available` is not a known platform.
      RuntimeError: no platform is available at all (JAX found no devices).

    Example:
      >>> choose_platform("tpu", ["cpu"]).fallback
      'TPU not found (platform argument asked for it). Using CPU; available: cpu.'
    """
    requested = normalize_platform(requested, origin="requested")
    names = {normalize_platform(p, origin="available") for p in available}
    ordered = tuple(p for p in PLATFORMS if p in names)
    if not ordered:
        raise RuntimeError(
            "JAX reports no devices on any platform (tpu, gpu, cpu); is jaxlib broken?"
        )
    if requested in ordered:
        return PlatformChoice(requested, requested, source, ordered, None)
    chosen = ordered[0]
    limit = f"; JAX_PLATFORMS={jax_platforms}" if jax_platforms else ""
    if requested is not None:
        how = "platform argument" if source == "argument" else f"{source}={requested}"
        line = (
            f"{requested.upper()} not found ({how} asked for it{limit}). "
            f"Using {chosen.upper()}; available: {', '.join(ordered)}."
        )
        return PlatformChoice(chosen, requested, source, ordered, line)
    line = None
    if chosen == "cpu":
        line = (
            f"No TPU or GPU found{f' (JAX_PLATFORMS={jax_platforms})' if limit else ''}. Using CPU."
        )
    return PlatformChoice(chosen, None, source, ordered, line)
