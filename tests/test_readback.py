"""Files read back from a run directory are untrusted (hpctrain.readback): every reader of one is fed malformed,
oversized, deeply nested, invalid UTF-8, wrong-typed, NaN and special files (a FIFO, a directory, a link out of the
run directory, a huge sparse file), and must end in its one expected way: a valid result that what comes after it
can use, or one line naming the file. Never a traceback, never a wait on a FIFO, never more read than the cap.

A seeded generator (not a property-testing library) makes the shapes: the same cases on every run, about a hundred
per reader, in a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpctrain import checkpoint
from hpctrain.cli import terminal
from hpctrain.health import Watchdog, find_stragglers, hang_report, read_progress
from hpctrain.health.hang import MAX_REPORT_BYTES, report_path
from hpctrain.health.preflight import MAX_PREFLIGHT_BYTES, PREFLIGHT_FILE, read_verdict
from hpctrain.health.progress import MAX_RECORD_BYTES, ProgressRecorder, RankProgress, progress_path
from hpctrain.health.view import hang_lines, rank_lines
from hpctrain.readback import BadRunFile, parse_json, read_json, read_text
from hpctrain.training.metrics import METRICS_FILE, read_metrics
from hpctrain.training.provenance import PROVENANCE_FILE, record_attempt

SEED = 29
CASES = 60

VALID_PROGRESS = {
    "rank": 1,
    "world_size": 2,
    "host": "node1",
    "pid": 12,
    "phase": "training",
    "epoch": 1,
    "step": 7,
    "step_in_epoch": 7,
    "steps_per_epoch": 50,
    "steps": 10,
    "step_s": 0.1,
    "data_s": 0.01,
    "compute_s": 0.02,
    "images_per_s": 640.0,
    "waiting_in": None,
    "collectives": None,
    "updated": 1_000_000.0,
}
VALID_PREFLIGHT = {
    "checks": [
        {"rank": 0, "node": "node0", "gemm_gflops": 100.0, "error": None, "links": {}},
        {"rank": 1, "node": "node1", "gemm_gflops": 98.0, "error": None, "links": {}},
    ],
    "allreduce_gbps": 1.5,
}
VALID_METRICS = {
    "epoch": 1,
    "step": 50,
    "train_loss": 0.5,
    "test_loss": 0.4,
    "test_accuracy": 0.9,
    "images_per_s": 1000.0,
    "epoch_seconds": 3.0,
    "lr": 0.1,
}
# What a field may be replaced with: every JSON type, out-of-range numbers, NaN, control characters, huge values.
ODD_VALUES: list[Any] = [
    "1",
    "",
    1.5,
    -1,
    0,
    10**30,
    -1e-9,
    None,
    True,
    False,
    [],
    [1],
    {},
    {"a": 1},
    "x" * 5000,
    "\x1b[31mred",
    "a\nb",
    "\ud800",  # a lone surrogate: JSON's escapes spell it, nothing can encode it (the hang report's thread died of it)
    "node\udcff1",
    math.nan,
    math.inf,
    -math.inf,
    1e308,
]


@contextlib.contextmanager
def deadline(seconds: float = 5.0) -> Iterator[None]:
    """Fail (rather than hang the suite) if the block blocks: SIGALRM interrupts a blocked open or read."""

    def expired(*_: Any) -> None:
        raise TimeoutError(f"blocked for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many bytes the code under test reads through os.read (readback's only read)."""
    counted = [0]
    real = os.read

    def counting(fd: int, n: int) -> bytes:
        data = real(fd, n)
        counted[0] += len(data)
        return data

    monkeypatch.setattr(os, "read", counting)
    return counted


