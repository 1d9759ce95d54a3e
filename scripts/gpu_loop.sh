#!/usr/bin/env bash
# The whole router loop on one GPU, as one resumable command: the `small` build, the latency profile,
# router data, the router (with its ablation when ROUTER_VARIANTS is set), calibration, the routed bench,
# router data on the test split's prompts (a replay of the benchmark's own prompts: does what the router
# learned hold there?) and the benchmark prompt files; then the same router loop for the ddt-e3 pair; then,
# while the budget lasts, the DDTree budget sweep with the oracle (E0_SAMPLES), the bench at temperature 1
# (E1_SAMPLES prompts) and the testbed's acceptance stage (the sweep is done when the routed bench ran DDTree at
# its budgets beside the oracle, as df-e3's does by default). Each call runs, in order, every step not yet done
# whose estimate fits in what is left of BUDGET_S, and stops before the first that does not; call it again
# with the same arguments (on the same warm machine: /tmp is not kept) to go on. A step is done when its
# output is there: a build stage in the testbed's manifest, profile.json, the router data's manifest, the
# exported router, the thresholds files, the bench's results copied into LOG_DIR. Router data resumes from
# its finished shards, so it starts whenever DATAGEN_MIN_S (60) are left.
# PAIRS (df-e3,ddt-e3): the pairs whose router loops run, in order; the first also gets the test-split data
# (TEST_PROMPTS a category, 80: the pool the benchmark draws from) and the prompt files (their own thresholds,
# replayed on rows of theirs that the bench does not draw: PROMPTS_CALIBRATE a file, 20).
# DAGGER=1: one DAgger round after each pair's calibration (gpu_budget.sh's dagger step: router data along the
# calibrated router's own decisions, the router refitted on both datasets and calibrated again); the routed bench
# then runs the refitted router, and the two calibrations (thresholds_neural[_replay]_round0_PAIR.json against
# thresholds_neural_dagger_PAIR.json) compare the rounds on the same prompts.
# ROUTING_PROFILE=1: after the latency profile, scripts/bench_routing.py times and profiles the routed variants
# beside their standalone drafters, and DDTree beside DFlash, on the built testbed's code prompts
# (LOG_DIR/routing_profile/, bench_routing.log); ~510 s on an H200 at 8 prompts x 256 tokens before DDTree joined
# (the profiled decodes are slow; ROUTING_PROMPTS=6 leaves room for it), so it takes a call of its own.
# TESTS_BESIDE=1: the CUDA tests run beside the first call's build (TESTS_TIMEOUT, 555 s), once.
# RESPONSES_AB=1: once the target is built, scripts/bench_responses.py times the responses stage's generator whole,
# shedding ended rows and attending over written columns (LOG_DIR/bench_responses.json; RESPONSES_AB_FLAGS, e.g.
# "--prompts-per-category 1024", sizes it; the step's estimate, 150 s, is a guess: the whole generator alone took
# 62 s for the preset's 4,096 prompts a category on an H100).
# PROFILE_DRAFTERS=1: first of all (no build needed), scripts/profile_drafter_step.py on a random-weight target of
# the preset's shapes (LOG_DIR/drafter_step.json/.txt; ~25 s on an H100 at 4 timed steps, 60 s is the estimate):
# what a drafter step costs on this card.
# PACK_DIR=DIR: once a router dataset is there, it is written to DIR (once) as a tar in 15 MiB parts,
# router_data_NAME.tar.00, .01, ... (a device's copy-back takes files of 16 MiB at most, 8 files and 64 MiB in all:
# rows at every position of 640 prompts x 256 tokens do not fit), so router modelling can go on elsewhere:
# `cat router_data_NAME.tar.* | tar xf - -C DEST` gives the dataset folder.
# TAU_RULE=auto: calibrate also replays a grid of tau rules (--whiflash-tau-rule) and keeps the fastest, or none; an
# eval-rule step after the routed bench then benches it (WhiFlash-Entropy under the rule beside AR and the drafters).
# Router data (defaults here, where gpu_session.sh alone keeps smaller ones): ROUTER_SOURCE (testbed:dev: prompts
# like the bench's, outside its pool), ROUTER_PROMPTS (150 a category), ROUTER_TOKENS (256), ROUTER_PROCS (8 ranks
# sharing the GPU) and ROUTER_FLAGS ("--no-compile-layers --parallel --path every": a row at every position,
# docs/design.md, "The router dataset"; calibration, the speed oracle and the speed report then walk each policy's
# own path). On `small` the router's share of the speed oracle's gain still grew from 80 to 320 training prompts
# (results/2026-12-06-small-williams-order-h100.md); 150 a category fits the loop in 30 minutes of an H100.
# SKIP=STEP,...: leave these steps out (step names as printed, without @PAIR: e.g. router-test,prompts-calibrate,
# eval-prompts,build-acceptance), so a later step gets the budget; a skipped step is neither run nor waited for.
# DRY_RUN=1: print each step's gpu_budget.sh command instead of running it (the loop then stops after it).
# Every knob of scripts/gpu_budget.sh and gpu_session.sh passes through (ROUTER_PROMPTS, ROUTER_PROCS,
# ROUTER_VARIANTS, CALIBRATE_DECODE, E0_SAMPLES, E_TOKENS, METHODS, ...). The benches' prompt counts are
# E0_SAMPLES (the routed bench and eval-t0, 80 = 20 a category), E1_SAMPLES (T = 1, 40) and E2_SAMPLES (a prompt
# file, 10), their new tokens E_TOKENS (256): gpu_budget.sh sets gpu_session.sh's EVAL_SAMPLES / EVAL_TOKENS from
# them, so those two reach only calibration's decode (CALIBRATE_DECODE=1).
# Usage: scripts/gpu_loop.sh LOG_DIR TESTBED_DIR BUDGET_S
#   e.g. three device commands of `TESTS_BESIDE=1 scripts/gpu_loop.sh /tmp/L /tmp/tb 560`
# PRESET=micro ROUTER_SOURCE=testbed:heldout ROUTER_PROMPTS=6 ROUTER_TOKENS=24 ROUTER_PROCS=1 LATENCY_CONTEXT=256
# E0_SAMPLES=8 E2_SAMPLES=2 E_TOKENS=24 EVAL_SAMPLES=4 EVAL_TOKENS=24 TEST_PROMPTS=2 checks it on a CPU in a few
# minutes (micro's corpus is too small for a dev pool beside the bench's).
set -u
cd "$(dirname "$0")/.."
L=${1:?LOG_DIR}; TB=${2:?TESTBED_DIR}; budget=${3:?BUDGET_S}
IFS=, read -r -a pairs <<< "${PAIRS:-df-e3,ddt-e3}"
start=$(date +%s)
# STICK_TAU (8): calibration and the routed bench keep slot 0 without a decision after a slot-0 round of tau >= 8
# (--whiflash-stick-tau): where the parallel drafter accepts long blocks a decision costs more than routing gains
# there; STICK_TAU= turns it off, and a TAU_RULE takes its place (the two are exclusive)
[ -z "${TAU_RULE:-}" ] && export STICK_TAU=${STICK_TAU-8}
export ROUTER_SOURCE=${ROUTER_SOURCE-testbed:dev} ROUTER_PROMPTS=${ROUTER_PROMPTS-150} ROUTER_TOKENS=${ROUTER_TOKENS-256} \
  ROUTER_PROCS=${ROUTER_PROCS-8} ROUTER_FLAGS=${ROUTER_FLAGS-"--no-compile-layers --parallel --path every"}
