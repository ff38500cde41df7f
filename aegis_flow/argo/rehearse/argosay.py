"""A local stand-in for Argo's test image ``argoproj/argosay:v2``.

``aegis-flow rehearse`` runs ``python -m aegis_flow.argo.rehearse.argosay ARGS...`` in place of a
container of that image that has no ``command`` (the image's ENTRYPOINT is ``/argosay``).

Matched against argoproj/argo-workflows **v4.0.5**, ``test/e2e/images/argosay/v2/argosay`` (the
same in v4.1.2): since Argo v3.1 (commit 8e137582cc, 2021-03) v2 is a ``#!/bin/sh`` + ``set -eu``
script on an Ubuntu base (dash as ``/bin/sh``, GNU coreutils/grep, C locale), no longer the Go
program that once lived at ``v2/main/argosay.go``. So, like the image:

* only the first argument selects: no argument or ``''`` -> ``hello argo``; ``echo`` (no MSG
  -> ``hello argo``; ``echo MSG`` -> dash ``echo``, i.e. backslash escapes are interpreted and a
  lone ``-n`` prints nothing; ``echo MSG FILE`` -> ``mkdir -p "$(dirname $FILE)"`` (unquoted, so
  split on blanks), MSG plus a newline into FILE, then a 0.1 s sleep; 3+ arguments after
  ``echo`` do nothing and exit 0, the script's ``default)`` branch being a literal pattern that
  never matches); ``cat FILE`` (one file); ``sleep N[smhd]`` (GNU ``sleep``: ``5``, ``2s``,
  ``0.5m``; a Go duration such as ``500ms`` is an invalid time interval, exit 1);
  ``exit [CODE]`` (default 0; dash: digits only, at most 2147483647, status ``CODE & 255``,
  anything else ``Illegal number``, exit 2); ``assert_contains FILE TEXT`` (``grep -F TEXT
  FILE``: prints the matching lines; 0 found, 1 not found, 2 unreadable); ``sh [FILE]``
  (``sh FILE``, default the file ``0``);
* extra arguments are ignored; an unknown sub-command exits 1 and prints nothing;
* a missing required argument is dash's ``set -u`` error on stderr, e.g.
  ``/argosay: 12: 2: parameter not set`` (script line, parameter number), exit 2;
* errors of the tools it calls use their C-locale wording (``cat: 'x': No such file or
  directory``, ``sleep: invalid time interval 'x'``).

There is no ``assert_exists`` and no Go-duration parsing in v2 (nor were there in the old Go
program, which had ``assert_contains``, ``cat``, ``echo``, ``exit``, ``sleep`` only).
Not reproduced: glob expansion of the unquoted ``$FILE`` and GNU ``sleep --help``/``--version``.

Side effects: all in the sub-commands run by :func:`run` (stdout/stderr writes, ``mkdir`` and the
file written by ``echo MSG FILE``, sleeping, the ``sh`` child process) and in :func:`main`,
which exits the process with the status.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from typing import BinaryIO

SCRIPT = "/argosay"  # $0 in dash's own messages (the image's ENTRYPOINT)
HELLO = b"hello argo\n"
_INT_MAX = 2**31 - 1
# dash's ``set -u`` errors name the script line of the expansion that failed
_LINE = {"assert_contains": 9, "cat": 12, "sleep": 31}
_SIMPLE_ESCAPES = {"\\": 0x5C, "a": 0x07, "b": 0x08, "e": 0x1B, "f": 0x0C, "n": 0x0A,
                   "r": 0x0D, "t": 0x09, "v": 0x0B}
# GNU sleep: strtod number (decimal, hex float, inf) and one optional unit letter
_SLEEP = re.compile(r"\s*\+?(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
                    r"|0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
                    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)(?P<unit>[smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SHELL_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def dash_echo(message: bytes) -> bytes:
    """What dash's builtin ``echo "$message"`` writes (pure)."""
    if message == b"-n":
        return b""
    out = bytearray()
    i, n = 0, len(message)
    while i < n:
        ch = message[i]
        if ch != 0x5C or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = chr(message[i + 1])
        if nxt == "c":
            return bytes(out)  # \c: stop here, no newline
        if nxt in "01234567":
            j = i + 2 if nxt == "0" else i + 1  # \0NNN or \NNN, up to three octal digits
            end = j
            while end < n and end < j + 3 and chr(message[end]) in "01234567":
                end += 1
            out.append(int(message[j:end] or b"0", 8) & 0xFF)
            i = end
        elif nxt in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[nxt])
            i += 2
        else:
            out += message[i:i + 2]
            i += 2
    out.append(0x0A)
    return bytes(out)


def gnu_quote(name: str) -> str:
    """A file name as GNU tools quote it in C-locale error messages (pure)."""
    if _SHELL_SAFE.fullmatch(name):
        return name
    return "'" + name.replace("'", "'\\''") + "'"


def gnu_dirname(path: str) -> str:
    """GNU ``dirname PATH`` (pure)."""
    stripped = path.rstrip("/")
    if not stripped:
        return "/" if path else "."
    cut = stripped.rfind("/")
    if cut < 0:
        return "."
    return stripped[:cut].rstrip("/") or "/"


def sleep_seconds(arg: str) -> float | None:
    """Seconds GNU ``sleep ARG`` waits, or None for an invalid time interval (pure)."""
    m = _SLEEP.fullmatch(arg)
    if m is None:
        return None
    num = m.group("num")
    value = float.fromhex(num) if num[:2].lower() == "0x" else float(num)
    return value * _UNIT[m.group("unit")]


