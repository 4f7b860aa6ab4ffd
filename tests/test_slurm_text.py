"""Text from Slurm is data: job names holding every byte 1-255 and every Unicode line and format separator, and names
spelled as Slurm's own fields and records, are read back as names, on the real local cluster.

sbatch takes any byte but NUL in a job name (up to 1,024 of them; argv carries no NUL), and squeue and scontrol print
it as it is: before issue 39, a byte that is not UTF-8 ended `status` in a UnicodeDecodeError for every user of the
cluster, `scontrol show job -o` was split at every ` Key=` (a held job named `x JobState=COMPLETED` read as
COMPLETED, ` StdOut=/etc/hostname` made `logs` print that file, a line end made the state UNKNOWN), and squeue's
lines were split at \\x1f and line ends (a name could move fields, forge a row or hide a job). Now every command's
output is decoded with undecodable bytes shown escaped (`\\xff`), and job fields are read with records.Fields:
every squeue field ended by a separator drawn at random for each query, every count checked.

The jobs are held (they never run) but two: one that echoes a line and ends (its log is read), one that holds a
shard and runs until `cancel` ends it. All are cancelled at the end.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.commands import slurm
from hpctrain.schedulers.slurm.queries.records import Fields, UnsplittableOutput, new_token
from squeue_text import printed
from training_helpers import run_hpctrain
from hpctrain.schedulers.slurm.queries import cluster_state, job_table, job_states

# Every Unicode character that some splitter takes for a line end (str.splitlines: \n \r \v \f \x1c-\x1e \x85
# U+2028 U+2029), the unit separator hpctrain used, and the format characters that reorder or hide text.
SEPARATORS = (
    "\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    "\u2066\u2067\u2068\u2069\ufeff"
)
FORGED = " JobState=COMPLETED StdOut=/etc/hostname Reason=forged"  # spelled as scontrol's fields
OLD_ROW = "\x1f1\x1fCOMPLETED\x1fNone\x1fnode1\x1f1\x1f0:01\x1f0\x1f\n99999\x1fforged\x1fRUNNING\x1f"  # squeue's

SHARD_FORGER = b"x JobState=COMPLETED Nodes=node1,node2 CPU_IDs=0 Mem=0 GRES=shard:64(IDX:1)"
NAMES: list[bytes] = [
    bytes(range(1, 128)),  # every ASCII byte: the C0 controls, \x1f, line ends, `=`, space, DEL
    bytes(range(128, 256)),  # every byte that is not ASCII: most of them not UTF-8 where they stand
    b"x JobState=COMPLETED",
    b"y StdOut=/etc/hostname",
    b"z\nJobId=1 JobName=forged JobState=COMPLETED StdOut=/etc/hostname",
    ("r" + OLD_ROW).encode(),
    *(f"s{sep}{FORGED}{sep}x".encode() for sep in SEPARATORS),  # each separator alone around forged fields
]


def shown(name: bytes) -> str:
    """The name as hpctrain reads it: UTF-8, any other byte escaped."""
    return name.decode("utf-8", "backslashreplace")


def sbatch(name: bytes, *args: str, cwd: Path) -> str:
    """sbatch with the name as bytes (not every name is UTF-8): the job id."""
    argv = [b"sbatch", b"--parsable", b"-J", name, *(a.encode() for a in args)]
    result = subprocess.run(argv, cwd=cwd, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout.decode().strip().split(";")[0]


def slurm_state(job_id: str) -> str:
    """The job's state from squeue, asked for that one field only (a name cannot reach it)."""
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--Format=State"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out.strip() or "GONE"


def queue_ids() -> set[str]:
    """Every job id the controller lists, asked for alone."""
    out = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--Format=JobID"], capture_output=True, text=True, check=True
    ).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


def hpctrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = run_hpctrain(*args, cwd=cwd, timeout=120)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result
    return result


def wait_for(job_id: str, states: set[str], timeout_s: float = 300.0) -> str:
    deadline = time.monotonic() + timeout_s
    while (state := slurm_state(job_id)) not in states:
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {state} after {timeout_s:.0f} s (wanted {sorted(states)}); see `squeue`")
        time.sleep(0.5)
    return state


