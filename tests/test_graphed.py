"""The CUDA-graph step's parts that run on a CPU (hpctrain.training.graphed): the learning rate as a tensor, the
warm-up that changes nothing, the capturable flag put back, and when a step is graphed at all. The capture and
replay themselves need a GPU: tests/test_gpu.py (marked gpu) runs them against the eager step and through a
stopped and resumed run."""

from __future__ import annotations

import copy

import pytest
import torch

from hpctrain.recipes.mnist import ClassicRecipe, FastRecipe, TutorialNet, warmup_linear_decay
from hpctrain.training.graphed import LearningRates, TrainingState, capturable, why_not_graphed
from hpctrain.training.workload import Optimization


def fast_optimization(steps: int = 30) -> tuple[torch.nn.Module, Optimization]:
    recipe = FastRecipe()
    torch.manual_seed(0)
    model = recipe.build_model()
    return model, recipe.build_optimization(model, 0.15, 1, steps)


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_learning_rate_tensors_follow_the_schedule_and_checkpoints_keep_floats():
    """Every step of the fast recipe's schedule, the tensor a captured step reads holds the scheduler's rate
    (float32 of it), the same tensor object throughout (a graph keeps its address), and the optimizer's
    state_dict (what checkpoints save) holds the floats it holds without graphs."""
    model, optimization = fast_optimization(steps=30)
    _, plain = fast_optimization(steps=30)
    rates = LearningRates(optimization.optimizer, torch.device("cpu"))
    tensors = list(rates.tensors)
    factor = warmup_linear_decay(6, 30)
    for step in range(35):
        with rates.installed():
            assert [g["lr"] for g in optimization.optimizer.param_groups] == tensors  # captured with these
        rates.sync()
        expected = torch.tensor(0.15 * factor(step), dtype=torch.float32)
        assert all(torch.equal(t, expected) for t in rates.tensors), (step, rates.tensors, expected)
        assert rates.tensors == tensors and all(a is b for a, b in zip(rates.tensors, tensors))
        state, reference = optimization.optimizer.state_dict(), plain.optimizer.state_dict()
        assert state["param_groups"] == reference["param_groups"]  # floats, not tensors
        optimization.scheduler.step()
        plain.scheduler.step()


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_learning_rate_tensor_is_filled_only_when_the_rate_changes():
    """The classic recipe's rate changes once an epoch: a step's sync then writes nothing."""
    recipe = ClassicRecipe()
    model = recipe.build_model()
    optimization = recipe.build_optimization(model, 1.0, 3, 10)
    rates = LearningRates(optimization.optimizer, torch.device("cpu"))
    rates.sync()
    rates.tensors[0].fill_(-1.0)  # a sync that wrote would overwrite this
    rates.sync()
    assert rates.tensors[0].item() == -1.0
    optimization.scheduler.step()  # the next epoch: 0.7
    rates.sync()
    assert rates.tensors[0].item() == pytest.approx(0.7)


@pytest.mark.parametrize("which", ["fast-sgd", "classic-adadelta", "adam"])
def test_warm_up_then_restore_trains_exactly_as_a_fresh_start(which):
    """A snapshot, two warm-up steps and a restore leave the model and optimizer so that the next steps are bitwise
    those of a model that never warmed up: state the warm-up created is zeroed, and zeros are the fresh state (SGD's
    momentum from zeros is its first step exactly)."""
    torch.manual_seed(1)
    if which == "fast-sgd":
        model, optimization = fast_optimization()
        optimizer = optimization.optimizer
    elif which == "classic-adadelta":
        model = TutorialNet().eval()  # no dropout: the CPU step is then a function of the weights alone
        optimizer = ClassicRecipe().build_optimization(model, 1.0, 1, 10).optimizer
    else:
        model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    twin_model, twin = copy.deepcopy((model, optimizer))  # one copy: the twin optimizer holds the twin's parameters
    shape = (16, 1, 28, 28) if which != "adam" else (16, 12)
    batches = [(torch.randn(shape), torch.randint(0, 3, (16,))) for _ in range(5)]

    def step(m, opt, images, labels):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(images).float(), labels).backward()
        opt.step()

    saved = TrainingState(model, optimizer, torch.device("cpu"))
    for images, labels in batches[:2]:  # the warm-up
        step(model, optimizer, images, labels)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin_model.state_dict().values()))
    saved.restore()
    for images, labels in batches[2:]:
        step(model, optimizer, images, labels)
        step(twin_model, twin, images, labels)
    for name, value in model.state_dict().items():
        assert torch.equal(value, twin_model.state_dict()[name]), name


def test_capturable_is_put_back_so_checkpoints_resume_anywhere():
    """Adadelta is captured with capturable=True; afterwards its groups say what they said before, so a checkpoint
    taken later loads into a CPU optimizer and steps there."""
    model = TutorialNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    if "capturable" not in optimizer.defaults:
        pytest.skip(f"torch {torch.__version__}'s Adadelta has no capturable flag (nor is it graphed there)")
    with capturable(optimizer):
        assert all(group["capturable"] for group in optimizer.param_groups)
    assert not any(group["capturable"] for group in optimizer.param_groups)
    fresh = torch.optim.Adadelta(TutorialNet().parameters(), lr=1.0)
    fresh.load_state_dict(optimizer.state_dict())
    assert fresh.state_dict()["param_groups"] == optimizer.state_dict()["param_groups"]


def test_which_steps_are_graphed():
    cuda = torch.device("cuda", 0)
    _, sgd = fast_optimization()
    fused = sgd.optimizer.defaults.get("fused")
    assert "cpu" in why_not_graphed(torch.device("cpu"), "single", sgd)
    assert "--strategy dp" in why_not_graphed(cuda, "dp", sgd)
    assert why_not_graphed(cuda, "single", sgd) == (None if fused else why_not_graphed(cuda, "single", sgd))
    plain = Optimization(torch.optim.SGD(TutorialNet().parameters(), lr=0.1, momentum=0.9), None, "step")
    assert "fused" in why_not_graphed(cuda, "single", plain)
    adadelta = ClassicRecipe().build_optimization(TutorialNet(), 1.0, 1, 10)
    has_flag = "capturable" in adadelta.optimizer.defaults  # torch >= 2.3
    assert (why_not_graphed(cuda, "single", adadelta) is None) == has_flag
    scaled = Optimization(adadelta.optimizer, adadelta.scheduler, "epoch", scaler=object())
    assert "scaler" in why_not_graphed(cuda, "single", scaled)
    rms = Optimization(torch.optim.RMSprop(TutorialNet().parameters()), None, "step")
    assert "RMSprop" in why_not_graphed(cuda, "single", rms)
    assert ClassicRecipe.graphs_step and FastRecipe.graphs_step
