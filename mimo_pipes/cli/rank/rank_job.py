"""What every rank of ``run`` and ``train`` does around its loop: its groups and layout, the dump of
consumed micro-batches, the progress bar, and the collective save of a state folder."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mimo_pipes.checkpoint import (
    commit_generation,
    discard_generation,
    encode_loader_state,
    loader_file,
    new_generation_id,
    open_generation,
    write_rank_files,
)
from mimo_pipes.cli.job.launcher import report_phase
from mimo_pipes.cli.job.options import JobOptions
from mimo_pipes.cli.job.output_paths import write_failed
from mimo_pipes.cli.rank.stop_signal import StopRequested, StopSignal
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.transport import resolve_exchange_transport
from mimo_pipes.errors import ConfigError, PeerError
from mimo_pipes.exchange import RankLayout
from mimo_pipes.exchange.process_groups import RankGroups, build_rank_groups
from mimo_pipes.exchange.world import (
    agreement_group,
    control_group,
    current_backend,
    gather_from_every_rank,
    job_group,
    largest_over_ranks,
    world_rank,
    world_size,
)
from mimo_pipes.observe.metrics import MovedPerWindow
from mimo_pipes.observe.summary import SUMMARY_ONLY_KEYS, ModuleSummary, summary_document
from mimo_pipes.observe.warning_tally import Snapshot
from mimo_pipes.parallel.topology import RankPosition, Topology
from mimo_pipes.samples.masking import MASKED


@dataclass(frozen=True)
class RankSetup:
    """This rank's place in the job: the topology, its groups, the layout its graph is built for, the
    group of the job's ranks (None: the whole world) and a Gloo group of them for the loop's agreements."""

    topology: Topology
    groups: RankGroups
    layout: RankLayout
    job: Any = None
    control: Any = None

    @property
    def position(self) -> RankPosition:
        return self.groups.position


def set_up_rank(config: PipelineConfig, *, exchange_transport: str | None = None) -> RankSetup | None:
    """Collective over the world: check the config, build every module's groups, and this rank's layout;
    None on a rank beyond the job's (it only took part in making the groups). ``exchange_transport``
    None: resolved from the config and the world's backend."""
    topology = config.validate()
    if topology.world_size > world_size():
        config.validate(world_size=world_size())  # names the first rank missing
    transport = exchange_transport or resolve_exchange_transport(
        config.exchange_transport,
        current_backend(),
        config.reorder.overlap_intra_microbatch_reorder,
        os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        warn=False,  # said once by the job's checks before the ranks started
    )
    groups = build_rank_groups(topology, exchange_backend=transport, timeout_s=config.exchange_timeout_s)
    job, control = job_group(topology.world_size), control_group(topology.world_size)
    # Rows that fail after the exchange are agreed on by every module (rows payload, --skip-bad-samples).
    masks = config.skip_bad_samples and config.exchange_payload == "rows"
    agreement = agreement_group(topology.world_size, config.exchange_timeout_s) if masks else None
    if groups is None:
        return None
    device = None
    if transport == "nccl":
        import torch

        device = torch.device("cuda", torch.cuda.current_device())
    layout = groups.layout(device, agreement)
    report_phase("joined")
    return RankSetup(topology, groups, layout, job, control)


@dataclass(frozen=True)
class RankReport:
    """What a rank hands rank 0 at the end besides its records: its warnings tally (merged there into one
    line per kind), its module's last exchange metrics line (printed there once the bar is closed), where
    it sits, and the samples and bytes its exchange moved for the micro-batches consumed."""

    warnings: Snapshot
    metrics_line: str | None = None
    position: tuple[str, int, int, int] = ("", 0, 0, 0)  # module, dp rank, tp rank, pp rank
    moved: tuple[int, int] = (0, 0)


def moved_by_module(reports: Iterable[RankReport]) -> dict[str, tuple[int, int]]:
    """Each module's (samples, bytes) moved: module-wide figures, so its first rank's."""
    return {report.position[0]: report.moved for report in reports if report.position[1:] == (0, 0, 0)}


def watch_moves(loader: Any) -> MovedPerWindow:
    """What the loader's exchange moves, window by window (nothing without an exchange)."""
    moved = MovedPerWindow()
    exchange = loader.exchange_node() if hasattr(loader, "exchange_node") else None
    if exchange is not None:
        exchange.add_observer(moved)
    return moved


def write_summary_json(path: str, summaries: list[ModuleSummary], moved: dict[str, tuple[int, int]]) -> None:
    """``--summary-json``: the document of :func:`~mimo_pipes.observe.summary.summary_document` (rank 0)."""
    import json

    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(summary_document(summaries, moved), indent=1) + "\n")
    except OSError as error:
        raise write_failed("--summary-json", target, error) from None


def consumed_record(batch: dict[str, Any], position: RankPosition) -> dict[str, Any]:
    """What the run summary keeps of one consumed micro-batch of the rank at ``position``: the
    ``--dump-assignments`` line plus :data:`~mimo_pipes.observe.summary.SUMMARY_ONLY_KEYS`. Under
    ``--skip-bad-samples`` with rows, ``masked_ids`` lists the samples masked in it (samples/masking.py)."""
    record = {
        "module": position.module.name,
        "dp_rank": position.dp_rank,
        "dp_size": position.dp_size,
        "step": batch["step"],
        "sample_ids": batch["sample_ids"],
        "image_tokens": batch["image_tokens"],
        "real_tokens": batch["real_tokens"],
        "slots": batch["slots"],
        "read_steps": batch["read_steps"],
        "tp_rank": position.tp_rank,
        "pp_rank": position.pp_rank,
    }
    if batch.get(MASKED) is not None:
        record["masked_ids"] = [sample for sample, why in zip(batch["sample_ids"], batch[MASKED]) if why is not None]
    return record


