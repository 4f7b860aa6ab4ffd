"""`verify`: a prepared directory checked against its index, byte for byte (``hpctrain prepare --verify``, and
the last step of every `prepare`); and `Reporter`, the progress both report through.

Every shard's size and sha256 must match the index, and each sample's offset and size must be those of its
image member in the tar (its class member saying its label).
"""

from __future__ import annotations

import os
from pathlib import Path

from hpctrain.data.shards.index import INDEX_NAME, load_index, shard_members
from hpctrain.errors import UserError
from hpctrain.fsutil import sha256_file


class Reporter:
    """What `prepare` and `verify` tell the user; the CLI's rich progress bar implements it, tests pass a silent
    one."""

    def start(self, split: str, total: int, done: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def note(self, message: str) -> None: ...


def verify(root: str | os.PathLike, reporter: Reporter | None = None) -> int:
    """Check a prepared directory against its index: every shard's size and sha256, and that each sample's offset
    and size are those of its image member (and its class member says its label). Returns the samples checked."""
    reporter = reporter or Reporter()
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such directory; give the OUT directory of `hpctrain prepare imagenet SRC OUT`")
    index = load_index(root)
    checked = 0
    for split, entry in index["splits"].items():
        samples = entry["samples"]
        reporter.start(f"verify {split}", len(samples["shard"]), 0)
        by_shard: dict[int, list[int]] = {}
        for i, shard in enumerate(samples["shard"]):
            by_shard.setdefault(shard, []).append(i)
        for number, shard in enumerate(entry["shards"]):
            path = root / shard["name"]
            fix = (
                f"delete it and rerun `hpctrain prepare imagenet SRC {root}` with the same options "
                "(it rebuilds from the first missing shard), or copy the shard again"
            )
            if not path.is_file():
                raise UserError(f"{path}: shard missing; {fix}")
            if path.stat().st_size != shard["bytes"] or sha256_file(path).sha256 != shard["sha256"]:
                raise UserError(f"{path}: corrupted shard (its size or sha256 differs from {INDEX_NAME}); {fix}")
            members = {offset: (size, label) for (offset, size), label in shard_members(path).values()}
            for i in by_shard.get(number, []):
                if members.get(samples["offset"][i]) != (samples["size"][i], samples["label"][i]):
                    raise UserError(
                        f"{path}: {INDEX_NAME} places sample {samples['path'][i]} at byte "
                        f"{samples['offset'][i]}, where the shard holds no such member; {fix}"
                    )
            if len(members) != shard["samples"]:
                raise UserError(f"{path}: holds {len(members)} samples, {INDEX_NAME} says {shard['samples']}; {fix}")
            reporter.advance(len(by_shard.get(number, [])))
            checked += len(by_shard.get(number, []))
    return checked
