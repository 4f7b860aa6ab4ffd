"""The training step and the evaluation forward as CUDA graphs: captured once, replayed from static buffers.

A small model's step on a GPU is launch-bound: the MNIST recipes' forward, backward and optimizer step are a few
dozen tiny kernels, and Python takes longer to launch them than the GPU to run them. Captured in a CUDA graph,
the whole step is one launch. Recipes ask for it (`Recipe.graphs_step`); `why_not_graphed` says whether it can work
here (a CUDA device, one process without DataParallel, no gradient scaler, an optimizer whose step can be
captured) and the rest of the loop is unchanged:

- **Static buffers.** Each batch is copied into a fixed input and target tensor; a batch of another shape (an
  epoch's short last batch) takes the eager step, which computes the same function.
- **Warm-up that changes nothing.** Capture needs the optimizer's state to exist and cuDNN's kernels chosen, so the
  step runs twice on a side stream first; the parameters, buffers, optimizer state and CUDA random state are put
  back afterwards (state the warm-up created is zeroed: the optimizers allowed here start from zeros, and SGD's
  momentum from zeros is bitwise its first step). A resumed run therefore trains exactly what the uninterrupted
  one trains after the same checkpoint.
- **The learning rate as a tensor.** Each parameter group's rate is a one-element tensor on the device while the
  graph is captured; before each replay the schedule's current rate (the float the scheduler keeps in the group,
  as on the CPU) is written into it when it changed. Checkpoints therefore hold floats, as they always did.
- **Capturable optimizers.** Adadelta and Adam(W) are captured with ``capturable=True`` (their step counters on the
  device), then the flag is put back, so a checkpoint resumes anywhere; SGD only in its fused form, which takes
  the rate as a tensor.

Dropout draws from the default CUDA generator, whose graph-safe offsets advance with each replay (so the random
state a checkpoint saves is where the replays left off, and a resumed run's replays continue from it). The
evaluation forward is captured the same way (`EvalGraph`), in eval mode, for batches of the test batch size.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
from torch import nn

from hpctrain.training.workload import Optimization, Recipe

WARMUP_STEPS = 2
CAPTURABLE = (torch.optim.Adadelta, torch.optim.Adam, torch.optim.AdamW)  # zero-initialized state, capturable=True


def why_not_graphed(device: torch.device, strategy: str, optimization: Optimization) -> str | None:
    """None when the training step can be captured here, else why not (said once at start-up)."""
    if device.type != "cuda":
        return f"training runs on {device.type}"
    if strategy != "single":
        return f"--strategy {strategy}: the step is captured in one process on one GPU only"
    if optimization.scaler is not None:
        return "float16 with a gradient scaler (its skipped steps are decided on the host)"
    optimizer = optimization.optimizer
    if isinstance(optimizer, torch.optim.SGD):
        return None if optimizer.defaults.get("fused") else "SGD without fused=True cannot take its rate as a tensor"
    if type(optimizer) in CAPTURABLE:
        if "capturable" not in optimizer.defaults:
            return f"this torch's {type(optimizer).__name__} has no capturable=True"
        return None
    return f"{type(optimizer).__name__} is not one of the optimizers captured here (fused SGD, Adadelta, Adam, AdamW)"


class LearningRates:
    """Each parameter group's learning rate mirrored in a one-element float32 tensor on `device`, the rate a
    captured optimizer step reads. `sync()` writes the groups' current (float) rates into the tensors, launching
    a fill only for a rate that changed; `installed()` puts the tensors into the groups for a capture."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.tensors = [torch.zeros((), dtype=torch.float32, device=device) for _ in optimizer.param_groups]
        self.values: list[float | None] = [None] * len(self.tensors)

    def sync(self) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            value = float(group["lr"])
            if value != self.values[i]:
                self.tensors[i].fill_(value)
                self.values[i] = value

    @contextlib.contextmanager
    def installed(self):
        self.sync()
        floats = [group["lr"] for group in self.optimizer.param_groups]
        for group, tensor in zip(self.optimizer.param_groups, self.tensors):
            group["lr"] = tensor
        try:
            yield
        finally:
            for group, value in zip(self.optimizer.param_groups, floats):
                group["lr"] = value


@contextlib.contextmanager
def capturable(optimizer: torch.optim.Optimizer):
    """The optimizer with capturable=True where it has the flag (its step counters moved to the device), restored
    afterwards: a checkpoint then records the flag it had, and resumes on any device."""
    groups = [group for group in optimizer.param_groups if "capturable" in group]
    before = [group["capturable"] for group in groups]
    for group in groups:
        group["capturable"] = True
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            step = state.get("step")
            if torch.is_tensor(step) and step.device != param.device:
                state["step"] = step.to(device=param.device, dtype=torch.float32)
    try:
        yield
    finally:
        for group, flag in zip(groups, before):
            group["capturable"] = flag


