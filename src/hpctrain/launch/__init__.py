"""Launching processes here: local.py spawns --nproc local workers. (Jobs are described in hpctrain.jobs and
submitted through hpctrain.schedulers.) Nothing here imports torch."""
