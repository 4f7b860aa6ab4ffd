"""MNIST and Fashion-MNIST: the tutorial's classic CNN, and our fast recipe.

Both hold the whole dataset as one normalized float tensor on the training device, so a batch is an index
gather: no DataLoader workers, no per-sample transforms.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn
from torch.nn import functional as F

from hpctrain import compat
from hpctrain.data import load_dataset
from hpctrain.recipes.base import Optimization, Recipe, TensorData, keep_freed_memory
from hpctrain.recipes.catalog import CATALOG
from hpctrain.training.precision import Precision, precision_for

# Mean and standard deviation of MNIST's training pixels, as the tutorial uses them (also for Fashion-MNIST).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
# Per-dataset statistics of the training pixels, for the fast recipe.
PIXEL_STATS = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}
WORKLOAD = CATALOG["mnist"]  # each recipe's defaults and description, shown by `hpctrain train mnist --help`


def load_tensors(
    dataset: str,
    data_dir: str,
    device: torch.device,
    train_limit: int | None,
    mean: float = MNIST_MEAN,
    std: float = MNIST_STD,
) -> TensorData:
    raw = load_dataset(dataset, data_dir)
    train_images, train_labels = raw["train_images"], raw["train_labels"]
    if train_limit is not None:
        train_images, train_labels = train_images[:train_limit], train_labels[:train_limit]
    if device.type == "cpu":
        keep_freed_memory()

    def normalize(images: torch.Tensor) -> torch.Tensor:
        # uint8 -> float on the device; [N, 28, 28] -> [N, 1, 28, 28], the layout conv layers expect.
        # The same float ops as the tutorial's ToTensor (x / 255) and Normalize ((x - mean) / std).
        images = images.to(device).unsqueeze(1).float().div_(255)
        return images.sub_(mean).div_(std)

    return TensorData(
        normalize(train_images),
        train_labels.to(device=device, dtype=torch.long),
        normalize(raw["test_images"]),
        raw["test_labels"].to(device=device, dtype=torch.long),
    )


# ------------------------------------------------------------------------------------------------ classic


class BitDropout(nn.Dropout):
    """nn.Dropout for p = 1/2, 1/4, 1/8, ...: each element is dropped with probability exactly p, independently.

    The mask comes from random bytes, 8 elements per byte (AND of k random bits is 1 with probability 2**-k),
    so it costs a fraction of the per-element Bernoulli draws nn.Dropout makes on the CPU, where those were
    the single most expensive part of the tutorial model's step after the convolutions. Same distribution,
    same scaling by 1 / (1 - p); draws from torch's global generator like nn.Dropout.
    """

    def __init__(self, p: float) -> None:
        super().__init__(p)
        bits = -math.log2(p) if 0 < p < 1 else 0.5
        if bits != int(bits) or not 1 <= bits <= 8:
            raise ValueError(f"BitDropout needs p = 2**-k for k in 1..8, got {p}; use nn.Dropout for other p")
        self.bits = int(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        if x.device.type != "cpu":  # on a GPU the stock dropout is one fused kernel: cheaper than these six
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        nbytes = (n + 7) // 8
        dropped = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=x.device)
        for _ in range(self.bits - 1):
            dropped &= torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=x.device)
        shifts = torch.arange(8, dtype=torch.uint8, device=x.device)
        keep = ((dropped.unsqueeze(1) >> shifts) & 1).view(-1)[:n].view(x.shape) ^ 1
        return x * keep.to(x.dtype).mul_(1 / (1 - self.p))


class TutorialNet(nn.Module):
    """The CNN of the pytorch/examples MNIST tutorial: conv 32, conv 64, max-pool, dropout, fc 128, fc 10.

    Same parameters (names and shapes: its checkpoints load here) and the same function. Two cheaper but
    equivalent steps: ReLU after the max-pool instead of before (max and ReLU commute, and ReLU then touches
    a quarter of the elements), and BitDropout. build_model() also stores the weights channels_last, the
    layout oneDNN's CPU convolutions work in natively (no reorder of activations every step).
    """

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = BitDropout(0.25)
        self.dropout2 = BitDropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x), inplace=True)
        x = F.max_pool2d(self.conv2(x), 2)
        x = self.dropout1(F.relu(x, inplace=True))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x), inplace=True)
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class ClassicRecipe(Recipe):
    """The tutorial exactly: Adadelta lr 1.0, StepLR(1, gamma 0.7), batch 64, test batch 1000, 14 epochs."""

    name = "classic"
    description = WORKLOAD.recipes["classic"].description
    defaults = WORKLOAD.recipes["classic"].defaults
    datasets = WORKLOAD.datasets
    graphs_step = True  # on a GPU the step is a few dozen tiny kernels: one graph launch instead (README: GPUs)

    def load_data(self, dataset, data_dir, device, train_limit):
        return load_tensors(dataset, data_dir, device, train_limit)

    def build_model(self) -> nn.Module:
        return TutorialNet().to(memory_format=torch.channels_last)

    def build_optimization(self, model, lr, epochs, steps_per_epoch):
        optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)
        return Optimization(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7), "epoch")

    def loss(self, output, target):
        return F.nll_loss(output, target)


# ------------------------------------------------------------------------------------------------ fast


def _conv_pool_block(c_in: int, c_out: int) -> list[nn.Module]:
    # Pool straight after the convolution: batch norm and ReLU then run on a quarter of the elements,
    # which matters on a CPU where these memory-bound layers cost as much as the convolutions.
    return [
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    ]


def patch_whitening(images: torch.Tensor, filters: int, eps: float = 1e-2) -> torch.Tensor:
    """3x3 convolution filters [filters, 1, 3, 3] that whiten the 3x3 patches of `images` ([N, 1, H, W]): the
    top filters // 2 principal directions of the patch covariance, each scaled by 1 / sqrt(its variance + eps),
    and their negatives (ReLU comes later, so each direction keeps both signs). Computed in float64 on the CPU,
    a thousand images at a time."""
    if filters < 2 or filters % 2:
        raise ValueError(f"patch whitening makes filters in +/- pairs: an even count, got {filters}")
    cov = torch.zeros(9, 9, dtype=torch.float64)
    count = 0
    for chunk in images.detach().cpu().float().split(1000):
        padded = F.pad(chunk[:, 0], (1, 1, 1, 1))  # [n, H + 2, W + 2]; F.unfold does the same, many times slower
        height, width = chunk.shape[-2:]
        shifted = [padded[:, i : i + height, j : j + width] for i in range(3) for j in range(3)]
        patches = torch.stack(shifted, dim=-1).reshape(-1, 9).double()
        cov += patches.T @ patches
        count += len(patches)
    variances, directions = torch.linalg.eigh(cov / max(count, 1))  # ascending
    top = directions.flip(1)[:, : filters // 2] / (variances.flip(0)[: filters // 2] + eps).sqrt()
    return torch.cat([top, -top], dim=1).T.reshape(filters, 1, 3, 3).float()


class FastNet(nn.Module):
    """Three conv-pool-BN-ReLU blocks (28 -> 14 -> 7 -> 3) and a linear layer; autocast inside forward to the type
    `hpctrain.training.precision` picks for the device (bf16, fp16 or none), float32 logits out. `whiten(filters)`
    fixes the first convolution's filters (patch_whitening's) and freezes them."""

    def __init__(self, widths: tuple[int, int, int] = (16, 32, 64), num_classes: int = 10) -> None:
        super().__init__()
        w1, w2, w3 = widths
        self.features = nn.Sequential(*_conv_pool_block(1, w1), *_conv_pool_block(w1, w2), *_conv_pool_block(w2, w3))
        self.head = nn.Linear(w3 * 3 * 3, num_classes)
        self._precision: dict[torch.device, Precision] = {}

    def whiten(self, filters: torch.Tensor) -> None:
        """Fixed first-layer filters (from patch_whitening): copied in and no longer trained."""
        stem = self.features[0]
        with torch.no_grad():
            stem.weight.copy_(filters)
        stem.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device not in self._precision:
            self._precision[x.device] = precision_for(x.device)
        with self._precision[x.device].autocast(x.device.type):
            return self.head(torch.flatten(self.features(x), 1)).float()


def warmup_linear_decay(warmup_steps: int, total_steps: int):
    """LR multiplier: linear rise from 0.1 to 1 over warmup_steps, then linear decay to 0.01 at total_steps
    (and after). Any step count works: a tiny --train-limit gives one or two steps."""

    def factor(step: int) -> float:
        if step >= total_steps:
            return 0.01
        if step < warmup_steps:
            return 0.1 + 0.9 * step / warmup_steps
        return 1.0 - 0.99 * (step - warmup_steps) / max(total_steps - warmup_steps, 1)

    return factor


def _fused(model: nn.Module) -> dict[str, bool]:
    """SGD's fused=True where this torch has it for the model's device: one kernel per parameter instead of several,
    half the optimizer's time per step. Elsewhere the plain SGD, said once."""
    device = next(model.parameters()).device.type
    if device == "meta":  # the stand-in a resume checks a checkpoint against (training.state_fit): no note
        return {}  # fused only chooses how the step is computed; state_fit lets it differ
    if compat.fused_sgd(device):
        return {"fused": True}
    since = "2.4 on a CPU, 2.3 on a GPU"
    compat.say_once("fused-sgd", f"torch {torch.__version__} has no fused SGD on {device} (torch {since}): plain SGD")
    return {}


