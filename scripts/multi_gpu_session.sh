#!/usr/bin/env bash
# Datagen, router training and eval on two GPUs of one host against one GPU (issue 17; docs/multi_gpu.md), step by
# step, each step under its own time limit:
#   build    the testbed (PRESET, default small; resumable, so a built folder is reused; BUILD_DEVICE=cuda
#            builds a CPU preset such as tiny on the GPU in a minute or two);
#   datagen  whiflash-datagen under torchrun with N=1 and N=2 on the same training-split prompts (fp32, CUDA
#            graphs): rounds/s per GPU, scaling efficiency, and whether the two datasets hold the same rows;
#   train    whiflash-train fit on the N=2 dataset with --trainer.devices 1 and 2 (DDP): wall time and metrics;
#   eval     whiflash-eval bench sharded over 2 GPUs with torchrun (bf16, CUDA graphs): per-rank GPU names and
#            per-rank speedups;
#   summary  the table of figures above, also in LOG_DIR/summary.md and LOG_DIR/figures.json (copied with the logs,
#            as LOG_DIR/logs.tar.gz, into COPY_TO when that is set, e.g. COPY_TO=$OUT).
# Usage: scripts/multi_gpu_session.sh LOG_DIR TESTBED_DIR [STEP...]   (default: build datagen train eval summary)
# The small build takes ~14 min of stages on an H200 (build it first with scripts/gpu_session.sh, UNTIL=responses
# then the rest, on one warm machine), so under a 10-minute command limit run `datagen`, then at once `train eval
# summary` with the same LOG_DIR and TESTBED_DIR (outside $OUT, which is emptied per command); `PRESET=tiny
# BUILD_DEVICE=cuda` builds a small world on the GPU in the same command (about a minute; 2026-11-30 run). Without a GPU the same steps run on the CPU with gloo:
# `PRESET=micro PER_CATEGORY=4 SHARD_SIZE=2 MAX_NEW=24 EVAL_SAMPLES=4` checks the script (2.5 min, 2 cores).
# Runs from a checkout: wheels in .whl/ (datasets, jsonargparse, ...) are installed to /tmp/site as the device
# notes say, and the checkout is installed editable (offline, no deps) when `whiflash.datagen` is not importable.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?LOG_DIR}
TB=${2:?TESTBED_DIR}
shift 2
STEPS=${*:-build datagen train eval summary}
PRESET=${PRESET:-small}
PER_CATEGORY=${PER_CATEGORY:-48}   # datagen prompts per category (4 categories)
SHARD_SIZE=${SHARD_SIZE:-6}        # prompts per shard: the unit a rank takes
MAX_NEW=${MAX_NEW:-96}
EVAL_SAMPLES=${EVAL_SAMPLES:-30}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
# NVLink multicast stays off: a program that uses it can take the host's shared GPUs out of service
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
quiet() { grep -v -i "it/s\|s/it\|warn"; }  # progress bars and library warnings stay in the logs only
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
python3 -c "import datasets, jsonargparse, whiflash.datagen.cli, whiflash.train.cli, whiflash.eval.cli" \
  || { echo "missing packages (see above): carry their wheels in .whl/"; exit 2; }
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$GPUS" -ge 1 ]; then
  DEV=cuda; ACCEL=gpu; EVAL_GPU=(--dtype bfloat16 --cuda-graphs)
  [ "$GPUS" -ge 2 ] || echo "only $GPUS GPU: the N=2 runs need two"
else
  DEV=cpu; ACCEL=cpu; EVAL_GPU=(--dtype float32 --threads 1)
fi
TORCHRUN=(python3 -m torch.distributed.run --standalone --nproc-per-node)  # + N (torchrun may not be on PATH)
# a command under a time limit, its output in LOG/KEY.log; "KEY START_NS END_NS EXIT_STATUS" goes to LOG/times.txt
timed() {
  local key=$1 limit=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$limit" "$@" >"$LOG/$key.log" 2>&1
  local rc=$?
  echo "$key $t0 $(date +%s%N) $rc" >>"$LOG/times.txt"
  quiet <"$LOG/$key.log" | tail -4
  return $rc
}

for step in $STEPS; do
  echo "=== $step ($(date +%T))"
  case $step in
    build)
      timeout 480 python3 - "$TB" "$PRESET" "${BUILD_DEVICE:-}" 2>&1 <<'PY' | tee "$LOG/build.log" | quiet | tail -12
import sys
from pathlib import Path

from whiflash.testbed.__main__ import build