def mutations(valid: dict[str, Any], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    """(what, file contents): the valid record with one field replaced, dropped, or nested; cut short; garbage."""
    keys = list(valid)
    for key in keys:
        for value in ODD_VALUES:
            yield f"{key}={value!r:.20}", json.dumps({**valid, key: value}).encode()
    for _ in range(CASES):
        text = json.dumps(valid)
        choice = rng.randrange(6)
        if choice == 0:
            yield "cut short", text[: rng.randrange(len(text))].encode()
        elif choice == 1:
            yield "random bytes", rng.randbytes(rng.randrange(1, 200))
        elif choice == 2:
            depth = rng.choice([33, 100, 5000, 200_000])
            yield f"nested {depth}", ("[" * depth + "]" * depth).encode()
        elif choice == 3:
            yield "invalid UTF-8", text.encode()[:-2] + b"\xff\xfe" + text.encode()[-2:]
        elif choice == 4:
            yield "not an object", json.dumps(rng.choice([[valid], "text", 3, None, True])).encode()
        else:
            dropped = rng.choice(keys)
            yield f"without {dropped}", json.dumps({k: v for k, v in valid.items() if k != dropped}).encode()


def special(path: Path, kind: str, outside: Path, valid: bytes) -> None:
    """Make `path` a file of `kind` (the outside file, linked to, holds a valid record: a link must not be read)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "link out":
        outside.write_bytes(valid)
        path.symlink_to(outside)
    elif kind == "sparse 1 TiB":
        with open(path, "wb") as handle:
            handle.truncate(1 << 40)
    elif kind == "over the cap":
        path.write_bytes(b" " * (1 << 21) + valid)  # valid JSON, but larger than any cap below 2 MiB


SPECIAL = ["fifo", "directory", "link out", "sparse 1 TiB"]


def one_line_naming(err: BaseException, path: Path) -> None:
    text = str(err)
    assert "\n" not in text and str(path) in text and "Traceback" not in text


# ---- the reader itself


def test_the_reader_never_blocks_follows_links_or_reads_past_its_cap(tmp_path: Path, bytes_read: list[int]) -> None:
    run = tmp_path / "run"
    valid = json.dumps(VALID_PROGRESS).encode()
    for kind in [*SPECIAL, "over the cap"]:
        path = run / kind.replace(" ", "-")
        special(path, kind, tmp_path / "outside.json", valid)
        before = bytes_read[0]
        with deadline(), pytest.raises(BadRunFile) as caught:
            read_json(path, 1 << 20, within=run)
        one_line_naming(caught.value, path)
        assert bytes_read[0] - before <= (1 << 20) + 1, kind
    # a folder on the way that is a link out of the run directory: not followed either
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "rank-0.json").write_bytes(valid)
    (run / "progress").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BadRunFile, match="symbolic link"):
        read_json(run / "progress" / "rank-0.json", 1 << 20, within=run)
    with pytest.raises(FileNotFoundError):  # not there yet: the caller's ordinary case, not a bad file
        read_text(run / "missing", 10, within=run)


def test_json_is_parsed_strictly_and_without_recursion() -> None:
    for text in ["NaN", '{"a": Infinity}', "[" * 100_000 + "]" * 100_000, '{"a": 1', '"\\ud800"x']:
        with pytest.raises(BadRunFile):
            parse_json(text, "x")
    for text in ['"\\ud800"', '{"\\udc00": 1}', '[["a\\uDFFFb"]]', '"\ud800"']:  # lone surrogates, as escapes or raw
        with pytest.raises(BadRunFile, match="lone surrogate"):
            parse_json(text, "x")
    assert parse_json('["\\ud83d\\ude00", "\\\\ud800"]', "x") == ["\U0001f600", "\\ud800"]  # a pair is text
    assert parse_json(json.dumps({"s": "[{" * 50}), "x") == {"s": "[{" * 50}  # brackets in a string do not nest


# ---- each reader of the run directory


def test_progress_records_of_any_shape_are_skipped_or_usable(tmp_path: Path, bytes_read: list[int]) -> None:
    rng = random.Random(SEED)
    valid = json.dumps(VALID_PROGRESS).encode()
    for n, (what, data) in enumerate(mutations(VALID_PROGRESS, rng)):
        run = tmp_path / f"run{n}"
        path = progress_path(run, 1)
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        ProgressRecorder(run, 0, 2, "node0", 50).write("training")  # a good record beside it
        bad: list[BadRunFile] = []
        with deadline():
            records = read_progress(run, bad.append)
        if bad:  # refused: one line naming the file, and the good record still read
            [err] = bad
            one_line_naming(err, path)
            assert [r.rank for r in records] == [0], what
        usable(records, what)
    for kind in SPECIAL:
        run = tmp_path / kind.replace(" ", "-")
        special(progress_path(run, 1), kind, tmp_path / "outside.json", valid)
        bad = []
        before = bytes_read[0]
        with deadline():
            assert read_progress(run, bad.append) == []
        [err] = bad
        one_line_naming(err, progress_path(run, 1))
        assert bytes_read[0] - before <= MAX_RECORD_BYTES + 1


def usable(records: list[RankProgress], what: str) -> None:
    """What reads the records after read_progress works on them: the straggler check, the hang report, `top`."""
    for r in records:
        assert type(r.rank) is int and type(r.world_size) is int and 0 <= r.rank < r.world_size, what
        assert isinstance(r.updated, (int, float)) and math.isfinite(r.updated), what
        for value in (r.step_s, r.data_s, r.compute_s, r.images_per_s):
            assert value is None or (not isinstance(value, bool) and math.isfinite(value) and value >= 0), what
    find_stragglers(records, now=1_000_001.0)
    report = hang_report(records, 2, 30.0, 10.0, Path("run"), 1_000_001.0)
    lines = rank_lines(records, 1_000_001.0)
    # what they give is written to files, terminals and logs: it must encode (strictly, as a file write does)
    "\n".join([report.text(), report.summary(), *lines, *(r.where() for r in records)]).encode()


def test_a_damaged_preflight_record_is_refused_in_one_line(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    for n, (what, data) in enumerate(mutations(VALID_PREFLIGHT, rng)):
        path = tmp_path / f"{n}" / PREFLIGHT_FILE
        path.parent.mkdir()
        path.write_bytes(data)
        with deadline():
            try:
                verdict = read_verdict(path)
            except BadRunFile as err:
                one_line_naming(err, path)
                continue
        verdict.lines()  # accepted: it must print
    checks = VALID_PREFLIGHT["checks"]
    for field, value in [
        ("rank", "1"),
        ("gemm_gflops", -5.0),
        ("links", {"node9": -1.0}),
        ("node", ["n"]),
        ("error", {"x": 1}),
    ]:
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps({**VALID_PREFLIGHT, "checks": [{**checks[0], field: value}, checks[1]]}))
        with pytest.raises(BadRunFile, match="check 1"):
            read_verdict(path)
    for kind in SPECIAL:
        path = tmp_path / kind.replace(" ", "-") / PREFLIGHT_FILE
        special(path, kind, tmp_path / "outside.json", json.dumps(VALID_PREFLIGHT).encode())
        with deadline(), pytest.raises(BadRunFile) as caught:
            read_verdict(path, within=path.parent)
        one_line_naming(caught.value, path)
    assert MAX_PREFLIGHT_BYTES < 1 << 40


def test_metrics_lines_that_are_not_records_are_skipped_and_a_bad_file_refused(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    good = json.dumps(VALID_METRICS)
    for n, (what, data) in enumerate(mutations(VALID_METRICS, rng)):
        run = tmp_path / f"{n}"
        run.mkdir()
        (run / METRICS_FILE).write_bytes(good.encode() + b"\n" + data.replace(b"\n", b" ") + b"\n" + good.encode())
        bad: list[BadRunFile] = []
        with deadline():
            records = read_metrics(run, bad.append)  # a line that is not UTF-8 is one bad line, not a bad file
        assert records[0] == VALID_METRICS  # the last line, without its newline, is a cut-short append: left out
        assert len(records) + len(bad) == 2, what
        for record in records:
            assert type(record["step"]) is int and record["step"] >= 0, what
        for err in bad:
            assert "\n" not in str(err) and f"{run / METRICS_FILE}, line 2" in str(err), what
    for kind in SPECIAL:
        run = tmp_path / kind.replace(" ", "-")
        special(run / METRICS_FILE, kind, tmp_path / "outside.json", good.encode() + b"\n")
        with deadline(), pytest.raises(BadRunFile) as caught:
            read_metrics(run)
        one_line_naming(caught.value, run / METRICS_FILE)


def test_a_metrics_line_that_is_not_utf8_never_blocks_a_resume(tmp_path: Path) -> None:
    """A resumed run drops the records a killed attempt wrote after its checkpoint (`MetricsLog`); a line that is
    not UTF-8 is kept as it is, byte for byte, and the rest read. Before, one such line made the whole file
    unreadable and every --resume of the run stopped there."""
    from hpctrain.training.metrics import MetricsLog

    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({**VALID_METRICS, "step": step}).encode() for step in (50, 100, 150)]
    stray = b'{"epoch": 2, "note": "\xff\xfe"}'
    (run / METRICS_FILE).write_bytes(lines[0] + b"\n" + stray + b"\n" + lines[1] + b"\n" + lines[2] + b"\n" + b'{"ep')
    MetricsLog(run, resumed_step=100).close()
    assert (run / METRICS_FILE).read_bytes() == lines[0] + b"\n" + stray + b"\n" + lines[1] + b"\n"
    bad: list[BadRunFile] = []
    assert [r["step"] for r in read_metrics(run, bad.append)] == [50, 100]
    [err] = bad
    assert str(err) == f"{run / METRICS_FILE}, line 2: not UTF-8 text (byte 22)"


def test_status_says_in_one_line_that_a_hang_report_or_stop_reason_is_unreadable(tmp_path: Path) -> None:
    for name in ("stop_reason", "hang/report.txt"):
        for kind in [*SPECIAL, "invalid UTF-8"]:
            run = tmp_path / name.replace("/", "-") / kind.replace(" ", "-")
            run.mkdir(parents=True)
            (run / "stop_reason").write_text("hung\n")
            report_path(run).parent.mkdir()
            report_path(run).write_text("hang: no training step completed for 30 s\nculprit: rank 1\n")
            (run / name).unlink()
            if kind == "invalid UTF-8":
                (run / name).write_bytes(b"hung\xff\n")
            else:
                special(run / name, kind, tmp_path / "outside.txt", b"hung\n")
            with deadline():
                [line] = hang_lines(run)
            assert line.startswith(f"skipped: {run / name}: "), line
    assert MAX_REPORT_BYTES < 1 << 40


def test_an_unreadable_provenance_record_is_set_aside_and_a_new_one_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    terminal.install(None)  # the warning as printed, whatever ran before in this worker
    rng = random.Random(SEED)
    shapes = [
        ("not an object", b"[]"),
        ("attempts a string", b'{"attempts": "x"}'),
        ("nested", b"[" * 10_000),
        ("invalid UTF-8", b'{"attempts": ["\xff"]}'),
        ("random", rng.randbytes(64)),
    ]
    for n, (what, data) in enumerate(shapes):
        run = tmp_path / f"{n}"
        run.mkdir()
        (run / PROVENANCE_FILE).write_bytes(data)
        with deadline():
            record_attempt(run, ["here"], {})
        assert len(json.loads((run / PROVENANCE_FILE).read_text())["attempts"]) == 1, what
        assert (run / f"{PROVENANCE_FILE}.unreadable").read_bytes() == data, what
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"hpctrain: warning: {run / PROVENANCE_FILE}: "), line
    run = tmp_path / "fifo"
    run.mkdir()
    os.mkfifo(run / PROVENANCE_FILE)
    with deadline():
        record_attempt(run, ["here"], {})  # set aside, not waited on
    assert (run / f"{PROVENANCE_FILE}.unreadable").is_fifo()


def test_a_checkpoint_manifest_of_any_shape_is_rejected_not_a_traceback(tmp_path: Path) -> None:
    import torch

    from hpctrain.checkpoint.files import manifest_path

    path = checkpoint.save({"model": {"w": torch.zeros(2)}}, tmp_path, "checkpoint_epoch_1.pt", epoch=1, step=5)
    manifest = manifest_path(path)
    valid = json.loads(manifest.read_text())
    rng = random.Random(SEED)
    for what, data in [*mutations(valid, rng)][::7]:
        manifest.write_bytes(data)
        with deadline():
            try:
                checkpoint.verify(path)
            except checkpoint.CheckpointError as err:
                assert "\n" not in str(err) and "Traceback" not in str(err), what
    for kind in SPECIAL:
        manifest.unlink() if not manifest.is_dir() else manifest.rmdir()
        special(manifest, kind, tmp_path / "outside.json", json.dumps(valid).encode())
        with deadline(), pytest.raises(checkpoint.CheckpointError, match="unreadable manifest"):
            checkpoint.verify(path)


# ---- what a service job writes (a dev session's or a cluster TensorBoard's folder)


def test_a_service_jobs_files_are_read_as_a_run_directorys_are(tmp_path: Path) -> None:
    """endpoint.json, connection.json and the job's output in a service's state folder were read with no cap,
    through links and FIFOs (servers.common.read_json, and the whole output for its last lines): now readback's
    readers refuse them in one line, or (the output's tail) say there is no output to show."""
    from hpctrain.schedulers.slurm.services.service_jobs import ENDPOINT_FILE, output_tail, read_endpoint
    from hpctrain.servers.common import Endpoint
    from hpctrain.servers.sessions import CONNECTION_FILE, read_connection

    endpoint = json.dumps({"job_id": "7", "node": "node1", "port": 20049}).encode()
    for kind in [*SPECIAL, "over the cap"]:
        state = tmp_path / kind.replace(" ", "-")
        for name, valid, read in (
            (ENDPOINT_FILE, endpoint, lambda: read_endpoint(state, "7")),
            (CONNECTION_FILE, b'{"scheduler": "slurm", "job_id": "7"}', lambda: read_connection(state)),
        ):
            special(state / name, kind, tmp_path / f"outside-{name}", valid)
            with deadline(), pytest.raises(BadRunFile) as caught:
                read()
            one_line_naming(caught.value, state / name)
        if kind in ("fifo", "directory", "link out"):
            special(state / "slurm-7.out", kind, tmp_path / "outside.out", b"not this job's output\n")
            with deadline():
                assert output_tail(state, "7") == f"(no output file {state / 'slurm-7.out'})"
    state = tmp_path / "state"
    state.mkdir()
    assert read_endpoint(state, "7") is None and read_connection(state) is None  # not written yet
    for bad in ({"job_id": "7", "node": "n", "port": 70000}, {"job_id": "7", "node": "n", "port": "80"}, [endpoint]):
        (state / ENDPOINT_FILE).write_text(json.dumps(bad if isinstance(bad, dict) else str(bad)))
        with pytest.raises(BadRunFile):
            read_endpoint(state, "7")
    (state / ENDPOINT_FILE).write_bytes(endpoint)
    assert read_endpoint(state, "7") == Endpoint(node="node1", port=20049)
    assert read_endpoint(state, "8") is None  # an earlier job's
    (state / CONNECTION_FILE).write_text("[1, 2]")
    with pytest.raises(BadRunFile, match="holds no JSON object"):
        read_connection(state)
    (state / "slurm-7.out").write_bytes(b"".join(b"line %d\n" % i for i in range(200_000)))  # 2.5 MB
    assert output_tail(state, "7").splitlines() == [f"  | line {i}" for i in range(199_985, 200_000)]


# ---- what must survive any record: rank 0's straggler check and the watchdog


def test_records_that_crashed_the_straggler_check_are_skipped(tmp_path: Path) -> None:
    """A step time of -1 beside one of 1 made the median step 0 (ZeroDivisionError in rank 0's check, mid-epoch);
    a rank written as a string failed the comparison with the world size (TypeError)."""
    for odd in (
        {"step_s": -0.1, "data_s": 0.5},
        {"rank": "0"},
        {"world_size": "2"},
        {"updated": "now"},
        {"data_s": None, "x": 1},
    ):
        run = tmp_path / json.dumps(odd).replace("/", "")
        for rank in (0, 1):
            path = progress_path(run, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**VALID_PROGRESS, "rank": rank, **(odd if rank == 0 else {})}))
        usable(read_progress(run), str(odd))


