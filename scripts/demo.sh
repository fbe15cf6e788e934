#!/usr/bin/env bash
# The quick start on a fresh machine: create .venv if needed, install mtp2draft (torch pinned to the CPU wheel this
# machine has on disk; a bare `torch` would pull a multi-GB CUDA build), then run the full path on the bundled target:
# convert -> distill -> evaluate beside the raw MTP head -> export, printing the acceptance table.
# Extra arguments go to `mtp2draft demo` (e.g. --steps 60).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e . 2>&1 \
  | grep -v "^WARNING: Location" || true
exec .venv/bin/mtp2draft demo "$@"
