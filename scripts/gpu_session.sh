#!/usr/bin/env bash
# Everything this project measures on one GPU, step by step (each step under its own time limit, so a
# slow one cannot cost the results of the others inside one 10-minute device command):
#   probe   time a few optimiser steps of the preset's target, eager and with compiled layers (ms/step, compile
#           seconds: the target stage's estimate) before spending a build on it;
#   build   the `small` testbed (prints stage times and the per-category tau table; resumable: UNTIL=STAGE
#           stops after a stage, so a build splits over device commands on one warm machine: UNTIL=responses
#           (~400 s), UNTIL=dflash (~390 s), then the rest with the next steps; SET="section.field=value ..."
#           overrides preset fields, JSON values without spaces);
#   bench   end-to-end tokens/s and speedup of every method on it, eager and CUDA graphs side by side
#           (adds WhiFlash-Neural when the `router` step has left a router in TESTBED_DIR/router);
#   latency whiflash-eval profile of the testbed's models at LATENCY_CONTEXT positions (1024) -> TESTBED_DIR/profile.json (round, verify and catch-up
#           times; the loop's rounds over real decodes of LATENCY_LOOP_PROMPTS dev prompts a category, 4, as a
#           bench pays them; 0: after a random prompt; the router and calibrate steps use it when it is there);
#   router  whiflash-datagen on testbed:heldout prompts (per category the split the drafters did not learn from;
#           ROUTER_SOURCE to change it, e.g. testbed:dev; ROUTER_PROMPTS per category, default 48, ROUTER_TOKENS new
#           tokens, default 96; ROUTER_PROCS processes sharing the GPU under torchrun, default 1; ROUTER_FLAGS more
#           datagen flags) + whiflash-train fit for the pair PAIR (default df-e3; ROUTER_TRAIN_FLAGS more fit flags;
#           with the latency profile it reports the share of the speed oracle's gain, and ROUTER_VARIANTS, e.g.
#           "tau,speed,speed/decision,speed+entropy", fits one router per variant with whiflash.train.compare, prints
#           the ablation table and keeps the first variant unless a later one replays > 1% faster, a threshold per category),
#           router into TESTBED_DIR/router (df-e3) or
#           TESTBED_DIR/router_PAIR; router-data and router-train are its two halves, for two device commands
#           (ROUTER_DATA: the folder router-data writes, default TESTBED_DIR/router_data_PAIR)
#           (needs `datasets`/`jsonargparse` importable);
#   calibrate  per-category WhiFlash-Entropy thresholds, and WhiFlash-Neural's when the router is there, by
#           replaying the router data with the latency profile (whiflash-eval calibrate --replay) ->
#           TESTBED_DIR/thresholds_PAIR.json and thresholds_neural_PAIR.json, which `eval` then passes
#           (STICK_TAU=K: both replay and bench the routers with --whiflash-stick-tau K; TAU_RULE=ENTER,LEAVE: with
#           --whiflash-tau-rule ENTER,LEAVE; TAU_RULE=auto: calibrate replays a grid of rules (and none) with the
#           entropy router, keeps the fastest on average over the categories in TESTBED_DIR/tau_rule.txt and its
#           thresholds in thresholds_rule_PAIR.json, and calibrates the routers without it; `eval` with TAU_RULE=auto
#           then benches the chosen rule (WhiFlash-Entropy at those thresholds); CALIBRATE_DECODE=1: the
#           neural thresholds by decoding EVAL_SAMPLES other test prompts, as `eval` will, each category at its
#           own -inf, T-0.5, T, T+0.5, inf around its replayed threshold T (--thresholds-around), or every category
#           at CALIBRATE_THRESHOLDS when set;
#           +-inf: each drafter alone, no decision paid; the neural replay leaves out the rows of the prompts the
#           router was trained on, listed in its export's training_prompts.json; NEURAL_ONLY=1: the neural router's
#           thresholds only, the entropy router's left as they are; MIN_GAIN (0.03): every calibration here keeps a
#           routing threshold only where it beats the faster drafter alone by that share, --min-gain, and
#           MIN_GAIN_CONFIDENCE (0.9): only where its prompts show it faster with that probability,
#           --min-gain-confidence; 0 turns that off);
#   eval    whiflash-eval bench of every method on the testbed's test split (WhiFlash-Neural when the
#           `router` step has left a router for PAIR), bf16 + CUDA graphs (+ compiled layers, the default) on
#           a GPU; METHODS overrides the method list, EVAL_SAMPLES / EVAL_TOKENS the prompts and new tokens,
#           EVAL_FLAGS adds bench flags (e.g. "--temperature 1"), EVAL_TAG names the run, EVAL_DATASET
#           replaces testbed:test (e.g. JSONL prompt files); the run folder goes
#           to LOG_DIR/eval, its results.md and samples.jsonl are copied to LOG_DIR/eval_PAIR[TAG]_*
#   quickstart  the upstream Quick Start command shape (--speculative-algorithm WHIFLASH --whiflash-router neural ...)
#           on the testbed's models and the router, no engine flags: prints the resolved config, then runs;
#   compare whiflash-eval bench of AR/EAGLE-3/DFlash/DDTree three times on the same prompts: SDPA
#           (WHIFLASH_DECODE_ATTENTION=0), the decode attention kernel, and the kernel with --compile-layers;
#   tests   the CUDA tests (lossless in fp32 / near-ties in bf16, graphs == eager, transformers parity;
#           TESTS_TIMEOUT seconds, default 560: the 30 tests took 461 s on an H200, 2026-12-01);
#   profile real-shape latency (scripts/profile_shapes.py; PROFILE_MODELS, default Qwen3-8B, Qwen3-4B and
#           Llama-3.1-8B, 3.5 min; `qwen3-8b,TESTBED_DIR` puts the testbed's cost ratios beside Qwen3-8B's;
#           PROFILE_FLAGS adds the script's flags, e.g. --no-diagnostics (ratios only, ~1 min a model);
#           --smoke at toy widths when there is no GPU).
# Usage: scripts/gpu_session.sh LOG_DIR TESTBED_DIR [STEP...]   (default steps: build bench tests)
# With a built testbed, `bench profile` remeasures the engine's H200 figures (results/) in under 7 minutes.
# Runs from a checkout without installing it (PYTHONPATH; the package reaches datagen/ train/ eval/ there as an
# install maps them), so a machine that has torch, transformers and lightning but neither setuptools nor an index
# runs every step; `router` also needs datasets and jsonargparse.
# A machine without the rest (datasets, jsonargparse and their wheels) and without an index: fetch the wheels
# here (`pip download --no-deps datasets dill multiprocess jsonargparse docstring_parser typeshed_client -d .whl`,
# the pure-Python ones the lent H200 image lacks; `.whl/` is ignored),
# carry `.whl`, and start the command with
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:?LOG_DIR}
TB=${2:?TESTBED_DIR}
shift 2
STEPS=${*:-build bench tests}
PRESET=${PRESET:-small}  # PRESET=micro checks the script on a CPU in a minute
PAIR=${PAIR:-df-e3}
ROUTER=$TB/router; [ "$PAIR" != df-e3 ] && ROUTER=$TB/router_$PAIR
mkdir -p "$LOG"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
quiet() { grep -v -i "it/s\|s/it\|prompt/s\|warn"; }  # progress bars and library warnings stay in the logs only

