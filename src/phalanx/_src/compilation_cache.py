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
"""

from __future__ import annotations

import os
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
      path: the cache directory (created when needed), or None to turn the cache off.

    Raises:
      ValueError: `path` exists and is not a directory.

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
    if directory.exists() and not directory.is_dir():
        raise ValueError(
            f"the compilation cache path {str(directory)!r} exists and is not a directory; "
            f"pass a directory, or None (or {ENV}=0) to turn the cache off"
        )
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _MIN_COMPILE_TIME_S)
    compilation_cache.reset_cache()  # the next compilation opens the new directory


def configure_from_environment() -> None:
    """What `import phalanx` does; see the module docstring."""
    setting = os.environ.get(ENV)
    if setting is not None:
        off = setting.strip().lower() in _OFF
        set_compilation_cache(None if off else setting)
    elif jax.config.jax_compilation_cache_dir is None:
        set_compilation_cache(default_directory())
