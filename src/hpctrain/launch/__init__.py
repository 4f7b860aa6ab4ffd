"""Launching jobs: the job description (job.py), environments (environments.py), Slurm rendering and thin
submission (slurm.py), local process spawning (local.py). Import the submodule you need; nothing here imports torch."""