for step in $STEPS; do
  echo "=== $step ($(date +%T))"
  case $step in
    probe)
      timeout 300 python3 - "$TB" "$PRESET" 2>&1 <<'PY' | tee "$LOG/probe.log" | quiet | tail -8
import sys
import time
from pathlib import Path

import torch

from whiflash.testbed.build import build
from whiflash.testbed.presets import get_preset
from whiflash.testbed.target import TargetModule, qwen3_config

cfg = get_preset(sys.argv[2])
tok_info = build(Path(sys.argv[1]), cfg, until="tokenizer")["stages"]["tokenizer"]
t = cfg.target
module = TargetModule(qwen3_config(t, tok_info), t).to(cfg.device)
opt = torch.optim.AdamW(module.parameters(), lr=1e-4, betas=(0.9, 0.95))
x = torch.randint(5, tok_info["vocab_size"], (t.batch_size, t.seq_len + 1), device=cfg.device)
cuda = cfg.device.startswith("cuda")
sync = torch.cuda.synchronize if cuda else (lambda: None)


def step() -> None:
    with torch.autocast(cfg.device.split(":")[0], torch.bfloat16, enabled=cuda):
        loss = module._loss(x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def ms_per_step(n: int = 20, warm: int = 5) -> float:
    for _ in range(warm):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) / n * 1e3


