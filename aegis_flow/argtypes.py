"""argparse value types shared by every subcommand: clear messages naming the bad value. Pure."""

from __future__ import annotations

import argparse


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def whole_number(text: str) -> int:
    """Any whole number: the range is checked with the rest of the configuration, so a bad
    value gets the same one line whatever its sign (``--workers 0`` and ``-2`` alike)."""
    return _whole(text)


def positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def port(text: str) -> int:
    """A TCP port; 0 means "any free port"."""
    value = _whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535 (0 = any free port), got {value}")
    return value


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than 0 (``5``, ``0.5``, ``5s``)."""
    value = text[:-1] if text.endswith("s") else text
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds like 5 or 0.5, got {text!r}") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return seconds


def job_name(text: str) -> str:
    """A job or namespace name as the NATS subjects accept it (see ``protocol.check_name``)."""
    from aegis_flow import protocol

    try:
        return protocol.check_name("job", text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def split_command(text: str, *, what: str = "the saver command") -> tuple[str, ...]:
    """One shell-like string as an argument list (``shlex.split``: quotes group, no shell
    runs it); ValueError naming the bad value and the fix when it is empty or unparseable."""
    import shlex

    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ValueError(f"{what} {text!r} cannot be parsed ({str(exc).lower()}): quote it "
                         "as one string, e.g. \"python upload.py --dir 'my ckpt'\"") from None
    if not argv:
        raise ValueError(f"{what} is empty: give the program and its arguments as one "
                         "string, e.g. \"python upload.py --dir ckpt\"")
    return argv


def saver_command(text: str) -> tuple[str, ...]:
    """``--saver "python upload.py --dir ckpt"``: the command as an argument list."""
    try:
        return split_command(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
