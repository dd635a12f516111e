"""torchrun for hwrun's ranks: `torch.distributed.run`'s own `main`, with the ranks' failure reported by its exit
status instead of torchrun's traceback box (each rank already printed its one-line error), and torch's elastic agent
logs quiet (its "sending SIGTERM" and "failed (exitcode: 2)" notes repeat what the ranks said). `python -m hwrun.parallel.torchrun ARGS` takes
torchrun's arguments; the exit status is the first failed rank's (2 for an hwrun error), 128 + N for a signal N.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run torchrun with `argv` (default: this process's arguments); its ranks' exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        torchrun(list(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as error:
        _rank, failure = error.get_first_failure()
        code = failure.exitcode
        return code if code > 0 else 128 - code if code < 0 else 1
    except SignalException as error:  # torchrun stopped its ranks on this signal
        return 128 + int(getattr(error, "sigval", signal.SIGTERM))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a module by hwrun.parallel.launch
    sys.exit(main())
