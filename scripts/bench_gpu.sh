#!/usr/bin/env bash
# The prepared GPU check: one run of at most 5 minutes on one GPU, a 60-second smoke run first.
#
#   here, once:  python scripts/gpu_wheels.py     # what the GPU image lacks (transformers 5.24, typer 0.29) -> .whl/
#   on the GPU:  bash scripts/bench_gpu.sh            # with .whl/ copied beside the checkout; give it 330 s
#   on a CPU:    bash scripts/bench_gpu.sh --dry  # (or BENCH_GPU_DRY=1) every step end to end, tiny sizes, no GPU
#
# Steps, each under `timeout`, all within BENCH_GPU_BUDGET seconds (300):
#   0. setup: the carried wheels into /tmp/site (GPU run; the image's torch is kept), versions and device to the log;
#   1. smoke (<= 60 s): scripts/bench_distill.py at the bundled tiny-deepseek-v3 target's dimensions, bf16,
#      --train-subset no-routed-experts, no compile (the environment, CUDA and the step itself); the run stops here
#      if it fails;
#   2. evaluate of the bundled tiny-mimo target on CUDA in bf16 (its raw draft from `convert`): must be lossless
#      (outputs equal to the target's greedy ones, or diverging only at bf16 ties of its top two logits);
#   3. the CUDA-marked tests (pytest -m gpu);
#   4. distill steps at DeepSeek-V3's dimensions (examples/configs/deepseek-v3.json: its 11.6B-parameter MTP layer,
#      routed experts frozen), bf16: first eager (distill-eager.json), then with --compile (distill.json), each with
#      tokens/s, the fraction of the bf16 peak and the measured peak memory beside `distill --plan`'s prediction (on
#      out-of-memory: batch 1, the largest that may fit). Last, with the budget that is left, so that a slow compile
#      cannot starve the quick checks, and eager first, so that a compile that does not finish still leaves figures.
# Everything it writes is under $OUT (default out/bench-gpu): bench.log, smoke.json, evaluate.json,
# distill-eager.json, distill.json, summary.json, summary.md; scratch (the converted draft, compiler caches) lives in
# $OUT/scratch and is removed at the end. No checkpoint is saved. Exit status 0 only when every step passed and
# evaluate was lossless.
# In the dry mode the device is the CPU, the sizes are tiny (the DeepSeek-V3 config with its dimensions overridden),
# the compiled run is left out (BENCH_GPU_COMPILE=1 keeps it), the CUDA-marked tests skip, and the time caps are 10
# times the GPU run's (they are sized for the GPU; the dry run checks that every step goes through).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=${BENCH_GPU_DRY:-0}
[ "${1:-}" = "--dry" ] && DRY=1
OUT=${OUT:-out/bench-gpu}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SCR=$OUT/scratch
rm -rf "$SCR" && mkdir -p "$SCR"
trap 'rm -rf "$SCR"' EXIT
LOG=$OUT/bench.log
: >"$LOG"
STEPS=$SCR/steps.tsv
: >"$STEPS"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 HF_HOME=$SCR/hf MTP2DRAFT_CACHE=$SCR/cache
export TORCHINDUCTOR_CACHE_DIR=$SCR/inductor TRITON_CACHE_DIR=$SCR/triton