# resumable: a finished testbed is reused as it is; BUILD_DEVICE=cuda builds a CPU preset (tiny) on the GPU
build(sys.argv[2], Path(sys.argv[1]), device=sys.argv[3] or None)
PY
      ;;
    datagen)
      for n in 1 2; do
        rm -rf "$LOG/data_n$n"  # a fresh run each time: the figures are of decoding, not of a resume
        timed "datagen_n$n" 300 "${TORCHRUN[@]}" "$n" -m whiflash.datagen --testbed "$TB" --prompts '[testbed:train]' \
          --per_category "$PER_CATEGORY" --shard_size "$SHARD_SIZE" --max_new_tokens "$MAX_NEW" --dtype float32 \
          --device "$DEV" --out "$LOG/data_n$n"
      done ;;
    train)
      for d in 1 2; do
        rm -rf "$LOG/train_d$d"
        strategy=ddp; [ "$d" -gt 1 ] || strategy=auto  # the baseline is a plain one-device run
        timed "train_d$d" 240 python3 -m whiflash.train.cli fit --data.path "$LOG/data_n2" --trainer.accelerator "$ACCEL" \
          --trainer.devices "$d" --trainer.strategy "$strategy" --trainer.default_root_dir "$LOG/train_d$d" \
          --trainer.enable_progress_bar false --data.cache_dir "$LOG/hf_cache"
      done ;;
    eval)
      rm -rf "$LOG/eval"
      timed eval 420 "${TORCHRUN[@]}" 2 -m whiflash.eval bench --testbed "$TB" --dataset testbed:test \
        --max-samples "$EVAL_SAMPLES" --max-new-tokens "$MAX_NEW" --methods ar,eagle3,dflash,ddtree,whiflash-entropy,oracle \
        --device "$DEV" "${EVAL_GPU[@]}" --no-plots --out "$LOG/eval" --name sharded ;;
    summary)
      python3 - "$LOG" "$PRESET" "$PER_CATEGORY" "$MAX_NEW" 2>&1 <<'PY' | tee "$LOG/summary.md"
import json
import re
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from whiflash.data import read_manifest

log, preset, per_category, max_new = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
times = {}
for line in (log / "times.txt").read_text().splitlines() if (log / "times.txt").exists() else []:
    key, t0, t1, rc = line.split()
    times[key] = ((int(t1) - int(t0)) / 1e9, int(rc))  # the last run of each step counts
figures: dict = {"date": time.strftime("%Y-%m-%d"), "preset": preset}
out = [f"## Multi-GPU session ({figures['date']}, testbed {preset})", ""]
no = lambda what: out.append(f"{what}: not run or failed (see {log})\n")  # noqa: E731


def table(head: list[str], rows: list[list]) -> None:
    out.extend(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)])
    out.extend("| " + " | ".join(str(c) for c in r) + " |" for r in rows)
    out.append("")


# datagen: per-rank decode seconds from the "decoded R rounds in T s" lines, the slowest rank bounding the run
dg = {}
for n in (1, 2):
    data, text = log / f"data_n{n}", (log / f"datagen_n{n}.log").read_text() if (log / f"datagen_n{n}.log").exists() else ""
    ranks = [(int(r), float(t)) for r, t in re.findall(r"decoded (\d+) rounds in ([\d.]+) s", text)]
    if not (data / "manifest.json").exists() or len(ranks) != n:
        continue
    rows, decode = read_manifest(data).num_rows, max(t for _, t in ranks)
    dg[n] = {"rounds": rows, "decode_s": decode, "rounds_per_s_per_gpu": rows / decode / n,
             "wall_s": times.get(f"datagen_n{n}", (float("nan"), 1))[0], "rank_decode_s": [t for _, t in ranks]}
if dg:
    out.append(f"**datagen** (testbed:train, {per_category} prompts per category, {max_new} new tokens, fp32; "
               "decode = the slowest rank's shard loop, wall = launch to exit with loading and graph capture)\n")
    table(["GPUs", "rounds", "decode s (per rank)", "rounds/s per GPU", "wall s"],
          [[n, f["rounds"], f"{f['decode_s']:.1f} ({', '.join(f'{t:.1f}' for t in f['rank_decode_s'])})",
            f"{f['rounds_per_s_per_gpu']:.1f}", f"{f['wall_s']:.1f}"] for n, f in dg.items()])
    if len(dg) == 2:
        a, b = log / "data_n1", log / "data_n2"
        ma, mb = read_manifest(a), read_manifest(b)
        key = [("prompt_id", "ascending"), ("round", "ascending")]
        ta, tb = (pq.read_table([d / s.file for s in m.shards]).sort_by(key) for d, m in ((a, ma), (b, mb)))
        dg["equal_rows"], dg["identical_shards"] = ta.equals(tb), ma.shards == mb.shards
        dg["scaling_efficiency"] = dg[2]["rounds_per_s_per_gpu"] / dg[1]["rounds_per_s_per_gpu"]
        out.append(f"scaling efficiency (rounds/s per GPU, 2 GPUs / 1): **{dg['scaling_efficiency']:.2f}**; "
                   f"merged rows equal: **{'yes' if dg['equal_rows'] else 'NO'}** ({ta.num_rows} vs {tb.num_rows} rows; "
                   f"shards byte-identical: {'yes' if dg['identical_shards'] else 'no'})\n")
    figures["datagen"] = dg
