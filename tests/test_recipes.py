"""MNIST recipes: data tensors, the classic model's exact architecture and function, the fast recipe's pieces,
and short real trainings on Fashion-MNIST (accuracy far above chance; no timings)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hpctrain.errors import UserError
from hpctrain.recipes import get_recipe
from hpctrain.recipes.base import Optimization, TensorData, keep_freed_memory
from hpctrain.recipes.mnist import (
    RECIPES,
    BitDropout,
    ClassicRecipe,
    FastNet,
    FastRecipe,
    warmup_linear_decay,
)

CPU = torch.device("cpu")


class ReferenceTutorialNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, written out as the tutorial has it (ReLU before the pool,
    nn.Dropout), to check that our cheaper TutorialNet computes the same function."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


@pytest.fixture(scope="module")
def fashion_classic(fashion_data_dir) -> TensorData:
    return get_recipe("mnist", "classic").load_data("fashion-mnist", str(fashion_data_dir), CPU, 1280)


def train(recipe, data: TensorData, epochs: int, batch_size: int, lr: float, seed: int = 0) -> nn.Module:
    """A minimal copy of the training loop's contract with a recipe (index gathers, per-step generator)."""
    torch.manual_seed(seed)
    model = recipe.build_model()
    n = len(data.train_labels)
    steps = math.ceil(n / batch_size)
    opt = recipe.build_optimization(model, lr, epochs, steps)
    generator = torch.Generator()
    order_rng = torch.Generator().manual_seed(seed)
    model.train()
    for epoch in range(epochs):
        order = torch.randperm(n, generator=order_rng)
        for step in range(steps):
            idx = order[step * batch_size : (step + 1) * batch_size]
            generator.manual_seed(seed * 1_000_003 + epoch * 10_007 + step)
            images = recipe.augment(data.train_images[idx], generator)
            loss = recipe.loss(model(images), data.train_labels[idx])
            opt.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            opt.optimizer.step()
            if opt.scheduler_interval == "step":
                opt.scheduler.step()
        if opt.scheduler_interval == "epoch":
            opt.scheduler.step()
    return model


@torch.inference_mode()
def accuracy(recipe, model: nn.Module, data: TensorData, limit: int = 2000) -> float:
    model.eval()
    logits = recipe.predict(model, data.test_images[:limit])
    return (logits.argmax(1) == data.test_labels[:limit]).float().mean().item()


# ------------------------------------------------------------------------------------------------ registry, data


def test_registry_has_both_recipes_and_rejects_unknown_names():
    assert set(RECIPES) == {"classic", "fast"}
    assert isinstance(get_recipe("mnist", "classic"), ClassicRecipe)
    assert isinstance(get_recipe("mnist", "fast"), FastRecipe)
    with pytest.raises(UserError, match="classic"):
        get_recipe("mnist", "tutorial")
    for recipe in RECIPES.values():
        assert set(recipe.datasets) == {"mnist", "fashion-mnist"}


@pytest.mark.parametrize("variant", ["classic", "fast"])
def test_load_data_shapes_dtypes_and_train_limit(variant, fashion_data_dir):
    data = get_recipe("mnist", variant).load_data("fashion-mnist", str(fashion_data_dir), CPU, 1234)
    assert data.train_images.shape == (1234, 1, 28, 28) and data.train_images.dtype == torch.float32
    assert data.train_labels.shape == (1234,) and data.train_labels.dtype == torch.int64
    assert data.test_images.shape == (10_000, 1, 28, 28) and data.test_labels.shape == (10_000,)
    assert set(data.test_labels.unique().tolist()) == set(range(10))
    if variant == "fast":  # normalized with Fashion-MNIST's own statistics
        assert abs(data.test_images.mean().item()) < 0.05 and abs(data.test_images.std().item() - 1) < 0.05


def test_classic_normalization_is_the_tutorials(fashion_classic, fashion_data_dir):
    from hpctrain.data import load_dataset

    raw = load_dataset("fashion-mnist", fashion_data_dir)["train_images"][:3]
    expected = (raw.float() / 255 - 0.1307) / 0.3081  # ToTensor + Normalize((0.1307,), (0.3081,))
    torch.testing.assert_close(fashion_classic.train_images[:3, 0], expected)


def test_keep_freed_memory_applies_on_glibc():
    import platform

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_memory() is glibc  # mallopt accepted both settings (or, elsewhere, nothing was tried)
    assert keep_freed_memory() is glibc  # cached: a second call does nothing new


# ------------------------------------------------------------------------------------------------ classic


def test_classic_architecture_is_the_tutorials():
    model = ClassicRecipe().build_model()
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "conv1.weight": (32, 1, 3, 3),
        "conv1.bias": (32,),
        "conv2.weight": (64, 32, 3, 3),
        "conv2.bias": (64,),
        "fc1.weight": (128, 9216),
        "fc1.bias": (128,),
        "fc2.weight": (10, 128),
        "fc2.bias": (10,),
    }
    assert (model.conv1.stride, model.conv1.padding, model.conv2.stride, model.conv2.padding) == (
        (1, 1),
        (0, 0),
        (1, 1),
        (0, 0),
    )
    assert (model.dropout1.p, model.dropout2.p) == (0.25, 0.5)
    # The tutorial's checkpoints load as they are (same state_dict keys and shapes).
    model.load_state_dict(ReferenceTutorialNet().state_dict())