mkdir -p "$L"

stage_done() {  # the testbed manifest says build stage $1 is done
  python3 - "$TB/manifest.json" "$1" <<'PY' 2>/dev/null
import json, sys
stage = json.load(open(sys.argv[1])).get("stages", {}).get(sys.argv[2], {})
sys.exit(0 if stage.get("done") else 1)
PY
}

done_() {  # is step $1 done for pair $2?
  local router=$TB/router; [ "$2" != df-e3 ] && router=$TB/router_$2
  case $1 in
    build-*) stage_done "${1#build-}" ;;
    gs-latency) [ -f "$TB/profile.json" ] ;;
    bench-routing) [ -f "$L/routing_profile/profile.json" ] ;;
    bench-responses) [ -f "$L/bench_responses.json" ] ;;
    profile-drafters) [ -f "$L/drafter_step.json" ] ;;
    gs-router-data) [ -f "$TB/router_data_$2/manifest.json" ] ;;
    router-test) [ -f "$TB/router_data_${2}_test/manifest.json" ] ;;
    gs-router-train) [ -d "${router}_round0" ] || { [ -f "$router/config.json" ] && [ "$router/config.json" -nt "$TB/router_data_$2/manifest.json" ]; } ;;
    gs-calibrate) [ -d "${router}_round0" ] || { [ -f "$TB/thresholds_$2.json" ] && { [ ! -d "$router" ] || [ -f "$TB/thresholds_neural_$2.json" ]; }; } ;;
    eval-routed) [ -f "$L/eval_$2_routed_results.md" ] ;;
    eval-rule) [ -f "$L/eval_$2_rule_results.md" ] || [ ! -s "$TB/tau_rule.txt" ] ;;  # none chosen: nothing to run
    prompts-calibrate) [ -f "$TB/thresholds_neural_prompts_$2.json" ] ;;
    dagger) [ -f "$TB/thresholds_neural_dagger_$2.json" ] ;;
    eval-prompts) [ -f "$L/eval_$2_prompts_results.md" ] ;;
    eval-t1) [ -f "$L/eval_$2_t1_results.md" ] ;;
    eval-t0) [ -f "$L/eval_$2_t0_results.md" ] || { f=$L/eval_$2_routed_results.md  # the routed bench held the sweep
               [ -f "$f" ] && grep -q "| ddtree-b" "$f" && grep -q "| oracle |" "$f"; } ;;
  esac
}

