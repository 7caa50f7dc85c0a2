# Sourced by the KREX prolog, epilog and task prolog: where krex is and where the node's arbiter
# listens, from krex.env in the directory of slurm.conf ($SLURM_CONF's, which slurmd sets for them).
# slurmd gives the prolog and epilog no PATH of their own.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
KREX=krex
KREX_RUNTIME_DIR=/run/krex
KREX_PROLOG_WAIT=10
conf_dir=$(dirname "${SLURM_CONF:-/etc/slurm/slurm.conf}")
[ -r "$conf_dir/krex.env" ] && . "$conf_dir/krex.env"
export PATH KREX_RUNTIME_DIR
