"""Test helper run under torchrun: the mtp2draft CLI, with the options in $RANK_<r>_OPTIONS appended on rank r only
(ranks started with different settings, which torchrun itself never does)."""

import os
import shlex
import sys

from mtp2draft.cli.app import main

if __name__ == "__main__":
    extra = shlex.split(os.environ.get(f"RANK_{os.environ.get('RANK', '0')}_OPTIONS", ""))
    sys.exit(main(sys.argv[1:] + extra))
