# session 23's device batch (issue 15): what an evaluation leaves on the GPU, then the agent study; see RESULTS.md
source .whl/use-wheels.sh
export PYTHONUNBUFFERED=1
python3 -m compileall -q krex_lab kernels benchmarks > /dev/null 2>&1
t0=$(date +%s)
timeout 50 python3 benchmarks/nvml_memory_lag.py --rounds 3 2>&1 | grep -v Numba | tail -14 | tee $OUT/nvml_lag.log
echo "lag at $(( $(date +%s) - t0 )) s"
timeout ${STUDY_TIMEOUT:-450} python3 benchmarks/agent_study.py --backend nvidia ${STUDY_ARGS} --no-plots 2>&1 \
  | grep --line-buffered -v -e "^krex: waiting" -e "NumbaPerformanceWarning" -e "warn(errors.Numba" > $OUT/study.log
tail -25 $OUT/study.log; echo "study at $(( $(date +%s) - t0 )) s"