if [ "${TESTS_BESIDE:-0}" = 1 ] && [ ! -f "$L/tests.started" ]; then
  touch "$L/tests.started"
  TESTS_TIMEOUT=${TESTS_TIMEOUT:-555} bash scripts/gpu_session.sh "$L/t" /tmp/whiflash-gpu-tests tests > "$L/tests.out" 2>&1 &
  tests_pid=$!
fi

# step[@pair]:estimate (seconds on an H200, with the CUDA tests beside the first ones)
steps=()
[ "${PROFILE_DRAFTERS:-0}" = 1 ] && steps+=(profile-drafters:60)
steps+=(build-target:330)
[ "${RESPONSES_AB:-0}" = 1 ] && steps+=(bench-responses:150)
steps+=(build-responses:80 build-eagle3:140 build-dflash:265 gs-latency:110)
[ "${ROUTING_PROFILE:-0}" = 1 ] && steps+=(bench-routing:520)
# calibration replays datagen rows in seconds (27 s for 600 prompts on an H100); decoding its grid takes minutes
cal_est=60; [ "${CALIBRATE_DECODE:-0}" = 1 ] && cal_est=210
for p in "${pairs[@]}"; do
  steps+=("gs-router-data@$p:${DATAGEN_MIN_S:-60}" "gs-router-train@$p:60" "gs-calibrate@$p:$cal_est")
  [ "${DAGGER:-0}" = 1 ] && steps+=("dagger@$p:420")
  steps+=("eval-routed@$p:180")
  [ "${TAU_RULE:-}" = auto ] && steps+=("eval-rule@$p:120")
  [ "$p" = "${pairs[0]}" ] && steps+=("router-test@$p:160" "prompts-calibrate@$p:70" "eval-prompts@$p:90")
