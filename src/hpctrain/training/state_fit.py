"""A checkpoint's optimizer and learning-rate scheduler state, matched against the model and the optimization this
run builds, before the first step.

A checkpoint passes its checksum when it is the file that was written, not when what it holds fits this run: torch's
`load_state_dict` takes an optimizer's state as it comes, and what does not fit fails later, in the middle of a step:
a momentum buffer of another shape, or a view that declares 10^6 x 10^6 elements over one (an expanded tensor), ends
the process with SIGSEGV in the optimizer's kernels; a learning rate of 'fast' or a scheduler's step size of 0 is a
traceback at the first step. So each is matched here against what this run's own optimizer and scheduler are (built
on the meta device by `hpctrain.training.resume`: nothing allocated), and the first problem is named:

- the optimizer's groups: as many as this run's, each with as many parameters, every setting of the kind this run's
  optimizer holds (a finite number where it holds a number; a flag where a flag, and the same one unless it only
  chooses how the step is computed; a flag missing from an older torch's checkpoint is torch's to fill in);
- each parameter's state: a step count as a finite number or a 0-dimensional real tensor, anything else a tensor of
  the parameter's shape and dtype, dense (no overlapping elements, no expanded view) and backed by its storage;
- the scheduler's state: every entry of the kind this run's scheduler holds (lists of the same length), none that
  would replace one of the scheduler's own attributes, and a learning rate it can compute and that is finite.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch

from hpctrain.errors import brief
from hpctrain.training.workload import Optimization

INT64_MAX = (1 << 63) - 1  # torch keeps counters as int64: beyond it, a number is no counter
IMPLEMENTATION_FLAGS = ("foreach", "fused")
"""An optimizer's flags that choose how its step is computed, not what it computes: a checkpoint may differ."""
SCALAR_STATE = ("step", "eta", "mu")
"""The entries of a parameter's optimizer state that torch's optimizers keep as one number (a step count, ASGD's
rates); every other entry is a tensor of the parameter's shape."""


def optimization_problem(state: dict[str, Any], optimization: Optimization) -> tuple[str, str] | None:
    """(field, what is wrong) for the first part of the checkpoint `state` that does not fit the `optimization`
    this run builds for its model (its groups hold the model's parameters, in the order the checkpoint's ids name
    them; its scheduler is loaded to try it: build one for this check alone); None when it fits."""
    if problem := optimizer_problem(state.get("optimizer"), optimization.optimizer):
        return "optimizer state", problem
    if problem := scheduler_problem(state.get("scheduler"), optimization.scheduler):
        return "scheduler state", problem
    return None


def optimizer_problem(saved: Any, optimizer: torch.optim.Optimizer) -> str | None:
    """What in the optimizer state `saved` does not fit `optimizer` (its groups and parameters); None if it fits."""
    if not (
        isinstance(saved, dict) and isinstance(saved.get("state"), dict) and isinstance(saved.get("param_groups"), list)
    ):
        return f"is {brief(saved, 60)}, not an optimizer's state (its 'state' and 'param_groups')"
    groups, theirs = optimizer.param_groups, saved["param_groups"]
    if len(theirs) != len(groups):
        return f"has {len(theirs)} parameter group(s), this run's optimizer {len(groups)}"
    by_id: dict[int, torch.Tensor] = {}
    for index, (mine, group) in enumerate(zip(groups, theirs)):
        where = f"param_groups[{index}]"
        if not isinstance(group, dict):
            return f"{where} is {brief(group, 40)}, not a parameter group"
        ids = group.get("params")
        if not isinstance(ids, list) or any(type(i) is not int for i in ids):
            return f"{where}.params is {brief(ids, 40)}, not a list of parameter numbers"
        if len(ids) != len(mine["params"]):
            return f"{where} holds {len(ids)} parameters, this run's model {len(mine['params'])}"
        for number, parameter in zip(ids, mine["params"]):
            if number in by_id:
                return f"{where} names parameter {number} twice"
            by_id[number] = parameter
        for key, fresh in mine.items():
            if key == "params":
                continue
            if key not in group:
                if fresh is None or isinstance(fresh, bool):
                    continue  # a flag newer than the checkpoint: the optimizer's __setstate__ gives its default
                return f"{where} has no {key!r}"
            if problem := kind_problem(group[key], fresh):
                return f"{where}.{key} {problem}"
            if isinstance(fresh, bool) and key not in IMPLEMENTATION_FLAGS and group[key] != fresh:
                return f"{where}.{key} is {group[key]}, this run's optimizer {fresh} (another algorithm)"
    for number, entry in saved["state"].items():
        if number not in by_id:
            return f"holds state for parameter {brief(number, 20)}, which no group has"
        if not isinstance(entry, dict):
            return f"state[{number}] is {brief(entry, 40)}, not a parameter's state"
        for name, value in entry.items():
            if problem := _state_problem(name, value, by_id[number]):
                return f"state[{number}].{name if isinstance(name, str) else brief(name, 40)} {problem}"
    return None


