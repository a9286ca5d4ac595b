"""Is an encoded image whole? A check of its file structure that decodes no pixel.

With ``--exchange-payload rows`` a row is counted from its images' headers before the exchange and decoded
after it, on the rank that trains on it. A file cut after a readable header (or whose body is not what its
header announces) then counts, moves, and fails where it is decoded: too late to replace the row alike on
every module. Under ``--skip-bad-samples`` every module's reading rank therefore checks, before counting,
that each image file is complete (:func:`incomplete_reason`), so the row is replaced before the exchange
like any other bad row, by the same rule on every module (``data/bad_rows/skipping.py``). The check reads the
bytes and walks the format's own framing:

* PNG: the signature, then every chunk's length, type and CRC up to ``IEND``, with at least one ``IDAT``;
* JPEG: the markers from ``SOI`` through the segments to a start of scan, then an ``EOI`` marker at the
  end of the data (trailing zero bytes allowed, as some writers pad);
* GIF: a ``;`` trailer; WebP: a RIFF size that matches the file.

Other formats are not checked here (their header is all that is read before the exchange). What the
framing cannot show (a whole file whose compressed pixels are corrupt) still fails where it is decoded.
"""

from __future__ import annotations

import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG markers that stand alone (no length field): TEM, RST0-7, SOI.
_STANDALONE = {0x01, *range(0xD0, 0xD8), 0xD8}


def incomplete_reason(data: bytes) -> str | None:
    """Why ``data`` is not a whole image file of a checked format, or None (whole, or not checked)."""
    if not data:
        return "is an empty file"
    if data.startswith(PNG_SIGNATURE):
        return _png(data)
    if data.startswith(b"\xff\xd8"):
        return _jpeg(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return None if data.rstrip(b"\x00").endswith(b";") else "is a GIF without its trailer (cut short)"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        size = struct.unpack("<I", data[4:8])[0] + 8
        return None if len(data) >= size else f"is a WebP of {len(data)} bytes whose header announces {size} (cut short)"
    return None


def _png(data: bytes) -> str | None:
    position, images = len(PNG_SIGNATURE), 0
    while True:
        if position + 12 > len(data):
            return f"is a PNG cut short at byte {len(data)} (no IEND chunk)"
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        end = position + 12 + length
        if end > len(data):
            return f"is a PNG cut short inside its {kind.decode('latin-1')!r} chunk at byte {len(data)}"
        (crc,) = struct.unpack(">I", data[end - 4 : end])
        if zlib.crc32(data[position + 4 : end - 4]) != crc:
            return f"is a PNG whose {kind.decode('latin-1')!r} chunk at byte {position} fails its CRC"
        images += kind == b"IDAT"
        if kind == b"IEND":
            return None if images else "is a PNG without image data (no IDAT chunk)"
        position = end


def _jpeg(data: bytes) -> str | None:
    position = 2
    while True:
        if position + 4 > len(data):
            return f"is a JPEG cut short at byte {len(data)} (before its image data)"
        if data[position] != 0xFF:
            return f"is a JPEG with no marker at byte {position} (not a JPEG after its header)"
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in _STANDALONE:
            position += 2
            continue
        if marker == 0xD9:
            return "is a JPEG that ends before its image data"
        (length,) = struct.unpack(">H", data[position + 2 : position + 4])
        if length < 2 or position + 2 + length > len(data):
            return f"is a JPEG cut short inside a segment at byte {len(data)}"
        position += 2 + length
        if marker == 0xDA:  # start of scan: entropy-coded data follows, ended by EOI
            return None if data.rstrip(b"\x00").endswith(b"\xff\xd9") else "is a JPEG cut short (no end-of-image marker)"


def check_row_images(row: dict, image_folder: str | None, sample_id: object) -> None:
    """Raise the row's SampleError (an unreadable image) for the first image item that is not a whole
    file; items that hold pixels already (PIL images, arrays) have nothing to check."""
    from pathlib import Path

    from mimo_pipes.data import bad_rows
    from mimo_pipes.data.processing.conversation import row_images
    from mimo_pipes.data.processing.media import encoded_source
    from mimo_pipes.errors import SampleError

    for k, item in enumerate(row_images(row)):
        try:
            source = encoded_source(item, image_folder, sample_id, f"image {k}")
        except TypeError:
            continue  # decoded already
        data = source.read_bytes() if isinstance(source, Path) else source.getvalue()
        why = incomplete_reason(data)
        if why is not None:
            raise SampleError(sample_id, f"dataset row {sample_id}: image {k} cannot be decoded: it {why}", field="images",
                              kind=bad_rows.UNREADABLE_IMAGE)
