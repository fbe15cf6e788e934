"""`python -m mtp2draft ...` and `torchrun --nproc-per-node N -m mtp2draft distill ...`: the same CLI as `mtp2draft`."""

import sys

from mtp2draft.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