def test_the_watchdog_outlives_a_task_that_fails_and_still_reports_a_hang(capsys: pytest.CaptureFixture[str]) -> None:
    """A stack request it could not parse used to end the watchdog's thread: a later real hang went unreported."""

    terminal.install(None)  # the line as printed, whatever ran before in this worker

    def failing() -> None:
        raise ValueError("a record of the wrong shape")

    fired = threading.Event()
    dog = Watchdog(0.5, 60.0, lambda *_: fired.set(), ticks=(failing,), poll_s=0.05)
    dog.beat()
    dog.beat()
    dog.start()
    try:
        assert fired.wait(10), "the watchdog died with its task"
    finally:
        dog.stop()
    lines = [line for line in capsys.readouterr().err.splitlines() if "ValueError" in line]
    assert len(lines) == 1 and "the watch goes on" in lines[0]  # said once, not at every poll


# ---- the consumers of the records: the hang report's thread, `debug stacks`


def test_a_record_of_any_shape_neither_silences_the_hang_report_nor_breaks_debug_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1's record, mutated: rank 0's hang work (`RankWatch._hang_files`, the thread the watchdog starts) still
    writes the report, naming rank 1 when its record is unusable, and `hpctrain debug stacks` answers in lines.
    Before, a lone surrogate in a record passed the reader and ended the report's thread (the run exited 142 with no
    report, the culprit unnamed), and `debug stacks` ended in a UnicodeEncodeError traceback."""
    from types import SimpleNamespace

    from hpctrain.cli import main
    from hpctrain.training.watch import RankWatch

    monkeypatch.setattr("time.sleep", lambda seconds: None)  # the report's grace, and debug stacks' poll
    monkeypatch.setenv("HPCTRAIN_TERMINATION_LOG", str(tmp_path / "said"))
    rng = random.Random(SEED)
    cases = [*mutations(VALID_PROGRESS, rng)]
    assert any("\\ud800" in data.decode(errors="replace") for _, data in cases)
    for n, (what, data) in enumerate(cases):
        run = tmp_path / f"run{n}"
        progress_path(run, 1).parent.mkdir(parents=True)
        progress_path(run, 1).write_bytes(data)
        watch = object.__new__(RankWatch)
        watch.run = SimpleNamespace(
            run_dir=run,
            device=SimpleNamespace(type="cpu"),
            is_main=True,
            env=SimpleNamespace(rank=0, world_size=2, is_distributed=True),
        )
        watch.host, watch._warned = "node0", set()
        watch.progress = ProgressRecorder(run, 0, 2, "node0", 50)
        with deadline():
            watch._hang_files(30.0, 20.0, "the stop vote after step 8", 17, None, "(stacks)\n")
        err = capsys.readouterr().err
        assert "could not write the hang report" not in err, (what, err)
        report = (run / "hang" / "report.txt").read_text()
        assert (run / "stop_reason").read_text() == "hung\n", what
        if f"skipped a progress record: {progress_path(run, 1)}" in err:
            assert "culprit: rank 1 never arrived" in report, (what, report)
        if n % 5 == 0:  # debug stacks reads the same records (every fifth case: each costs a CLI run)
            with deadline():
                code = main(["debug", "stacks", "1", "--run-dir", str(run), "--wait", "0.01", "--scheduler", "slurm"])
            out, err = capsys.readouterr()
            assert code == 1 and "Traceback" not in err, (what, err)
            assert out.startswith("no answer within 0.01 s from: rank 0 on node0") and "\n" == out[-1], (what, out)


# ---- a checkpoint's optimizer and scheduler state: the optimizer load


def _optimization_state(recipe_name: str) -> tuple[Any, Any, Any]:
    """(cfg, recipe, a checkpoint's state) as `hpctrain train` writes it after a step: the recipe's real model,
    optimizer (momentum buffers made) and scheduler, on the CPU."""
    import torch

    from hpctrain.config import TrainConfig
    from hpctrain.recipes import get_recipe
    from hpctrain.training.setup import resolve_config

    cfg = TrainConfig(workload="mnist", recipe=recipe_name, dataset="fashion-mnist", threads=1, epochs=2)
    recipe = get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
    cfg = resolve_config(cfg, recipe)
    torch.manual_seed(0)
    model = recipe.build_model()
    optimization = recipe.build_optimization(model, cfg.lr, cfg.epochs, 4)
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    optimization.optimizer.step()
    optimization.scheduler.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimization.optimizer.state_dict(),
        "scheduler": optimization.scheduler.state_dict(),
    }
    return cfg, recipe, state


def _odd_state_values(rng: random.Random, like: Any) -> list[Any]:
    """What a leaf of an optimizer's or scheduler's state may be replaced with: ODD_VALUES, and tensors of the wrong
    shape, dtype or layout (an expanded view of one element, a sparse one), non-finite scalars."""
    import torch

    values: list[Any] = [*ODD_VALUES, torch.zeros(3), torch.tensor(math.nan), torch.tensor(1.0), torch.tensor(2)]
    values += [torch.tensor(1j), torch.tensor(True), torch.zeros(0), torch.zeros(2, 2).to_sparse()]
    if isinstance(like, torch.Tensor) and like.dim() > 0:
        values += [
            torch.zeros(1).expand(*like.shape),
            like.double(),
            like.flatten(),
            like.transpose(0, -1).contiguous().transpose(0, -1),  # the same shape, strides permuted: dense
            torch.zeros(1).expand(10**6, 10**6),
        ]
    return rng.sample(values, 6)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """`value` with the item at `path` replaced by `new`: the dicts and lists along the path copied, nothing else."""
    if not path:
        return new
    copied = dict(value) if isinstance(value, dict) else list(value)
    copied[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copied


@pytest.mark.parametrize("recipe_name", ["fast", "classic"])
def test_an_optimizer_or_scheduler_state_of_any_shape_is_refused_in_one_line_or_steps(recipe_name: str) -> None:
    """Each leaf of a real checkpoint's optimizer and scheduler state (or the whole of one, or the model's weights)
    replaced by a seeded choice of odd values: `check_fits` refuses it in one line naming the checkpoint, or the
    state loads into this run's own model, optimizer and scheduler and they step. Before, a momentum buffer of the
    wrong shape, an expanded view, `lr: 'fast'` or a scheduler's string counter passed, to fail mid-run (SIGSEGV
    in the optimizer's kernels, or a traceback)."""
    import copy

    import torch

    from hpctrain.errors import UserError
    from hpctrain.training.resume import check_fits

    rng = random.Random(SEED)
    cfg, recipe, state = _optimization_state(recipe_name)
    check_fits(cfg, recipe, state["model"], Path("ck.pt"), optimization=state)  # the sound state passes
    paths = [("optimizer", *p) for p in _leaves(state["optimizer"])] + [
        ("scheduler", *p) for p in _leaves(state["scheduler"])
    ]
    paths = rng.sample(paths, min(len(paths), 24)) + [("model",), ("optimizer",), ("scheduler",)]
    refused = accepted = 0
    for path in paths:
        where = state
        for key in path:
            where = where[key]
        for value in _odd_state_values(rng, where)[:4]:
            crafted = _replaced(state, path, value)
            what = f"{'.'.join(map(str, path))} = {value!r:.60}"
            try:
                check_fits(cfg, recipe, crafted["model"], Path("ck.pt"), optimization=crafted)
            except UserError as err:
                assert str(err).startswith("ck.pt") and "\n" not in str(err), (what, str(err))
                refused += 1
                continue
            accepted += 1
            crafted = copy.deepcopy(crafted)  # the optimizer steps its state in place: not the shared original's
            torch.manual_seed(0)
            model = recipe.build_model()
            optimization = recipe.build_optimization(model, cfg.lr, cfg.epochs, 4)
            model.load_state_dict(crafted["model"])
            optimization.optimizer.load_state_dict(crafted["optimizer"])
            optimization.scheduler.load_state_dict(crafted["scheduler"])
            for parameter in model.parameters():
                parameter.grad = torch.randn_like(parameter)
            optimization.optimizer.step()
            optimization.scheduler.step()
    assert refused > 50 and accepted > 0, (refused, accepted)