def _param_not_set(sub: str, index: int, err: BinaryIO) -> int:
    err.write(f"{SCRIPT}: {_LINE[sub]}: {index}: parameter not set\n".encode())
    return 2


def _os_error(tool: str, name: str, exc: OSError, err: BinaryIO, quote: bool = True) -> None:
    shown = gnu_quote(name) if quote else name
    err.write(os.fsencode(f"{tool}: {shown}: {exc.strerror}\n"))


def _assert_contains(args: list[str], out: BinaryIO, err: BinaryIO) -> int:
    if len(args) < 3:
        return _param_not_set("assert_contains", 3, err)
    pattern, filename = os.fsencode(args[2]), args[1]
    try:
        with open(filename, "rb") as f:
            data = f.read()
    except OSError as exc:
        _os_error("grep", filename, exc, err, quote=False)
        return 2
    needles = pattern.split(b"\n")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    hits = [line for line in lines if any(n in line for n in needles)]
    if not hits:
        return 1
    if b"\0" in data:
        out.write(os.fsencode(f"grep: {filename}: binary file matches\n"))
    else:
        out.write(b"".join(line + b"\n" for line in hits))
    return 0


def _cat(args: list[str], out: BinaryIO, err: BinaryIO) -> int:
    if len(args) < 2:
        return _param_not_set("cat", 2, err)
    try:
        with open(args[1], "rb") as f:
            out.write(f.read())
    except OSError as exc:
        _os_error("cat", args[1], exc, err)
        return 1
    return 0


def _echo(args: list[str], out: BinaryIO, err: BinaryIO) -> int:
    if len(args) == 1:
        out.write(HELLO)
    elif len(args) == 2:
        out.write(dash_echo(os.fsencode(args[1])))
    elif len(args) == 3:
        return _echo_to_file(args[1], args[2], err)
    return 0  # 3+ arguments after echo: no branch of the inner case matches


def _echo_to_file(message: str, target: str, err: BinaryIO) -> int:
    words = [w for w in re.split(r"[ \t\n]+", target) if w]  # $(dirname $3): unquoted
    if not words:
        err.write(b"dirname: missing operand\nTry 'dirname --help' for more information.\n")
    directory = "\n".join(gnu_dirname(w) for w in words)
    try:
        if not directory:
            raise FileNotFoundError(2, os.strerror(2), directory)
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        shown = gnu_quote(str(exc.filename) if exc.filename is not None else directory)
        err.write(os.fsencode(f"mkdir: cannot create directory {shown}: {exc.strerror}\n"))
        return 1
    try:
        with open(target, "wb") as f:
            f.write(dash_echo(os.fsencode(message)))
    except OSError as exc:
        reason = "Directory nonexistent" if isinstance(exc, FileNotFoundError) else exc.strerror
        err.write(os.fsencode(f"{SCRIPT}: 20: cannot create {target}: {reason}\n"))
        return 2
    time.sleep(0.1)  # the image sleeps so the PNS executor can secure the root file
    return 0


def _exit(args: list[str], err: BinaryIO) -> int:
    text = args[1] if len(args) > 1 and args[1] else "0"
    if not (text.isascii() and text.isdigit()) or int(text) > _INT_MAX:
        err.write(os.fsencode(f"{SCRIPT}: 28: exit: Illegal number: {text}\n"))
        return 2
    return int(text) & 0xFF


def _sleep(args: list[str], err: BinaryIO) -> int:
    if len(args) < 2:
        return _param_not_set("sleep", 2, err)
    arg = args[1]
    try_help = b"Try 'sleep --help' for more information.\n"
    if arg == "--":
        return 0
    if arg.startswith("--"):
        err.write(os.fsencode(f"sleep: unrecognized option '{arg}'\n") + try_help)
        return 1
    if arg.startswith("-") and len(arg) > 1:
        err.write(os.fsencode(f"sleep: invalid option -- '{arg[1]}'\n") + try_help)
        return 1
    seconds = sleep_seconds(arg)
    if seconds is None:
        err.write(os.fsencode(f"sleep: invalid time interval '{arg}'\n") + try_help)
        return 1
    while math.isinf(seconds):
        time.sleep(86400.0)
    time.sleep(seconds)
    return 0


def _sh(args: list[str]) -> int:
    script = args[1] if len(args) > 1 and args[1] else "0"
    return subprocess.run(["sh", script], check=False).returncode


def run(args: list[str], out: BinaryIO, err: BinaryIO) -> int:
    """Run argosay with ``args`` (no program name); return the exit status."""
    sub = args[0] if args else ""
    if sub == "":
        out.write(HELLO)
        return 0
    if sub == "assert_contains":
        return _assert_contains(args, out, err)
    if sub == "cat":
        return _cat(args, out, err)
    if sub == "echo":
        return _echo(args, out, err)
    if sub == "exit":
        return _exit(args, err)
    if sub == "sleep":
        return _sleep(args, err)
    if sub == "sh":
        out.flush()
        err.flush()
        return _sh(args)
    return 1


def main(argv: list[str] | None = None) -> None:
    """Entry point: run and exit the process with argosay's status."""
    args = sys.argv[1:] if argv is None else argv
    code = run(args, sys.stdout.buffer, sys.stderr.buffer)
    sys.stdout.buffer.flush()
    sys.stderr.buffer.flush()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
