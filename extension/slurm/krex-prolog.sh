#!/bin/sh
# Slurm Prolog (root, on the node, when the job is allocated): the node's KREX arbiter must answer.
# If it does not, `krex slurm prolog` drains the node with a reason saying so, writes it in the
# job's AdminComment and exits 1 (Slurm then requeues and holds the job). If it does, the job is
# recorded for the arbiter, which then tells the job's sessions and regions by job and account.
. "$(dirname "$0")/krex-slurm-env.sh"
exec "$KREX" slurm prolog --wait "$KREX_PROLOG_WAIT"
