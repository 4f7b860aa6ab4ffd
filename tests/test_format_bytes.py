"""One byte formatter for people (fsutil.format_bytes): binary units to 3 significant digits. Three used to print
the same counts three ways (format_bytes: `512 bytes`, `1.02e+03 KiB`; images' human_size: `1024.0 KiB`; the
download's human_bytes: `1.0 MB`, decimal units); the cases where they differed are pinned here."""

from __future__ import annotations

import pytest

from hpctrain.fsutil import format_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (1536, "1.5 KiB"),
        (1_000_000, "977 KiB"),
        (1_048_575, "1 MiB"),
        (1_048_576, "1 MiB"),
        (1023 * 1024, "1023 KiB"),
        (2_000_000_000, "1.86 GiB"),
        (5 * 2**40, "5 TiB"),
        (3 * 2**50, "3 PiB"),
        (2**70, "1048576 PiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text


def test_no_exponent_and_no_four_digit_fraction_below_1024_pib():
    for power in range(0, 60):
        for n in (2**power - 1, 2**power, 10 ** (power // 4) * 999):
            number = format_bytes(n).split()[0]
            assert "e" not in number and float(number) < 1024 and len(number.replace(".", "")) <= 4, (n, number)


def test_no_other_byte_formatter_in_the_product() -> None:
    """Seven formatters in four styles (`1.5G`, `1.5Gi`, `1.5 GiB`, `1536 MiB`) printed byte counts before; now every
    count shown to people goes through format_bytes. What divides a value by a binary unit inside an f-string is a
    formatter; the renderers of a grammar (sbatch --mem `64G`, a Kubernetes quantity `64Gi`, a job file's `mem: 16G`)
    are the only ones allowed, each named for the grammar it writes."""
    import re
    from pathlib import Path

    import hpctrain

    unit = re.compile(r"\{[^{}]*(?:/|//|>>)\s*\(?(?:1024\b|2\s*\*\*\s*[1-9]|1\s*<<\s*[0-9])")
    grammars = {
        ("schedulers/slurm/grammar.py", "slurm_mem"),
        ("schedulers/kubernetes/manifests/options.py", "quantity_mb"),
        ("jobs/values.py", "mem_text"),
    }
    root = Path(hpctrain.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        function = ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if m := re.match(r"\s*def (\w+)", line):
                function = m[1]
            name = path.relative_to(root).as_posix()
            if unit.search(line) and (name, function) not in grammars:
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == [], "format byte counts with hpctrain.fsutil.format_bytes:\n" + "\n".join(found)
