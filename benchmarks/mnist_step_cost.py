"""The fast MNIST recipe's cost per image of one training step: its network now against the one before issue 22, and
now in float32 against now in bfloat16 (the CPU table of hpctrain.training.precision: it says which of the two is
the faster here, and the last line says whether the table picked it).

`now`: FastRecipe's own network and optimizer (widths 8, 24, 64; the first layer frozen). `before`: FastNet with
16, 32, 64 trained filters and the same optimizer. A step is forward (autocast to the type named, or to the type
the recipe picks here), label-smoothed loss, backward and the recipe's fused SGD, on random images of the recipe's
batch. The variants run
interleaved, in rounds; each round times --steps steps of each, and the figure is the minimum over rounds of the
median step, per image: a load that comes and goes moves the median of a round but hardly the minimum over rounds.

    python benchmarks/mnist_step_cost.py --threads 2
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/mnist_step_cost.py --threads 2   # AVX2, fp32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from hpctrain.recipes.mnist import FastNet, FastRecipe
from hpctrain.training.precision import Precision, precision_for

CPU = torch.device("cpu")


def variant(
    widths: tuple[int, int, int],
    frozen: bool,
    dtype: torch.dtype | None | str = "recipe",
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    recipe = FastRecipe()
    recipe.widths = widths
    model = recipe.build_model() if frozen else FastNet(widths).to(memory_format=torch.channels_last)
    if dtype != "recipe":
        model._precision[CPU] = Precision(dtype, str(dtype))
    return model, recipe.build_optimization(model, 0.15, 1, 100).optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=112)
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round (default 20)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    picked = precision_for(CPU)
    variants = {
        "before (16, 32, 64 trained)": variant((16, 32, 64), frozen=False),
        "now (8 frozen, 24, 64)": variant(FastRecipe.widths, frozen=True),
        "now, float32": variant(FastRecipe.widths, frozen=True, dtype=None),
        "now, bfloat16 autocast": variant(FastRecipe.widths, frozen=True, dtype=torch.bfloat16),
    }
    images, labels = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.rounds):
        for name, (model, optimizer) in variants.items():
            times = []
            for _ in range(args.steps):
                started = time.perf_counter()
                loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                times.append(time.perf_counter() - started)
            best[name] = min(best[name], statistics.median(times) / args.batch)
    base = next(iter(best.values()))
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, the recipe here: {picked.why}")
    for name, seconds in best.items():
        print(f"{name:28s} {seconds * 1e6:7.1f} us per image  ({seconds / base:.2f})")
    faster = torch.bfloat16 if best["now, bfloat16 autocast"] < best["now, float32"] else None
    ratio = best["now, bfloat16 autocast"] / best["now, float32"]
    verdict = "right" if faster == picked.dtype else "WRONG: the table in hpctrain/training/precision.py needs this CPU"
    print(f"bfloat16 / float32 step time: {ratio:.2f}; the table picked {picked.name}: {verdict}")


if __name__ == "__main__":
    main()
