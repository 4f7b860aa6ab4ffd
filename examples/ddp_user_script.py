"""Your own training script on hpctrain's library: the same file runs under python, torchrun and srun.

    python examples/ddp_user_script.py --run-dir runs/demo
    torchrun --standalone --nproc-per-node 2 examples/ddp_user_script.py --run-dir runs/demo
    srun -N2 --ntasks-per-node=1 python examples/ddp_user_script.py --run-dir runs/demo

Launching it again with the same --run-dir resumes from the newest complete checkpoint, whatever the
number of processes was before. SIGUSR1 (Slurm's time-limit warning) or SIGTERM (scancel) makes every rank stop after
the same step, with a checkpoint, so a resumed run loses nothing. The model and data are toys; the point
is the few lines around them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from hpctrain import checkpoint
from hpctrain.distributed import all_reduce_mean, barrier, destroy_process_group, setup
from hpctrain.health import ProgressRecorder, Watchdog, dump_stacks
from hpctrain.training import StepVote, StopReason, StopRequest


def make_data(n: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed noisy linear problem, identical on every rank (same generator seed)."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=gen)
    y = x @ torch.randn(16, 1, generator=gen) + 0.01 * torch.randn(n, 1, generator=gen)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", required=True, help="checkpoints go to RUN_DIR/checkpoints (shared by all nodes)")
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

        # 5. Health: a live record per rank (RUN/progress/rank-N.json, what `hpctrain top` shows) and a watchdog
        # thread that, when no step completes in time, leaves this rank's stacks in RUN/hang/ and ends the process.
        progress = ProgressRecorder(Path(args.run_dir), env.rank, env.world_size, socket.gethostname(), len(batches))

        def hung(quiet_s: float, limit_s: float) -> None:
            where = Path(args.run_dir) / "hang" / f"rank-{env.rank}.txt"
            dump_stacks(where, f"rank {env.rank}: no step for {quiet_s:.0f} s (limit {limit_s:.0f} s)")
            progress.phase("hung")
            os._exit(142)

        watchdog = Watchdog(args.hang_timeout, long_s=660.0, on_hang=hung).start()
        for epoch in range(start_epoch, args.epochs):
            vote = StepVote()
            for b in range(start_batch if epoch == start_epoch else 0, len(batches)):
                i, started = batches[b], time.perf_counter()
                loss = torch.nn.functional.mse_loss(trained(x[i : i + 64]), y[i : i + 64])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                # 6. All ranks agree whether any was told to stop: one tiny collective every few steps (as many as
                # fit in 50 ms; always on an epoch's last step), at the same steps on every rank. On NCCL the vote
                # goes over a gloo group made for it, so it never waits for the GPU.
                reason = vote.after_step(stop.reason, settle=b + 1 == len(batches))
                watchdog.beat()
                progress.step(epoch + 1, epoch * len(batches) + b + 1, b + 1, len(x[i : i + 64]),
                              time.perf_counter() - started, data_s=0.0, compute_s=0.0)
                if reason is not StopReason.NONE:
                    save(epoch, b + 1, f"checkpoint_step_{epoch * len(batches) + b + 1}.pt")
                    print(f"[rank {env.rank}] stopping ({reason.label}) after a checkpoint", flush=True)
                    sys.exit(reason.exit_code)  # 75 after a time-limit warning, 143 after SIGTERM
            mean_loss = all_reduce_mean(loss).item()
            save(epoch + 1, 0, f"checkpoint_epoch_{epoch + 1}.pt")
            if env.is_main:
                print(f"epoch {epoch + 1} loss {mean_loss:.6f}", flush=True)
        watchdog.stop()
        progress.phase("finished")
    finally:
        stop.uninstall()
        destroy_process_group()


if __name__ == "__main__":
    main()
