"""MNIST and Fashion-MNIST: the tutorial's classic CNN, and our fast recipe.

Both hold the whole dataset as one normalized float tensor on the training device, so a batch is an index
gather: no DataLoader workers, no per-sample transforms.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hpctrain.data import load_dataset
from hpctrain.recipes.base import Defaults, Optimization, Recipe, TensorData

# Mean and standard deviation of MNIST's training pixels, as the tutorial uses them (also for Fashion-MNIST).
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def load_tensors(dataset: str, data_dir: str, device: torch.device, train_limit: int | None) -> TensorData:
    raw = load_dataset(dataset, data_dir)
    train_images, train_labels = raw["train_images"], raw["train_labels"]
    if train_limit is not None:
        train_images, train_labels = train_images[:train_limit], train_labels[:train_limit]

    def normalize(images: torch.Tensor) -> torch.Tensor:
        # uint8 -> float on the device; [N, 28, 28] -> [N, 1, 28, 28], the layout conv layers expect.
        images = images.to(device).unsqueeze(1).float().div_(255)
        return images.sub_(MNIST_MEAN).div_(MNIST_STD)

    return TensorData(
        normalize(train_images),
        train_labels.to(device=device, dtype=torch.long),
        normalize(raw["test_images"]),
        raw["test_labels"].to(device=device, dtype=torch.long),
    )


class TutorialNet(nn.Module):
    """The CNN of the pytorch/examples MNIST tutorial: conv 32, conv 64, max-pool, dropout, fc 128, fc 10."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class ClassicRecipe(Recipe):
    """The tutorial exactly: Adadelta lr 1.0, StepLR(1, gamma 0.7), batch 64, test batch 1000, 14 epochs."""

    name = "classic"
    description = "pytorch/examples MNIST tutorial: its CNN, Adadelta, StepLR"
    defaults = Defaults(epochs=14, batch_size=64, lr=1.0, test_batch_size=1000)
    datasets = ("mnist", "fashion-mnist")

    def load_data(self, dataset, data_dir, device, train_limit):
        return load_tensors(dataset, data_dir, device, train_limit)

    def build_model(self) -> nn.Module:
        return TutorialNet()

    def build_optimization(self, model, lr, epochs, steps_per_epoch):
        optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)
        return Optimization(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7), "epoch")

    def loss(self, output, target):
        return F.nll_loss(output, target)


RECIPES: dict[str, Recipe] = {"classic": ClassicRecipe()}
