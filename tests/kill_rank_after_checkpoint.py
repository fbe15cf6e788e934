"""Test helper run under torchrun: the mtp2draft CLI, except that rank $KILL_RANK SIGKILLs itself right after the
checkpoint of step $KILL_AFTER_STEP is complete (a hard crash at a known point; `kill -9` from outside races the run)."""

import importlib
import os
import signal
import sys

from mtp2draft.cli.app import main

distill_module = importlib.import_module("mtp2draft.train.recipe")  # the module (the package exports the function)

_save = distill_module.save_checkpoint


def _save_then_die(folder, step, *args, **kwargs):
    _save(folder, step, *args, **kwargs)
    if step == int(os.environ["KILL_AFTER_STEP"]) and os.environ.get("RANK") == os.environ["KILL_RANK"]:
        os.kill(os.getpid(), signal.SIGKILL)


distill_module.save_checkpoint = _save_then_die

if __name__ == "__main__":
    sys.exit(main())