from whiflash.testbed.compiled import compiled_or_eager

tokens = t.batch_size * t.seq_len
eager = ms_per_step()
print(f"probe: target {sum(p.numel() for p in module.parameters()) / 1e6:.1f}M params, eager {eager:.1f} ms/step, "
      f"{tokens / eager * 1e3:,.0f} tok/s; {t.max_steps} steps ~ {eager * t.max_steps / 1e3:.0f} s")
t0 = time.perf_counter()
ok = compiled_or_eager(module.model, lambda: (step(), sync()), "probe")
compile_s = time.perf_counter() - t0
if ok:
    compiled = ms_per_step()
    print(f"probe: compiled layers {compiled:.1f} ms/step ({eager / compiled:.2f}x eager), compile {compile_s:.0f} s; "
          f"{t.max_steps} steps ~ {compiled * t.max_steps / 1e3 + compile_s:.0f} s")
PY
      ;;
    build)
      overrides=(); for kv in ${SET:-}; do overrides+=("$kv"); done
      timeout "${BUILD_TIMEOUT:-570}" python3 - "$TB" "$PRESET" "${UNTIL:-}" "${overrides[@]}" 2>&1 <<'PY' | tee -a "$LOG/build.log" | quiet | tail -34
import sys
from pathlib import Path

from whiflash.testbed.__main__ import build

