"""Read typed settings from environment variables, with errors that name the variable.

Every phalanx setting that can come from the environment goes through these helpers so a bad
value fails early with the variable's name, what it held, and what would be legal.
"""

from __future__ import annotations

from collections.abc import Mapping


def read_str(environ: Mapping[str, str], name: str) -> str | None:
    """Return the stripped value of `name`, or None when it is unset or empty.

    Args:
      environ: the environment to read (usually `os.environ`).
      name: the variable's name.

    Returns:
      The value without surrounding whitespace, or None.

    Example:
      >>> read_str({"A": " x "}, "A")
      'x'
    """
    value = environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def read_int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int | None:
    """Return `name` parsed as an int of at least `minimum`, or None when unset or empty.

    Args:
      environ: the environment to read (usually `os.environ`).
      name: the variable's name.
      minimum: the smallest legal value.

    Returns:
      The integer, or None.

    Raises:
      ValueError: the value is not an integer or is below `minimum`.

    Example:
      >>> read_int({"N": "2"}, "N", minimum=1)
      2
    """
    text = read_str(environ, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={environ[name]!r} is not an integer; "
            f"set it to a whole number >= {minimum} (e.g. {name}={max(minimum, 1)}) or unset it"
        ) from None
    if value < minimum:
        raise ValueError(
            f"environment variable {name}={value} is below {minimum}; "
            f"set it to a whole number >= {minimum} or unset it"
        )
    return value


def check_int(value: object, name: str, *, minimum: int = 0) -> int:
    """Return `value` if it is an int of at least `minimum` (bools rejected).

    Args:
      value: the value to check, usually a function argument.
      name: the argument's name, for the error message.
      minimum: the smallest legal value.

    Returns:
      `value`, unchanged.

    Raises:
      TypeError: `value` is not an int.
      ValueError: `value` is below `minimum`.

    Example:
      >>> check_int(3, "num_processes", minimum=1)
      3
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be an int >= {minimum}; got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {name}={value}")
    return value
