"""The embedded synthetic vision-language SFT dataset.

Every row is one single-turn conversation: a prompt about zero or more images and a response.
The images are real (JPEG-encoded, decoded to PIL by ``datasets``) but cheap to draw: blocks, lines and
rows of dark strokes that stand in for text. What matters for load balancing is their *size mix*,
which follows the shapes seen in document, receipt and mixed SFT data:

=============  =========================================================  ==========
kind           images                                                     share
=============  =========================================================  ==========
``receipt``    one tall, narrow scan, 400-800 x 1000-2400 px, grayscale   15 %
``document``   one A4-like page, 850x1100 up to 1700x2200 px, grayscale   15 %
``chart``      one plot, 600-1200 px wide, aspect 0.5-0.75                15 %
``photo``      one photo, 4:3, 3:2, 16:9, 1:1 or portrait, long side      20 %
               256-1024 px
``thumbnail``  one icon or preview, 24-96 px per side                     10 %
``multi``      2-4 small images (photos, charts, thumbnails; long side    10 %
               at most 512 px)
``text``       no image                                                   15 %
=============  =========================================================  ==========

The kinds are dealt out in exact proportions (largest remainder) and shuffled, so even a small dataset
holds every kind. All randomness comes from :class:`numpy.random.Generator` seeded with ``seed`` (kinds)
and ``(seed, id)`` (each row), so a dataset is a pure function of ``(num_samples, seed)``.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mimo_pipes.observe.third_party import quiet_datasets

KIND_MIX: dict[str, float] = {
    "receipt": 0.15,
    "document": 0.15,
    "chart": 0.15,
    "photo": 0.20,
    "thumbnail": 0.10,
    "multi": 0.10,
    "text": 0.15,
}
"""Share of each kind in a generated dataset (sums to 1)."""

KINDS: tuple[str, ...] = tuple(KIND_MIX)

RECEIPT_WIDTH = (400, 800)
RECEIPT_HEIGHT = (1000, 2400)
DOCUMENT_BASE = (850, 1100)  # width, height of the smallest page (about A4 at 100 dpi)
DOCUMENT_SCALE = (1.0, 2.0)  # pages range from DOCUMENT_BASE up to twice it per side
CHART_WIDTH = (600, 1200)
CHART_ASPECT = (0.5, 0.75)  # height / width
PHOTO_ASPECTS: tuple[tuple[int, int], ...] = ((4, 3), (3, 4), (16, 9), (9, 16), (3, 2), (1, 1))
PHOTO_LONG_SIDE = (256, 1024)
THUMBNAIL_SIDE = (24, 96)
MULTI_COUNT = (2, 4)  # images per multi-image sample, inclusive
MULTI_LONG_SIDE = (160, 512)
JPEG_QUALITY = 85

# Word bank for prompts, responses and the tokenizer's training corpus. Plain English-ish vocabulary.
WORDS: tuple[str, ...] = tuple(
    """
    the a an of to in on at for with from by about over under between after before during and or but
    so if then than this that these those it its they their there here what which who when where why how
    is are was were be been has have had do does did can could will would should may might must
    total amount price item items tax tip cash card change paid due date time store shop market cafe
    coffee tea bread milk eggs apples rice pasta soap paper pens notebook water juice lunch dinner
    page section title heading paragraph table figure note summary report letter form invoice contract
    policy chapter appendix reference footnote signature address name number account balance statement
    chart plot axis value values trend growth decline peak month year quarter week day series bar line
    pie share percent rate average median highest lowest increase decrease compared steady sharp
    photo picture image scene person people child dog cat bird tree trees street road car bus train
    house building window door sky cloud sun beach sea river mountain field park garden city night
    red green blue yellow black white gray orange brown small large tall wide bright dark left right
    top bottom center middle front back near far open closed old new first second third last next
    show shows shown read write describe explain list count find compare extract answer question
    text word words letters line lines row rows column columns cell cells box label legend caption
    good clear simple short long main key important likely visible several many few some all each
    one two three four five six seven eight nine ten hundred thousand
    """.split()
)

_PROMPTS: dict[str, tuple[str, ...]] = {
    "receipt": (
        "What is the total amount on this receipt?",
        "List the items and prices on this receipt.",
        "Extract the store name, the date and the total.",
        "How much tax was paid?",
    ),
    "document": (
        "Summarize this page.",
        "What is the title of this document?",
        "Extract the key points from this page.",
        "Read the first paragraph and explain it.",
    ),
    "chart": (
        "Describe the trend shown in this chart.",
        "Which series has the highest value?",
        "What does the chart compare?",
        "Read the values on the chart.",
    ),
    "photo": (
        "Describe this photo.",
        "What is in the picture?",
        "How many people are visible?",
        "Write a short caption for this image.",
    ),
    "thumbnail": (
        "What does this icon show?",
        "Describe this small image.",
        "Name the main color of this image.",
    ),
    "multi": (
        "Compare these images.",
        "What do these pictures have in common?",
        "Describe each image in order.",
        "Which image shows a chart?",
    ),
    "text": (
        "Explain the difference between a receipt and an invoice.",
        "Write a short summary of the quarter report.",
        "Answer the question about the store policy.",
        "List three key points about the market trend.",
        "Describe a street at night.",
    ),
}

# Response length in words (inclusive range) per kind.
_RESPONSE_WORDS: dict[str, tuple[int, int]] = {
    "receipt": (8, 80),
    "document": (20, 140),
    "chart": (10, 80),
    "photo": (6, 60),
    "thumbnail": (3, 20),
    "multi": (15, 100),
    "text": (30, 260),
}


def random_sentence(rng: np.random.Generator, num_words: int) -> str:
    """``num_words`` words from :data:`WORDS`, with occasional numbers and punctuation."""
    idx = rng.integers(0, len(WORDS), size=num_words)
    numeric = rng.random(num_words) < 0.06
    out = []
    for k in range(num_words):
        if numeric[k]:
            out.append(f"{int(rng.integers(1, 1000))}.{int(rng.integers(0, 100)):02d}")
        else:
            out.append(WORDS[int(idx[k])])
        if k % 11 == 10:
            out[-1] += "," if rng.random() < 0.5 else "."
    text = " ".join(out)
    return text[:1].upper() + text[1:] + "."


def kind_counts(num_samples: int) -> dict[str, int]:
    """How many rows of each kind a dataset of ``num_samples`` rows holds (largest remainder)."""
    shares = np.array([KIND_MIX[k] for k in KINDS], dtype=np.float64) * num_samples
    counts = np.floor(shares).astype(np.int64)
    order = sorted(range(len(KINDS)), key=lambda i: (-(shares[i] - counts[i]), i))
    for i in order[: num_samples - int(counts.sum())]:
        counts[i] += 1
    return {k: int(c) for k, c in zip(KINDS, counts)}


# ----------------------------------------------------------------------------------------------------
# Images


def _uniform_int(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _gray(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(rng.integers(lo, hi + 1))


def _color(rng: np.random.Generator, lo: int = 0, hi: int = 255) -> tuple[int, int, int]:
    c = rng.integers(lo, hi + 1, size=3)
    return int(c[0]), int(c[1]), int(c[2])


def _strokes(draw: ImageDraw.ImageDraw, rng, x0: int, x1: int, y: int, height: int, fill) -> None:
    """A line of 'words': dark bars of random widths separated by gaps, from x0 up to x1."""
    x = x0
    while x < x1:
        w = int(rng.integers(max(3, height), max(4, 6 * height)))
        if x + w > x1:
            break
        draw.rectangle([x, y, x + w, y + height], fill=fill)
        x += w + max(2, height // 2 + int(rng.integers(0, height + 1)))


def _receipt(rng: np.random.Generator) -> Image.Image:
    w, h = _uniform_int(rng, RECEIPT_WIDTH), _uniform_int(rng, RECEIPT_HEIGHT)
    img = Image.new("L", (w, h), _gray(rng, 225, 255))
    d = ImageDraw.Draw(img)
    ink = _gray(rng, 0, 70)
    margin = w // 12
    line_h = int(rng.integers(26, 40))
    text_h = line_h // 3
    # Header: store name, centered and bold.
    d.rectangle([w // 4, margin, 3 * w // 4, margin + 2 * text_h], fill=ink)
    y = margin + 4 * text_h
    while y < h - margin - line_h:
        r = rng.random()
        if r < 0.08:
            for x in range(margin, w - margin, 12):  # dashed separator
                d.line([x, y + text_h // 2, x + 6, y + text_h // 2], fill=ink, width=2)
        elif r < 0.85:
            _strokes(d, rng, margin, w // 2 + int(rng.integers(0, w // 6)), y, text_h, ink)  # item
            d.rectangle([w - margin - int(rng.integers(40, 80)), y, w - margin, y + text_h], fill=ink)  # price
        y += line_h
    return img


def _document(rng: np.random.Generator) -> Image.Image:
    scale = float(rng.uniform(*DOCUMENT_SCALE))
    w = int(round(DOCUMENT_BASE[0] * scale * rng.uniform(0.97, 1.03)))
    h = int(round(DOCUMENT_BASE[1] * scale * rng.uniform(0.97, 1.03)))
    img = Image.new("L", (w, h), _gray(rng, 235, 255))
    d = ImageDraw.Draw(img)
    ink = _gray(rng, 0, 60)
    margin = w // 10
    text_h = max(6, int(round(9 * scale)))
    line_h = int(text_h * rng.uniform(2.0, 2.6))
    d.rectangle([margin, margin, margin + int(w * rng.uniform(0.3, 0.6)), margin + 2 * text_h], fill=ink)
    y = margin + 4 * text_h
    columns = 2 if rng.random() < 0.3 else 1
    col_w = (w - 2 * margin) // columns
    while y < h - margin - line_h:
        if rng.random() < 0.12:  # paragraph break or a figure box
            if rng.random() < 0.3 and y + 12 * line_h < h - margin:
                d.rectangle([margin, y, w - margin, y + 10 * line_h], outline=ink, width=2)
                d.line([margin, y + 10 * line_h, w - margin, y], fill=ink, width=2)
                y += 11 * line_h
            else:
                y += line_h
            continue
        for c in range(columns):
            x0 = margin + c * col_w
            _strokes(d, rng, x0, x0 + col_w - 2 * text_h, y, text_h, ink)
        y += line_h
    return img


def _chart(rng: np.random.Generator, width: int | None = None) -> Image.Image:
    w = width if width is not None else _uniform_int(rng, CHART_WIDTH)
    h = max(16, int(round(w * rng.uniform(*CHART_ASPECT))))
    img = Image.new("RGB", (w, h), _color(rng, 235, 255))
    d = ImageDraw.Draw(img)
    m = max(4, w // 12)
    axis = (40, 40, 40)
    d.line([m, h - m, w - m // 2, h - m], fill=axis, width=2)
    d.line([m, m // 2, m, h - m], fill=axis, width=2)
    for k in range(1, 5):  # grid
        yy = h - m - k * (h - 1.5 * m) / 5
        d.line([m, yy, w - m // 2, yy], fill=(210, 210, 210), width=1)
    n = int(rng.integers(4, 13))
    values = rng.uniform(0.1, 1.0, size=n)
    span_w = (w - 1.5 * m) / n
    if rng.random() < 0.5:  # bars
        color = _color(rng, 30, 200)
        for i, v in enumerate(values):
            x0 = m + i * span_w + span_w * 0.15
            d.rectangle([x0, h - m - v * (h - 1.5 * m), x0 + span_w * 0.7, h - m], fill=color)
    else:  # one or two lines
        for _ in range(int(rng.integers(1, 3))):
            pts = [(m + (i + 0.5) * span_w, h - m - v * (h - 1.5 * m)) for i, v in enumerate(values)]
            d.line(pts, fill=_color(rng, 0, 200), width=3)
            values = np.clip(values + rng.normal(0, 0.15, size=n), 0.05, 1.0)
    _strokes(d, rng, m, w // 2, max(1, m // 6), max(3, m // 5), axis)  # title
    return img


def _photo(rng: np.random.Generator, long_side: tuple[int, int] = PHOTO_LONG_SIDE) -> Image.Image:
    aw, ah = PHOTO_ASPECTS[int(rng.integers(0, len(PHOTO_ASPECTS)))]
    side = _uniform_int(rng, long_side)
    if aw >= ah:
        w, h = side, max(16, int(round(side * ah / aw)))
    else:
        w, h = max(16, int(round(side * aw / ah))), side
    img = Image.new("RGB", (w, h), _color(rng))
    d = ImageDraw.Draw(img)
    horizon = int(h * rng.uniform(0.3, 0.7))
    d.rectangle([0, horizon, w, h], fill=_color(rng))
    for _ in range(int(rng.integers(5, 20))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1 = x0 + int(rng.integers(4, max(5, w // 3)))
        y1 = y0 + int(rng.integers(4, max(5, h // 3)))
        if rng.random() < 0.5:
            d.ellipse([x0, y0, x1, y1], fill=_color(rng))
        else:
            d.rectangle([x0, y0, x1, y1], fill=_color(rng))
    return img


def _thumbnail(rng: np.random.Generator) -> Image.Image:
    w, h = _uniform_int(rng, THUMBNAIL_SIDE), _uniform_int(rng, THUMBNAIL_SIDE)
    img = Image.new("RGB", (w, h), _color(rng))
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(1, 4))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        d.ellipse([x0, y0, x0 + int(rng.integers(3, w + 1)), y0 + int(rng.integers(3, h + 1))], fill=_color(rng))
    return img


def _multi(rng: np.random.Generator) -> list[Image.Image]:
    out = []
    for _ in range(_uniform_int(rng, MULTI_COUNT)):
        r = rng.random()
        if r < 0.5:
            out.append(_photo(rng, MULTI_LONG_SIDE))
        elif r < 0.8:
            out.append(_chart(rng, width=_uniform_int(rng, MULTI_LONG_SIDE)))
        else:
            out.append(_thumbnail(rng))
    return out


def _images_for(kind: str, rng: np.random.Generator) -> list[Image.Image]:
    if kind == "receipt":
        return [_receipt(rng)]
    if kind == "document":
        return [_document(rng)]
    if kind == "chart":
        return [_chart(rng)]
    if kind == "photo":
        return [_photo(rng)]
    if kind == "thumbnail":
        return [_thumbnail(rng)]
    if kind == "multi":
        return _multi(rng)
    if kind == "text":
        return []
    raise ValueError(f"unknown sample kind {kind!r}")


def _encode(img: Image.Image) -> dict:
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return {"bytes": buf.getvalue(), "path": None}


def make_row(sample_id: int, kind: str, seed: int = 0) -> dict:
    """One row of kind ``kind``, a pure function of ``(seed, sample_id, kind)``; images as JPEG bytes."""
    rng = np.random.default_rng([seed, sample_id])
    images = _images_for(kind, rng)
    prompts = _PROMPTS[kind]
    prompt = prompts[int(rng.integers(0, len(prompts)))]
    if rng.random() < 0.3:
        prompt = prompt + " " + random_sentence(rng, int(rng.integers(3, 15)))
    response = random_sentence(rng, _uniform_int(rng, _RESPONSE_WORDS[kind]))
    return {
        "id": sample_id,
        "images": [_encode(im) for im in images],
        "prompt": prompt,
        "response": response,
        "kind": kind,
    }


def dataset_features():
    """The ``datasets.Features`` of a generated dataset."""
    import datasets

    return datasets.Features(
        {
            "id": datasets.Value("int64"),
            "images": datasets.List(datasets.Image()),
            "prompt": datasets.Value("string"),
            "response": datasets.Value("string"),
            "kind": datasets.Value("string"),
        }
    )


def sample_kinds(num_samples: int, seed: int = 0) -> list[str]:
    """The kind of every row of a generated dataset: the mix of :func:`kind_counts`, shuffled by ``seed``."""
    counts = kind_counts(num_samples)
    kinds = np.repeat(np.array(KINDS), [counts[k] for k in KINDS])
    return [str(kind) for kind in np.random.default_rng(seed).permutation(kinds)]


def generate_synthetic_dataset(path: str | Path | None, num_samples: int, seed: int = 0):
    """Generate ``num_samples`` rows deterministically from ``seed``; save to ``path`` if given.

    Returns a :class:`datasets.Dataset` with columns ``id``, ``images`` (decoded to PIL), ``prompt``,
    ``response`` and ``kind``. With ``path``, the dataset is written with ``save_to_disk`` and can be
    reopened with :func:`datasets.load_from_disk`.
    """
    import datasets

    if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    num_samples = int(num_samples)
    kinds = sample_kinds(num_samples, seed)
    rows = [make_row(i, kinds[i], seed) for i in range(num_samples)]
    columns = {key: [r[key] for r in rows] for key in ("id", "images", "prompt", "response", "kind")}
    ds = datasets.Dataset.from_dict(columns, features=dataset_features())
    if path is not None:
        with quiet_datasets():
            ds.save_to_disk(str(path))
    return ds