def test_classic_hyperparameters_are_the_tutorials():
    recipe = ClassicRecipe()
    d = recipe.defaults
    assert (d.epochs, d.batch_size, d.lr, d.test_batch_size) == (14, 64, 1.0, 1000)
    model = recipe.build_model()
    opt = recipe.build_optimization(model, d.lr, d.epochs, 938)
    assert isinstance(opt, Optimization) and opt.scheduler_interval == "epoch"
    assert type(opt.optimizer) is torch.optim.Adadelta
    group = opt.optimizer.param_groups[0]
    assert (group["lr"], group["rho"], group["eps"], group["weight_decay"]) == (1.0, 0.9, 1e-6, 0)
    assert isinstance(opt.scheduler, torch.optim.lr_scheduler.StepLR)
    assert (opt.scheduler.step_size, opt.scheduler.gamma) == (1, 0.7)
    for _ in range(2):
        opt.optimizer.step()
        opt.scheduler.step()
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.49)


def test_classic_computes_the_tutorials_function_and_gradients():
    torch.manual_seed(0)
    reference = ReferenceTutorialNet().eval()
    ours = ClassicRecipe().build_model().eval()  # channels_last weights, pool-then-ReLU, BitDropout
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(16, 1, 28, 28)
    target = torch.randint(0, 10, (16,))
    out_ref, out = reference(x), ours(x)
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    F.nll_loss(out_ref, target).backward()
    F.nll_loss(out, target).backward()
    for (name, p_ref), p in zip(reference.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-3, atol=1e-6, msg=name)


def test_classic_model_is_channels_last_and_outputs_log_probabilities():
    model = ClassicRecipe().build_model()
    assert model.conv2.weight.is_contiguous(memory_format=torch.channels_last)
    out = model.eval()(torch.randn(5, 1, 28, 28))
    assert out.shape == (5, 10)
    torch.testing.assert_close(out.exp().sum(1), torch.ones(5))


@pytest.mark.parametrize("p", [0.5, 0.25, 0.125])
def test_bit_dropout_drops_with_probability_p_and_rescales(p):
    torch.manual_seed(1)
    layer = BitDropout(p).train()
    x = torch.ones(400, 1001)  # not a multiple of 8 elements per row
    y = layer(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 0.005  # 400k Bernoulli draws: std ~ 0.0007
    values = y.unique()
    assert len(values) == 2 and values[0] == 0 and values[1].item() == pytest.approx(1 / (1 - p))
    # Rows are not copies of each other (each element has its own bits).
    assert not torch.equal(y[0], y[1])
    assert torch.equal(layer.eval()(x), x)


def test_bit_dropout_refuses_other_probabilities():
    with pytest.raises(ValueError, match="2\\*\\*-k"):
        BitDropout(0.3)


def test_bit_dropout_gradient_follows_the_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 300, requires_grad=True)
    y = BitDropout(0.5).train()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 2)


def test_classic_recipe_learns_a_few_thousand_images(fashion_classic):
    recipe = ClassicRecipe()
    model = train(recipe, fashion_classic, epochs=1, batch_size=64, lr=1.0)  # 20 steps
    assert accuracy(recipe, model, fashion_classic, limit=1000) > 0.5  # chance: 0.1


# ------------------------------------------------------------------------------------------------ fast


