"""A dataset row processed after the exchange into one module's fields only: :class:`ModuleProcessor`.

With ``--exchange-payload rows`` every module counts each row before the exchange
(:class:`~mimo_pipes.data.processing.row_counter.RowCounter`); the rank that trains on the row then processes
it (:meth:`ModuleProcessor.__call__`) into its module's fields (:mod:`mimo_pipes.samples.module_fields`): the
language module from the text and the image sizes alone (the compact layout the row carries, or its headers:
:mod:`~mimo_pipes.data.processing.row_layout`), an encoder module by processing the row. Either way the result
is, field for field and bit for bit, what :class:`~mimo_pipes.data.processing.processor.SampleProcessor` makes
of the row with the module's other fields dropped (a test holds every family to it).
"""

from __future__ import annotations

import numpy as np

from mimo_pipes.data import bad_rows
from mimo_pipes.data.processing.conversation import row_videos
from mimo_pipes.data.processing.media_sizes import MediaSizes, media_sizes
from mimo_pipes.data.processing.processor import CONSUMED_KEYS, SampleProcessor, token_fields
from mimo_pipes.data.processing.row_layout import IDS, RUNS, TRAINED, compact_layout, expanded, header_layout, row_name
from mimo_pipes.data.storage.s3_url import is_s3
from mimo_pipes.errors import SampleError
from mimo_pipes.samples.handover import for_caller
from mimo_pipes.samples.module_fields import ModuleFields
from mimo_pipes.samples.sample import IMAGE_TOKENS, PLACEHOLDER_RUNS, TOKEN_LAYOUT, Sample


class ModuleProcessor:
    """Makes ``fields``' part of a row after the exchange (see the module doc): ``processor(row)``, and
    :meth:`stand_in` for a row whose processing failed. Picklable (for worker processes); safe to call from
    several threads."""

    def __init__(self, processor: SampleProcessor, fields: ModuleFields | None = None) -> None:
        self.processor = processor
        self.fields = fields or ModuleFields()

    @bad_rows.names_place
    def __call__(self, row: dict) -> Sample:
        """This module's fields of ``row`` (a row :meth:`RowCounter.count
        <mimo_pipes.data.processing.row_counter.RowCounter.count>` made, or a plain one), and every key the
        processor passes through."""
        layout = row.get(TOKEN_LAYOUT)
        if TOKEN_LAYOUT in row or PLACEHOLDER_RUNS in row:
            row = {key: value for key, value in row.items() if key not in (TOKEN_LAYOUT, PLACEHOLDER_RUNS)}
        if self.fields.pixels:
            return for_caller(self.fields.select(self.processor(row)), self.processor.owner)
        if layout is None:
            try:
                layout = compact_layout(*header_layout(self.processor, row), self.processor.placeholder_ids)
            except SampleError:
                raise
            except Exception:  # noqa: BLE001 - no cheap size: processed, as it was for its cost
                return for_caller(self.fields.select(self.processor(row)), self.processor.owner)
        out = {key: value for key, value in row.items() if key not in CONSUMED_KEYS}
        out.update(token_fields(*expanded(layout)))
        out.update((name, value) for name, value in layout.items() if name not in (IDS, TRAINED, RUNS))
        return for_caller(out, self.processor.owner)

    def start_fetches(self, row: dict) -> None:
        """Starts fetching the image files ``row`` names by path under an ``s3://`` image folder, when this module
        processes pixels (rows keep paths across the exchange with ``--exchange-image-paths``); returns at once."""
        folder = self.processor.image_folder
        if self.fields.pixels and is_s3(folder):
            from mimo_pipes.data.storage.s3_images import prefetch_media

            prefetch_media(row, str(folder))

    def counted_rows(self, row: dict) -> int | None:
        """The rows of ``pixel_values`` processing ``row`` gives, from its image tokens counted before the exchange
        (the image processor's own resize rule on its header sizes); None where that does not tell (no pixels in
        this module, a family other than patches, videos, no count)."""
        tokens = row.get(IMAGE_TOKENS)
        family = self.processor.family
        if not self.fields.pixels or not isinstance(tokens, int) or getattr(family, "name", None) != "qwen2-vl" or row_videos(row):
            return None
        return tokens * family.merge_size ** 2

    @bad_rows.names_place
    def stand_in(self, row: dict) -> Sample:
        """What this module trains on in place of ``row`` when processing it failed after the exchange (see
        :mod:`mimo_pipes.samples.masking`): an encoder processes the row with every image and video blank
        (black, of its header's size, so its fields have the shapes its cost was counted for); the language
        module's fields need no pixel, so they are the row's own. Raises when the sizes cannot be read."""
        if not self.fields.pixels:
            return self(row)
        sizes = media_sizes(row, self.processor.image_folder, row_name(row))
        return self(_with_blank_media(row, sizes))


def _with_blank_media(row: dict, sizes: MediaSizes) -> dict:
    """``row`` with its images and videos (under whichever key it keeps them) black, at their sizes."""
    from PIL import Image

    out = dict(row)
    images = [Image.new("RGB", (width, height)) for height, width in sizes.images]
    videos = [np.zeros((frames, height, width, 3), dtype=np.uint8) for frames, height, width in sizes.videos]
    for keys, blank in ((("images", "image"), images), (("videos", "video"), videos)):
        key = keys[0] if row.get(keys[0]) is not None else keys[1]
        if row.get(key) is not None:
            out[key] = blank if isinstance(row[key], (list, tuple)) else blank[0]
    return out
