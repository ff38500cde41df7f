"""Fault injection inside the training process (only on PYTHONPATH when ``exit:`` is injected).

Side effect: a daemon timer thread that calls ``os._exit(code)``. Chains to any other
``sitecustomize`` further down the path so the user's own one still runs.
"""

import os
import sys
import threading


def _arm() -> None:
    spec = os.environ.pop("AEGIS_INJECT_EXIT", "")
    if not spec:
        return
    code, _, after = spec.partition(":")
    marker = os.environ.pop("AEGIS_INJECT_MARKER", "")

    def fire() -> None:
        if marker:  # tells aegis-flow run that the fault fired
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644))
            except OSError:
                pass
        sys.stderr.write(f"[aegis-flow inject] exiting with code {code}\n")
        sys.stderr.flush()
        os._exit(int(code))

    timer = threading.Timer(float(after or 0), fire)
    timer.daemon = True
    timer.start()


_arm()
_here = os.path.dirname(os.path.abspath(__file__))
_rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
if "sitecustomize" in sys.modules and sys.modules["sitecustomize"].__file__ == __file__:
    import importlib.util

    for _p in _rest:
        _cand = os.path.join(_p or ".", "sitecustomize.py")
        if os.path.isfile(_cand):
            _spec = importlib.util.spec_from_file_location("_aegis_user_sitecustomize", _cand)
            if _spec and _spec.loader:
                _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
            break
