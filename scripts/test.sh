#!/usr/bin/env bash
# Run the test suite on a fresh machine: create .venv if needed, install the package with its test extras
# (torch pinned to the CPU wheel on this machine's disk), then lint and test.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[test,train]" 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest -q "$@"