def test_fast_model_shapes_and_float32_logits():
    model = FastRecipe().build_model()
    logits = model(torch.randn(7, 1, 28, 28))
    assert logits.shape == (7, 10) and logits.dtype == torch.float32
    assert model.features[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert FastNet((8, 8, 8))(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_fast_recipe_trains_on_plain_images_by_default():
    recipe = FastRecipe()
    images = torch.randn(8, 1, 28, 28)
    assert torch.equal(recipe.augment(images, torch.Generator().manual_seed(0)), images)


def test_fast_augment_is_deterministic_for_a_generator_and_only_flips():
    recipe = FastRecipe(flips=True)
    images = torch.randn(64, 1, 28, 28)
    a = recipe.augment(images, torch.Generator().manual_seed(5))
    b = recipe.augment(images, torch.Generator().manual_seed(5))
    c = recipe.augment(images, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    flipped = [not torch.equal(a[i], images[i]) for i in range(64)]
    assert 10 < sum(flipped) < 54  # about half
    for i in range(64):
        assert torch.equal(a[i], images[i].flip(2) if flipped[i] else images[i])
    # the global generator is not touched: the loop's resume guarantee relies on it
    state = torch.get_rng_state()
    recipe.augment(images, torch.Generator().manual_seed(7))
    assert torch.equal(state, torch.get_rng_state())


@pytest.fixture(scope="module")
def mnist_layout_dir(fashion_data_dir, tmp_path_factory):
    """A data dir laid out for --dataset mnist. MNIST itself cannot be downloaded here, so its files are
    Fashion-MNIST's (the same IDX format and sizes): enough to exercise the MNIST code path."""
    root = tmp_path_factory.mktemp("mnist-layout")
    (root / "mnist").mkdir()
    for path in (fashion_data_dir / "fashion-mnist").iterdir():
        (root / "mnist" / path.name).symlink_to(path)
    return root


def test_fast_recipe_mirrors_clothes_but_not_digits(fashion_data_dir, mnist_layout_dir):
    images = torch.randn(8, 1, 28, 28)
    recipe = FastRecipe(flips=True)
    recipe.load_data("fashion-mnist", str(fashion_data_dir), CPU, 10)
    assert not torch.equal(recipe.augment(images, torch.Generator().manual_seed(0)), images)
    data = recipe.load_data("mnist", str(mnist_layout_dir), CPU, 10)
    assert torch.equal(recipe.augment(images, torch.Generator().manual_seed(0)), images)
    model = recipe.build_model().eval()
    torch.testing.assert_close(recipe.predict(model, images), model(images))
    # MNIST's statistics: the same pixels normalize differently than under fashion-mnist
    expected = (data.train_images[0, 0] * 0.3081 + 0.1307) * 255
    assert torch.allclose(expected, expected.round(), atol=1e-3)


@pytest.mark.parametrize("variant", ["classic", "fast"])
def test_recipes_load_the_mnist_layout(variant, mnist_layout_dir):
    data = get_recipe("mnist", variant).load_data("mnist", str(mnist_layout_dir), CPU, 50)
    assert data.train_images.shape == (50, 1, 28, 28) and len(data.test_labels) == 10_000


def test_fast_predict_averages_the_mirrored_view():
    recipe = FastRecipe(flips=True)
    torch.manual_seed(0)
    model = recipe.build_model().eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.inference_mode():
        torch.testing.assert_close(recipe.predict(model, x), (model(x) + model(x.flip(3))) / 2)


def test_warmup_then_linear_decay_for_any_length():
    f = warmup_linear_decay(10, 100)
    assert f(0) == pytest.approx(0.1) and f(10) == pytest.approx(1.0)
    assert f(5) == pytest.approx(0.55) and f(55) == pytest.approx(1 - 0.99 * 0.5)
    assert f(100) == pytest.approx(0.01) and f(1000) == pytest.approx(0.01)
    values = [f(s) for s in range(101)]
    assert values[:11] == sorted(values[:11]) and values[10:] == sorted(values[10:], reverse=True)
    tiny = warmup_linear_decay(1, 1)  # --train-limit smaller than one batch, one epoch
    assert [tiny(0), tiny(1), tiny(2)] == pytest.approx([0.1, 0.01, 0.01])


def test_fast_optimization_spares_norms_and_biases_from_weight_decay():
    recipe = FastRecipe()
    model = recipe.build_model()
    opt = recipe.build_optimization(model, 0.2, 2, 10)
    assert opt.scheduler_interval == "step"
    decayed, spared = opt.optimizer.param_groups
    assert all(p.ndim > 1 for p in decayed["params"]) and decayed["weight_decay"] > 0
    assert all(p.ndim == 1 for p in spared["params"]) and spared["weight_decay"] == 0
    assert len(decayed["params"]) + len(spared["params"]) == len(list(model.parameters()))
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.02)  # warmup starts at 10%
    # state round-trips through a weights_only load, as a checkpoint does
    import io

    buf = io.BytesIO()
    torch.save({"optimizer": opt.optimizer.state_dict(), "scheduler": opt.scheduler.state_dict()}, buf)
    buf.seek(0)
    torch.load(buf, weights_only=True)


def test_fast_recipe_learns_a_few_thousand_images(fashion_data_dir):
    recipe = FastRecipe()
    data = recipe.load_data("fashion-mnist", str(fashion_data_dir), CPU, 4000)
    model = train(recipe, data, epochs=2, batch_size=recipe.defaults.batch_size, lr=recipe.defaults.lr)
    assert accuracy(recipe, model, data) > 0.7  # chance: 0.1


def test_fast_recipe_trains_on_fewer_images_than_one_batch(fashion_data_dir):
    recipe = FastRecipe()
    data = recipe.load_data("fashion-mnist", str(fashion_data_dir), CPU, 100)
    model = train(recipe, data, epochs=1, batch_size=256, lr=0.2)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_cudnn_benchmark_is_the_recipes_choice_and_only_on_cuda() -> None:
    """ImageNet's convolutional recipes time cuDNN's algorithms (a few fixed input shapes); MNIST's does not; and
    never off CUDA. What runs here: the decision; the flag's effect needs a GPU."""
    from hpctrain.training.setup import cudnn_benchmark

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    for recipe in ("fast", "classic"):
        assert cudnn_benchmark(get_recipe("imagenet", recipe), cuda) is True
        assert cudnn_benchmark(get_recipe("imagenet", recipe), cpu) is False
    for recipe in ("fast", "classic"):
        assert cudnn_benchmark(get_recipe("mnist", recipe), cuda) is False
