#!/bin/sh
# Slurm TaskProlog (the job's user, before each task): what the task prints as `export NAME=value`
# lands in its environment. Every task reaches the node's arbiter, and `krex exclusive`, kernels and
# pools use the GPU Slurm gave the job (its first, as the arbiter numbers GPUs: physical indices).
. "$(dirname "$0")/krex-slurm-env.sh"
echo "export KREX_RUNTIME_DIR=$KREX_RUNTIME_DIR"
gpus=${SLURM_STEP_GPUS:-$SLURM_JOB_GPUS}
[ -n "$gpus" ] && echo "export KREX_GPU=${gpus%%,*}"
exit 0
