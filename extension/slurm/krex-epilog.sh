#!/bin/sh
# Slurm Epilog (root, on the node, after the job ended: finished, cancelled or timed out): kill the
# job's processes that are still KREX sessions, so that the arbiter ends what they held or queued
# (nothing stays frozen, locked or pinned), and forget the job. Always exits 0 (`krex slurm epilog`):
# a failing epilog would drain the node for a job that is already over.
. "$(dirname "$0")/krex-slurm-env.sh"
"$KREX" slurm epilog
exit 0