def scheduler_problem(saved: Any, scheduler: Any) -> str | None:
    """What in the scheduler state `saved` does not fit `scheduler` (of this run's kind, over this run's optimizer),
    or keeps it from computing a finite learning rate; None if it fits. `scheduler` is loaded with `saved` to try."""
    if not isinstance(saved, dict) or any(type(key) is not str for key in saved):
        return f"is {brief(saved, 60)}, not a learning-rate scheduler's state"
    fresh = scheduler.state_dict()
    for key, value in saved.items():
        if key in fresh:
            if problem := kind_problem(value, fresh[key]):
                return f"{key} {problem}"
        elif hasattr(scheduler, key) or key.startswith("__"):
            return f"holds {key!r}, which would replace the scheduler's own {key!r}: not a state this run's takes"
    try:
        scheduler.load_state_dict(copy.deepcopy(saved))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "call get_lr() within step()": it is, in effect, what step() does
            rates = scheduler.get_lr()
    except Exception as err:  # any failure of the scheduler's arithmetic on these values
        return f"gives no learning rate ({type(err).__name__}: {brief(str(err), 80)})"
    if not all(isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate) for rate in rates):
        return f"gives the learning rates {brief(rates, 60)}, not finite numbers"
    return None


def kind_problem(value: Any, fresh: Any) -> str | None:
    """Why `value` (from a checkpoint) is not of the kind of `fresh` (what this run's own object holds there); None
    if it is: a flag (or None) for a flag, a finite number for a number (a whole one for a whole one, within int64),
    text for text, a sequence of the same length item by item, a mapping key by key, a finite tensor of as many
    elements for a tensor."""
    if fresh is None or isinstance(fresh, bool):
        return None if value is None or isinstance(value, bool) else f"is {brief(value, 40)}, not true, false or None"
    if isinstance(fresh, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is {brief(value, 40)}, not a number"
        if isinstance(fresh, int) and not isinstance(value, int):
            return f"is {brief(value, 40)}, not a whole number"
        if isinstance(value, int):
            return None if abs(value) <= INT64_MAX else f"is {brief(value, 40)}, beyond any count"
        return None if math.isfinite(value) else f"is {value}, not a finite number"
    if isinstance(fresh, str):
        return None if isinstance(value, str) else f"is {brief(value, 40)}, not text"
    if isinstance(fresh, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(fresh):
            return f"is {brief(value, 40)}, not {len(fresh)} value(s)"
        for index, (item, own) in enumerate(zip(value, fresh)):
            if problem := kind_problem(item, own):
                return f"item {index} {problem}"
        return None
    if isinstance(fresh, dict):
        if not isinstance(value, dict):
            return f"is {brief(value, 40)}, not a mapping"
        for key in fresh.keys() & value.keys():
            if problem := kind_problem(value[key], fresh[key]):
                return f"[{brief(key, 20)}] {problem}"
        return None
    if isinstance(fresh, torch.Tensor):
        if not isinstance(value, torch.Tensor) or value.numel() != fresh.numel():
            return f"is {brief(value, 40)}, not a tensor of {fresh.numel()} element(s)"
        return _scalar_problem(value) if value.numel() == 1 else _layout_problem(value)
    return None if isinstance(value, type(fresh)) else f"is {brief(value, 40)}, not a {type(fresh).__name__}"


def _state_problem(name: Any, value: Any, parameter: torch.Tensor) -> str | None:
    """One entry of a parameter's optimizer state: a step count (SCALAR_STATE) as a finite number or a 0-dimensional
    real tensor, else a tensor that can stand beside `parameter` in the optimizer's kernels (not None: a buffer "not
    made yet" beside made ones fails SGD's fused kernel)."""
    if name in SCALAR_STATE:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return None if math.isfinite(value) and abs(value) <= INT64_MAX else f"is {value}, not a finite number"
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            return f"is {brief(value, 40)}, not a number"
        return _scalar_problem(value)
    if not isinstance(value, torch.Tensor):
        return f"is {brief(value, 40)}, not a tensor"
    if tuple(value.shape) != tuple(parameter.shape):
        return f"has the shape {tuple(value.shape)}, its parameter {tuple(parameter.shape)}"
    if value.dtype != parameter.dtype:
        return f"is of {value.dtype}, its parameter of {parameter.dtype}"
    return _layout_problem(value)


def _scalar_problem(value: torch.Tensor) -> str | None:
    if (problem := _layout_problem(value)) is not None:
        return problem
    if value.dtype.is_complex or value.dtype == torch.bool:
        return f"is a tensor of {value.dtype}, not a real number"
    return None if bool(torch.isfinite(value).all()) else f"is {value.tolist()}, not finite"


def _layout_problem(value: torch.Tensor) -> str | None:
    """A plain dense tensor, wholly backed by its storage; else what it is."""
    if value.layout != torch.strided or value.is_quantized or value.device.type == "meta":
        return f"is a {value.layout} {value.device.type} tensor, not a plain one"
    if value.numel() == 0:
        return None
    extent = value.storage_offset() + sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
    if (extent + 1) * value.element_size() > value.untyped_storage().nbytes():
        return f"declares {value.numel()} elements over a storage of {value.untyped_storage().nbytes()} bytes"
    expected = 1
    for stride, size in sorted((stride, size) for size, stride in zip(value.shape, value.stride()) if size != 1):
        if stride != expected:
            return f"overlaps itself (strides {tuple(value.stride())} for the shape {tuple(value.shape)}: a view)"
        expected *= size
    return None
