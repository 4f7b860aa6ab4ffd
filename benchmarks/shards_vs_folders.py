"""Training input from image folders vs from `hpctrain prepare` shards: same images, same workers, one run.

The shards are made with --keep-size, so both read exactly the same JPEG bytes and produce the same batches;
only the storage differs (one file per image vs one pread per image from a few large tar files). Two figures
per source, alternating (folders, shards, folders, shards, ...) so that load from other processes hits both alike:

  first epoch   seconds for one full training pass (random-resized-crop 224 + flip -> uint8 batches), worker
                start-up included; with --drop-caches (root only) the page cache is dropped before every pass,
                so files come from the disk as on a cold node;
  images/s      the same pass's images per second (median over --rounds).

On a local disk with a warm cache the two should be close (the decode dominates); the difference shows on
network file systems (NFS, Lustre) where each open is a metadata round trip, and with a cold cache.

    python benchmarks/shards_vs_folders.py                       # 600 generated JPEGs, 2 workers, 3 rounds
    python benchmarks/shards_vs_folders.py --data /path/imagenet --limit 20000 --workers 8 --drop-caches
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.data.imagefolder import scan_class_folders
from hpctrain.data.loader import ImageFolderSource, LoaderConfig
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.shards import PrepareConfig, open_prepared, prepare
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from imagenet_input import cpu_model, generate


def one_pass(images, workers: int, batch: int, epoch: int) -> tuple[float, int]:
    started = time.perf_counter()
    source = ImageFolderSource(
        images, None, LoaderConfig(workers=workers), seed=0, train_crop=RandomResizedCrop(), eval_crop=CenterCrop()
    )
    count = 0
    for b in source.train_batches(EpochPlan(len(images), batch, 1, 0), epoch, 0, 0):
        count += b.images.shape[0]
    return time.perf_counter() - started, count


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="an image folder root (DATA/train/<class>/*); default: generate")
    parser.add_argument("--images", type=int, default=600, help="JPEGs to generate (default 600)")
    parser.add_argument("--limit", type=int, help="use only the first N training images of --data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shard-size", type=int, default=10**9, help="bytes per shard (default 1 GB)")
    parser.add_argument("--drop-caches", action="store_true", help="drop the page cache before every pass (root)")
    args = parser.parse_args()
    if args.drop_caches and os.geteuid() != 0:
        parser.error("--drop-caches needs root (it writes /proc/sys/vm/drop_caches)")

    with tempfile.TemporaryDirectory() as tmp:
        root = args.data if args.data else generate(Path(tmp) / "folders", args.images).parent
        folders = scan_class_folders(root / "train")
        if args.limit:
            folders = folders.subset(list(range(min(args.limit, len(folders)))))
            linked = Path(tmp) / "limited" / "train"  # prepare reads folders: link the chosen files only
            for path in folders.paths:
                target = linked / Path(path).parent.name / Path(path).name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(path, target)
            root = linked.parent
            folders = scan_class_folders(root / "train")
        out = Path(tmp) / "shards"
        started = time.perf_counter()
        prepare(PrepareConfig(root, out, max_side=None, shard_size=args.shard_size, workers=max(1, args.workers)))
        prepare_seconds = time.perf_counter() - started
        shards = open_prepared(out).train
        n = len(folders)
        print(
            f"CPU: {cpu_model()}; {n} JPEGs ({sum(map(int, shards.sizes)) / 1e6:.1f} MB) in "
            f"{len(shards.shard_names)} shard(s), prepared (--keep-size, verified) in {prepare_seconds:.1f} s; "
            f"{args.workers} worker processes; batch {args.batch}; page cache "
            f"{'dropped before every pass' if args.drop_caches else 'warm'}"
        )
        for images in (folders, shards):
            one_pass(images, args.workers, args.batch, -1)  # warm-up: imports, lazy init (and the cache)
        times: dict[str, list[float]] = {"folders": [], "shards": []}
        for r in range(args.rounds):
            for name, images in (("folders", folders), ("shards", shards)):
                if args.drop_caches:
                    drop_caches()
                seconds, count = one_pass(images, args.workers, args.batch, r)
                assert count == n, (count, n)
                times[name].append(seconds)
        for name, seconds in times.items():
            rates = [n / s for s in seconds]
            print(
                f"  {name:8s} first epoch {statistics.median(seconds):6.2f} s   {statistics.median(rates):6.0f} "
                f"images/s   (rounds: {', '.join(f'{v:.0f}' for v in rates)})"
            )
        ratio = statistics.median(f / s for f, s in zip(times["folders"], times["shards"]))
        print(f"  shards / folders speed: median {ratio:.2f}x")


if __name__ == "__main__":
    main()
