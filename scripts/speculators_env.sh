#!/usr/bin/env bash
# Create speculators' own venv for the speculators-mtp engine test (`pytest -m engine`), idempotently.
#
# speculators cannot live in mtp2draft's venv: speculators 0.9.0 pins transformers <= 5.19.0, mtp2draft needs >= 5.24.
# So it gets its own venv, at $MTP2DRAFT_SPECULATORS_VENV (default ~/.cache/mtp2draft/speculators-venv), which
# tests/testing/test_engine_speculators.py drives through a subprocess. Order matters:
#   1. torch==2.13.0 first, the CPU wheel on this machine's disk (a bare `torch`, or torch pulled in by speculators,
#      would be a multi-GB CUDA build);
#   2. speculators==0.9.0 with transformers==5.19.0 (the newest it admits);
#   3. remove torchvision / torchaudio / torchcodec: speculators declares them but imports neither (0.9.0's sources),
#      and the index's builds break `import transformers` against the CPU torch (as in scripts/vllm_env.sh).
# A marker file is written only after all three succeed: an interrupted install is redone on the next call.
# Prints the venv's python on stdout (logs on stderr).
set -euo pipefail
VENV="${MTP2DRAFT_SPECULATORS_VENV:-$HOME/.cache/mtp2draft/speculators-venv}"
TORCH="torch==2.13.0"
SPECULATORS="speculators==0.9.0"
TRANSFORMERS="transformers==5.19.0"
MARKER="$VENV/.mtp2draft-ready"
WANT="$TORCH $SPECULATORS $TRANSFORMERS"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
rm -f "$MARKER"
start=$(date +%s)
echo "creating speculators venv at $VENV ($WANT)" >&2
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# pip's own status decides (pipefail); the filter only drops the index's noise
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }; }
pip install -q "$TORCH"
pip install -q "$SPECULATORS" "$TRANSFORMERS" "$TORCH"
pip uninstall -q -y torchvision torchaudio torchcodec
# the check that the venv works: speculators' mtp type registers against this transformers and torch is the CPU one
"$VENV/bin/python" -c "
from importlib.metadata import version
import torch, transformers, speculators
from speculators.models.mtp.model_definitions import mtp_model_classes
assert torch.__version__.startswith('2.13.0'), torch.__version__
print('speculators', version('speculators'), 'transformers', transformers.__version__, 'torch', torch.__version__,
      'mtp types', sorted(mtp_model_classes))" >&2
echo "$WANT" > "$MARKER"
echo "speculators venv ready in $(( $(date +%s) - start ))s" >&2
echo "$VENV/bin/python"