if [ "$DRY" = 1 ]; then
  PY=${PYTHON:-python3}
  DEVICE=cpu
  COMPILE=${BENCH_GPU_COMPILE:-0}
  TINY='{"hidden_size":64,"intermediate_size":128,"moe_intermediate_size":32,"n_routed_experts":8,
    "num_experts_per_tok":2,"n_group":2,"topk_group":1,"num_attention_heads":4,"num_key_value_heads":4,
    "q_lora_rank":32,"kv_lora_rank":16,"qk_nope_head_dim":16,"qk_rope_head_dim":8,"v_head_dim":16,"vocab_size":512}'
  SMOKE=(--config examples/configs/deepseek-v3.json --override "$TINY" --batch 1 --length 16 --iters 1 --warmup 1)
  MAIN=(--config examples/configs/deepseek-v3.json --override "$TINY" --length 32 --iters 1 --warmup 1)
  BATCH=2
  EVAL=(--max-prompts 2 --max-new-tokens 8)
  SCALE=10 # the caps are the GPU run's; a dry run only checks that every step goes through, on a CPU maybe shared
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
else
  PY=python3
  DEVICE=cuda
  COMPILE=${BENCH_GPU_COMPILE:-1}
  SMOKE=(--config examples/targets/tiny-deepseek-v3/config.json --batch 2 --length 256 --iters 3)
  MAIN=(--config examples/configs/deepseek-v3.json --length "${BENCH_GPU_LENGTH:-2048}" --iters "${BENCH_GPU_ITERS:-3}")
  BATCH=${BENCH_GPU_BATCH:-2}
  EVAL=(--max-prompts 20 --max-new-tokens 64)
  SCALE=1
  if [ -d .whl ]; then
    {
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        for z in .whl/*.zip; do $PY -m zipfile -e "$z" /tmp/site; done
    } >>"$LOG" 2>&1 || { echo "setup failed: see $LOG" | tee -a "$LOG"; exit 1; }
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
BUDGET=${BENCH_GPU_BUDGET:-$((300 * SCALE))}
COMMON=(--device "$DEVICE" --precision bf16 --train-subset no-routed-experts)

# step NAME CAP_SECONDS COMMAND...: run under the smaller of CAP and the budget left; log it; record rc and time
step() {
  local name=$1 cap=$(($2 * SCALE)) left=$((BUDGET - SECONDS)) start=$SECONDS rc
  shift 2
  ((left < cap)) && cap=$left
  if ((cap < 5)); then
    printf '%s\tskipped\t0\n' "$name" >>"$STEPS"
    echo "== $name: skipped, the budget is spent" >>"$LOG"
    return 124
  fi
  echo "== $name (at most ${cap}s): $*" >>"$LOG"
  timeout -k 5 "$cap" "$@" >>"$LOG" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >>"$STEPS"
  echo "== $name: rc $rc in $((SECONDS - start))s" | tee -a "$LOG"
  return $rc
}

{
  echo "== setup: dry=$DRY device=$DEVICE compile=$COMPILE budget=${BUDGET}s"
  $PY -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
    "transformers", transformers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} >>"$LOG" 2>&1

if step smoke 60 $PY scripts/bench_distill.py "${SMOKE[@]}" "${COMMON[@]}" --json "$OUT/smoke.json"; then
  # the quick checks first, so that a slow compile at DeepSeek-V3's size cannot starve them
  step convert 20 $PY -m mtp2draft convert examples/targets/tiny-mimo --out "$SCR/raw" --dtype float32
  step evaluate 40 sh -c "$PY -m mtp2draft evaluate $SCR/raw --target examples/targets/tiny-mimo \
    --data examples/data/heldout.jsonl --device $DEVICE --dtype bfloat16 -k 4 ${EVAL[*]} --json >$OUT/evaluate.json"
  mapfile -t GPU_TESTS < <(grep -l "pytest.mark.gpu" tests/test_*.py)
  step gpu-tests 50 $PY -m pytest -q -p no:cacheprovider -m gpu "${GPU_TESTS[@]}"
  step distill-eager 70 $PY scripts/bench_distill.py "${MAIN[@]}" --batch "$BATCH" "${COMMON[@]}" \
    --json "$OUT/distill-eager.json"
  if [ $? = 3 ] && [ "$DRY" != 1 ]; then # out of memory: the largest that fits, batch 1
    BATCH=1
    step distill-eager-batch1 60 $PY scripts/bench_distill.py "${MAIN[@]}" --batch 1 "${COMMON[@]}" \
      --json "$OUT/distill-eager.json"
  fi
  if [ "$COMPILE" = 1 ]; then
    step distill 180 $PY scripts/bench_distill.py "${MAIN[@]}" --batch "$BATCH" "${COMMON[@]}" --compile \
      --json "$OUT/distill.json"
  fi
else
  echo "smoke run failed: the rest is not run (see $LOG)" | tee -a "$LOG"
fi

# summary.json / summary.md from what the steps left; the exit status says whether everything passed
$PY - "$OUT" "$STEPS" "$DRY" <<'EOF'
import json
import re
import sys
from pathlib import Path

out, steps, dry = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1"


def read(name):
    path = out / name
    return json.loads(path.read_text()) if path.is_file() and path.stat().st_size else None


def gib(n):
    return f"{n / 2**30:.1f} GiB" if isinstance(n, int | float) else "n/a"


ran = {name: {"rc": rc, "seconds": int(s)} for name, rc, s in (r.split("\t") for r in steps.read_text().splitlines())}
ev = read("evaluate.json") or {}
keys = ("target", "device", "dtype", "tie_tolerance", "lossless", "mean_acceptance_length", "acceptance_per_position")
ties = sum(r.get("ties", 0) for r in ev.get("results", []))
tests = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|deselected).*?)\s*=*$", (out / "bench.log").read_text(), re.M)
summary = {
    "dry": dry,
    "steps": ran,
    "smoke": read("smoke.json"),
    "distill_eager": read("distill-eager.json"),
    "distill_compiled": read("distill.json"),
    "gpu_tests": tests[-1] if tests else None,
    "evaluate": {**{k: ev.get(k) for k in keys}, "ties": ties} if ev else None,
}
eager = "distill-eager-batch1" if "distill-eager-batch1" in ran else "distill-eager"
needed = ["smoke", "convert", "evaluate", "gpu-tests", eager] + (["distill"] if not dry or "distill" in ran else [])
# lossless: every output equal to the target's greedy one, or diverging only at a top-two tie within the dtype's
# tolerance (counted in ties); any other mismatch raises LosslessError, and evaluate exits non-zero
summary["ok"] = all(ran.get(n, {}).get("rc") == "0" for n in needed) and (ev.get("lossless") is True or ties > 0)
(out / "summary.json").write_text(json.dumps(summary, indent=2))


def distill_lines(d, what):
    if not d:
        return [f"distill ({what}): no figures (see bench.log)"]
    return [
        f"distill ({what}), DeepSeek-V3's MTP layer ({d.get('device')}, {d.get('precision')}, "
        f"{d.get('train_subset')}, batch {d.get('batch')} x {d.get('length')} tokens, {d.get('ttt_steps')} TTT "
        f"steps): {d.get('tokens_per_s')} tokens/s, {d.get('achieved_tflops')} TFLOP/s = "
        f"{d.get('fraction_of_bf16_peak')} of the bf16 peak ({d.get('bf16_peak_tflops')} TFLOP/s); warm-up "
        f"{d.get('warmup_s')} s. {d.get('error', '')}",
        f"memory: measured peak {gib(d.get('measured_peak_bytes'))}, `distill --plan` {gib(d.get('plan_total_bytes'))} "
        f"(measured / plan {d.get('measured_over_plan')})",
    ]


lines = [
    f"# bench_gpu{' (dry, CPU)' if dry else ''}: {'ok' if summary['ok'] else 'NOT ok'}",
    "",
    "| step | rc | seconds |",
    "| --- | --- | --- |",
    *[f"| {n} | {r['rc']} | {r['seconds']} |" for n, r in ran.items()],
    "",
    *distill_lines(summary["distill_eager"], "eager"),
    *(distill_lines(summary["distill_compiled"], "--compile") if "distill" in ran else []),
    f"gpu tests: {summary['gpu_tests']}",
    f"evaluate: {summary['evaluate']}",
]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if summary["ok"] else 1)
EOF