@pytest.mark.slurm
def test_names_holding_every_byte_and_separator_are_read_as_names(slurm_cluster, tmp_path: Path) -> None:
    held: dict[str, bytes] = {}
    ran: dict[str, bytes] = {}
    try:
        for name in NAMES:
            held[sbatch(name, "--hold", "-o", "/dev/null", "--wrap", "true", cwd=tmp_path)] = name
        # Two that run: one named to read as ended and as holding 64 shards more (cancel must still stop it, `cluster`
        # counts its one shard), one whose log is read.
        runs_on = sbatch(
            SHARD_FORGER, "--gres=shard:1", "-o", str(tmp_path / "%j.out"), "--wrap", "sleep 600", cwd=tmp_path
        )
        ran[runs_on] = SHARD_FORGER
        logged = sbatch(
            b"y StdOut=/etc/hostname\nStdOut=/etc/hostname",
            "-o",
            str(tmp_path / "%j.out"),
            "--wrap",
            "echo written-by-the-job",
            cwd=tmp_path,
        )
        ran[logged] = b"y StdOut=/etc/hostname\nStdOut=/etc/hostname"

        # One job at a time: its name, its state, and only it.
        for job_id, name in held.items():
            info = job_states.get_job(job_id)
            assert info is not None and (info.job_id, info.name, info.state) == (job_id, shown(name), "PENDING")
            assert info.stdout == "/dev/null" and info.reason == "JobHeldUser"

        # The lists: each job once, as itself; no row that is not a job.
        before = queue_ids()
        listed = job_states.list_jobs(all_users=True)
        columns = job_table.list_columns(all_users=True)
        everyone = before | queue_ids()
        rows = list(columns)
        for records in ([(j.job_id, j.name, j.state) for j in listed], [row[:3] for row in rows]):
            ids = [job_id for job_id, _, _ in records]
            assert len(ids) == len(set(ids)) and set(ids) <= everyone
            mine = {job_id: (name, state) for job_id, name, state in records if job_id in held}
            assert mine == {job_id: (shown(name), "PENDING") for job_id, name in held.items()}

        # The commands users run: status (a table, JSON, everyone's), status JOB, logs, cancel.
        for args in (("status",), ("status", "--all-users"), ("status", "--json"), ("status", "--all-users", "--json")):
            result = hpctrain(*args, cwd=tmp_path)
            assert result.returncode == 0, result
            if "--json" in args:
                entries = [e for e in json.loads(result.stdout) if e["job_id"] in held]
                assert sorted((e["job_id"], e["name"], e["state"]) for e in entries) == sorted(
                    (job_id, shown(name), "PENDING") for job_id, name in held.items()
                )
        hostname = Path("/etc/hostname").read_text().strip()
        for job_id, name in held.items():
            one = hpctrain("status", job_id, "--json", cwd=tmp_path)
            assert one.returncode == 0, one
            record = json.loads(one.stdout)
            assert (record["job_id"], record["name"], record["state"]) == (job_id, shown(name), "PENDING")
            assert hpctrain("status", job_id, cwd=tmp_path).returncode == 0
            logs = hpctrain("logs", job_id, cwd=tmp_path)
            assert logs.returncode != 0 and "has written no output yet" in logs.stderr, logs  # held: nothing written
            assert hostname not in logs.stdout
            cancel = hpctrain("cancel", job_id, cwd=tmp_path)
            assert cancel.returncode == 0 and "already ended" not in cancel.stdout, cancel
            assert wait_for(job_id, {"CANCELLED"}, timeout_s=60) == "CANCELLED"

        wait_for(logged, {"COMPLETED"})
        info = job_states.get_job(logged)
        assert info is not None and (info.state, info.stdout) == ("COMPLETED", str(tmp_path / f"{logged}.out"))
        logs = hpctrain("logs", logged, cwd=tmp_path)
        assert logs.returncode == 0 and logs.stdout.strip() == "written-by-the-job", logs
        assert hostname not in logs.stdout

        wait_for(runs_on, {"RUNNING"})
        assert job_states.get_job(runs_on).state == "RUNNING"
        marker = "x" + new_token()[1:]
        session = slurm(["scontrol", "-d", "-o"], input=cluster_state.session_input([runs_on], marker)).stdout
        use = cluster_state.parse_shard_use(session, [shown(SHARD_FORGER)], marker)
        assert sum(count for per_gpu in use.values() for count in per_gpu.values()) == 1, (use, session)
        assert hpctrain("cluster", cwd=tmp_path).returncode == 0
        cancel = hpctrain("cancel", runs_on, cwd=tmp_path)
        assert cancel.returncode == 0 and "already ended" not in cancel.stdout, cancel
        assert wait_for(runs_on, {"CANCELLED"}, timeout_s=120) == "CANCELLED"
    finally:
        for job_id in [*held, *ran]:
            slurm_cluster.cancel_quietly(job_id)


