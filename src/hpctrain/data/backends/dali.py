"""The ``dali`` backend: an NVIDIA DALI pipeline decodes each crop's region, resizes and mirrors it.

The pipeline is fed by ``fn.external_source`` in batch mode with hpctrain's own requests: batch k of a pass holds
the samples `EpochPlan` (training) or `eval_requests` (validation) give step k, read through `EncodedImages.read` by
DALI's parallel Python workers (one batch per worker, `LoaderConfig.workers` of them), together with each sample's
crop window chosen by hpctrain's `CropSpec` from the image header. So the crops are the same pure functions of
(seed, epoch, sample index) as the cpu backend's, and a pass started at any step reads exactly the batches an
uninterrupted one reads: exact resume without DALI's own checkpointing.

``fn.decoders.image_slice`` decodes only the window (``device="mixed"`` on a GPU: nvJPEG and the hardware JPEG
decoder where the GPU has one; ``device="cpu"`` otherwise, which is how the tests run it), ``fn.resize`` resizes it
to the output size (linear, antialiased) and ``fn.flip`` mirrors it when the crop says so. The pipeline's output is
the uint8 NHWC batch every backend hands to `to_device`, which normalizes it as for the other backends.

Bad images: a sample that cannot be read or whose header cannot be parsed becomes an all-zero image labelled
IGNORE_LABEL with ``--skip-bad-images`` (an error naming it otherwise), as in the cpu backend. A file whose header
parses but whose data DALI cannot decode stops the pass (DALI cannot skip a sample inside a batch); the error
names the file (found by the CPU decoder) and the fix.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from hpctrain.data.backends.encoded import RequestTable, read_window
from hpctrain.data.decode import BadImageError, CropSpec, decode_crop
from hpctrain.data.loader import (
    IGNORE_LABEL,
    Batch,
    BatchRequest,
    Batches,
    ImageFolderSource,
    LoaderConfig,
    TrainRequests,
    check_shared_memory,
)
from hpctrain.errors import UserError


class DaliFeed:
    """The external source's callback: batch `info.iteration` -> (bytes, crop anchors, crop shapes, flips, ok).

    Picklable (DALI's workers are started with spawn on a GPU); a bad sample is replaced by a small black JPEG and
    marked not ok.
    """

    def __init__(self, images, spec: CropSpec, seed: int, table: RequestTable) -> None:
        self.images, self.spec, self.seed, self.table = images, spec, seed, table

    def __call__(self, info) -> tuple[list[np.ndarray], ...]:
        if info.iteration >= len(self.table):
            raise StopIteration
        columns: tuple[list[np.ndarray], ...] = ([], [], [], [], [])
        for index in self.table[info.iteration].tolist():
            try:
                window = read_window(self.images, index, self.spec, self.seed, self.table.epoch)
                data, crop, ok = window.data, window.crop, 1
            except BadImageError:
                data, crop, ok = _black_jpeg(), _black_crop(), 0
            encoded, anchor, shape, flip, good = columns
            encoded.append(np.frombuffer(data, dtype=np.uint8))
            anchor.append(np.array([crop.top, crop.left], dtype=np.int32))
            shape.append(np.array([crop.height, crop.width], dtype=np.int32))
            flip.append(np.array(int(crop.flip), dtype=np.int32))
            good.append(np.array(ok, dtype=np.uint8))
        return columns


class DaliSource(ImageFolderSource):
    """`ImageFolderSource`'s requests and crops, decoded by a DALI pipeline (on `device` when it is a GPU)."""

    def __init__(
        self,
        train,
        val,
        config: LoaderConfig,
        seed: int,
        train_crop=None,
        eval_crop=None,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(train, val, config, seed, train_crop, eval_crop)
        self.device = torch.device(device)

    def train_batches(
        self,
        plan,
        epoch: int,
        start_step: int,
        rank: int,
        size: tuple[int, int] | None = None,
    ) -> Batches:
        import dataclasses

        crop = dataclasses.replace(self.train_crop, size=size) if size else self.train_crop
        requests = list(TrainRequests(plan, epoch, start_step, rank))
        return self._pass(self.train, crop, requests)

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> Batches:
        from hpctrain.data.loader import eval_requests

        if self.val is None:
            raise UserError("no validation images: add DATA/val/<class>/* or pass --val-path DIR")
        return self._pass(self.val, self.eval_crop, eval_requests(len(self.val), world_size, rank, batch_size))

    def _pass(
        self,
        images,
        spec: CropSpec,
        requests: Sequence[BatchRequest],
    ) -> Batches:
        epoch = requests[0].epoch if requests else 0
        table = RequestTable.of(epoch, [r.indices for r in requests])
        height, width = spec.size
        check_shared_memory(table.max_batch * height * width * 3, self.config)
        batches = self._run(images, spec, table)
        return Batches(batches, len(table), self.config.skip_bad_images)

    def _run(self, images, spec: CropSpec, table: RequestTable) -> Iterator[Batch]:
        if not len(table):
            return
        pipe = self._pipeline(DaliFeed(images, spec, self.seed, table), spec.size, table.max_batch)
        try:
            pipe.build()
            for step in range(len(table)):
                indices = table[step]
                try:
                    pictures, ok = pipe.run()
                except RuntimeError as err:
                    raise _decode_error(images, spec, self.seed, table.epoch, indices, err) from None
                out = _to_torch(pictures, self.device)
                labels = torch.from_numpy(images.labels[indices])
                bad = []
                for slot in np.flatnonzero(np.array(ok.as_tensor()) == 0).tolist():
                    out[slot] = 0
                    labels[slot] = IGNORE_LABEL
                    bad.append(_why_bad(images, int(indices[slot])))
                yield Batch(out, labels, tuple(bad))
        finally:
            del pipe  # stops DALI's worker processes

    def _pipeline(self, feed: DaliFeed, size: tuple[int, int], max_batch: int):
        from nvidia.dali import fn, pipeline_def, types

        gpu = self.device.type == "cuda"
        workers = self.config.workers

        @pipeline_def
        def decode_crop_resize():
            encoded, anchor, shape, flip, ok = fn.external_source(
                source=feed,
                num_outputs=5,
                batch=True,
                batch_info=True,
                parallel=workers > 0,
                dtype=[types.UINT8, types.INT32, types.INT32, types.INT32, types.UINT8],
            )
            pictures = fn.decoders.image_slice(
                encoded,
                anchor,
                shape,
                device="mixed" if gpu else "cpu",
                axis_names="HW",
                output_type=types.RGB,
                adjust_orientation=False,  # the header's size is the stored one, as in the cpu backend
                jpeg_fancy_upsampling=True,
            )  # the same chroma upsampling as libjpeg-turbo's (cpu backend)
            pictures = fn.resize(
                pictures, resize_y=size[0], resize_x=size[1], interp_type=types.INTERP_LINEAR, antialias=True
            )
            return fn.flip(pictures, horizontal=flip), ok

        options = {"py_num_workers": workers, "py_start_method": "spawn" if gpu else "fork"} if workers else {}
        return decode_crop_resize(
            batch_size=max_batch,
            num_threads=max(1, workers),
            seed=self.seed & 0x7FFFFFFF,
            device_id=(self.device.index or torch.cuda.current_device()) if gpu else None,
            prefetch_queue_depth=self.config.prefetch_factor,
            **options,
        )


def _to_torch(pictures, device: torch.device) -> torch.Tensor:
    """A DALI batch of equal-sized HWC uint8 images -> a torch uint8 NHWC tensor on `device` (copied once)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    dense = pictures.as_tensor()
    out = torch.empty(dense.shape(), dtype=torch.uint8, device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(dense, out, cuda_stream=stream)
    return out


def _why_bad(images, index: int) -> tuple[str, str]:
    """(name, message) of a sample the feed found bad (read again here: its message did not travel with it)."""
    try:
        data = images.read(index)
        from hpctrain.data.backends.encoded import header_size

        header_size(data)
    except BadImageError as err:
        return err.path, str(err)
    except Exception as err:
        bad = BadImageError(images.name(index), f"{type(err).__name__}: {err}")
        return bad.path, str(bad)
    return images.name(index), str(BadImageError(images.name(index), "unreadable"))


def _decode_error(
    images,
    spec: CropSpec,
    seed: int,
    epoch: int,
    indices: np.ndarray,
    err: RuntimeError,
) -> UserError:
    """DALI failed on a batch: name the file the CPU decoder also rejects, or the batch's files."""
    height, width = spec.size
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    for index in indices.tolist():
        try:
            decode_crop(images.read(index), images.name(index), spec, seed, epoch, index, pixels)
        except BadImageError as bad:
            return UserError(
                f"{bad.path}: NVIDIA DALI cannot decode this image; replace or delete the file, or "
                "use --data-backend cpu (with --skip-bad-images to train without it)"
            )
    names = ", ".join(images.name(i) for i in indices.tolist()[:3])
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return UserError(f"NVIDIA DALI failed on a batch with {names}, ... ({first}); use --data-backend cpu or nvjpeg")


@functools.cache
def _black_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _black_crop():
    from hpctrain.data.transforms import Crop

    return Crop(0, 0, 8, 8)