class AssignmentDump:
    """``--dump-assignments DIR``: ``DIR/rank{r}.jsonl``, one line per consumed micro-batch (appended to on resume)."""

    def __init__(self, options: JobOptions, rank: int) -> None:
        self.file: IO[str] | None = None
        self.path = Path(options.dump_assignments or ".") / f"rank{rank}.jsonl"
        if options.dump_assignments is not None:
            try:
                os.makedirs(options.dump_assignments, exist_ok=True)
                self.file = open(self.path, "a" if options.resume else "w", buffering=1)
            except OSError as error:
                raise write_failed("--dump-assignments", self.path, error) from None

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            import json

            try:
                self.file.write(json.dumps({k: v for k, v in record.items() if k not in SUMMARY_ONLY_KEYS}) + "\n")
            except OSError as error:
                self._drop()
                raise write_failed("--dump-assignments", self.path, error) from None

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError as error:
                raise write_failed("--dump-assignments", self.path, error) from None

    def _drop(self) -> None:
        """Close after a failed write without flushing again (the same error, raised from ``close``)."""
        file, self.file = self.file, None
        if file is not None:
            with contextlib.suppress(OSError):
                file.close()


def progress_bar(enabled: bool, total: int, initial: int, desc: str = "micro-batches", unit: str = "mb") -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)


def save_state(
    setup: RankSetup,
    directory: str,
    loader_state: dict[str, Any],
    settings: dict[str, Any],
    consumed: int,
    extra_files: dict[str, bytes] | None = None,
) -> None:
    """Collective over the job: one checkpoint generation. Every rank writes its files into the new
    generation's folder, the ranks tell rank 0 what they wrote (or why they could not), and rank 0 commits
    the generation only if every rank wrote all of its files. Either way every rank learns the outcome; a
    save that did not complete raises ConfigError naming ``--save-state``, the rank and the file, on every
    rank, and the folder keeps its previous generation. ``extra_files``: this rank's other files by name
    (a trainer's model state)."""
    rank = world_rank()
    generation = _agreed(new_generation_id() if rank == 0 else None, setup)[0]
    files = {loader_file(rank): encode_loader_state(generation, rank, loader_state), **(extra_files or {})}
    try:
        outcome: tuple[str, Any] = ("written", write_rank_files(directory, generation, files))
    except OSError as error:
        outcome = ("failed", _os_error(error, directory))
    outcomes = _agreed(outcome, setup)
    failed = [(r, message) for r, (status, message) in enumerate(outcomes) if status != "written"]
    verdict: tuple[str, str] | None = None
    if rank == 0:
        if not failed:
            written = {name: digest for _, digests in outcomes for name, digest in digests.items()}
            try:
                commit_generation(directory, generation, consumed=consumed, world_size=setup.topology.world_size,
                                  layout=[module.spec for module in setup.topology.modules], settings=settings, files=written)
                verdict = ("committed", "")
            except OSError as error:
                failed = [(0, _os_error(error, directory))]
        if failed:
            discard_generation(directory, generation)
            verdict = ("failed", f"rank {failed[0][0]} {failed[0][1]}; {_kept(directory)}")
    status, message = _agreed(verdict, setup)[0]
    if status != "committed":
        raise ConfigError("--save-state", f"the state after {consumed} micro-batches was not saved: {message}")


def _agreed(value: Any, setup: RankSetup) -> list[Any]:
    """Every rank's ``value``; a rank gone in the middle of a save is a PeerError (the folder keeps its
    previous generation: nothing was committed)."""
    try:
        return gather_from_every_rank(value, setup.control)
    except RuntimeError as error:
        raise PeerError(None, f"a rank stopped during the save of the state ({error}); the state folder keeps its previous state") from error


def _os_error(error: OSError, directory: str) -> str:
    where = error.filename or directory
    return f"could not write {where} ({error.strerror or error})"


def _kept(directory: str) -> str:
    try:
        previous = open_generation(directory, flag="--save-state")
    except ConfigError:
        return f"{directory} holds no complete state"
    return f"{directory} keeps the complete state saved after {previous.consumed} micro-batches"


class StopAtBoundary:
    """Reads SIGTERM / SIGINT at every micro-batch (or iteration) boundary of a rank's loop.

    ``saving``: the job saves its state on a stop, so every rank must stop at the same boundary: the ranks
    agree at each boundary (the largest signal any rank received, one small all-reduce over the control
    group). Without it each rank stops on its own signal."""

    def __init__(self, setup: RankSetup, saving: bool) -> None:
        self.setup = setup
        self.saving = saving
        self.signal = StopSignal()

    def __enter__(self) -> StopAtBoundary:
        self.signal.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.signal.__exit__(*exc_info)

    def requested(self) -> int:
        """The signal to stop for (0: go on); collective when saving."""
        local = self.signal.signum or 0
        return largest_over_ranks(local, self.setup.control) if self.saving else local


def stop_job(signum: int, saved: str | None, consumed: int) -> StopRequested:
    """The rank's exception for a stop (``saved``: where a complete state of ``consumed`` micro-batches went)."""
    if saved is not None:
        report_phase("saved", consumed)
    return StopRequested(signum, saved)