HOSTILE = [shown(name) for name in NAMES]


def test_fields_read_every_hostile_name_back_and_refuse_a_forged_separator() -> None:
    """records.Fields on text laid out as squeue prints it (tests/squeue_text.py) for jobs named as above (names
    and work directories holding \\x1f, line ends and forged rows); a value holding the query's own token (which
    no name can be made to hold: it is drawn after the names exist) makes the text unsplittable, never a different
    job."""
    fields = Fields(job_states.SQUEUE_FIELDS)
    rows = [
        {f: f"{f.lower()}-{i}" for f in fields.names} | {"JobID": str(i), "Name": name, "WorkDir": name[::-1]}
        for i, name in enumerate(HOSTILE)
    ]
    listed = job_states.parse_squeue(printed(rows, fields), fields)
    assert [(j.job_id, j.name, j.work_dir) for j in listed] == [(r["JobID"], r["Name"], r["WorkDir"]) for r in rows]
    forged = [rows[0] | {"Reason": f"r{fields.token}x"}]
    with pytest.raises(UnsplittableOutput, match="does not split into the fields"):
        job_states.parse_squeue(printed(forged, fields), fields)
    for cut in (2, 7, 20):  # text cut short within its last job: refused, not read as fewer or other jobs
        text = printed(rows[:2], fields)
        with pytest.raises(UnsplittableOutput):
            job_states.parse_squeue(text[: len(text) - cut], fields)
    assert fields.token[0] not in "0123456789.,:" and len(fields.token) == 17
    assert fields.token != Fields(fields.names).token  # drawn for each query


def test_every_command_output_is_decoded_with_undecodable_bytes_escaped() -> None:
    """commands.slurm (every Slurm client hpctrain runs) on a real process printing a byte that is not UTF-8 and a
    carriage return: `\\xff` shown escaped, `\\r` kept (subprocess's text mode makes it a line end)."""
    result = slurm(["printf", "a\\377b\\r\\n\\342\\200\\250"])
    assert result.stdout == "a\\xffb\r\n\u2028"


def test_a_shard_record_is_read_where_the_job_name_puts_it() -> None:
    """`cluster` on 22.05/23.02 counts shards from `scontrol -d show job` records: a name or a path spelled as
    the state and per-node GRES fields counts nothing (the real fields are read after the known name and before
    ` MinCPUsNode=`, after which the user's own paths and comment come)."""
    forged = " JobState=RUNNING Nodes=node2 CPU_IDs=0 Mem=0 GRES=shard:64(IDX:1)"

    def record(name: str, state: str, gres: str, workdir: str) -> str:
        return (
            f"JobId=7 JobName={name} UserId=alice(1000) GroupId=alice(1000) JobState={state} Reason=None "
            f"NodeList=node1 NumNodes=1 JOB_GRES={gres} Nodes=node1 CPU_IDs=0 Mem=0 GRES={gres} "
            f"MinCPUsNode=1 Command=/x Comment={forged} WorkDir={workdir} StdOut=/dev/null"
        )

    for name in ("x" + forged, "y\n" + forged + "\n", "shard" + forged):
        use: dict[str, dict[int, int]] = {}
        cluster_state.record_shard_use(record(name, "PENDING", "shard:16(IDX:0)", "/w" + forged), name, use)
        assert use == {}  # pending: holds nothing, whatever its name and paths say
        cluster_state.record_shard_use(record(name, "RUNNING", "gpu:0", "/w" + forged), name, use)
        assert use == {}
        cluster_state.record_shard_use(record(name, "RUNNING", "shard:16(IDX:0)", "/w" + forged), name, use)
        assert use == {"node1": {0: 16}}
    marker = "x0123456789abcdef"
    session = "".join(
        f"scontrol: show job {i}\n{record(n, 'RUNNING', 'shard:8(IDX:0)', '/w')}\n{marker}{i}\n"
        for i, n in enumerate(HOSTILE[:3])
    )
    assert cluster_state.parse_shard_use(session, HOSTILE[:3], marker) == {"node1": {0: 24}}
