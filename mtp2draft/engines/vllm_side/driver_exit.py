"""How the drivers run by vLLM's Python (`dump_driver.py`, `serve_driver.py`) end once their reply is written.

vLLM 0.32's CPU engine can abort in its own interpreter-exit teardown ("terminate called without an active
exception", SIGABRT; seen here in 2 of 4 dump runs), which would fail a run whose files are all written. So a driver
leaves without that teardown. Imports only the standard library.
"""

from __future__ import annotations

import os
import sys


def leave(status: int) -> None:
    """Flush and exit with `status`, skipping atexit handlers and vLLM's teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
