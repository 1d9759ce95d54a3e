#!/usr/bin/env bash
# Steps of scripts/gpu_session.sh inside one device command of BUDGET seconds: each step runs only while
# its estimate fits in what is left, under a time limit of what is left (a build stage cut by its limit is
# lost whole, so stop before one that cannot finish; the next command on the warm machine resumes it).
#   build-STAGE   build the testbed up to STAGE (UNTIL=STAGE; corpus ... acceptance)
#   eval-t0       whiflash-eval bench, greedy: AR, EAGLE-3, DFlash, DDTree at budgets 16/32/64, oracle;
#                 E0_SAMPLES prompts (80), E_TOKENS new tokens (256); the fp32 margins of any bf16 mismatch
#                 are in the run's results.json, copied beside results.md
#   eval-t1       AR, EAGLE-3, DFlash, DDTree (one budget) and WhiFlash-Neural df-e3 (when its router is there, at its
#                 calibrated thresholds) at temperature 1, E1_SAMPLES prompts (40)
#   prompts-calibrate[@PAIR]  router data on PROMPTS_CALIBRATE (20) rows of each prompt file that eval-prompts does
#                 not draw (scripts/heldout_prompts.py), the neural router replayed on them -> per benchmark category
#                 thresholds, TESTBED_DIR/thresholds_neural_prompts_PAIR.json
#   eval-prompts[@PAIR]  AR, EAGLE-3, DFlash, DDTree and WhiFlash-Neural on the JSONL prompt files in PROMPTS_DIR
#                 (.prompts), E2_SAMPLES rows of each (10, upstream's selection), E_TOKENS new tokens; the neural
#                 router at prompts-calibrate's thresholds when that step ran, else at the testbed's
#   gputest       the testbed generator's CUDA-graph test
#   bench-responses  scripts/bench_responses.py on the built target (RESPONSES_AB_FLAGS): the responses stage's
#                 generator whole, shedding ended rows, and attending over written columns -> LOG_DIR/bench_responses.*
#   profile-drafters  scripts/profile_drafter_step.py at PRESET's shapes (random weights) -> LOG_DIR/drafter_step.{json,txt}
#   bench-routing scripts/bench_routing.py --testbed --profile: the routed variants beside their standalone drafters
#                 on ROUTING_PROMPTS (8) test prompts of ROUTING_CATEGORY (code), E_TOKENS tokens, profiled
#                 (LOG_DIR/routing_profile/, LOG_DIR/bench_routing.log)
#   router-test[@PAIR]  router data on the test split (TEST_PROMPTS a category, 80: the pool the benchmark draws its
#                 prompts from) -> TESTBED_DIR/router_data_PAIR_test, to replay the router on the benchmark's prompts;
#                 then `whiflash-eval report` of the routed bench against them (LOG_DIR/report_PAIR_test) and the
#                 neural router replayed on the bench's own prompts (LOG_DIR/replay_PAIR_test_neural.json)
#   gs-STEP[@PAIR]  any gpu_session.sh step (latency, router, calibrate, tests, ...) for PAIR (default df-e3)
#   dagger[@PAIR]  one DAgger round: router data along the router's own decisions at its calibrated thresholds
#                 (datagen --path router, on the prompts of the router data) -> TESTBED_DIR/router_data_PAIR_dagger;
#                 the round-0 router and thresholds kept as router*_round0, thresholds_neural_round0_PAIR.json;
#                 the router refitted on both datasets (--data.extra_paths) and calibrated again (gs-calibrate's
#                 knobs, CALIBRATE_DECODE included) -> TESTBED_DIR/thresholds_neural_dagger_PAIR.json
#   eval-routed[@PAIR]  the routed bench: AR, EAGLE-3, DFlash, DDTree, WhiFlash-Entropy (calibrated thresholds when
#                 the calibrate step left them), WhiFlash-Neural and the oracle; E0_SAMPLES prompts, E_TOKENS tokens;
#                 df-e3's runs DDTree at TREE_BUDGETS (16,32,64) unless EVAL_FLAGS says otherwise, so it holds
#                 eval-t0's table too (gpu_loop.sh then counts eval-t0 done); then scripts/copy_rate.py on its AR answers
#                 -> LOG_DIR/copy_rate.md / .json, after the first pair's (the target's recall of its training text)
#   eval-rule[@PAIR]  with TAU_RULE=auto: the tau rule calibrate chose (--whiflash-tau-rule, WhiFlash-Entropy at the
#                 rule's thresholds) beside AR, EAGLE-3 and DFlash on the same prompts; nothing when it chose none
# The router loop on a built testbed: gs-latency:90 gs-router:300 gs-calibrate:60 eval-routed:300
#   (ROUTER_PROMPTS / ROUTER_TOKENS size the router data; gs-router@ddt-e3 eval-routed@ddt-e3 for the other pair).
# Usage: scripts/gpu_budget.sh LOG_DIR TESTBED_DIR BUDGET_S STEP:ESTIMATE_S ...
#   e.g. scripts/gpu_budget.sh $OUT/L /tmp/tb 545 build-target:430 build-responses:150
# PRESET=micro E0_SAMPLES=8 E1_SAMPLES=4 E_TOKENS=24 ROUTER_PROMPTS=6 ROUTER_TOKENS=24 LATENCY_CONTEXT=256 checks it
# on a CPU in a few minutes.
set -u
cd "$(dirname "$0")/.."
L=${1:?LOG_DIR}; TB=${2:?TESTBED_DIR}; budget=${3:?BUDGET_S}; shift 3
start=$(date +%s)
neural_grid=-inf,-6,-4,-3,-2,-1.5,-1,-0.5,-0.25,0,0.25,0.5,0.75,1,1.5,2,2.5,3,4,6,inf  # +-inf: a drafter alone
# the routed benches follow TAU_RULE=ENTER,LEAVE; with TAU_RULE=auto the chosen rule has a bench of its own (eval-rule)
# and the others run without it; eval-t0 and eval-t1 never take one
rule=${TAU_RULE:-}; [ "$rule" = auto ] && rule=
stick=(); [ -n "${STICK_TAU:-}" ] && stick=(--whiflash-stick-tau "$STICK_TAU")  # replays price what the bench runs
for item in "$@"; do
  name=${item%%:*}; est=${item##*:}
  pair=df-e3; [[ $name == *@* ]] && pair=${name#*@} && name=${name%@*}
  left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt "$est" ]; then echo "=== stop before $name (${left}s left < ${est}s estimate)"; break; fi
  echo "=== $name (${left}s left, estimate ${est}s) $(date +%T)"
  case $name in
    build-*) UNTIL=${name#build-} BUILD_TIMEOUT=$left bash scripts/gpu_session.sh "$L" "$TB" build ;;
    eval-t0) TAU_RULE= EVAL_TIMEOUT=$left EVAL_SAMPLES=${E0_SAMPLES:-80} EVAL_TOKENS=${E_TOKENS:-256} \
               METHODS=ar,eagle3,dflash,ddtree,oracle EVAL_FLAGS="--tree-budget 16,32,64" EVAL_TAG=_t0 \
               bash scripts/gpu_session.sh "$L" "$TB" eval ;;
    eval-t1) neural=; [ -d "$TB/router" ] && neural=,whiflash-neural  # df-e3's router, at its T = 0 thresholds
             TAU_RULE= EVAL_TIMEOUT=$left EVAL_SAMPLES=${E1_SAMPLES:-40} EVAL_TOKENS=${E_TOKENS:-256} \
               METHODS=ar,eagle3,dflash,ddtree$neural EVAL_FLAGS="--temperature 1" EVAL_TAG=_t1 \
               bash scripts/gpu_session.sh "$L" "$TB" eval ;;
    router-test) PAIR=$pair ROUTER_TIMEOUT=$left ROUTER_SOURCE=testbed:test ROUTER_PROMPTS=${TEST_PROMPTS:-80} \
               ROUTER_DATA=$TB/router_data_${pair}_test bash scripts/gpu_session.sh "$L" "$TB" router-data
               # the routed bench against these rows: the speed oracle on the bench's own prompts, each drafter's
               # τ in the rows (along its own walk on rows at every position) against its τ alone (report_PAIR_test/report.md)
               routed=$(ls -d "$L"/eval/*_"${pair}"_routed 2>/dev/null | tail -1)
               [ -n "$routed" ] && [ -f "$TB/router_data_${pair}_test/manifest.json" ] && \
                 python3 -m whiflash.eval report "$routed" --replay "$TB/router_data_${pair}_test" \
                   --latency-profile "$TB/profile.json" --out "$L/report_${pair}_test" 2>&1 | tail -3 && \
                 sed -n '/Share of the speed oracle/,$p' "$L/report_${pair}_test/report.md"
               # and the neural router replayed on exactly those prompts, to set beside what the bench measured
               router=$TB/router; [ "$pair" != df-e3 ] && router=$TB/router_$pair
               [ -n "$routed" ] && [ -d "$router" ] && \
                 python3 -m whiflash.eval calibrate --replay "$TB/router_data_${pair}_test" --replay-run "$routed" "${stick[@]}" \
                   --latency-profile "$TB/profile.json" --calibrate-method whiflash-neural \
                   --whiflash-neural-router-path "$router" --thresholds="$neural_grid" \
                   --out "$L/eval" --output "$L/replay_${pair}_test_neural.json" 2>&1 | tail -2 ;;
    gs-*) PAIR=$pair ROUTER_TIMEOUT=$left LATENCY_TIMEOUT=$left CALIBRATE_TIMEOUT=$left TESTS_TIMEOUT=$left \
            EVAL_TIMEOUT=$left BUILD_TIMEOUT=$left bash scripts/gpu_session.sh "$L" "$TB" "${name#gs-}" ;;
    dagger)  router=$TB/router; [ "$pair" != df-e3 ] && router=$TB/router_$pair
               thr=$TB/thresholds_neural_$pair.json; data=$TB/router_data_${pair}_dagger
               [ -d "${router}_round0" ] || { [ -d "$router" ] && [ -f "$thr" ]; } || \
                 { echo "=== $name: needs the router and its calibrated thresholds (gs-router, gs-calibrate)"; continue; }
               if [ ! -d "${router}_round0" ]; then  # the round-0 router's rows: its decisions, its thresholds
                 PAIR=$pair ROUTER_TIMEOUT=$left ROUTER_DATA=$data \
                   ROUTER_FLAGS="${ROUTER_FLAGS:-} --path router --router $router --router-thresholds $thr" \
                   bash scripts/gpu_session.sh "$L" "$TB" router-data
                 [ -f "$data/manifest.json" ] || { echo "=== $name: its router data did not finish"; continue; }
                 for f in "$TB"/thresholds_neural_*"$pair".json; do  # thresholds_neural[_replay]_PAIR.json
                   case $f in *_round0_*|*_dagger_*|*_prompts_*) ;; *) mv "$f" "${f%_"$pair".json}_round0_$pair.json" ;; esac
                 done
                 [ -f "$TB/variants_$pair.json" ] && mv "$TB/variants_$pair.json" "$TB/variants_round0_$pair.json"
                 mv "$TB/router_runs_$pair" "$TB/router_runs_round0_$pair" 2>/dev/null  # the refit's runs start afresh
                 mv "$router" "${router}_round0"
               fi
               left=$(( budget - ($(date +%s) - start) ))
               [ -f "$router/config.json" ] && [ "$router/config.json" -nt "$data/manifest.json" ] || \
                 PAIR=$pair ROUTER_TIMEOUT=$left ROUTER_TRAIN_FLAGS="${ROUTER_TRAIN_FLAGS:-} --data.extra_paths=[$data]" \
                   bash scripts/gpu_session.sh "$L" "$TB" router-train
               left=$(( budget - ($(date +%s) - start) ))
               [ -d "$router" ] && PAIR=$pair NEURAL_ONLY=1 CALIBRATE_TIMEOUT=$left bash scripts/gpu_session.sh "$L" "$TB" calibrate && \
                 [ -f "$thr" ] && cp "$thr" "$TB/thresholds_neural_dagger_$pair.json" && cp "$TB"/thresholds_neural_*"$pair".json "$L/" ;;
    eval-routed) methods=()  # df-e3: the eval step's default list (+ WhiFlash-Neural when the router is there)
               flags=${EVAL_FLAGS:-}  # df-e3: DDTree's budget sweep too (eval-t0's, at one bench fewer)
               [ "$pair" = df-e3 ] && flags=${EVAL_FLAGS:---tree-budget ${TREE_BUDGETS:-16,32,64}}
               [ "$pair" != df-e3 ] && methods=(METHODS=ar,eagle3,ddtree,whiflash-neural)
               env PAIR=$pair EVAL_TIMEOUT=$left EVAL_SAMPLES=${E0_SAMPLES:-80} EVAL_TOKENS=${E_TOKENS:-256} \
                 "${methods[@]}" EVAL_FLAGS="$flags" TAU_RULE="$rule" EVAL_TAG=_routed \
                 bash scripts/gpu_session.sh "$L" "$TB" eval
               # how much of the answers the target recalls from its training text (~15 s of CPU), once: every
               # pair's bench decodes the same answers
               samples=$L/eval_${pair}_routed_samples.jsonl
               [ ! -f "$L/copy_rate.md" ] && [ -f "$samples" ] && [ -d "$TB/corpus" ] && timeout 120 \
                 python3 scripts/copy_rate.py "$samples" --testbed "$TB" --json "$L/copy_rate.json" > "$L/copy_rate.md" ;;
    eval-rule) # the tau rule calibrate chose (TAU_RULE=auto), WhiFlash-Entropy at its thresholds, beside the drafters
               env PAIR=$pair EVAL_TIMEOUT=$left EVAL_SAMPLES=${E0_SAMPLES:-80} EVAL_TOKENS=${E_TOKENS:-256} \
                 METHODS=ar,eagle3,dflash,whiflash-entropy TAU_RULE=auto EVAL_TAG=_rule \
                 bash scripts/gpu_session.sh "$L" "$TB" eval ;;
    prompts-calibrate) files=("${PROMPTS_DIR:-.prompts}"/*.jsonl); heldout=$TB/prompts_heldout_$pair
               # rows of each prompt file outside the ones eval-prompts draws -> router data -> the neural router
               # replayed on them: thresholds per benchmark category (chat, coding, math) for eval-prompts
               python3 scripts/heldout_prompts.py "${files[@]}" --bench-samples "${E2_SAMPLES:-10}" \
                 --per-file "${PROMPTS_CALIBRATE:-20}" --out "$heldout" || { echo "=== $name: no held-out rows"; continue; }
               data=$(ls "$heldout"/*.jsonl | paste -sd,); router=$TB/router; [ "$pair" != df-e3 ] && router=$TB/router_$pair
               PAIR=$pair ROUTER_TIMEOUT=$left ROUTER_SOURCE=$data ROUTER_DATA=$TB/router_data_${pair}_prompts \
                 bash scripts/gpu_session.sh "$L" "$TB" router-data
               [ -f "$TB/router_data_${pair}_prompts/manifest.json" ] && [ -d "$router" ] && \
                 python3 -m whiflash.eval calibrate --replay "$TB/router_data_${pair}_prompts" "${stick[@]}" \
                   --latency-profile "$TB/profile.json" --calibrate-method whiflash-neural \
                   --whiflash-neural-router-path "$router" --thresholds="$neural_grid" --min-gain "${MIN_GAIN:-0.03}" \
                   --min-gain-confidence "${MIN_GAIN_CONFIDENCE:-0.9}" \
                   --out "$L/eval" --output "$TB/thresholds_neural_prompts_$pair.json" 2>&1 | tail -8 && \
                 cp "$TB/thresholds_neural_prompts_$pair.json" "$L/" ;;
    eval-prompts) files=("${PROMPTS_DIR:-.prompts}"/*.jsonl)  # benchmark prompt files
               data=$(IFS=,; echo "${files[*]}")
               thr=(); [ -f "$TB/thresholds_neural_prompts_$pair.json" ] && thr=(NEURAL_THRESHOLDS="$TB/thresholds_neural_prompts_$pair.json")
               env PAIR=$pair "${thr[@]}" TAU_RULE="$rule" EVAL_TIMEOUT=$left EVAL_SAMPLES=${E2_SAMPLES:-10} EVAL_TOKENS=${E_TOKENS:-256} EVAL_DATASET="$data" \
                 METHODS=ar,eagle3,dflash,ddtree,whiflash-neural EVAL_TAG=_prompts bash scripts/gpu_session.sh "$L" "$TB" eval ;;
    bench-responses) timeout "$left" python3 scripts/bench_responses.py --testbed "$TB" ${RESPONSES_AB_FLAGS:-} \
                       --json "$L/bench_responses.json" 2>&1 | grep -v '%|' | tee "$L/bench_responses.log" | tail -6 ;;
    profile-drafters) timeout "$left" python3 scripts/profile_drafter_step.py --preset "${PRESET:-small}" \
                        --json "$L/drafter_step.json" 2>&1 \
                        | grep -v -e USDT -e 'Loading weights' -e 'Writing model' > "$L/drafter_step.txt"
                      grep -e '^eagle3:' -e '^dflash:' "$L/drafter_step.txt" ;;
    bench-routing) timeout "$left" python3 scripts/bench_routing.py --testbed "$TB" --category "${ROUTING_CATEGORY:-code}" \
                 --prompts "${ROUTING_PROMPTS:-8}" --new-tokens "${E_TOKENS:-256}" --repeats 3 --json "$L/bench_routing.json" \
                 --profile "$L/routing_profile" 2>&1 | grep -v -E 'USDT|profiler_st' | tee "$L/bench_routing.log" | tail -32 ;;
    gputest) timeout "$left" python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -k batched_generation 2>&1 | tail -3 ;;
    *) echo "unknown step $name (build-STAGE, eval-t0, eval-t1, eval-routed, eval-rule, dagger, prompts-calibrate, eval-prompts, router-test, bench-routing, bench-responses, profile-drafters, gs-STEP, gputest)"; exit 2 ;;
  esac
  echo "=== $name done, ${left}s were left before it; $(( $(date +%s) - start ))s in all"
done
# the device copies back a limited number of files: the manifest first, then the acceptance rows
mkdir -p "$L"; cp "$TB/manifest.json" "$L/manifest.json" 2>/dev/null
cp "$TB/acceptance/acceptance.jsonl" "$L/" 2>/dev/null
exit 0
