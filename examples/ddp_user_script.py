"""Your own training script on hpctrain's library: the same file runs under python, torchrun and srun.

    python examples/ddp_user_script.py --run-dir runs/demo
    torchrun --standalone --nproc-per-node 2 examples/ddp_user_script.py --run-dir runs/demo
    srun -N2 --ntasks-per-node=1 python examples/ddp_user_script.py --run-dir runs/demo

    hpctrain submit --nodes 2 --nproc-per-node 2 --time 30 -- python examples/ddp_user_script.py

Launching it again with the same --run-dir resumes from the newest complete checkpoint, whatever the
number of processes was before. SIGUSR1 (Slurm's time-limit warning) or SIGTERM (scancel) makes every rank stop after
the same step, with a checkpoint, so a resumed run loses nothing; under `hpctrain submit` the job then requeues
itself (the script said it handles SIGUSR1 by installing StopRequest, and that its state is saved with
announce_stop). A rank that hangs is reported as the built-in recipes' are (health_watch). The model and data are
toys; the point is the few lines around them.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from hpctrain import checkpoint
from hpctrain.distributed import all_reduce_mean, barrier, destroy_process_group, setup
from hpctrain.training import StepVote, StopReason, StopRequest, announce_stop
from hpctrain.training.script_watch import health_watch


def make_data(n: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed noisy linear problem, identical on every rank (same generator seed)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=gen)
    y = x @ torch.randn(16, 1, generator=gen) + 0.01 * torch.randn(n, 1, generator=gen)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    job_run_dir = os.environ.get("HPCTRAIN_RUN_DIR")  # the job's run directory, under `hpctrain submit`
    parser.add_argument("--run-dir", required=job_run_dir is None, default=job_run_dir,
                        help="checkpoints go to RUN_DIR/checkpoints (shared by all nodes; default under `hpctrain "
                        "submit`: the job's run directory)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--dist-init-method", default=None, help="env, slurm, tcp://HOST:PORT or file:///PATH")
    parser.add_argument("--hang-timeout", type=float, default=None,
                        help="seconds without a step that count as a hang (default: derived from the step times)")
    args = parser.parse_args()

    # 1. Who am I, which device, join the group (a no-op when this is the only process).
    env, device = setup(device=args.device, init_method=args.dist_init_method)
    print(f"[rank {env.rank}] {env.describe()} on {device}", flush=True)
    stop = StopRequest().install()  # signal handlers that only set a flag
    try:
        torch.manual_seed(0)
        model = torch.nn.Linear(16, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        ckpt_dir = f"{args.run_dir}/checkpoints"

        # 2. Resume: every rank loads the same newest complete checkpoint (None on the first launch).
        start_epoch = start_batch = 0
        state = checkpoint.load_latest(ckpt_dir, map_location="cpu")
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch, start_batch = state["epoch"], state.get("batch", 0)
            print(f"[rank {env.rank}] resumed from epoch {start_epoch}, batch {start_batch}", flush=True)

        # 3. Wrap for DDP only when there are several processes; keep `model` for saving (no "module." prefix).
        device_ids = [device.index] if device.type == "cuda" else None
        trained = DistributedDataParallel(model, device_ids=device_ids) if env.is_distributed else model

        def save(epoch: int, batch: int, name: str) -> None:
            # One rank writes; the others wait so nobody races ahead of (or exits before) the checkpoint.
            if env.is_main:
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
                         "batch": batch}
                checkpoint.save(state, ckpt_dir, name, epoch=epoch, step=epoch * len(batches) + batch,
                                world_size=env.world_size, keep=2)
            barrier()

        # 4. Each rank trains on its own shard of the data.
        x, y = make_data()
        x, y = x[env.rank :: env.world_size].to(device), y[env.rank :: env.world_size].to(device)
        batches = range(0, len(x), 64)

        # 5. Health, as the built-in recipes have it: a live record per rank (RUN/progress/, what `hpctrain top`
        # shows), answers to `hpctrain debug stacks`, and on a hang every rank's stacks in RUN/hang/, a report naming
        # the rank that never arrived, and exit status 142 (under `hpctrain submit`: a restart from the checkpoint).
        watch = health_watch(args.run_dir, env, device, model, len(batches), hang_timeout=args.hang_timeout)
        phase = "stopped"
        try:
            for epoch in range(start_epoch, args.epochs):
                vote = StepVote()
                for b in range(start_batch if epoch == start_epoch else 0, len(batches)):
                    i = batches[b]
                    loss = torch.nn.functional.mse_loss(trained(x[i : i + 64]), y[i : i + 64])
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    # 6. All ranks agree whether any was told to stop: one tiny collective every few steps (as many
                    # as fit in 50 ms; always on an epoch's last step), at the same steps on every rank. On NCCL the
                    # vote goes over a gloo group made for it, so it never waits for the GPU.
                    reason = vote.after_step(stop.reason, settle=b + 1 == len(batches))
                    watch.step(epoch, epoch * len(batches) + b + 1, b + 1, len(x[i : i + 64]), data_wait_s=0.0)
                    if reason is not StopReason.NONE:
                        with watch.long_phase("checkpoint"):
                            save(epoch, b + 1, f"checkpoint_step_{epoch * len(batches) + b + 1}.pt")
                        if env.is_main:  # the state is saved: say so, for the batch script (preempted: requeue me)
                            announce_stop(reason, args.run_dir)
                        print(f"[rank {env.rank}] stopping ({reason.label}) after a checkpoint", flush=True)
                        sys.exit(reason.exit_code)  # 75 after a time-limit warning, 143 after SIGTERM
                mean_loss = all_reduce_mean(loss).item()
                with watch.long_phase("checkpoint"):
                    save(epoch + 1, 0, f"checkpoint_epoch_{epoch + 1}.pt")
                if env.is_main:
                    print(f"epoch {epoch + 1} loss {mean_loss:.6f}", flush=True)
            if env.is_main:
                announce_stop(StopReason.NONE, args.run_dir)  # completed: never requeued
            phase = "finished"
        finally:
            watch.close(phase)
    finally:
        stop.uninstall()
        destroy_process_group()


if __name__ == "__main__":
    main()
