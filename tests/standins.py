"""STAND-INS for apptainer, enroot and nvidia-smi, which cannot be installed on the test machine. Each is a small
executable put first on PATH that appends its argv (one JSON list per line) to $STANDIN_LOG and behaves as the
real tool does in the documented cases the tests need:

* `apptainer pull DEST docker://...` / `apptainer build DEST DEF`: prints apptainer's INFO lines and writes a file
  that starts like a SIF image (the 32-byte launch line, then `SIF_MAGIC`).
* `enroot import --output DEST docker://...`: prints enroot's [INFO] lines and writes a squashfs-like file (`hsqs`).
  With STANDIN_FAIL=1 both write half a file and exit 255, as an interrupted download does.
* `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`: prints the lines of $STANDIN_GPUS (`index, util,
  memory.used, memory.total` per GPU, the documented CSV form).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROLOGUE = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
fail = os.environ.get("STANDIN_FAIL") == "1"
"""

APPTAINER = (
    PROLOGUE
    + """
dest = sys.argv[2] if sys.argv[2] != "--fakeroot" else sys.argv[3]
print("INFO:    Converting OCI blobs to SIF format")
print("INFO:    Starting build...")
with open(dest, "wb") as out:
    out.write(b"#!/usr/bin/env run-singularity\\n".ljust(32, b"\\0"))
    if fail:
        sys.exit(255)
    out.write(b"SIF_MAGIC\\0" + b"\\0" * 4096)
print(f"INFO:    Creating SIF file...")
"""
)

ENROOT = (
    PROLOGUE
    + """
assert sys.argv[1] == "import" and sys.argv[2] in ("-o", "--output"), sys.argv
print(f"[INFO] Querying registry for permission grant")
print(f"[INFO] Fetching image manifest list")
with open(sys.argv[3], "wb") as out:
    if fail:
        out.write(b"\\0" * 100)
        sys.exit(255)
    out.write(b"hsqs" + b"\\0" * 8192)
"""
)

NVIDIA_SMI = (
    PROLOGUE
    + """
print(os.environ.get("STANDIN_GPUS", "").replace(";", "\\n"))
"""
)


def install(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("apptainer", APPTAINER), ("enroot", ENROOT), ("nvidia-smi", NVIDIA_SMI)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
