"""A time and a memory size have one reader of what a user gives (--time, --mem: jobs/values.py, into seconds and
bytes); what Slurm prints is read in its own grammar (schedulers/slurm/grammar.py, records.py and gres.py), its
times through the same reader as a user's; a GRES has one reader (grammar.py) for --gres and what Slurm prints.
Here both sides read the same texts, the ones where hpctrain's two readers used to give different answers among
them, with the answer Slurm documents: sbatch rounds a size in K up to whole megabytes (str_to_mbytes in
src/common/proc_args.c) and takes an optional B after the unit; a GRES count may carry K, M, G, T or P, multiples
of 1024 (sbatch(1), --gres)."""

from __future__ import annotations

import pytest

from hpctrain.cli.dev import format_age
from hpctrain.errors import UserError
from hpctrain.jobs.values import format_duration, parse_mem_bytes, parse_time_limit
from hpctrain.schedulers.slurm.grammar import mem_mb, read_gres_request, slurm_mem
from hpctrain.schedulers.slurm.queries.records import printed_duration, printed_mem_mb
from hpctrain.schedulers.slurm.queries import gres


@pytest.mark.parametrize(
    ("text", "mb"),
    [("1500K", 2), ("1024K", 1), ("1025k", 2), ("16GB", 16384), ("2tb", 2 << 20), ("4000", 4000), ("0", 0)],
)
def test_a_size_reads_the_same_from_a_user_and_from_slurm(text, mb):
    assert mem_mb(parse_mem_bytes(text)) == mb  # what sbatch asks for from the user's size
    assert slurm_mem(mb) in (text.upper().rstrip("B"), f"{mb}M", f"{mb // 1024}G")
    assert printed_mem_mb(text) == mb  # 1500K was 1 here (rounded down) and 16GB was refused


def test_only_slurm_prints_fractions_and_petabytes():
    assert printed_mem_mb("1.50G") == 1536 and printed_mem_mb("1.3G") == 1332  # rounded up, as K is
    assert printed_mem_mb("1P") == 1 << 30
    for text in ("1.5G", "1P"):  # sbatch --mem takes neither
        with pytest.raises(UserError, match="--mem 16G"):
            parse_mem_bytes(text)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 5400),
        ("30:15", 1815),
        ("01:30:00", 5400),
        ("2-00", 172800),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        (" 5 ", 300),
    ],
)
def test_a_time_reads_the_same_from_a_user_and_from_slurm(text, seconds):
    assert parse_time_limit(text) == printed_duration(text) == seconds
    assert slurm_round_trip(seconds) == seconds


def slurm_round_trip(seconds: int) -> int | None:
    return printed_duration(format_duration(seconds))


def test_no_limit_is_printed_by_slurm_and_refused_from_a_user():
    assert printed_duration("UNLIMITED") is None and format_duration(None) == "UNLIMITED"
    assert printed_duration("0") == 0
    for text in ("UNLIMITED", "0"):
        with pytest.raises(UserError, match="MM:SS|zero"):
            parse_time_limit(text)


def test_every_duration_shown_has_one_form():
    """The dev session list's ages are squeue's form too (it printed 1d02h, 2h05m, 3m07s)."""
    assert format_age(93784) == format_duration(93784) == "1-02:03:04"
    assert format_age(7500) == "02:05:00" and format_age(None) == "-"


@pytest.mark.parametrize(
    ("text", "user", "printed"),
    [
        ("shard:1K", (0, None, 1024), [gres.GresEntry("shard", None, 1024)]),  # refused from a user before
        ("gpu:(null):2", (2, None, 0), [gres.GresEntry("gpu", None, 2)]),  # the user's GPU type was "(null)"
        ("gpu:a100:2", (2, "a100", 0), [gres.GresEntry("gpu", "a100", 2)]),
    ],
)
def test_a_gres_reads_the_same_from_a_user_and_from_slurm(text, user, printed):
    assert read_gres_request(text) == user
    assert gres.parse_gres(text) == printed


@pytest.mark.parametrize("text", ["gpu:0", "shard:a100:16", "mps:100", "gpu:1x"])
def test_a_gres_a_job_cannot_ask_for_is_refused_with_the_forms(text):
    with pytest.raises(UserError, match=r"use gpu:N, gpu:TYPE:N or shard:N"):
        read_gres_request(text)
