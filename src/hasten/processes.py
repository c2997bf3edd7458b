"""Child processes that end with the command that started them.

`hasten bench` and `hasten tune` run each trial in a worker process. A worker is started in its
own session (so a signal meant for it reaches its whole group, torchrun's workers included) and,
on Linux, with a parent-death signal: if the command dies, even by SIGKILL, the kernel sends
the worker SIGTERM. `stop` ends a worker's group: SIGTERM, then SIGKILL after a grace period
(or at a second Ctrl-C). Commands turn SIGTERM into an exception that unwinds like Ctrl-C, so
their temporary folders go on every signal they can see.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys

GRACE_S = 10.0


def _die_with_parent() -> None:   # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    """Popen(argv) in a new session that receives SIGTERM when this process dies (Linux)."""
    return subprocess.Popen(argv, start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None, **kw)


def stop(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the worker's whole session, SIGKILL after `grace_s` (or at a second Ctrl-C);
    wait for it."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            continue
    proc.wait()


class Terminated(BaseException):
    """SIGTERM outside training: unwinds like Ctrl-C, so what was made is undone."""


def raise_terminated(signum, frame):
    raise Terminated()
