"""Stopping together: SIGTERM and Ctrl-C, and ranks that are gone.

A run stops cleanly when SIGTERM or a first Ctrl-C (SIGINT) arrives: the current step ends, a
checkpoint is written, and fit returns; a second Ctrl-C stops at once (KeyboardInterrupt).
Under data parallelism a signal may reach the ranks at different steps (or one rank only), so
the ranks vote: each step end starts a small asynchronous all-reduce (MAX) of "a signal
arrived here" on a gloo group of its own, and reads the previous step's result, so every
rank stops, and rank 0 saves, at the same step. The vote costs one tiny collective per step,
started a step before it is read.

When a collective fails, `lost_ranks` names the ranks on this machine whose process is gone
(each rank records its host and process id in the process group's store), so the error can
say which rank died instead of a bare timeout.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import torch

from .world import World

_NAMES = {"sigint": "Ctrl-C", "sigterm": "SIGTERM", "logger": "a logger's failure"}


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


class StopCoordinator:
    """One per Trainer: `install` the signal handlers for a fit, ask `should_stop` at step ends
    (True once every rank agrees a signal arrived), `lost_ranks` when a collective fails, and
    `close` at the end of the fit. Built on every rank at the same point (its vote group is
    made by a collective)."""

    def __init__(self, world: World):
        self.world = world
        self.reason: str | None = None           # 'sigint', 'sigterm' (or 'logger': request) once one arrived
        self._event = threading.Event()          # a signal arrived here (set by the handler)
        self._votes = self._vote_work = None
        self._vote_box = torch.zeros(1, dtype=torch.int32)   # reused every step: filled after the last vote is read
        self._old_handlers = None
        if world.size > 1:   # a CPU (gloo) group for the votes, whatever the device
            import torch.distributed as dist
            self._votes = dist.new_group(backend="gloo")
            # where each rank runs, so that a rank that dies can be named by the others (same machine)
            dist.distributed_c10d._get_default_store().set(f"hasten/rank{world.rank}",
                                                           f"{socket.gethostname()} {os.getpid()}")

    # ------------------------------------------------------------------ signals
    @property
    def signalled(self) -> bool:
        """A stop was asked for (by a signal here, or agreed by the vote)."""
        return self._event.is_set()

    @property
    def pending(self) -> bool:
        """Whether a step end must call `should_stop` (the one cheap check in the loop)."""
        return self._votes is not None or self._event.is_set()

    @property
    def what(self) -> str:
        """'Ctrl-C', 'SIGTERM' or "a logger's failure", for messages."""
        return _NAMES.get(self.reason or "sigterm", "SIGTERM")

    def install(self) -> None:
        """SIGTERM and a first Ctrl-C ask for a checkpoint at the end of the current step and a
        clean stop; a second Ctrl-C stops at once. Only the main thread can install handlers."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._event.clear()
        self.reason = None

        def on_signal(signum, frame):
            if signum == signal.SIGINT and self._event.is_set():
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            self.reason = "sigint" if signum == signal.SIGINT else "sigterm"
            self._event.set()
            if signum == signal.SIGINT:
                print("\nCtrl-C: saving a checkpoint at the end of this step, then stopping "
                      "(press Ctrl-C again to stop at once, without saving)", file=sys.stderr, flush=True)

        self._old_handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def request(self, reason: str) -> None:
        """Ask for the same clean stop a signal asks for (the checkpoint at the end of this step),
        for `reason` ('logger': a logger failed under on_logger_error=stop)."""
        self.reason = self.reason or reason
        self._event.set()

    def should_stop(self) -> bool:
        """True when training must stop at this step end: a signal arrived (under data
        parallelism: the ranks' vote of the previous step end says one arrived somewhere)."""
        if self._votes is not None:
            if not self._agree():
                return False
            if self.reason is None:
                self.reason = "sigterm"   # another rank's signal: the same clean stop here
            self._event.set()
        return self._event.is_set()

    def _agree(self) -> bool:
        """The ranks' vote of the previous step end (the same answer on every rank); starts this one's."""
        import torch.distributed as dist
        agreed = False
        if self._vote_work is not None:
            self._vote_work.wait()   # started a whole step ago: long done
            agreed = bool(self._vote_box.item())
        self._vote_box.fill_(int(self._event.is_set()))
        self._vote_work = dist.all_reduce(self._vote_box, op=dist.ReduceOp.MAX, group=self._votes, async_op=True)
        return agreed

    # ------------------------------------------------------------------ lost ranks
    def lost_ranks(self, grace_s: float = 2.0) -> list[int]:
        """The other ranks on this machine whose process is gone (ranks elsewhere cannot be
        checked from here); empty in one process. A killed process closes its sockets before
        it is gone, so a collective can fail while its peer still looks alive: when none is
        gone yet, look again for up to `grace_s` seconds (this runs only after a failure)."""
        if self.world.size <= 1:
            return []
        import torch.distributed as dist
        host = socket.gethostname()
        try:
            store = dist.distributed_c10d._get_default_store()
        except Exception:
            return []
        pids = {}   # rank -> process id, for the other ranks on this machine
        for r in range(self.world.size):
            if r == self.world.rank:
                continue
            try:
                where, pid = store.get(f"hasten/rank{r}").decode().rsplit(" ", 1)
            except Exception:
                continue
            if where == host:
                pids[r] = int(pid)
        deadline = time.monotonic() + grace_s
        while True:
            lost = [r for r, pid in pids.items() if not process_alive(pid)]
            if lost or not pids or time.monotonic() >= deadline:
                return lost
            time.sleep(0.05)

    def close(self) -> None:
        """End of a fit: finish the last vote still in flight (before the process group can be
        torn down, else gloo aborts the process) and put the old signal handlers back."""
        if self._vote_work is not None:
            try:
                self._vote_work.wait()
            except RuntimeError:
                pass                      # a lost rank: reported by the caller
            self._vote_work = None
        for sig, handler in (self._old_handlers or {}).items():
            signal.signal(sig, handler)
        self._old_handlers = None