# the function behind `python -m whiflash.testbed build`
build(sys.argv[2], Path(sys.argv[1]), until=sys.argv[3] or None, set=sys.argv[4:])
PY
      cp "$TB/manifest.json" "$LOG/${PRESET}_manifest.json" 2>/dev/null
      cp -r "$TB/tokenizer" "$LOG/${PRESET}_tokenizer" 2>/dev/null ;;  # to read the eval's token ids back here
    router|router-data|router-train)  # router = router-data then router-train
      [ "$step" = router-train ] || {
      gpu=(--dtype float32); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && gpu=(--dtype bfloat16)
      procs=${ROUTER_PROCS:-1}; launch=(python3 -m whiflash.datagen)
      [ "$procs" -gt 1 ] && launch=(python3 -m torch.distributed.run --standalone --nproc-per-node "$procs" -m whiflash.datagen)
      start=$(date +%s)
      data=${ROUTER_DATA:-$TB/router_data_$PAIR}; name=$(basename "$data")
      timeout "${ROUTER_TIMEOUT:-300}" "${launch[@]}" --testbed "$TB" --prompts "${ROUTER_SOURCE:-testbed:heldout}" --pair "$PAIR" \
        --per-category "${ROUTER_PROMPTS:-48}" --max-new-tokens "${ROUTER_TOKENS:-96}" --processes-per-device "$procs" \
        "${gpu[@]}" ${ROUTER_FLAGS:-} --out "$data" 2>&1 | tee "$LOG/$name.log" | quiet | grep -v "^\[\|W1\|I1" | tail -12
      echo "datagen: $(( $(date +%s) - start )) s with $procs process(es) on the device, launch included"
      mkdir -p "$LOG/$name" && cp "$data"/*.png "$data/manifest.json" "$LOG/$name/" 2>/dev/null; }
      [ "$step" = router-data ] && continue
      [ "$step" = router-train ] && start=$(date +%s)
      left=$(( ${ROUTER_TIMEOUT:-300} - ($(date +%s) - start) ))
      train_flags=(); for f in ${ROUTER_TRAIN_FLAGS:-}; do train_flags+=("$f"); done
      timeout "$left" python3 - "$TB" "$PAIR" "$ROUTER" "${ROUTER_VARIANTS:-}" "${train_flags[@]}" 2>&1 <<'PY' | tee -a "$LOG/router_$PAIR.log" | quiet | tail -30
import shutil
import sys
from pathlib import Path

from whiflash.train.cli import run
from whiflash.train.compare import KEEP_MARGIN, compare_variants, kept_variant, variants_table

tb, pair, router, variants, flags = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4], sys.argv[5:]
sys.argv = ["whiflash-train"]  # LightningCLI reads sys.argv alongside args
data, runs, profile = tb / f"router_data_{pair}", tb / f"router_runs_{pair}", tb / "profile.json"
if variants and profile.is_file():  # the ablation: one fit per variant, keep the fastest on the replay
    result = compare_variants(str(data), str(profile), str(runs), flags, variants.split(","))
    print(variants_table(result))
    # thresholds are calibrated per category downstream, so the variant is chosen as it will run
    kept = kept_variant(result)
    print(f"kept variant {kept} (the first listed unless a later one replays > {KEEP_MARGIN:.0%} faster on "
          "validation, a threshold per category)")
    shutil.copy(runs / "variants.json", tb / f"variants_{pair}.json")
    src = Path(result["variants"][kept]["run"]) / "router"
else:
    extra = ["--data.latency_profile", str(profile)] if profile.is_file() else []
    run(["fit", "--data.path", str(data), "--trainer.default_root_dir", str(runs), *extra, *flags])
    src = sorted(runs.glob("*/router"))[-1]
shutil.rmtree(router, ignore_errors=True)
shutil.copytree(src, router)
PY
      cp "$TB/variants_$PAIR.json" "$LOG/" 2>/dev/null
      cp -r "$ROUTER" "$LOG/$(basename "$ROUTER")" 2>/dev/null ;;
    latency)
      gpu=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && gpu=(--device cuda --dtype bfloat16)
      timeout "${LATENCY_TIMEOUT:-240}" python3 -m whiflash.eval profile --testbed "$TB" "${gpu[@]}" --context "${LATENCY_CONTEXT:-1024}" \
        --loop-prompts "${LATENCY_LOOP_PROMPTS:-4}" --out "$LOG/eval" \
        --name "${PRESET}_latency" --output "$TB/profile.json" 2>&1 | tee "$LOG/latency.log" | quiet | tail -12
      cp "$TB/profile.json" "$LOG/profile_${PRESET}.json" 2>/dev/null ;;
    calibrate)
      # MIN_GAIN: a category routes only where that beats its faster drafter alone by this share (calibrate
      # --min-gain); on `small`, code's dev prompts promised a router +2.5% that the bench's prompts lost (-2.7%),
      # prose's +3.2% that they lost (-1.5%): a fixed share does not know how many prompts it rests on, the
      # bootstrap over them does (--min-gain-confidence, MIN_GAIN_CONFIDENCE)
      margin=(--min-gain "${MIN_GAIN:-0.03}" --min-gain-confidence "${MIN_GAIN_CONFIDENCE:-0.9}")
      ent=(--latency-profile "$TB/profile.json" --calibrate-method whiflash-entropy "${margin[@]}"
           --thresholds=-inf,0.05,0.1,0.2,0.3,0.5,0.75,1,1.5,2,3,inf)
      if [ "${TAU_RULE:-}" = auto ]; then  # each rule of a grid replayed (in parallel) with the entropy router
        rm -f "$TB"/tau_rule_*.json "$TB/tau_rule.txt"
        for r in none 4,1 4,2 5,1 5,2 5,3 6,1 6,2 6,3 7,2 8,2; do
          rule=(); [ "$r" = none ] || rule=(--whiflash-tau-rule "$r")
          timeout "${CALIBRATE_TIMEOUT:-240}" python3 -m whiflash.eval calibrate --replay "$TB/router_data_$PAIR" "${ent[@]}" \
            "${rule[@]}" --out "$LOG/eval/tau_rule_${r/,/-}" --output "$TB/tau_rule_${r/,/-}.json" \
            > "$LOG/tau_rule_${r/,/-}.log" 2>&1 &  # one --out each: a tool locks the folder it writes
        done
        wait
        # the rule whose per-category replayed speedups are highest on average (each category at its fastest
        # threshold, a drafter alone among them): tau_rule.txt holds it, empty for none
        python3 - "$TB" <<'PY' | tee "$LOG/tau_rule.log"
