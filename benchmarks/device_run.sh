#!/usr/bin/env bash
# Everything that needs the GPU machine, in one batch (device time is scarce).
# Usage on a GPU machine, from the repo root, with the package's dependencies importable:
#   bash benchmarks/device_run.sh [STAGE ...]
# Stages: each `case` below, a comment beside it (default: info
# gputests fidelity latency warm quickstart). `before` runs the latency stage in .before/, an earlier tree unpacked there
# (`mkdir .before && git archive REV krex_lab benchmarks pyproject.toml | tar -x -C .before`, carried; add `kernels`
# for a REV from before the candidate library moved into krex_lab/kernels/), and
# names its JSON ...-before-REV (REV from .before/REV): both trees measured back to back on one machine.
# Logs and JSON are gathered in one archive, $OUT/device-results.tgz, and benchmarks/out/ on
# that machine. proccost, lockcost, lag, modes and harnesshost run the probes of benchmarks/probes/ (its README).
set -uo pipefail
FINAL=${OUT:-/tmp/krex-final}; mkdir -p "$FINAL"
export OUT=/tmp/krex-out; rm -rf "$OUT"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
stages=("$@"); [ ${#stages[@]} -gt 0 ] || stages=(info gputests fidelity latency warm quickstart)
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
for stage in "${stages[@]}"; do
  stamp "$stage"
  case $stage in
    info)
      nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv | tee "$OUT/info.txt"
      python3 -c "import sys, torch; print(sys.version, torch.__version__, torch.cuda.device_count())" | tee -a "$OUT/info.txt"
      nproc | tee -a "$OUT/info.txt" ;;
    gputests)
      # -v: each test's outcome as it ends (a run stopped by the timeout still says which failed);
      # --timeout: a hanging test fails alone instead of eating the stage (about 5 min in all).
      KREX_GPU_DIAG="$OUT/diag" timeout ${GPUTESTS_TIMEOUT:-540} python3 -m pytest -p no:cacheprovider -v -rA \
        --tb=short --timeout 200 -m gpu tests/gpu -o addopts="" > "$OUT/gpu_tests.log" 2>&1
      grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu_tests.log" | tail -40 ;;
    gputests-guard)  # tests/gpu whole with Arbiter.guard_neighbours on and the region tests on the cpuset shield
      KREX_GUARD_NEIGHBOURS=1 KREX_TEST_SHIELD=${GUARD_SHIELD:-cpuset} KREX_GPU_DIAG="$OUT/diag-guard" \
        timeout ${GPUTESTS_TIMEOUT:-540} python3 -m pytest -p no:cacheprovider -v -rA \
        --tb=short --timeout 200 -m gpu tests/gpu -o addopts="" > "$OUT/gpu_tests_guard.log" 2>&1
      grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/gpu_tests_guard.log" | tail -40 ;;
    latency-shields)  # the round trip with 0/3/15 idle siblings, guard_neighbours on, for each shield mode
      for shield in cpuset affinity sessions; do
        timeout 200 python3 benchmarks/regions/arbiter_latency.py --backend nvidia --cuda --counts 0,3,15 --modes idle \
          --shield $shield --arbiter-option=--Arbiter.guard_neighbours=True --rounds ${LATENCY_ROUNDS:-100} 2>&1 | tail -8 \
          | tee "$OUT/latency-$shield.log"
      done ;;
    fidelity)
      timeout 420 python3 benchmarks/regions/fidelity.py ${FIDELITY_ARGS:-} 2>&1 | tail -60 | tee "$OUT/fidelity.log" ;;
    latency)
      timeout 240 python3 benchmarks/regions/arbiter_latency.py --backend nvidia --cuda --counts 0,3,15 \
        --modes ${LATENCY_MODES:-idle,busy} --rounds ${LATENCY_ROUNDS:-100} ${LATENCY_ARGS:-} 2>&1 | tail -20 \
        | tee "$OUT/latency.log" ;;
    latencygap)  # the same, each round after the shield's linger is over: a region on its own (~20 s)
      timeout 240 python3 benchmarks/regions/arbiter_latency.py --backend nvidia --cuda --counts 0,3,15 --gap 0.1 \
        --modes ${LATENCY_MODES:-idle,busy} --rounds ${LATENCY_ROUNDS:-100} ${LATENCY_ARGS:-} 2>&1 | tail -20 \
        | tee "$OUT/latencygap.log" ;;
    before)
      rev=$(cat .before/REV); mkdir -p /tmp/before-out
      latency=benchmarks/regions/arbiter_latency.py  # a tree from before the family folders has it at benchmarks/
      [ -e ".before/$latency" ] || latency=benchmarks/arbiter_latency.py
      (cd .before && OUT=/tmp/before-out timeout 240 python3 $latency --backend nvidia --cuda \
        --counts 0,3,15 --modes ${LATENCY_MODES:-idle,busy} --rounds ${LATENCY_ROUNDS:-100} ${LATENCY_ARGS:-} 2>&1) \
        | tail -20 | tee "$OUT/latency-before-$rev.log"
      for f in /tmp/before-out/arbiter_latency-*.json; do
        [ -e "$f" ] && cp "$f" "$OUT/$(basename "$f" | sed "s/-cuda-/-cuda-before-$rev-/")"
      done ;;
    proccost)  # probe: /proc reads, signals and affinity calls of 15 torch siblings, each timed alone; ~40 s
      timeout 120 python3 benchmarks/probes/proc_cost.py ${PROCCOST_ARGS:-} 2>&1 | tail -20 | tee "$OUT/proccost.log" ;;
    lockcost)  # probe: the checkpoint lock alone, 1/3/15 idle driver-API siblings, 1..16 threads; ~30 s
      timeout 120 python3 benchmarks/probes/lock_cost.py ${LOCKCOST_ARGS:-} 2>&1 | tail -30 | tee "$OUT/lockcost.log" ;;
    warm)
      # The image sets no bytecode cache for carried wheels (pip --no-compile) and the tree arrives
      # without one: compile once, as an installed package is, or every `krex run` recompiles its
      # imports (about 90 ms on the H200, 2026-12-01: the startup being measured).
      python3 -m compileall -q krex_lab ${PYTHONPATH%%:*} > /dev/null 2>&1
      timeout 240 python3 benchmarks/pool/warm_vs_cold.py 2>&1 | tail -30 | tee "$OUT/warm.log" ;;
    warmcpu)  # the same harness on the fake backend with a NumPy script: the CLI's own start-up and
      # round trip on a quiet 16-core host, comparable with the CPU machine's figure (~1 min)
      python3 -m compileall -q krex_lab ${PYTHONPATH%%:*} > /dev/null 2>&1
      timeout 240 python3 benchmarks/pool/warm_vs_cold.py --framework numpy --backend fake --runs 31 2>&1 | tail -30 \
        | tee "$OUT/warmcpu.log" ;;
    quickstart)
      timeout 240 python3 benchmarks/lab/quickstart_device.py 2>&1 | tail -30 | tee "$OUT/quickstart.log" ;;
    harnesshost)  # probe: the judge's timed loop in fresh processes, each with more of a candidate's confinement,
      # build, rlimits and hold (HARNESS_ARGS: --variants ...); ~3 min with the in-process builds
      timeout ${HARNESS_TIMEOUT:-300} python3 benchmarks/probes/harness_host.py ${HARNESS_ARGS:-} 2>&1 | grep -v Warning \
        | tail -20 | tee "$OUT/harness_host.log" ;;
    lag)  # probe: how long freed GPU memory keeps counting in NVML, and what one evaluation leaves (~40 s)
      timeout 90 python3 benchmarks/probes/nvml_memory_lag.py --rounds 3 2>&1 | grep -v Numba | tail -16 | tee "$OUT/nvml_lag.log" ;;
    modes)  # probe: the tiled matmul alone, inputs in one place, shifted, or after the GPU idled, short or long warm-up (~4 min)
      timeout 330 python3 benchmarks/probes/candidate_modes.py ${MODES_ARGS:---trials 8 --candidates matmul/optimised,softmax/naive} \
        2>&1 | grep -v Numba | tail -12 | tee "$OUT/modes.log" ;;
    study)  # LLM-agent study (benchmarks/agent/agent_study.py): about 8 min
      # 16 warm workers (numba.cuda, torch, Triton preloaded: ~40 s), the reference pass (every correct candidate alone on
      # a warm worker, 4 times, each on fresh inputs: ~280 s; a tiled matmul reads one of two times by its allocation),
      # then 16 agents x {command,region}, think mean 8 s, 10 s warm-up + 45 s measured each
      python3 -m compileall -q krex_lab benchmarks ${PYTHONPATH%%:*} > /dev/null 2>&1
      timeout ${STUDY_TIMEOUT:-545} python3 benchmarks/agent/agent_study.py --backend nvidia ${STUDY_ARGS:---agents 16 --think-mean 8 \
        --seconds 45 --warmup 10 --launch warm --modes command,region --reference-repeats 4 --no-reference-after} 2>&1 \
        | grep -v -e "^krex: waiting" -e "NumbaPerformanceWarning" -e "warn(errors.NumbaPerformanceWarning" \
        > "$OUT/study.log"; tail -30 "$OUT/study.log" ;;
    studylong)  # toward deciding the 3.4x bar: 16 agents x {command,region}, think 8 s, 140 s windows (a
      # ratio's 95 % counting interval about +-14 %, against +-25 % in 45 s; runs on other machines differ by more:
      # repeat it), two alone runs a candidate; about 8.5 min
      python3 -m compileall -q krex_lab benchmarks ${PYTHONPATH%%:*} > /dev/null 2>&1
      timeout ${STUDY_TIMEOUT:-560} python3 benchmarks/agent/agent_study.py --backend nvidia --agents 16 --think-mean 8 \
        --seconds 140 --warmup 10 --launch warm --modes command,region --reference-repeats 2 --no-reference-after \
        ${STUDYLONG_ARGS:-} 2>&1 | grep -v -e "^krex: waiting" -e "NumbaPerformanceWarning" \
        -e "warn(errors.NumbaPerformanceWarning" > "$OUT/studylong.log"; tail -12 "$OUT/studylong.log" ;;
    study0)  # think time 0 (the GPU saturated): 16 agents x {command,region,none}, warm, 24 s each; ~4 min
      python3 -m compileall -q krex_lab benchmarks ${PYTHONPATH%%:*} > /dev/null 2>&1
      timeout ${STUDY_TIMEOUT:-330} python3 benchmarks/agent/agent_study.py --backend nvidia --agents 16 --think-mean 0 \
        --seconds 24 --warmup 5 --launch warm --reference-repeats 1 --no-reference-after --no-plots 2>&1 \
        | grep -v -e "^krex: waiting" -e "NumbaPerformanceWarning" -e "warn(errors.NumbaPerformanceWarning" \
        > "$OUT/study0.log"; tail -12 "$OUT/study0.log" ;;
    bench)  # krex_lab.bench vs triton do_bench and the krex_lab/kernels/ presets; then notebook 02 on the GPU
      timeout 240 python3 benchmarks/regions/bench_vs_do_bench.py ${BENCH_ARGS:-} 2>&1 | tail -70 | tee "$OUT/bench.log"
      timeout 300 python3 benchmarks/lab/notebook_device.py notebooks/02_optimize_a_kernel.ipynb 2>&1 \
        | grep -v "IPKernelApp.*without encryption" | tail -60 | tee "$OUT/notebook02.log" ;;
    multigpu)
      timeout 300 python3 benchmarks/multigpu/multi_gpu.py ${MULTIGPU_ARGS:-} 2>&1 | grep -v "IPKernelApp.*without encryption" | tail -90 | tee "$OUT/multigpu.log" ;;
    outsidetime)  # the judge's figure from outside the candidate: the driver's lock ends a round, the side-stream
      # and event-patch cheats get the outside figure, honest candidates keep theirs (about 5 min)
      timeout ${OUTSIDETIME_TIMEOUT:-420} python3 -m pytest -p no:cacheprovider -v -rA --tb=short --timeout 300 -m gpu \
        tests/gpu/test_outside_gpu.py tests/gpu/test_redteam_gpu.py tests/gpu/test_evaluate_gpu.py -o addopts="" \
        > "$OUT/outsidetime.log" 2>&1; tail -40 "$OUT/outsidetime.log" ;;
    judge)  # one evaluation at a time on one warm worker, phase by phase (benchmarks/eval/judge_device.py)
      timeout 300 python3 benchmarks/eval/judge_device.py --backend nvidia --problems ${JUDGE_PROBLEMS:-15,13,04,17} \
        --repeat 3 2>&1 | tail -30 | tee "$OUT/judge.log" ;;
    sandbox)  # the candidate's sandbox on the GPU: its cost per spare (lock, CUDA context inside it, confine) and
      # its GPU tests (load_inline, Triton, numba inside it; the judge's memory denied; no file made in /dev/shm
      # though the CUDA IPC counters there open; a CUDA build found again after its directory was emptied); about 4 min
      timeout 120 python3 benchmarks/eval/sandbox_cost.py --cuda --runs 20 2>&1 | tail -8 | tee "$OUT/sandbox.log"
      timeout 420 python3 -m pytest -p no:cacheprovider -v -rA --tb=short --timeout 300 -m gpu \
        tests/gpu/test_sandbox_gpu.py -o addopts="" 2>&1 | tail -15 | tee -a "$OUT/sandbox.log" ;;
    redteam)  # the red-team corpus (tests/evaluate/redteam/: CPU and GPU cheats, each with its honest twin) on the GPU,
      # plus KernelBench's adversarial kernels when a checkout is carried (REDTEAM_ARGS="--kernelbench shared/KernelBench")
      timeout ${REDTEAM_TIMEOUT:-580} python3 benchmarks/eval/redteam.py ${REDTEAM_ARGS:-} 2>&1 | tail -70 | tee "$OUT/redteam.log" ;;
    redteambatch)  # the corpus's speed cheats, their twins and KernelBench's adversarial kernels in ONE batch of 16
      # beside 3 foreign GPU processes of 20 GiB each (benchmarks/eval/redteam_batch.py; a KernelBench checkout carried
      # as .kb: REDTEAMBATCH_ARGS="--kernelbench .kb")
      timeout ${REDTEAMBATCH_TIMEOUT:-560} python3 benchmarks/eval/redteam_batch.py --jobs 16 --hogs 3 --hog-gib 20 \
        ${REDTEAMBATCH_ARGS:-} 2>&1 | tail -60 | tee "$OUT/redteambatch.log" ;;
    redteamtests)  # the GPU red-team tests alone: every GPU cheat with its twin, then one of each kind in a batch
      # of 16 evaluations at once beside honest candidates (tests/gpu/test_redteam_gpu.py, test_redteam_batch_gpu.py)
      timeout ${REDTEAMTESTS_TIMEOUT:-580} python3 -m pytest -p no:cacheprovider -v -rA --tb=short -m gpu \
        tests/gpu/test_redteam_gpu.py tests/gpu/test_redteam_batch_gpu.py -o addopts="" > "$OUT/redteam_tests.log" 2>&1
      grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|forged|correct at" "$OUT/redteam_tests.log" | tail -60 ;;
    evalbatch)  # krex eval --batch (16 warm workers, regions) vs KernelBench's batch way (compile all in parallel,
      # then one fresh process per evaluation), 22 problems / 31 candidates (CUDA load_inline, Triton, torch), then the
      # > 1 ms ones alone again (benchmarks/eval/eval_batch.py); about 8-9 min. JSON and log go straight to the device's $OUT
      # too, so that a run cut short still returns what it measured.
      python3 -m compileall -q krex_lab benchmarks ${PYTHONPATH%%:*} > /dev/null 2>&1
      (command -v nvcc && nvcc --version | tail -1; echo "CUDA_HOME=${CUDA_HOME:-}") > "$FINAL/evalbatch.log" 2>&1
      OUT=$FINAL timeout ${EVALBATCH_TIMEOUT:-560} python3 benchmarks/eval/eval_batch.py --backend nvidia \
        --budget-s ${EVALBATCH_BUDGET:-420} ${EVALBATCH_ARGS:-} >> "$FINAL/evalbatch.log" 2>&1
      tail -45 "$FINAL/evalbatch.log" ;;
    gpufiles)  # some files of tests/gpu (GPU_FILES="tests/gpu/a.py ..."; GPU_LOG names the log): tests/gpu whole
      # in two calls of the device's 10-minute limit. The log goes straight to the device's $OUT (a cut run says which
      # tests ended how).
      KREX_GPU_DIAG="$FINAL/diag" timeout ${GPUTESTS_TIMEOUT:-540} python3 -m pytest -p no:cacheprovider -v -rA \
        --tb=short --timeout 240 -m gpu ${GPU_FILES:-tests/gpu} -o addopts="" > "$FINAL/${GPU_LOG:-gpu_files}.log" 2>&1
      grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$FINAL/${GPU_LOG:-gpu_files}.log" | tail -40 ;;
    pmpp)  # GPU MODE's reference kernels as published (problems/pmpp, carried into .pmpp/: nothing is fetched here):
      # every problem's submission and solutions, published and gathered layouts (benchmarks/eval/gpumode_pmpp.py); ~3-5 min
      timeout ${PMPP_TIMEOUT:-560} python3 benchmarks/eval/gpumode_pmpp.py ${PMPP_DIR:-.pmpp/problems/pmpp} --backend nvidia \
        --workers ${PMPP_WORKERS:-4} ${PMPP_ARGS:-} 2>&1 | tail -75 | tee "$OUT/pmpp.log" ;;
    poolstart)  # 16 warm workers (torch) started two at a time, then as many at once as the node has CPUs: time to
      # the first worker ready and to all 16 (benchmarks/pool/pool_start.py), twice each; about 2-3 min
      timeout 300 python3 benchmarks/pool/pool_start.py --backend nvidia --workers 16 --concurrency 2,0 --repeat 2 \
        ${POOLSTART_ARGS:-} 2>&1 | tail -12 | tee "$OUT/poolstart.log" ;;
    evalbatchforeign)  # evalbatch beside 3 foreign GPU processes holding 20 GiB each (idle: their memory is the
      # point), admitted by GPU memory; the JSON records the pool's start, admission and requeues; about 8-9 min
      python3 -m compileall -q krex_lab benchmarks ${PYTHONPATH%%:*} > /dev/null 2>&1
      (command -v nvcc && nvcc --version | tail -1; echo "CUDA_HOME=${CUDA_HOME:-}") > "$FINAL/evalbatchforeign.log" 2>&1
      OUT=$FINAL timeout ${EVALBATCH_TIMEOUT:-560} python3 benchmarks/eval/eval_batch.py --backend nvidia --jobs 16 \
        --foreign 3 --foreign-gib 20 --budget-s ${EVALBATCH_BUDGET:-420} ${EVALBATCH_ARGS:-} \
        >> "$FINAL/evalbatchforeign.log" 2>&1
      tail -45 "$FINAL/evalbatchforeign.log" ;;
    defences)  # what each of the judge's defences costs an evaluation on the GPU (benchmarks/eval/eval_overhead.py:
      # the tests' elementwise problem on a warm worker, 12 times; about 1-2 min)
      OUT=$FINAL timeout ${DEFENCES_TIMEOUT:-300} python3 benchmarks/eval/eval_overhead.py --backend nvidia --runs 12 \
        --cli-runs 1 2>&1 | tail -16 | tee "$FINAL/defences.log" ;;
    letgo)  # the judge's GPU tests with KREX_JUDGE_LET_GO off, then on (GPU_FILES: others): which outside figure
      # agrees with the candidate's own; each test prints metadata.timing_split_us (where the brackets' time went)
      for v in 0 1; do
        KREX_JUDGE_LET_GO=$v timeout ${LETGO_TIMEOUT:-270} python3 -m pytest -p no:cacheprovider -v -s -rA --tb=short \
          --timeout 200 -m gpu ${GPU_FILES:-tests/gpu/test_evaluate_gpu.py tests/gpu/test_judge_memory_gpu.py} \
          -o addopts="" > "$FINAL/letgo-$v.log" 2>&1
        grep -E "PASSED|FAILED|ERROR|passed|failed|timing_split|judge_memory_rounds" "$FINAL/letgo-$v.log" | tail -25
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
done
stamp done
tar czf "$FINAL/device-results.tgz" -C "$OUT" . && ls -la "$FINAL"
