# session 23's device batch (issue 15): NVML's free lag, then the agent study; see RESULTS.md
source .whl/use-wheels.sh
export PYTHONUNBUFFERED=1
python3 -m compileall -q krex_lab kernels benchmarks > /dev/null 2>&1
( nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 1000 > $OUT/clocks.csv 2>&1 & echo $! > /tmp/smi.pid )
t0=$(date +%s)
timeout 60 python3 benchmarks/nvml_memory_lag.py 2>&1 | tail -12 | tee $OUT/nvml_lag.log
echo "lag at $(( $(date +%s) - t0 )) s"
timeout 100 python3 -m pytest -p no:cacheprovider -q -m gpu tests/gpu/test_pool_gpu.py -o addopts="" > $OUT/pool_gpu_tests.log 2>&1
tail -3 $OUT/pool_gpu_tests.log; echo "pool tests at $(( $(date +%s) - t0 )) s"
timeout ${STUDY_TIMEOUT:-450} python3 benchmarks/agent_study.py --backend nvidia ${STUDY_ARGS} --no-plots 2>&1 \
  | grep --line-buffered -v -e "^krex: waiting" -e "NumbaPerformanceWarning" -e "warn(errors.Numba" > $OUT/study.log
tail -25 $OUT/study.log; echo "study at $(( $(date +%s) - t0 )) s"
cp /tmp/krex-agents-*/pool.log $OUT/ 2>/dev/null
kill $(cat /tmp/smi.pid)
