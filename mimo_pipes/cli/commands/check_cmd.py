"""``mimo-pipes check``: every row of a dataset checked as a run would process it, without training.

Takes run's data flags (``--dataset``, ``--processor``, ``--image-folder``, ``--seq-length``), opens the
data and the processor as the default recipe does, and gives every row a verdict
(:class:`~mimo_pipes.data.bad_rows.row_check.RowChecker`) on worker processes, one per core it is given, in
batches whose results are taken in order: the output is the same for any number of workers. Lists every
bad row once (its file and line or row, its dataset row and id, the kind of fault and the reason), then
the counts per kind, the rows whose text gives way to ``--seq-length`` (a count: they are not bad) and
the rows whose sizes no header gives. Exit status 1 when any row is bad, 0 when none is, 2 for bad
configuration (one line naming the flag).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, deque
from collections.abc import Iterator

from mimo_pipes.cli.job.args import add_data_arguments, add_seq_length_argument
from mimo_pipes.cli.job.launcher import EXIT_CONFIG, EXIT_FAILED
from mimo_pipes.config.workers import rank_cores
from mimo_pipes.errors import ConfigError

BATCH_ROWS = 64  # rows a worker checks at a time: small enough to keep both cores busy on small files
IN_FLIGHT_PER_WORKER = 4  # batches submitted ahead of the one awaited: memory bounded by the input's batches
MAX_ID = 60  # characters of a row's id in its line
EXIT_INTERRUPTED = 130  # as a shell reports SIGINT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check every row of a dataset as a run would process it, without training: images readable (headers; "
        "every pixel with --decode) and inside the image folder, the conversation well formed, the image "
        "placeholders the processor makes matching the chat's image markers, and a token left to train on "
        "within --seq-length. Lists every bad row once with its file, line or row and the reason, then the "
        "counts per reason. Exit status: 1 when any row is bad, 0 when none is, 2 for bad configuration."
    )
    add_data_arguments(parser, dataset_required=True)
    add_seq_length_argument(parser)
    parser.add_argument("--decode", action="store_true",
                        help="also decode every image and video frame in full, as processing does: finds files cut short "
                             "after a readable header (slower than reading headers)")
    parser.add_argument("--num-workers", type=int, default=None, metavar="N",
                        help="worker processes that check rows (default: one per core this process may run on)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from mimo_pipes.config import PipelineConfig
    from mimo_pipes.data.bad_rows.row_check import RowChecker
    from mimo_pipes.data.from_config import check_data_settings, image_folder, open_processor
    from mimo_pipes.data.sources.energon_source import is_energon
    from mimo_pipes.data.sources.open_source import check_source
    from mimo_pipes.data.sources.source_rows import open_rows

    try:
        workers = rank_cores() if args.num_workers is None else args.num_workers
        if workers < 1:
            raise ConfigError("--num-workers", f"must be >= 1, got {workers}")
        config = PipelineConfig(dataset=args.dataset, processor=args.processor, image_folder=args.image_folder, seq_length=args.seq_length,
                                split_part=args.split_part)
        config.validate()
        check_data_settings(config)
        check_source(args.dataset, args.split_part)  # a wrong path is said before the processor loads
        processor = open_processor(config)
        source = open_rows(args.dataset, args.split_part)
    except ConfigError as error:
        print(f"mimo-pipes check: error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    if is_energon(args.dataset):  # its images are read from its shards
        images = f"split part {args.split_part!r}; images read from its shards"
    else:
        images = f"image paths resolve inside {image_folder(config)}" + ("" if args.image_folder else " (the dataset's folder; --image-folder sets another)")
    print(f"mimo-pipes check: {args.dataset}: {source.total} rows; processor {args.processor or 'embedded'} "
          f"({processor.family.name}), --seq-length {args.seq_length}; {images}")
    report = Report(source.findings)
    checker = RowChecker(processor, decode=args.decode)
    batches = max(1, -(-source.total // BATCH_ROWS))
    try:
        with _progress(source.total, not args.quiet) as bar:
            bar.update(sum(finding.rows for finding in source.findings))
            for batch, verdicts in _verdicts(source.batches(BATCH_ROWS), checker, min(workers, batches)):
                report.add(batch, verdicts)
                bar.update(len(batch))
    except KeyboardInterrupt:
        print(f"mimo-pipes check: interrupted after {report.checked} of {source.total} rows", file=sys.stderr)
        return EXIT_INTERRUPTED
    for line in report.lines(source, args.seq_length):
        print(line)
    return EXIT_FAILED if report.bad else 0


class Report:
    """What the verdicts found, in the order of the rows."""

    def __init__(self, findings: list) -> None:
        self.findings = list(findings)
        self.bad_rows: list[tuple[int, object, object]] = []  # (dataset row, id, verdict)
        self.truncated: list[tuple[int, int]] = []  # (dataset row, tokens before)
        self.processed: Counter[str] = Counter()
        self.checked = 0

    @property
    def bad(self) -> bool:
        return bool(self.findings or self.bad_rows)

    def add(self, batch: list[tuple[int, dict]], verdicts: list) -> None:
        self.checked += len(batch)
        for (row, values), verdict in zip(batch, verdicts):
            if verdict.bad:
                self.bad_rows.append((row, values.get("id"), verdict))
            elif verdict.truncated_from is not None:
                self.truncated.append((row, verdict.truncated_from))
            if verdict.processed is not None:
                self.processed[verdict.processed] += 1

    def lines(self, source, seq_length: int) -> list[str]:
        from mimo_pipes.data.processing.row_counter import MAX_COST_REASONS, cost_line

        places = source.places([row for row, _, _ in self.bad_rows] + [row for row, _ in self.truncated[:1]])
        entries = [(finding.place, f"{finding.place.text}: {finding.kind}: {finding.reason}") for finding in self.findings]
        for row, ident, verdict in self.bad_rows:
            named = "" if ident is None else f", id {repr(ident)[:MAX_ID]}"
            entries.append((places[row], f"{places[row].text}{named}: {verdict.kind}: {verdict.reason}"))
        lines = [text for _, text in sorted(entries, key=lambda entry: entry[0].order)]
        rows = Counter(verdict.kind for _, _, verdict in self.bad_rows)
        for finding in self.findings:
            rows[finding.kind] += finding.rows
        rows = +rows  # file faults stand for no row
        files = Counter(finding.kind for finding in self.findings if not finding.rows)
        total = self.checked + sum(finding.rows for finding in self.findings)
        bad_files = f"; {sum(files.values())} of {len(source.files or [])} files" if files else ""
        lines.append(f"bad: {sum(rows.values()) or 'none'} of {total} rows{bad_files}")
        for kind, count in sorted(rows.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"{count:>8}  {kind}")
        for kind, count in sorted(files.items(), key=lambda item: (-item[1], item[0])):
            lines.append(f"{count:>8}  {kind} (files)")
        if self.truncated:
            row, before = self.truncated[0]
            gives = "1 row gives" if len(self.truncated) == 1 else f"{len(self.truncated)} rows give"
            lines.append(f"truncated: {gives} way to --seq-length {seq_length}, not bad (later turns first, then "
                         f"the prompt's start and the reply's end; images kept; first: {places[row].text}, {before} tokens)")
        if self.processed:
            reasons = dict(list(self.processed.items())[:MAX_COST_REASONS])
            lines.append(cost_line(sum(self.processed.values()), self.checked, reasons))
        return lines


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    # leave=True: the bar ends with its line (a newline), so the report's first line starts a line of its own
    # where stdout and stderr share a file or pipe (a cleared bar leaves only a carriage return there).
    return tqdm(total=total, desc="check", unit=" rows", file=sys.stderr, dynamic_ncols=True, leave=True, disable=not enabled)


# ----------------------------------------------------------------------------------------------------
# Checking batches, in this process or on worker processes

_CHECKER = None


def _start(checker) -> None:
    global _CHECKER
    _CHECKER = checker


def _check(rows: list[dict]) -> list:
    from mimo_pipes.observe.warning_tally import collected

    with collected():  # a truncation is the verdict's to report, not a warning to log
        return [_CHECKER(row) for row in rows]  # type: ignore[misc]


def _verdicts(batches: Iterator[list[tuple[int, dict]]], checker, workers: int) -> Iterator[tuple[list[tuple[int, dict]], list]]:
    """Each batch with its verdicts, in order."""

    def rows(batch: list[tuple[int, dict]]) -> list[dict]:
        return [dict(values, sample_id=row) for row, values in batch]  # named as the run names them

    if workers == 1:
        _start(checker)
        for batch in batches:
            yield batch, _check(rows(batch))
        return
    import concurrent.futures

    from mimo_pipes.samples.worker_start import worker_context

    # Forked from the worker server, never from this process (which holds the tokenizer's threads).
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=worker_context(), initializer=_start, initargs=(checker,)) as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.submit(_check, rows(batch))))
            if len(pending) >= IN_FLIGHT_PER_WORKER * workers:
                done, future = pending.popleft()
                yield done, future.result()
        while pending:
            done, future = pending.popleft()
            yield done, future.result()
