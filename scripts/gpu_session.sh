#!/usr/bin/env bash
# Everything this project measures on one GPU, in one command (~9 minutes on an H200):
#   1. the CUDA tests (lossless in fp32 / near-ties in bf16, graphs == eager, transformers parity);
#   2. the `small` testbed build (prints its stage times and the per-category tau table);
#   3. end-to-end tokens/s and speedup of every method on it, eager and CUDA graphs side by side.
# Usage: scripts/gpu_session.sh [LOG_DIR] [TESTBED_DIR]   (defaults: runs/gpu, runs/testbed/small)
# Runs from a checkout without installing it (PYTHONPATH), so a machine that has torch,
# transformers and lightning but not this package's other CLI dependencies can run it.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-runs/gpu}
TB=${2:-runs/testbed/small}
mkdir -p "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$LOG/gpu_tests.log" | tail -5
python3 - "$TB" 2>&1 <<'PY' | tee "$LOG/build.log" | grep -v "it/s\|s/it" | tail -30
import sys
from pathlib import Path

from whiflash.testbed.__main__ import build

build("small", Path(sys.argv[1]))  # the function behind `python -m whiflash.testbed build`
PY
cp "$TB/manifest.json" "$LOG/small_manifest.json" 2>/dev/null
python3 scripts/bench_testbed.py --testbed "$TB" --prompts 4 --max-new-tokens 96 --json "$LOG/bench_small.json" 2>&1 \
  | grep -v -i warn | tee "$LOG/bench_small.log" | tail -16
