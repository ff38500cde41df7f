"""One container of a rehearsed pod: its own filesystem view, hostname and environment.

Run as ``ip netns exec POD unshare --mount --uts --propagation private -- python shim.py SPEC``
(standalone: stdlib only, so it starts fast and needs nothing from the package). Inside the
new mount namespace it builds a root for the container under ``SPEC.root``:

* every top-level directory of the host's ``/`` is seen through an overlay whose writable
  layer belongs to the container (writes stay in the container, as in an image's writable
  layer; read-only where overlayfs refuses; ``/dev``, ``/proc`` and ``/sys`` bound as they
  are), except the
  directories on the way to a mount path, which are made as real directories and filled the
  same way one level down (so a mount at ``/var/run/aegis/auth`` never creates anything on the
  host), and symlinks, which are copied as symlinks;
* the container's own ``/tmp`` (a fresh directory per container, as an image's ``/tmp`` is),
  and in it, through an overlay as above (a mount with ``overlay``), the host directories a
  pod needs that lie under the host's ``/tmp`` (a checkout and its interpreter there);
* the pod's volumes at their ``mountPath`` (``emptyDir`` directories shared by the pod's
  containers, Secret files), read-only where the spec says so, and the image stand-in's files;

then sets the pod's hostname, ``chroot``s, changes to the working directory and ``exec``s the
container's command with its environment. A command that cannot be found exits 128 with the
container runtime's words (``exec: "X": executable file not found in $PATH``).

Side effects: mounts (private to the new mount namespace, gone when the container exits),
directories under ``SPEC.root``, the hostname of the new UTS namespace, exec.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
_libc = ctypes.CDLL(None, use_errno=True)
WRITABLE = {"/dev", "/proc", "/sys"}  # the host's other directories are mounted read-only


def _mount(src: str, dst: str, flags: int) -> None:
    if _libc.mount(src.encode(), dst.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


def _bind(src: str, dst: str, *, read_only: bool = False) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst):
            open(dst, "a").close()
    _mount(src, dst, MS_BIND | MS_REC)
    if read_only:
        _mount(src, dst, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _prefixes(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _overlay(host: str, target: str, layers: str) -> bool:
    """``host`` seen through a per-container overlay: writes land in ``layers`` (and vanish
    with the container), as in an image's writable layer; False if overlayfs refuses."""
    key = host.strip("/").replace("/", "_") or "root"
    upper, work = os.path.join(layers, key, "upper"), os.path.join(layers, key, "work")
    os.makedirs(upper, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    opts = f"lowerdir={host},upperdir={upper},workdir={work}".encode()
    return bool(_libc.mount(b"overlay", target.encode(), b"overlay", 0, opts) == 0)


def _populate(host: str, root: str, shadowed: set[str], mounted: set[str], layers: str
              ) -> None:
    for entry in sorted(os.listdir(host)):
        hp = os.path.join(host, entry)
        try:
            _populate_one(hp, root, shadowed, mounted, layers)
        except OSError:
            if os.path.lexists(hp):
                raise
            # gone from the host meanwhile (another process's temporary file under a shadowed
            # /tmp: a container started a moment later would not see it either)


def _populate_one(hp: str, root: str, shadowed: set[str], mounted: set[str], layers: str
                  ) -> None:
    rp = root + hp
    if hp in mounted and hp not in shadowed:
        return
    if os.path.islink(hp):
        os.symlink(os.readlink(hp), rp)
    elif hp in shadowed and os.path.isdir(hp):
        os.makedirs(rp, exist_ok=True)
        _populate(hp, root, shadowed, mounted, layers)
    elif os.path.isdir(hp):
        os.makedirs(rp, exist_ok=True)
        if hp in WRITABLE:
            _mount(hp, rp, MS_BIND | MS_REC)
        elif not _overlay(hp, rp, layers):
            _mount(hp, rp, MS_BIND | MS_REC)
            _mount(hp, rp, MS_BIND | MS_REMOUNT | MS_RDONLY)
    elif os.path.isfile(hp):
        open(rp, "a").close()
        _mount(hp, rp, MS_BIND)
        _mount(hp, rp, MS_BIND | MS_REMOUNT | MS_RDONLY)


def build_root(root: str, mounts: list[dict[str, object]], layers: str) -> None:
    paths = [os.path.realpath(str(m["path"])) for m in mounts]
    shadowed = {p for path in paths for p in _prefixes(path)}
    os.makedirs(root, exist_ok=True)
    _populate("/", root, shadowed, set(paths), layers)
    for m, path in sorted(zip(mounts, paths, strict=True), key=lambda mp: mp[1].count("/")):
        if m.get("overlay"):  # a host directory seen as the others are: through its own layer
            os.makedirs(root + path, exist_ok=True)
            if _overlay(str(m["source"]), root + path, layers):
                continue
        _bind(str(m["source"]), root + path, read_only=bool(m.get("readOnly")))


def main(argv: list[str]) -> int:
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        build_root(spec["root"], spec["mounts"], spec.get("layers") or spec["root"] + ".layers")
        name = spec["hostname"].encode()
        if _libc.sethostname(name, len(name)) != 0:
            raise OSError(ctypes.get_errno(), "sethostname")
        os.chroot(spec["root"])
        workdir = spec.get("workdir") or "/"
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
    except OSError as exc:
        print(f"rehearse: cannot set up the container's filesystem: {exc}", file=sys.stderr)
        return 128
    cmd = spec["argv"]
    env = spec["env"]
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f'exec: "{cmd[0]}": executable file not found in $PATH', file=sys.stderr)
    except PermissionError:
        print(f'exec: "{cmd[0]}": permission denied', file=sys.stderr)
    except OSError as exc:  # Go's errno text is lower case ("argument list too long")
        text = exc.strerror or str(exc)
        print(f'exec: "{cmd[0]}": {text[:1].lower()}{text[1:]}', file=sys.stderr)
    return 128


if __name__ == "__main__":
    sys.exit(main(sys.argv))
