"""Checkpoint generations on disk (single process, the ranks' parts of a save played in turn): a save is
visible only once complete, a resume reads only the committed generation's own files, whole; the save lock;
output paths checked before any work; component specs compared by meaning."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
from state_folders import save_job

from mimo_pipes import checkpoint
from mimo_pipes.checkpoint import (
    MANIFEST_FILE,
    acquire_save_lock,
    commit_generation,
    discard_generation,
    encode_loader_state,
    loader_file,
    new_generation_id,
    open_generation,
    read_rank_state,
    write_rank_files,
)
from mimo_pipes.checkpoint import generation as generation_module
from mimo_pipes.cli.job.output_paths import check_output_file, check_output_folder
from mimo_pipes.cli.job.resume_checks import check_resume_dir
from mimo_pipes.cli.main import main
from mimo_pipes.config import PipelineConfig
from mimo_pipes.config.job_options import JobOptions
from mimo_pipes.errors import ConfigError

WORLD = 4
LAYOUT = ["language=tp=1,cp=1,pp=1,dp=2,etp=1,rank_offset=0", "images=tp=1,cp=1,pp=1,dp=2,etp=1,rank_offset=2"]


def rank_states(consumed: int) -> dict[int, dict]:
    """Distinct loader states per rank and per save, so a state of another save is told apart."""
    return {rank: {"num_yielded": consumed, "root": {"rank": rank, "padding": "x" * (40 + 7 * rank)}} for rank in range(WORLD)}


def save(directory, consumed: int, settings: dict | None = None, failing: set[int] = frozenset()) -> bool:
    """The collective save of ``state_save.save_state``, its ranks played in turn: every rank writes its files,
    rank 0 commits only when every rank wrote all of them (else discards the generation). ``failing``:
    ranks whose writes raise OSError. True if committed."""
    generation = new_generation_id()
    written, failed = {}, False
    for rank, state in rank_states(consumed).items():
        try:
            written.update(write_rank_files(directory, generation, {loader_file(rank): encode_loader_state(generation, rank, state)}))
        except OSError:
            failed = True
    if failed:
        discard_generation(directory, generation)
        return False
    commit_generation(directory, generation, consumed=consumed, world_size=WORLD, layout=LAYOUT, settings=settings or {"seed": 1},
                      files=written)
    return True


def restored(directory) -> dict[int, dict]:
    """What every rank would restore (each file checked against the manifest)."""
    found = open_generation(directory)
    found.verify()
    return {rank: found.read_loader_state(rank) for rank in range(found.world_size)}


def test_a_committed_generation_restores_every_rank_and_replaces_the_previous(tmp_path):
    assert save(tmp_path, 3)
    assert restored(tmp_path) == rank_states(3)
    first = open_generation(tmp_path).folder
    assert save(tmp_path, 6)
    assert restored(tmp_path) == rank_states(6)
    assert not first.exists()  # the previous generation's folder is gone once the new one is committed
    assert read_rank_state(tmp_path, 2) == rank_states(6)[2]
    manifest = json.loads((tmp_path / MANIFEST_FILE).read_text())
    assert manifest["consumed_microbatches"] == 6 and manifest["layout"] == LAYOUT
    assert set(manifest["files"]) == {loader_file(rank) for rank in range(WORLD)}


# --- fault injection: every step of a save fails (full disk) or stops (killed process) ------------------


class Killed(BaseException):
    """The process died here: nothing after this step runs (no clean-up either)."""


class Faults:
    """Counts the save's changes to the folder (every write, folder, rename, removal; their names in
    ``steps``) and makes step ``at`` fail: ``full`` writes half of the bytes then raises ENOSPC; ``killed``
    writes half and stops the save there."""

    def __init__(self, monkeypatch, at: int = -1, mode: str = "full") -> None:
        self.at, self.mode, self.steps = at, mode, []
        for name in ("_write_file", "_make_folder", "_replace", "_remove"):
            monkeypatch.setattr(generation_module, name, self._wrap(getattr(generation_module, name), name))

    def _wrap(self, original, name):
        def operation(*args):
            self.steps.append(name)
            if len(self.steps) - 1 != self.at:
                return original(*args)
            if name == "_write_file":
                path, data = args
                with open(path, "wb") as file:
                    file.write(data[: len(data) // 2])  # a torn write
            if self.mode == "killed":
                raise Killed
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))
        return operation


def steps_of_a_save(tmp_path) -> list[str]:
    """The changes one save makes to a folder that already holds a generation (recorded, not assumed)."""
    directory = tmp_path / "count"
    assert save(directory, 3)
    with pytest.MonkeyPatch.context() as patch:
        recorder = Faults(patch)
        assert save(directory, 6)
    return recorder.steps


@pytest.mark.parametrize("mode", ["full", "killed"])
def test_a_save_that_fails_at_any_step_leaves_the_last_complete_generation(tmp_path, mode):
    """At every step of a save over a complete generation, a full disk or a killed process leaves a folder that
    resumes as the previous generation exactly, or, once the commit's rename is done, the new one exactly:
    never a mix of the two, never a torn file. The next save then completes and clears what was left."""
    steps = steps_of_a_save(tmp_path)
    assert steps.count("_write_file") == WORLD + 1 and steps.count("_replace") == 1  # rank files, the manifest
    renamed_at = steps.index("_replace")
    for at in range(len(steps)):
        directory = tmp_path / f"{mode}-{at}"
        assert save(directory, 3)
        with pytest.MonkeyPatch.context() as patch:
            Faults(patch, at, mode)
            try:
                committed = save(directory, 6)
            except (Killed, OSError):  # the process died, or the commit's own clean-up failed
                committed = None
        expected = rank_states(6) if at > renamed_at else rank_states(3)
        assert restored(directory) == expected, (at, steps[at])
        assert committed in (None, at > renamed_at), (at, steps[at])
        assert save(directory, 9) and restored(directory) == rank_states(9)
        leftovers = sorted(path.name for path in directory.iterdir())
        assert leftovers == [open_generation(directory).folder.name, MANIFEST_FILE], leftovers


def test_a_save_failing_on_some_ranks_is_not_committed(tmp_path, monkeypatch):
    assert save(tmp_path, 3)
    original = generation_module._write_file

    def full_on_ranks_1_and_3(path, data):
        if path.name in (loader_file(1), loader_file(3)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        original(path, data)

    monkeypatch.setattr(generation_module, "_write_file", full_on_ranks_1_and_3)
    assert not save(tmp_path, 6)
    assert restored(tmp_path) == rank_states(3)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("generation-")] == [open_generation(tmp_path).folder.name]


# --- what a resume refuses, in one line naming the file -------------------------------------------------


def test_a_rank_file_of_another_save_is_refused_naming_it(tmp_path):
    other = tmp_path / "other"
    assert save(tmp_path / "state", 3) and save(other, 5)
    target = open_generation(tmp_path / "state").folder / loader_file(2)
    shutil.copy(open_generation(other).folder / loader_file(2), target)
    with pytest.raises(ConfigError) as raised:
        restored(tmp_path / "state")
    message = str(raised.value)
    assert message.startswith(f"--resume: {target} ") and "\n" not in message
    assert "is not the file this save wrote" in message or "not this save's file" in message


def test_a_truncated_rank_file_is_refused_naming_it_and_its_size(tmp_path):
    assert save(tmp_path, 3)
    target = open_generation(tmp_path).folder / loader_file(1)
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[: size // 2])
    with pytest.raises(ConfigError, match=rf"^--resume: {target} is {size // 2} bytes, the manifest says {size}: truncated"):
        read_rank_state(tmp_path, 1)
    target.unlink()
    with pytest.raises(ConfigError, match=rf"^--resume: {target} is missing"):
        restored(tmp_path)


def test_a_truncated_manifest_is_one_line_naming_it(tmp_path):
    assert save(tmp_path, 3)
    manifest = tmp_path / MANIFEST_FILE
    manifest.write_text(manifest.read_text()[:40])
    with pytest.raises(ConfigError, match=rf"^--resume: {manifest} is not a complete manifest \(.*\): it was cut short or edited$"):
        open_generation(tmp_path)


def test_an_edited_manifest_and_the_old_format_are_refused(tmp_path):
    assert save(tmp_path / "edited", 3, settings={"seed": 1})
    path = tmp_path / "edited" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["settings"]["seed"] = 2
    path.write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="its settings do not match their digest"):
        open_generation(tmp_path / "edited")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "meta.json").write_text(json.dumps({"format": 2}))
    with pytest.raises(ConfigError, match="holds a state of format 2 .meta.json., saved by an older mimo-pipes"):
        open_generation(tmp_path / "old")
    with pytest.raises(ConfigError, match="holds no saved state"):
        open_generation(tmp_path)


def test_component_specs_are_compared_by_meaning(tmp_path):
    save_job(tmp_path, PipelineConfig(components=("language=tp=1,pp=1,dp=2,rank_offset=0", "images=tp=1,dp=2,rank_offset=2")))
    written_otherwise = PipelineConfig(components=("language=dp=2", "images=dp=2,rank_offset=2,cp=1"))
    assert check_resume_dir(str(tmp_path), written_otherwise, WORLD, JobOptions()) == 3


def test_resume_checks_of_the_cli_are_one_line_before_any_rank_starts(tmp_path, capsys):
    flags = ["--steps", "6", "--micro-batch-size", "4", "--embedded-samples", "48", "--quiet"]
    save_job(tmp_path, PipelineConfig(micro_batch_size=4, embedded_samples=48), JobOptions(progress=False))
    target = open_generation(tmp_path).folder / loader_file(3)
    target.write_bytes(target.read_bytes()[:10])
    assert main(["run", *flags, "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --resume: {target} is 10 bytes"), err
    (tmp_path / MANIFEST_FILE).write_text("{")
    assert main(["run", *flags, "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a complete manifest" in err[0] and "Traceback" not in err[0], err


# --- the save lock ----------------------------------------------------------------------------------------


def test_a_second_job_saving_into_the_folder_is_refused(tmp_path):
    first = acquire_save_lock(tmp_path, "job-a")
    with pytest.raises(ConfigError, match=rf"^--save-state: {tmp_path} is locked by another job saving there \(process {os.getpid()} "):
        acquire_save_lock(tmp_path, "job-b")
    same_job = acquire_save_lock(tmp_path, "job-a")  # another rank of the same torchrun job
    same_job.release()  # not its lock to give back
    with pytest.raises(ConfigError):
        acquire_save_lock(tmp_path, "job-b")
    first.release()
    acquire_save_lock(tmp_path, "job-b").release()


def test_a_lock_left_by_a_killed_job_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    lock = acquire_save_lock(tmp_path, "job-a")
    record = json.loads(lock.path.read_text())
    lock.path.write_text(json.dumps({**record, "pid": int(dead)}))  # its process has exited
    taken = acquire_save_lock(tmp_path, "job-b")
    assert taken.owner and json.loads(taken.path.read_text())["job"] == "job-b"
    taken.release()
    assert not taken.path.exists()


def test_run_refuses_to_save_where_another_job_saves(tmp_path, capsys):
    holder = acquire_save_lock(tmp_path / "state", "another job")
    try:
        assert main(["run", "--steps", "4", "--quiet", "--save-state", str(tmp_path / "state")]) == 2
    finally:
        holder.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --save-state: {tmp_path / 'state'} is locked by another job"), err


# --- output paths, checked before any rank starts --------------------------------------------------------


@pytest.mark.parametrize("flag", ["--save-state", "--dump-assignments", "--tensorboard"])
def test_an_output_folder_that_is_a_file_is_refused_naming_the_flag(tmp_path, capsys, flag):
    existing = tmp_path / "a-file"
    existing.write_text("")
    extra = ["--scalable-dp", "--intra-microbatch-reorder"] if flag == "--tensorboard" else []
    assert main(["run", "--steps", "4", "--quiet", *extra, flag, str(existing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"mimo-pipes run: error: {flag}: {existing} is a file, not a folder"]
    assert main(["run", "--steps", "4", "--quiet", *extra, flag, str(existing / "below")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"mimo-pipes run: error: {flag}: cannot create {existing / 'below'}: {existing} is a file"]


def test_analyze_and_calibrate_check_their_out_before_any_work(tmp_path, capsys):
    existing = tmp_path / "a-file"
    existing.write_text("")
    assert main(["analyze", "--steps", "4", "--quiet", "--out", str(existing)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"mimo-pipes analyze: error: --out: {existing} is a file, not a folder"]
    with pytest.raises(ConfigError, match=f"^--out: {tmp_path} is a folder: give the path of the file to write$"):
        check_output_file(tmp_path, "--out")
    with pytest.raises(ConfigError, match=f"^--out: cannot create {existing / 'model.json'}: {existing} is a file$"):
        check_output_file(existing / "model.json", "--out")


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder no file can be created in: immutable for root (chattr +i), else without write permission."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("root here, and the folder cannot be made immutable")
        yield folder
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        folder.chmod(0o500)
        yield folder
        folder.chmod(0o700)


def test_an_output_folder_that_cannot_be_written_is_refused(read_only_folder, capsys):
    with pytest.raises(ConfigError, match=rf"^--save-state: cannot write {read_only_folder / 'state'}: {read_only_folder} is not writable \("):
        check_output_folder(read_only_folder / "state", "--save-state")
    assert main(["run", "--steps", "4", "--quiet", "--dump-assignments", str(read_only_folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"mimo-pipes run: error: --dump-assignments: cannot write {read_only_folder}: "), err


def test_the_checkpoint_package_exports_what_the_commands_use():
    """The state on disk is the library's; the checks a resume makes of the command line's options are the
    command line's (cli/job/resume_checks.py), so the checkpoint package never names a CLI option."""
    assert {"open_generation", "acquire_save_lock", "read_rank_state", "commit_generation"} <= set(checkpoint.__all__)
    assert not {"check_resume_dir", "resume_settings"} & set(checkpoint.__all__)
