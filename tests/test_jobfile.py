"""Job files that would make reading them costly or crash the reader: each is one clear error, exit status 2."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs import from_mapping, load_job_file
from hpctrain.jobs.file_reading import MAX_JOB_FILE_BYTES

# 9 levels of 9 aliases each: under 500 bytes of YAML that expand to 9**9 strings when anything walks the value.
BILLION_LAUGHS = (
    "command: [x]\nnodes: [&a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"
    + "".join(f", &{chr(c)} [{','.join(['*' + chr(c - 1)] * 9)}]" for c in range(ord("b"), ord("j")))
    + "]\n"
)


def submit_dry_run(job_file: Path, memory_limit: int | None = None) -> subprocess.CompletedProcess:
    def limit_memory() -> None:
        if memory_limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    return subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--dry-run", "--no-check", "--job-file", str(job_file)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=job_file.parent,
        preexec_fn=limit_memory,
    )


def test_yaml_aliases_and_anchors_are_refused(tmp_path: Path) -> None:
    bomb = tmp_path / "job.yaml"
    bomb.write_text(BILLION_LAUGHS)
    with pytest.raises(
        UserError, match=r"anchors \(&name\) and aliases \(\*name\) are not allowed.*write the values out"
    ):
        load_job_file(bomb)
    anchor_only = tmp_path / "anchor.yaml"
    anchor_only.write_text("nodes: &n 2\ncommand: [x]\n")
    with pytest.raises(UserError, match="anchors"):
        load_job_file(anchor_only)


def test_billion_laughs_through_the_cli_is_one_line_exit_2(tmp_path: Path) -> None:
    bomb = tmp_path / "job.yaml"
    bomb.write_text(BILLION_LAUGHS)
    result = submit_dry_run(bomb)
    assert result.returncode == 2, result.stderr[:2000]
    assert result.stderr.count("\n") == 1 and "anchors" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_messages_never_format_a_huge_value_whole() -> None:
    value: list = ["lol"] * 10
    for _ in range(6):  # a million strings, shared: cheap to hold, megabytes to print
        value = [value] * 10
    with pytest.raises(UserError) as err:
        from_mapping({"command": ["x"], "nodes": value}, "job file j.yaml")
    message = str(err.value)
    assert message.startswith('job file j.yaml: nodes must be a whole number, or "MIN:MAX" for an elastic job (got [[[')
    assert len(message) < 300


@pytest.mark.parametrize("suffix,opening,closing", [(".yaml", "[", "]"), (".toml", "[", "]"), (".toml", "{b = ", "}")])
def test_deep_nesting_is_refused(tmp_path: Path, suffix: str, opening: str, closing: str) -> None:
    separator = ": " if suffix == ".yaml" else " = "
    path = tmp_path / f"job{suffix}"
    path.write_text("a" + separator + opening * 5000 + ("1" if "=" in opening else "") + closing * 5000 + "\n")
    with pytest.raises(UserError, match="nests lists or tables too deeply"):
        load_job_file(path)
    result = submit_dry_run(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "too deeply" in result.stderr


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_text_that_is_not_utf8_is_refused(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"job{suffix}"
    path.write_bytes(
        "name = 'caf\u00e9'\n".encode("latin-1") if suffix == ".toml" else "name: caf\u00e9\n".encode("latin-1")
    )
    with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 0xe9 at offset \d+\); save it as UTF-8"):
        load_job_file(path)
    result = submit_dry_run(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "not UTF-8" in result.stderr


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_an_endless_file_is_read_only_up_to_the_cap(tmp_path: Path, suffix: str) -> None:
    big = tmp_path / f"big{suffix}"
    with open(big, "wb") as handle:
        handle.truncate(2 * MAX_JOB_FILE_BYTES)
    with pytest.raises(UserError, match="is larger than 1 MiB"):
        load_job_file(big)
    endless = tmp_path / f"job{suffix}"
    os.symlink("/dev/zero", endless)  # an uncapped read never returns: the memory limit makes that a failure
    result = submit_dry_run(endless, memory_limit=1 << 30)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "not a regular file (a character device)" in result.stderr


def test_a_file_at_the_cap_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    body = "command: [x]\n"
    path.write_text(body + "#" * (MAX_JOB_FILE_BYTES - len(body) - 1) + "\n")
    assert load_job_file(path) == {"command": ["x"]}


def test_yaml_syntax_errors_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("nodes: [1\n")
    with pytest.raises(UserError, match="not valid YAML") as err:
        load_job_file(path)
    assert "\n" not in str(err.value)


def test_toml_job_files_read_on_python_3_10_through_tomli(tmp_path: Path) -> None:
    """pyproject says Python >= 3.10, where the standard library has no tomllib. Only 3.11 runs here, so a child
    interpreter is made to look like 3.10: tomllib hidden, sys.version_info 3.10, and `tomli` offered (tomllib is
    tomli 2.0 taken into the standard library, with the same loads/TOMLDecodeError; the real tomli is not installed
    here). What is checked for real: that hpctrain imports and reads a TOML job file, and rejects a bad one, that
    way."""
    good, bad = tmp_path / "job.toml", tmp_path / "bad.toml"
    good.write_text('name = "demo"\ncommand = ["python", "train.py"]\n')
    bad.write_text("name = \n")
    code = (
        "import sys, tomllib\n"
        "sys.modules['tomli'] = tomllib\n"
        "sys.modules['tomllib'] = None\n"
        "sys.version_info = (3, 10, 14, 'final', 0)\n"
        "from hpctrain.errors import UserError\n"
        "from hpctrain.jobs import load_job_file\n"
        "print(load_job_file(sys.argv[1])['name'])\n"
        "try:\n"
        "    load_job_file(sys.argv[2])\n"
        "except UserError as err:\n"
        "    print(err)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(good), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "demo" and "is not valid TOML" in lines[1]


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "large"])
def test_a_params_file_is_capped_and_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Guards issue 17: a `.params` job file -> /dev/zero was read forever and a 300 MB one took over a minute
    (YAML/TOML were capped at 1 MiB, .params was not); a FIFO would hang. Same rules for every job file now."""
    params = tmp_path / "job.params"
    if kind == "dev-zero":
        os.symlink("/dev/zero", params)
    elif kind == "fifo":
        os.mkfifo(params)
    else:
        with open(params, "wb") as handle:
            handle.truncate(300 * MAX_JOB_FILE_BYTES)
    result = submit_dry_run(params, memory_limit=1 << 30)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    expected = "is larger than 1 MiB" if kind == "large" else "not a regular file"
    assert result.stderr.count("\n") == 1 and expected in result.stderr


