"""`hpctrain train WORKLOAD`: train a built-in recipe here, in this process or in --nproc local worker processes.

The same command runs unchanged under torchrun, srun or a Kubeflow PyTorchJob: the process finds its rank in the
environment. Its options and how they become a TrainConfig are the recipes' (hpctrain.recipes.train_options), which
`hpctrain submit` and the web console's job form validate a job's training options with.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.train_start import other_local_rank, refuse_bad_input, train_here
from hpctrain.errors import UserError
from hpctrain.recipes.train_options import add_arguments, config_from_args, config_from_argv

__all__ = ["add_arguments", "config_from_args", "config_from_argv", "run"]  # the command's parser is the recipes'


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.resume is not None:
        from hpctrain.training.resume import RECORDED_DEFAULTS, with_recorded_settings

        cfg = with_recorded_settings(cfg, {name for name in RECORDED_DEFAULTS if _unset(getattr(args, name, None))})
    try:
        cfg, plan = refuse_bad_input(cfg, dataset_defaulted=args.dataset is None)
    except UserError:
        if other_local_rank():
            _leave_the_report_to_local_rank_0()
        raise
    if plan is None:
        return train_here(cfg)
    from hpctrain.launch.processes import spawn

    # The workers learn their ranks from the spawner; a --dist-init-method slurm that made this srun task fan out
    # (one worker per GPU it owns) described the task, not them.
    return spawn(plan, train_here, (cfg.replace(nproc=None, dist_init_method=None),))


# How long a process beside local rank 0 waits for it to report a start-up error before reporting it itself.
REPORT_WAIT_S = 60.0


def _leave_the_report_to_local_rank_0() -> None:
    """Every process of the node finds the same bad input; local rank 0 says it, once. The others wait instead of
    exiting at once: a launcher (torchrun, srun --kill-on-bad-exit) stops the whole group when the first process
    exits, and the first one out would otherwise cut local rank 0 off before it printed. The launcher stops this
    process when local rank 0 has exited; if it has not within REPORT_WAIT_S (no such launcher), this one reports."""
    import time

    time.sleep(REPORT_WAIT_S)


def _unset(value: object) -> bool:
    """An option the command line left out: None, or a store_true flag not given (0 is a value)."""
    return value is None or value is False