import json, sys
from pathlib import Path

tb = Path(sys.argv[1])
details = {f.stem[len("tau_rule_"):]: json.loads(f.read_text())["details"] for f in sorted(tb.glob("tau_rule_*.json"))}
mean = {r: sum(d["speedup"] for d in cats.values()) / len(cats) for r, cats in details.items()}
if not mean:
    sys.exit("tau rule: no replay of the grid finished (see LOG_DIR/tau_rule_*.log)")
best = max(mean, key=lambda r: (mean[r], r == "none"))  # a tie keeps no rule
print("tau rule, mean replayed speedup over categories:", {r: round(v, 3) for r, v in mean.items()}, "->", best)
(tb / "tau_rule.txt").write_text("" if best == "none" else best.replace("-", ","))
PY
        rule=$(cat "$TB/tau_rule.txt" 2>/dev/null)  # its thresholds, for the rule's own bench (eval with TAU_RULE=auto)
        [ -n "$rule" ] && cp "$TB/tau_rule_${rule/,/-}.json" "$TB/thresholds_rule_$PAIR.json"
        TAU_RULE=  # the routers' own calibration below stays without the rule
      fi
      stick=(); [ -n "${STICK_TAU:-}" ] && stick=(--whiflash-stick-tau "$STICK_TAU")
      [ -n "${TAU_RULE:-}" ] && stick+=(--whiflash-tau-rule "$TAU_RULE")
      [ "${NEURAL_ONLY:-0}" = 1 ] || timeout "${CALIBRATE_TIMEOUT:-240}" python3 -m whiflash.eval calibrate --replay "$TB/router_data_$PAIR" "${stick[@]}" \
        "${ent[@]}" --out "$LOG/eval" --output "$TB/thresholds_$PAIR.json" 2>&1 \
        | tee "$LOG/calibrate_$PAIR.log" | quiet | tail -12
      # the neural router's thresholds per category, replayed on the rows of the prompts it was not trained on
      # (its export's training_prompts.json); +-inf are its two drafters alone. CALIBRATE_DECODE=1: then decode
      # (EVAL_SAMPLES test prompts outside the ones `eval` benches, EVAL_TOKENS tokens) at each category's
      # replayed threshold and +-0.5 around it, and each drafter alone
      if [ -d "$ROUTER" ]; then
        replayed="$TB/thresholds_neural_$PAIR.json"; [ "${CALIBRATE_DECODE:-0}" = 1 ] && replayed="$TB/thresholds_neural_replay_$PAIR.json"
        timeout "${CALIBRATE_TIMEOUT:-240}" python3 -m whiflash.eval calibrate --replay "$TB/router_data_$PAIR" "${stick[@]}" \
          --latency-profile "$TB/profile.json" --calibrate-method whiflash-neural --whiflash-neural-router-path "$ROUTER" \
          "${margin[@]}" --thresholds=-inf,-6,-4,-3,-2,-1.5,-1,-0.5,-0.25,0,0.25,0.5,0.75,1,1.5,2,2.5,3,4,6,inf --out "$LOG/eval" \
          --output "$replayed" 2>&1 | tee -a "$LOG/calibrate_$PAIR.log" | quiet | tail -12
      fi
      if [ -d "$ROUTER" ] && [ "${CALIBRATE_DECODE:-0}" = 1 ] && [ -f "$TB/thresholds_neural_replay_$PAIR.json" ]; then
        gpu=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && gpu=(--device cuda --dtype bfloat16 --cuda-graphs)
        # each category decodes only its own replayed threshold +-0.5 and the two drafters alone
        grid=(--thresholds-around "$TB/thresholds_neural_replay_$PAIR.json")
        [ -n "${CALIBRATE_THRESHOLDS:-}" ] && grid=(--thresholds="$CALIBRATE_THRESHOLDS")
        timeout "${CALIBRATE_TIMEOUT:-240}" python3 -m whiflash.eval calibrate --testbed "$TB" --dataset testbed:test \
          --max-samples "${EVAL_SAMPLES:-30}" --max-new-tokens "${EVAL_TOKENS:-96}" --whiflash-drafters "$PAIR" "${stick[@]}" \
          --calibrate-method whiflash-neural --whiflash-neural-router-path "$ROUTER" "${grid[@]}" "${margin[@]}" \
          "${gpu[@]}" --out "$LOG/eval" --output "$TB/thresholds_neural_$PAIR.json" 2>&1 | tee -a "$LOG/calibrate_$PAIR.log" | quiet | tail -12
      fi
      cp "$TB/thresholds_$PAIR.json" "$TB"/thresholds_neural*_"$PAIR.json" "$LOG/" 2>/dev/null ;;
    bench)
      router=(); [ -d "$TB/router" ] && router=(--router "$TB/router")
      timeout 300 python3 scripts/bench_testbed.py --testbed "$TB" --prompts 4 --max-new-tokens 96 "${router[@]}" \
        --json "$LOG/bench_${PRESET}.json" 2>&1 | tee "$LOG/bench_${PRESET}.log" | quiet | tail -18 ;;
    eval)
      neural=""; router=(); [ -d "$ROUTER" ] && neural=",whiflash-neural" router=(--whiflash-neural-router-path "$ROUTER")
      # NEURAL_THRESHOLDS: another thresholds.json for the neural router (the prompt files' own, from gpu_budget.sh)
      entropy_thr=$TB/thresholds_$PAIR.json
      if [ "${TAU_RULE:-}" = auto ]; then  # the rule calibrate chose, with WhiFlash-Entropy at its thresholds
        TAU_RULE=$(cat "$TB/tau_rule.txt" 2>/dev/null)
        [ -n "$TAU_RULE" ] || { echo "eval: calibrate chose no tau rule (TESTBED_DIR/tau_rule.txt): nothing to bench"; continue; }
        entropy_thr=$TB/thresholds_rule_$PAIR.json
      fi
      thr=(); for f in "$entropy_thr" "${NEURAL_THRESHOLDS:-$TB/thresholds_neural_$PAIR.json}"; do [ -f "$f" ] && thr+=("$f"); done
      [ ${#thr[@]} -gt 0 ] && router+=(--whiflash-thresholds "$(IFS=,; echo "${thr[*]}")")
      [ -n "${STICK_TAU:-}" ] && router+=(--whiflash-stick-tau "$STICK_TAU")
      [ -n "${TAU_RULE:-}" ] && router+=(--whiflash-tau-rule "$TAU_RULE")
      gpu=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" && gpu=(--device cuda --dtype bfloat16 --cuda-graphs)
      timeout "${EVAL_TIMEOUT:-420}" python3 -m whiflash.eval bench --testbed "$TB" --dataset "${EVAL_DATASET:-testbed:test}" \
        --max-samples "${EVAL_SAMPLES:-30}" --max-new-tokens "${EVAL_TOKENS:-96}" --whiflash-drafters "$PAIR" \
        --methods "${METHODS:-ar,eagle3,dflash,ddtree,whiflash-entropy${neural},oracle}" "${router[@]}" "${gpu[@]}" \
        ${EVAL_FLAGS:-} --out "$LOG/eval" --name "${PRESET}_$PAIR${EVAL_TAG:-}" 2>&1 | tee "$LOG/eval_$PAIR${EVAL_TAG:-}.log" | quiet | tail -5
      run_dir=$(ls -d "$LOG"/eval/*"${PRESET}_$PAIR${EVAL_TAG:-}" 2>/dev/null | tail -1)
      for f in results.md results.json samples.jsonl; do  # run folders nest too deep for the device's copy-back
        [ -f "$run_dir/$f" ] && cp "$run_dir/$f" "$LOG/eval_$PAIR${EVAL_TAG:-}_$f"
      done
      head -60 "$LOG/eval_$PAIR${EVAL_TAG:-}_results.md" 2>/dev/null ;;
    quickstart)  # the upstream Quick Start shape on the testbed's models and router, with no engine flags (the defaults)
      qs=(python3 -m whiflash.eval bench --speculative-algorithm WHIFLASH --model-name-or-path "$TB/target"
          --draft-name-or-path "$TB/dflash" --whiflash-eagle-draft "$TB/eagle3" --whiflash-router neural
          --whiflash-neural-router-path "$ROUTER" --whiflash-drafters "$PAIR" --testbed "$TB" --dataset "${EVAL_DATASET:-testbed:test}"
          --max-samples "${EVAL_SAMPLES:-20}" --max-new-tokens "${EVAL_TOKENS:-256}")
      "${qs[@]}" --print_config > "$LOG/quickstart_config.txt" 2>&1
      grep -iE "^ *(device|dtype|cuda_graphs|compile_layers|decode_attention|gemv)" "$LOG/quickstart_config.txt"
      timeout "${EVAL_TIMEOUT:-300}" "${qs[@]}" --out "$LOG/eval" --name "${PRESET}_quickstart" 2>&1 \
        | tee "$LOG/quickstart.log" | quiet | grep -v "INFO" | tail -14
      run_dir=$(ls -d "$LOG"/eval/*"${PRESET}_quickstart" 2>/dev/null | tail -1)
      cp "$run_dir/results.md" "$LOG/quickstart_results.md" 2>/dev/null ;;
    compare)  # the engine's options end to end, same prompts: SDPA, the decode attention kernel, + compiled layers
      for opt in sdpa kernel compile; do
        env=(); flags=(--no-compile-layers)  # compiled layers are the CUDA default: off but for `compile`
        [ $opt = sdpa ] && env=(WHIFLASH_DECODE_ATTENTION=0)
        [ $opt = compile ] && flags=(--compile-layers)
        timeout "${EVAL_TIMEOUT:-240}" env "${env[@]}" python3 -m whiflash.eval bench --testbed "$TB" --dataset testbed:test \
          --max-samples "${EVAL_SAMPLES:-24}" --max-new-tokens 96 --methods "${METHODS:-ar,eagle3,dflash,ddtree}" \
          --device cuda --dtype bfloat16 --cuda-graphs "${flags[@]}" --out "$LOG/compare" --name "${PRESET}_$opt" 2>&1 \
          | tee "$LOG/compare_$opt.log" | quiet | tail -3
        cp "$LOG"/compare/*"${PRESET}_$opt"*/results.md "$LOG/compare_$opt.md" 2>/dev/null  # run folders nest too deep to copy back whole
        grep "^| all" "$LOG/compare_$opt.md" 2>/dev/null
      done ;;
    tests)
      timeout "${TESTS_TIMEOUT:-560}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$LOG/gpu_tests.log" | tail -5 ;;
    profile)
      smoke=(); python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || smoke=(--smoke --ctx 64)
      models=(); [ -n "${PROFILE_MODELS:-}" ] && models=(--models "$PROFILE_MODELS")
      timeout "${PROFILE_TIMEOUT:-300}" python3 scripts/profile_shapes.py "${smoke[@]}" "${models[@]}" ${PROFILE_FLAGS:-} --json "$LOG/profile.json" 2>&1 \
        | tee "$LOG/profile.log" | quiet | tail -40 ;;
    *) echo "unknown step $step (probe, build, latency, router, router-data, router-train, calibrate, bench, eval, quickstart, compare, tests, profile)"; exit 2 ;;
  esac
done
echo "=== done ($(date +%T))"
