"""Read-only views of a live Slurm cluster: nodes, partitions and jobs parsed from the Slurm client
commands, plus the pre-submit checks built on them. Nothing here imports torch."""
