"""The ranks' health as lines of text, for `hpctrain top` and `hpctrain status`: each rank's live record, images/s
per node, the slowest rank and what it waits on, any straggler, how a hung attempt ended, and an elastic run's node
count beside the one asked for with each membership change (from its record of attempts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.health.hang import MAX_REPORT_BYTES, report_path
from hpctrain.health.progress import RankProgress
from hpctrain.health.stragglers import find_stragglers
from hpctrain.readback import BadRunFile, read_json, read_text
from hpctrain.stops import MAX_PROVENANCE_BYTES, PROVENANCE_FILE

__all__ = ["elastic_lines", "hang_lines", "node_count", "rank_lines", "read_attempts"]


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    """The attempts recorded in RUN/provenance.json (hpctrain.training.provenance), oldest first, each a mapping;
    [] when there is no valid record."""
    try:
        record = read_json(run_dir / PROVENANCE_FILE, MAX_PROVENANCE_BYTES, within=run_dir)
    except (OSError, BadRunFile):
        return []
    attempts = record.get("attempts") if isinstance(record, dict) else None
    return [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []


def node_count(current: object, requested: str) -> str:
    """An elastic job's node count now beside the range asked for: "1 of 1:2"."""
    return f"{current} of {requested}"


def elastic_lines(run_dir: Path) -> list[str]:
    """For `status JOB`: an elastic run's node count now beside the one asked for ("1 of 1:2"), and each membership
    change as one line, from the attempt record."""
    attempts = read_attempts(run_dir)
    if not attempts or not isinstance(attempts[-1].get("requested_nodes"), str):
        return []
    last = attempts[-1]
    count = node_count(last.get("nodes", "?"), last["requested_nodes"])
    lines = [f"{'nodes:':12} {count} (elastic; the run's last group)"]
    changes = [a["membership_change"] for a in attempts if isinstance(a.get("membership_change"), str)]
    return lines + [f"{'membership:':12} {change}" for change in changes]


def rank_lines(records: list[RankProgress], now: float) -> list[str]:
    """The ranks' live progress records (hpctrain.health): a line per rank, images/s per node, the slowest rank and
    what it waits on, and any straggler."""
    if not records:
        return []
    width = max(4, *(len(r.host) for r in records))
    lines = [
        f"{'RANK':>4s} {'HOST':{width}s} {'PHASE':13s} {'EPOCH':>5s} {'STEP':>7s} {'STEP ms':>8s} "
        f"{'INPUT ms':>8s} {'FWD ms':>7s} {'IMG/S':>8s} {'AGE':>5s}"
    ]
    for r in records:
        ms = [f"{v * 1000:.1f}" if v is not None else "-" for v in (r.step_s, r.data_s, r.compute_s)]
        rate = f"{r.images_per_s:,.0f}" if r.images_per_s is not None else "-"
        lines.append(
            f"{r.rank:>4d} {r.host:{width}s} {r.phase:13s} {r.epoch:>5d} {r.step:>7d} {ms[0]:>8s} "
            f"{ms[1]:>8s} {ms[2]:>7s} {rate:>8s} {r.age_s(now):>4.0f}s"
        )
    per_node: dict[str, float] = {}
    for r in records:
        if r.images_per_s is not None:
            per_node[r.host] = per_node.get(r.host, 0.0) + r.images_per_s
    if per_node:
        lines.append("images/s per node: " + ", ".join(f"{host} {rate:,.0f}" for host, rate in per_node.items()))
    timed = [r for r in records if r.own_s is not None and r.step_s]
    if len(timed) > 1:
        slowest = max(timed, key=lambda r: r.own_s or 0.0)
        own = slowest.own_s or 0.0
        waits = "input" if (slowest.data_s or 0.0) >= (slowest.compute_s or 0.0) else "compute (forward pass)"
        lines.append(f"slowest: {slowest.where()}, {own * 1000:.1f} ms of its own per step (most of it {waits})")
    lines += [f"straggler: {s.describe()}" for s in find_stragglers(records, now)]
    return lines


def hang_lines(run_dir: Path) -> list[str]:
    """When the run's last attempt ended hung (its stop_reason): the report's verdict and where the stacks are."""
    try:
        if read_text(run_dir / "stop_reason", 4096, within=run_dir).strip() != "hung":
            return []
        report = read_text(report_path(run_dir), MAX_REPORT_BYTES, within=run_dir).splitlines()
    except BadRunFile as err:
        return [f"skipped: {err}"]
    except OSError:
        return []
    verdict = next((line for line in report if line.startswith("culprit:")), "culprit: (the report has none)")
    return [
        f"hung: {report[0].removeprefix('hang: ')}" if report else "hung",
        verdict,
        f"stacks and the full report: {report_path(run_dir).parent}/",
    ]