else:
    no("datagen")

tr = {}
for d in (1, 2):
    runs = sorted((log / f"train_d{d}").glob("*/results.json"))
    if runs:
        res, man = json.loads(runs[-1].read_text()), json.loads((runs[-1].parent / "manifest.json").read_text())
        tr[d] = {"wall_s": times.get(f"train_d{d}", (float("nan"), 1))[0], "steps": man["global_step"],
                 "epochs": man["epochs"], **{k: res[k] for k in ("mse", "mae", "spearman", "auroc")},
                 "share": res["routing"]["share"], "threshold": res["routing"]["best_threshold"]}
if tr:
    out.append("**whiflash-train fit** on the 2-GPU dataset (DDP; --data.batch_size is per step over all devices; "
               "validation metrics of the exported router)\n")
    table(["devices", "wall s", "steps", "epochs", "val MSE", "Spearman", "AUROC", "share", "threshold"],
          [[d, f"{f['wall_s']:.1f}", f["steps"], f["epochs"], f"{f['mse']:.4f}", f"{f['spearman']:.4f}",
            f"{f['auroc']:.4f}", f"{f['share']:.4f}", f"{f['threshold']:g}"] for d, f in tr.items()])
    figures["train"] = tr
else:
    no("train")

runs = sorted((log / "eval").glob("*_sharded/results.json"))
if runs:
    run = runs[-1].parent
    manifest, results = json.loads((run / "manifest.json").read_text()), json.loads(runs[-1].read_text())
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    methods = [m for m in manifest["methods"] if m != "ar"]
    ranks = manifest.get("ranks") or [{"rank": 0, **manifest["hardware"], "samples": [s["id"] for s in manifest["samples"]]}]
    per_rank = []
    for r in ranks:
        mine = [x for x in rows if x["sample"] in set(r["samples"]) and x.get("speedup") is not None]
        mean = lambda m: sum(x["speedup"] for x in mine if x["method"] == m) / max(1, sum(x["method"] == m for x in mine))  # noqa: E731
        per_rank.append({"rank": r["rank"], "device": r["device"], "gpu": r.get("gpu", r.get("cpu")),
                         "samples": len(r["samples"]), **{m: mean(m) for m in methods}})
    out.append(f"**whiflash-eval bench** sharded over {len(ranks)} ranks ({results['samples']} test-split samples, "
               f"{max_new} new tokens; mean speedup over AR per rank, AR and method on the same GPU; "
               f"{len(results['mismatches'])} lossless mismatches; run {run.name})\n")
    table(["rank", "device", "GPU", "samples", *methods],
          [[p["rank"], p["device"], p["gpu"], p["samples"], *[f"{p[m]:.2f}x" for m in methods]] for p in per_rank])
    every = results["cells"]["all"]
    out.append("all ranks pooled: " + ", ".join(f"{m} {every[m]['speedup']:.2f}x" for m in methods) + "\n")
    figures["eval"] = {"ranks": per_rank, "run": str(run)}
else:
    no("eval")
(log / "figures.json").write_text(json.dumps(figures, indent=2, default=str) + "\n")
print("\n".join(out))
PY
      if [ -n "${COPY_TO:-}" ]; then
        (cd "$LOG" && tar czf logs.tar.gz -- *.log times.txt data_n*/manifest.json train_d*/*/results.json \
          eval/*/manifest.json eval/*/results.md 2>/dev/null)
        mkdir -p "$COPY_TO" && cp "$LOG/summary.md" "$LOG/figures.json" "$LOG/logs.tar.gz" "$COPY_TO/"
      fi ;;
    *) echo "unknown step $step (build, datagen, train, eval, summary)"; exit 2 ;;
  esac
done
echo "=== done ($(date +%T))"