@pytest.mark.parametrize(
    "content,message",
    [
        (b"worker_count=1\nname=caf\xff\n", "is not UTF-8 text (byte 0xff at offset 23); save it as UTF-8"),
        (
            b"worker_count=1\nworker_memory=1e100000\n",
            "worker_memory='1e100000' must be a positive number of GB, at most 1048576",
        ),
    ],
)
def test_params_file_values_that_tracebacked_are_clear_errors(tmp_path: Path, content: bytes, message: str) -> None:
    """Guards issue 17: a .params file with byte 0xff (UnicodeDecodeError) and `worker_memory=1e100000`
    (ValueError: integer string conversion limit) ended in tracebacks."""
    params = tmp_path / "job.params"
    params.write_bytes(content)
    result = submit_dry_run(params)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "suffix,line", [(".yaml", "nodes: {n}\n"), (".toml", "nodes = {n}\n"), (".yaml", "time: -{n}\n")]
)
def test_a_number_of_thousands_of_digits_is_one_line_exit_2(tmp_path: Path, suffix: str, line: str) -> None:
    """Issue 39, item 8: a 5,000-digit integer in a job file ended in a traceback (Python's limit on converting
    more than 4,300 digits raises ValueError inside the YAML or TOML parser)."""
    path = tmp_path / f"job{suffix}"
    path.write_text("command = ['x']\n" if suffix == ".toml" else "command: [x]\n")
    with open(path, "a") as handle:
        handle.write(line.format(n="7" * 5000))
    with pytest.raises(UserError, match="holds a number of 5000 digits: no job option is anywhere near that large"):
        load_job_file(path)
    result = submit_dry_run(path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-1000:]
    assert result.stderr.count("\n") == 1 and str(path) in result.stderr
