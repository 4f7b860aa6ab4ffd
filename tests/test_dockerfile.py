"""examples/Dockerfile, the README's way to an image with hpctrain in it (issue 17: the Kubernetes example's image,
nvcr.io/nvidia/pytorch:24.05-py3, has no hpctrain). No container engine runs here, so the file is checked as a
build would read it: its base is the README's image, what it copies exists in this clone, and what it runs installs
this package and runs it. (A stand-in for `docker build`, which cannot run here.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).parent.parent
DOCKERFILE = ROOT / "examples" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, comments and continuations handled as Docker does."""
    text = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def test_the_dockerfile_adds_this_clone_of_hpctrain_to_the_readmes_pytorch_image() -> None:
    steps = instructions()
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG")
    assert [kind for kind, _ in steps] == ["ARG", "FROM", "COPY", "COPY", "RUN"]
    assert steps[1][1] == "${BASE}" and args["BASE"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert args["BASE"] in (ROOT / "README.md").read_text()  # the image the README's Kubernetes example names
    copied = [shlex.split(a) for kind, a in steps if kind == "COPY"]
    for *sources, target in copied:
        assert target.startswith("/opt/hpctrain/")
        assert all((ROOT / source).exists() for source in sources), sources
    assert {source for *sources, _ in copied for source in sources} >= {"pyproject.toml", "src"}
    run = shlex.split(steps[-1][1])
    assert run[:5] == ["python3", "-m", "pip", "install", "--no-cache-dir"] and "/opt/hpctrain" in run
    assert run[-2:] == ["hpctrain", "env"]
    # The README says how to build it.
    assert "docker build -f examples/Dockerfile" in (ROOT / "README.md").read_text()
