#!/usr/bin/env bash
# Everything this project measures on one GPU, step by step (each step under its own time limit, so a
# slow one cannot cost the results of the others inside one 10-minute device command):
#   build   the `small` testbed (prints stage times and the per-category tau table; resumable);
#   bench   end-to-end tokens/s and speedup of every method on it, eager and CUDA graphs side by side
#           (adds WhiFlash-Neural when the `router` step has left a router in TESTBED_DIR/router);
#   router  whiflash-datagen on training-split prompts + whiflash-train fit, router into TESTBED_DIR/router
#           (needs the package installed: `pip install -e .`, and `datasets`/`jsonargparse` importable);
#   eval    whiflash-eval bench of every method on the testbed's test split (WhiFlash-Neural when the
#           `router` step has left a router), bf16 + CUDA graphs on a GPU; the run folder goes to LOG_DIR/eval
#   tests   the CUDA tests (lossless in fp32 / near-ties in bf16, graphs == eager, transformers parity);
#   profile real-shape latency of Qwen3-8B, Qwen3-4B and Llama-3.1-8B (scripts/profile_shapes.py, 3.5 min;
#           --smoke at toy widths when there is no GPU).
# Usage: scripts/gpu_session.sh LOG_DIR TESTBED_DIR [STEP...]   (default steps: build bench tests)
# With a built testbed, `bench profile` is the whole of docs/engine.md's H200 figures in under 7 minutes.
# Runs from a checkout without installing it (PYTHONPATH) for every step but `router`, so a machine that
# has torch, transformers and lightning but not this package's other dependencies can run them.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?LOG_DIR}
TB=${2:?TESTBED_DIR}
shift 2
STEPS=${*:-build bench tests}
PRESET=${PRESET:-small}  # PRESET=micro checks the script on a CPU in a minute
mkdir -p "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
quiet() { grep -v -i "it/s\|s/it\|warn"; }  # progress bars and library warnings stay in the logs only

for step in $STEPS; do
  echo "=== $step ($(date +%T))"
  case $step in
    build)
      timeout 460 python3 - "$TB" "$PRESET" 2>&1 <<'PY' | tee "$LOG/build.log" | quiet | tail -30
import sys
from pathlib import Path

from whiflash.testbed.__main__ import build

build(sys.argv[2], Path(sys.argv[1]))  # the function behind `python -m whiflash.testbed build`
PY
      cp "$TB/manifest.json" "$LOG/${PRESET}_manifest.json" 2>/dev/null ;;
    router)
      timeout 300 python3 - "$TB" 2>&1 <<'PY' | tee "$LOG/router.log" | quiet | tail -30
import shutil
import sys
from pathlib import Path

import torch

from whiflash.datagen.cli import datagen
from whiflash.train.cli import run

tb = Path(sys.argv[1])
data = datagen(out=tb / "router_data", prompts=["testbed:train"], testbed=tb, per_category=48,
               max_new_tokens=96, dtype="bfloat16" if torch.cuda.is_available() else "float32")
sys.argv = ["whiflash-train"]  # LightningCLI reads sys.argv alongside args
run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(tb / "router_runs")])
shutil.copytree(sorted((tb / "router_runs").glob("*/router"))[-1], tb / "router", dirs_exist_ok=True)
PY
      cp -r "$TB/router" "$LOG/router" 2>/dev/null ;;
    bench)
      router=(); [ -d "$TB/router" ] && router=(--router "$TB/router")
      timeout 300 python3 scripts/bench_testbed.py --testbed "$TB" --prompts 4 --max-new-tokens 96 "${router[@]}" \
        --json "$LOG/bench_${PRESET}.json" 2>&1 | tee "$LOG/bench_${PRESET}.log" | quiet | tail -18 ;;
    eval)
      neural=""; router=(); [ -d "$TB/router" ] && neural=",whiflash-neural" router=(--whiflash-neural-router-path "$TB/router")
      gpu=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && gpu=(--device cuda --dtype bfloat16 --cuda-graphs)
      timeout 420 python3 -m whiflash.eval bench --testbed "$TB" --dataset testbed:test --max-samples "${EVAL_SAMPLES:-30}" \
        --max-new-tokens 96 --methods "ar,eagle3,dflash,ddtree,whiflash-entropy${neural},oracle" "${router[@]}" "${gpu[@]}" \
        --out "$LOG/eval" --name "$PRESET" 2>&1 | tee "$LOG/eval.log" | quiet | tail -5
      cat "$LOG"/eval/*/results.md 2>/dev/null | head -60 ;;
    tests)
      timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$LOG/gpu_tests.log" | tail -5 ;;
    profile)
      smoke=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || smoke=(--smoke --ctx 64)
      timeout 300 python3 scripts/profile_shapes.py "${smoke[@]}" --json "$LOG/profile.json" 2>&1 \
        | tee "$LOG/profile.log" | quiet | tail -40 ;;
    *) echo "unknown step $step (build, router, bench, eval, tests, profile)"; exit 2 ;;
  esac
done
echo "=== done ($(date +%T))"
