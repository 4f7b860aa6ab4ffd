# shellcheck shell=bash
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
if [ -z "$head_node" ]; then
    echo "hpctrain: cannot resolve the head node from SLURM_JOB_NODELIST=${SLURM_JOB_NODELIST}" >&2
    exit 1
fi