class FastRecipe(Recipe):
    """Ours: the quickest route to about 90% Fashion-MNIST test accuracy on a CPU we found (docs/benchmarks.md).

    A small batch-normalized CNN in bfloat16 (where the hardware has it), SGD with Nesterov momentum, a short
    linear warmup then linear decay per step, label smoothing, one epoch by default. No augmentation by
    default: in runs of 1 to 3 epochs random flips cost accuracy (measured); `flips=True` adds random
    horizontal flips and flip-averaged evaluation, never for MNIST (digits are not mirror-symmetric).
    """

    name = "fast"
    description = WORKLOAD.recipes["fast"].description
    # Batch 112 at lr 0.15 beat batch 64 at lr 0.1 on time (3.4 vs 4.3 s) and matched it on accuracy (seeds 0-2:
    # 90.53, 90.20, 90.17%; measured with the earlier network, in docs/benchmarks.md's history).
    defaults = WORKLOAD.recipes["fast"].defaults
    datasets = WORKLOAD.datasets
    graphs_step = True
    # 8 whitened, frozen first-layer filters instead of 16 trained ones, and 24 second-layer filters instead of 32:
    # about 40% less work per image in float32, the same accuracy (CLI, seeds 0-4: 90.05-90.45%, median 90.38%);
    # see docs/benchmarks.md.
    widths = (8, 24, 64)
    whitening_images = 5000  # the first this many training images set the first layer's filters
    momentum = 0.9
    weight_decay = 5e-4
    warmup_fraction = 0.2
    label_smoothing = 0.1

    def __init__(self, flips: bool = False) -> None:
        self.wants_flips = flips
        self.flips = flips
        self.stem: torch.Tensor | None = None  # the first layer's filters, once the training images are known

    def load_data(self, dataset, data_dir, device, train_limit):
        # Decided here, where the dataset is known: digits must not be mirrored.
        self.flips = self.wants_flips and dataset != "mnist"
        mean, std = PIXEL_STATS[dataset]
        data = load_tensors(dataset, data_dir, device, train_limit, mean, std)
        self.stem = patch_whitening(data.train_images[: self.whitening_images], self.widths[0])
        return data

    def build_model(self) -> nn.Module:
        model = FastNet(self.widths)
        # Frozen even without data (a model built only to load a checkpoint): the optimizer's groups never change.
        model.whiten(self.stem if self.stem is not None else model.features[0].weight.detach().clone())
        return model.to(memory_format=torch.channels_last)

    def build_optimization(self, model, lr, epochs, steps_per_epoch):
        # No weight decay on biases and batch-norm parameters: it only fights their scale. The frozen first layer
        # stays in its group but never gets a gradient, and SGD leaves a parameter without one untouched.
        decay = [p for p in model.parameters() if p.ndim > 1]
        no_decay = [p for p in model.parameters() if p.ndim <= 1]
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.SGD(groups, lr=lr, momentum=self.momentum, nesterov=True, **_fused(model))
        total = max(1, epochs * steps_per_epoch)
        warmup = max(1, round(self.warmup_fraction * total))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(warmup, total))
        return Optimization(optimizer, scheduler, "step")

    def precision(self, device: torch.device) -> Precision:
        # FastNet autocasts inside its forward (so a DataParallel replica does too), to this same type.
        return precision_for(device)

    def autocast(self, device: torch.device):
        return contextlib.nullcontext()

    def augment(self, images, generator):
        if not self.flips:
            return images
        flip = torch.rand(images.shape[0], device=images.device, generator=generator) < 0.5
        return torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)

    def loss(self, output, target):
        return F.cross_entropy(output, target, label_smoothing=self.label_smoothing)

    def predict(self, model, images):
        logits = model(images)
        if self.flips:
            logits = (logits + model(images.flip(3))) / 2
        return logits


RECIPES: dict[str, Recipe] = {"classic": ClassicRecipe(), "fast": FastRecipe()}
