"""Packed image shards: image folders written once into large WebDataset-style tar files, read by byte offset.

Millions of small files are slow on NFS and Lustre (every open is a metadata round trip); a few hundred 1 GB
files are not. ``hpctrain prepare imagenet SRC OUT`` writes, in OUT:

- ``train-000000.tar``, ``train-000001.tar``, ... and ``val-000000.tar``, ...: plain POSIX tar files in the
  WebDataset layout (each sample is ``<key>.jpg`` or ``.png`` (the image, as its format) followed by ``<key>.cls``
  (its class index as decimal text)), readable by the ``webdataset`` library and by DALI's webdataset reader. The
  key is the sample's position in the split's sorted source list (so a skipped bad image leaves a gap). Member
  headers carry no time stamps, owners or host names: the same SRC and options give the same bytes.
- ``index.json`` (`INDEX_NAME`): format name and version, the options used, and per split the class names in
  training-index order, each shard's name, size and sha256, and per sample (as columns) its shard, the byte
  offset and size of its image data inside the shard, its label and its original path relative to SRC.

Sample i of a split is the i-th packed sample, which, with ``--keep-size`` and no skipped image, is sample i of
the image folders too: the same seed then gives the same batches and crops from either.

The modules, one job each, importing downwards in this order:

- `writer`: `prepare` (resumable, locked, verified at the end) and its options, `PrepareConfig`;
- `encode`: what is stored for each image, encoded in a pool of worker processes;
- `verify`: the whole directory checked against its index (``--verify``), and the `Reporter` of progress;
- `reader`: `open_prepared`, each split as a `ShardImages` read by ``os.pread`` for training;
- `index`: the index format, loaded and checked once, and a shard's members read from its tar headers.
"""

from hpctrain.data.shards.index import INDEX_NAME, is_prepared
from hpctrain.data.shards.reader import PreparedData, ShardImages, open_prepared
from hpctrain.data.shards.verify import Reporter, verify
from hpctrain.data.shards.writer import DEFAULT_JPEG_QUALITY, DEFAULT_MAX_SIDE, PrepareConfig, parse_size, prepare

__all__ = [
    "DEFAULT_JPEG_QUALITY",
    "DEFAULT_MAX_SIDE",
    "INDEX_NAME",
    "PrepareConfig",
    "PreparedData",
    "Reporter",
    "ShardImages",
    "is_prepared",
    "open_prepared",
    "parse_size",
    "prepare",
    "verify",
]
