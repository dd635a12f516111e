"""`SignalStop`: SIGTERM/SIGINT handlers that only note the signal, so a training loop can save at the next step
boundary and stop; a second signal restores the earlier handler and re-raises it at once. No torch, no Transformers:
`GracefulStop` (Trainer) and `HwrunAccelerateGuard` (your own Accelerate loop) both build on it."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


class SignalStop:
    """Notes the first SIGTERM/SIGINT in `received` (the loop saves and stops); a second one stops at once.

    `install()` is explicit and idempotent (a second call changes nothing), `uninstall()` restores exactly the handlers
    found at `install()` (idempotent too); both act in the main thread only, where Python delivers signals."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def installed(self) -> bool:
        """True between `install()` and `uninstall()`."""
        return bool(self._previous)

    def install(self) -> bool:
        """Install the handlers (main thread only; returns False elsewhere, with a log line). Already installed: True,
        and nothing changes (the handlers found the first time are the ones restored)."""
        if self.installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            logger.info("Not in the main thread: SIGTERM/SIGINT will not save a checkpoint.")
            return False
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Restore the handlers that were there before `install()` (idempotent)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            logger.warning("Second %s: stopping now without a checkpoint.", signal.Signals(signum).name)
            previous = self._previous.get(signum, signal.SIG_DFL)
            self.uninstall()
            if callable(previous):
                previous(signum, frame)
                return
            signal.raise_signal(signum)
            return
        self.received = signum
        logger.warning("%s received: saving a checkpoint after this step, then stopping "
                       "(send it again to stop at once).", signal.Signals(signum).name)
