#!/usr/bin/env bash
# Create speculators' own venv for the speculators-mtp engine test (`pytest -m engine`), idempotently.
#
# speculators cannot live in mtp2draft's venv: speculators 0.9.0 pins transformers <= 5.19.0, mtp2draft needs >= 5.24.
# So it gets its own venv, at $MTP2DRAFT_SPECULATORS_VENV (default ~/.cache/mtp2draft/speculators-venv), which
# tests/testing/test_engine_speculators.py drives through a subprocess; scripts/engine_venv.sh builds it (torch's CPU
# wheel first, then speculators==0.9.0 with transformers==5.19.0, the newest it admits, then the media wheels it
# declares but never imports removed). Prints the venv's python on stdout (logs on stderr).
set -euo pipefail
source "$(dirname "$0")/engine_venv.sh"
# the check that the venv works: speculators' mtp type registers against this transformers and torch is the CPU one
engine_venv speculators "${MTP2DRAFT_SPECULATORS_VENV:-$HOME/.cache/mtp2draft/speculators-venv}" "
from importlib.metadata import version
import torch, transformers, speculators
from speculators.models.mtp.model_definitions import mtp_model_classes
assert torch.__version__.startswith('2.13.0'), torch.__version__
print('speculators', version('speculators'), 'transformers', transformers.__version__, 'torch', torch.__version__,
      'mtp types', sorted(mtp_model_classes))" "speculators==0.9.0" "transformers==5.19.0"
