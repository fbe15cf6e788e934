# Sourced by scripts/vllm_env.sh and scripts/speculators_env.sh: build an engine's own venv, idempotently.
#
#   engine_venv NAME VENV CHECK PACKAGE...
#
# Engines pin an older transformers than mtp2draft's, so each gets a venv of its own. Order matters:
#   1. torch==2.13.0 first, the CPU wheel on this machine's disk (a bare `torch`, or torch pulled in by a package,
#      would be a multi-GB CUDA build); it is pinned again beside the packages so nothing replaces it;
#   2. the PACKAGEs;
#   3. remove torchvision / torchaudio / torchcodec: the index's builds break `import transformers` against the CPU
#      torch, and the engines here need them only for media inputs (vLLM) or not at all (speculators 0.9.0).
# Then CHECK (Python source) runs in the venv. A marker file holding the pins is written only after all of it
# succeeds: an interrupted install, or other pins, is redone on the next call. Prints the venv's python on stdout
# (logs on stderr).
TORCH="torch==2.13.0"

engine_venv() {
  local name="$1" venv="$2" check="$3"
  shift 3
  local marker="$venv/.mtp2draft-ready" want="$TORCH $*" start
  if [ -f "$marker" ] && [ "$(cat "$marker")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "$venv/bin/python"
    return 0
  fi
  rm -f "$marker"
  start=$(date +%s)
  echo "creating $name venv at $venv ($want)" >&2
  mkdir -p "$(dirname "$venv")"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  # pip's own status decides (pipefail); the filter only drops the index's noise
  pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 | { grep -v "^WARNING: Location" >&2 || true; }; }
  pip install -q "$TORCH"
  pip install -q "$@" "$TORCH"
  pip uninstall -q -y torchvision torchaudio torchcodec
  "$venv/bin/python" -c "$check" >&2
  echo "$want" > "$marker"
  echo "$name venv ready in $(( $(date +%s) - start ))s" >&2
  echo "$venv/bin/python"
}