class TrainingState:
    """A copy of what a training step changes (parameters, buffers, optimizer state, CUDA random state), to put
    back after the warm-up. State the optimizer did not have yet is put back as zeros."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.tensors = [t.detach().clone() for t in self._model_tensors()]
        self.state = {
            param: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state.items()}
            for param, state in optimizer.state.items()
        }
        self.rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def _model_tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers()]

    @torch.no_grad()
    def restore(self) -> None:
        for live, saved in zip(self._model_tensors(), self.tensors):
            live.copy_(saved)
        for param, state in self.optimizer.state.items():
            saved = self.state.get(param, {})
            for key, value in state.items():
                if torch.is_tensor(value):
                    if key in saved:
                        value.copy_(saved[key])  # in place: a captured step keeps reading this memory
                    else:
                        value.zero_()
                elif key in saved:
                    state[key] = saved[key]
        if self.rng is not None:
            torch.cuda.set_rng_state(self.rng, self.device)


class StepGraph:
    """forward, loss, backward and optimizer step for batches of one shape, captured on first use and replayed.

    `step(images, labels)` returns the loss tensor (the graph's static output: read it, or add it up, before the
    next step), or None when the batch's shape is not the captured one (the caller then steps eagerly). Only a
    batch of `batch` samples is captured: an attempt resumed at an epoch's short last batch captures the next."""

    def __init__(
        self,
        model: nn.Module,
        optimization: Optimization,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        autocast: Callable[[], contextlib.AbstractContextManager],
        device: torch.device,
        batch: int,
    ) -> None:
        self.batch = batch
        self.model, self.optimizer, self.loss_fn, self.autocast, self.device = (
            model,
            optimization.optimizer,
            loss,
            autocast,
            device,
        )
        self.rates = LearningRates(self.optimizer, device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.images: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.loss: torch.Tensor | None = None

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        if self.graph is None:
            if len(labels) != self.batch:
                return None
            self._capture(images, labels)
        assert self.images is not None and self.labels is not None and self.graph is not None
        if images.shape != self.images.shape or labels.shape != self.labels.shape or images.dtype != self.images.dtype:
            return None
        self.images.copy_(images)
        self.labels.copy_(labels)
        self.rates.sync()
        self.graph.replay()
        return self.loss

    def _one_step(self) -> torch.Tensor:
        with self.autocast():
            loss = self.loss_fn(self.model(self.images), self.labels)
        loss.backward()
        self.optimizer.step()
        return loss

    def _capture(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images.clone(), labels.clone()
        saved = TrainingState(self.model, self.optimizer, self.device)
        with capturable(self.optimizer), self.rates.installed():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self.optimizer.zero_grad(set_to_none=True)
                    self._one_step()
            torch.cuda.current_stream(self.device).wait_stream(side)
            saved.restore()
            self.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the static gradients
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.loss = self._one_step()
        if saved.rng is not None:  # capturing draws nothing, but the replays must start from the saved offset
            torch.cuda.set_rng_state(saved.rng, self.device)


class EvalGraph:
    """The evaluation forward (`predict(model, images)`, in eval mode, no gradients) for batches of one shape,
    captured on first use; `__call__` returns the logits (static: use them before the next call), or None for
    a batch of another shape."""

    def __init__(self, predict: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> None:
        self.predict, self.device = predict, device
        self.graph: torch.cuda.CUDAGraph | None = None
        self.images: torch.Tensor | None = None
        self.output: torch.Tensor | None = None

    def __call__(self, images: torch.Tensor) -> torch.Tensor | None:
        if self.graph is None:
            self.images = images.clone()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.predict(self.images)  # warm-up: eval mode changes no state
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.output = self.predict(self.images)
        assert self.images is not None
        if images.shape != self.images.shape or images.dtype != self.images.dtype:
            return None
        self.images.copy_(images)
        self.graph.replay()
        return self.output


def build_graphs(
    recipe: Recipe,
    model: nn.Module,
    optimization: Optimization,
    device: torch.device,
    strategy: str,
    batch: int,
    say: Callable[[str], None],
) -> tuple[StepGraph | None, EvalGraph | None]:
    """The step and evaluation graphs when `recipe` asks for them (`graphs_step`) and they can work here, each
    said in one line on a CUDA device; (None, None) otherwise. HPCTRAIN_CUDA_GRAPHS=0 turns them off (to measure
    the eager step against them)."""
    if not recipe.graphs_step or device.type != "cuda":
        return None, None
    why = why_not_graphed(device, strategy, optimization)
    if why is None and os.environ.get("HPCTRAIN_CUDA_GRAPHS", "1") == "0":
        why = "HPCTRAIN_CUDA_GRAPHS=0"
    if why is not None:
        say(f"the training step runs eagerly, not as a CUDA graph: {why}")
        return None, None
    say("the training step (forward, backward, optimizer) and the evaluation forward are replayed as CUDA graphs")

    def autocast() -> contextlib.AbstractContextManager:
        return recipe.autocast(device)

    def predict(images: torch.Tensor) -> torch.Tensor:
        with autocast():
            return recipe.predict(model, images)

    return StepGraph(model, optimization, recipe.loss, autocast, device, batch), EvalGraph(predict, device)