done
steps+=(eval-t0:200 eval-t1:120 build-acceptance:200)
IFS=, read -r -a skip <<< "${SKIP:-}"
for s in "${skip[@]}"; do  # drop every step named s, whatever its pair
  for i in "${!steps[@]}"; do item=${steps[$i]%%:*}; [ "${item%@*}" = "$s" ] && unset "steps[$i]"; done
done
steps=("${steps[@]}")
pack() {  # the router dataset folder TB/$1 into PACK_DIR, once
  [ -n "${PACK_DIR:-}" ] && [ -f "$TB/$1/manifest.json" ] && [ ! -f "$L/$1.packed" ] || return 0
  mkdir -p "$PACK_DIR" && tar cf - -C "$TB" "$1" | split -b 15m -d - "$PACK_DIR/$1.tar." \
    && touch "$L/$1.packed" && echo "=== $1 packed into $PACK_DIR"
}
skip_to=0
for i in "${!steps[@]}"; do
  [ "$i" -lt "$skip_to" ] && continue
  item=${steps[$i]}; step=${item%%:*}; est=${item##*:}; pair=${pairs[0]}
  [[ $step == *@* ]] && pair=${step#*@} && step=${step%@*}
  name=$step; [[ $step == build-* || $step == gs-latency || $step == bench-* || $step == profile-* ]] || name=$step@$pair
  done_ "$step" "$pair" && { echo "=== $name: done before"; continue; }
  left=$(( budget - ($(date +%s) - start) ))
  [ "$left" -lt "$est" ] && { echo "=== stop before $name (${left}s left < ${est}s): call again to go on"; break; }
  run=$step; skip_to=$(( i + 1 ))
  if [[ $step == build-* ]]; then  # the next build stages that fit too go in the same process (UNTIL=the last):
    # each build process spends 13-17 s re-checking the stages before its own
    while [[ ${steps[$skip_to]:-} == build-* ]]; do
      more=${steps[$skip_to]##*:}
      [ $(( est + more )) -le "$left" ] || break
      est=$(( est + more )); run=${steps[$skip_to]%%:*}; skip_to=$(( skip_to + 1 ))
    done
    [ "$run" != "$step" ] && echo "=== $step to ${run#build-} in one build process (${est}s estimate)"
  fi
  if [ "${DRY_RUN:-0}" = 1 ]; then echo "=== would run: gpu_budget.sh $L $TB $left $run@$pair:$est"
  else PAIR=$pair bash scripts/gpu_budget.sh "$L" "$TB" "$left" "$run@$pair:$est"; fi
  done_ "${run}" "$pair" || { echo "=== $name did not finish: call again to go on"; break; }
done
for p in "${pairs[@]}"; do pack "router_data_$p"; pack "router_data_${p}_test"; done
# the testbed's realism bars (scripts/testbed_bars.py) from the T = 0 bench (eval-t0's, else the routed one, which
# holds the drafters and the sweep), the T = 1 bench, the build and the neural router's replayed calibration (its
# share of the speed oracle's gain), once a T = 0 bench is there -> LOG_DIR/bars.md
p=${pairs[0]}; t0=$L/eval_${p}_t0_results.json; [ -f "$t0" ] || t0=$L/eval_${p}_routed_results.json
if [ -f "$t0" ]; then
  more=(); [ -f "$L/eval_${p}_t1_results.json" ] && more=(--t1 "$L/eval_${p}_t1_results.json")
  [ -f "$TB/thresholds_neural_$p.json" ] && more+=(--thresholds "$TB/thresholds_neural_$p.json")
  python3 scripts/testbed_bars.py "$t0" "${more[@]}" --testbed "$TB" --pair "$p" --out "$L/bars.md" | tail -1
fi
[ -n "${tests_pid:-}" ] && wait "$tests_pid" && tail -3 "$L/tests.out"
echo "=== $(( $(date +%s) - start ))s of ${budget}s"
