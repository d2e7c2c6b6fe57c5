"""JAX's persistent compilation cache, on by default in a phalanx cache directory.

Why: a restarted or resumed job (after a preemption, a crash, a new `fit` in a new process)
compiles the same steps again, which takes seconds to minutes. With the cache on, the
compiled executables are read back from disk instead, so the first step comes sooner.

`import phalanx` turns it on, in this order of precedence:

- `PHALANX_COMPILATION_CACHE=0` (or `off`, `false`, `no`, empty): off.
- `PHALANX_COMPILATION_CACHE=/some/dir`: that directory.
- JAX's own `JAX_COMPILATION_CACHE_DIR` / `jax_compilation_cache_dir`, when the user set
  it: left alone.
- otherwise `$XDG_CACHE_HOME/phalanx/jax` (default `~/.cache/phalanx/jax`).

`phalanx.set_compilation_cache(path)` changes it at run time (`None` turns it off).

`import phalanx` never fails because of the cache: when the directory cannot be made or
written (a read-only home, a path under a file), it warns once and goes on without a
persistent cache.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import jax

ENV = "PHALANX_COMPILATION_CACHE"
_OFF = {"", "0", "off", "false", "no", "none"}
# Cache even quick compiles (JAX's default keeps only those over 1 s): a small model's
# steps compile in well under a second on a GPU, yet several of them add up at restart.
_MIN_COMPILE_TIME_S = 0.0


def default_directory() -> Path:
    """`$XDG_CACHE_HOME/phalanx/jax`, or `~/.cache/phalanx/jax`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "phalanx" / "jax"


def set_compilation_cache(path: str | os.PathLike | None) -> None:
    """Turns JAX's persistent compilation cache on in `path`, or off with `None`.

    Takes effect for the next compilation; executables compiled before stay in memory.

    Args:
      path: the cache directory (created now if needed), or None to turn the cache off.

    Raises:
      ValueError: `path` exists and is not a directory, or cannot be created or written
        (the cache is then left as it was).

    Example:
      >>> phalanx.set_compilation_cache("/scratch/jax-cache")   # shared by restarts
      >>> phalanx.set_compilation_cache(None)                    # off
    """
    from jax._src import compilation_cache

    if path is None:
        jax.config.update("jax_enable_compilation_cache", False)
        compilation_cache.reset_cache()
        return
    directory = Path(path).expanduser()
    reason = _unusable(directory)
    if reason is not None:
        raise ValueError(
            f"{reason}; pass a writable directory, or None (or {ENV}=0) to turn the cache off"
        )
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_TIME_S)
    compilation_cache.reset_cache()  # the next compilation opens the new directory


def _unusable(directory: Path) -> str | None:
    """Why `directory` cannot hold the cache (None: it can; it is created if missing). JAX
    would otherwise fail, or warn, at every compilation."""
    try:
        if directory.exists() and not directory.is_dir():
            return f"the compilation cache path {str(directory)!r} exists and is not a directory"
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        reason = f"{type(error).__name__}: {error.strerror or error}"
        return f"the compilation cache directory {str(directory)!r} cannot be created ({reason})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the compilation cache directory {str(directory)!r} is not writable"
    return None


def configure_from_environment() -> None:
    """What `import phalanx` does; see the module docstring. A directory that cannot be
    used turns the cache off, with one warning: importing phalanx never fails for it."""
    setting = os.environ.get(ENV)
    if setting is not None and setting.strip().lower() in _OFF:
        set_compilation_cache(None)
        return
    if setting is None:
        if jax.config.jax_compilation_cache_dir is not None:
            return  # the user's own JAX setting
        directory = default_directory()
    else:
        directory = Path(setting).expanduser()
    reason = _unusable(directory)
    if reason is None:
        set_compilation_cache(directory)
        return
    set_compilation_cache(None)
    warnings.warn(
        f"phalanx runs without a persistent compilation cache: {reason}. Compiled steps are "
        f"not kept for the next run; set {ENV} to a writable directory, or {ENV}=0 to turn "
        "the cache off without this warning",
        RuntimeWarning,
        stacklevel=2,
    )
