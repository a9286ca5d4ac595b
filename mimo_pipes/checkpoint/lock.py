"""The save lock: one job at a time saves into a state folder.

Two jobs saving into one folder would each commit over the other's generation, and the first would report a
state that is no longer there. A job takes ``DIR/lock`` before any of its ranks starts and gives it back
when it ends; a second job is refused right away, naming the holder. The lock file says which job holds
it (every rank of one torchrun job shares the id), on which host and process; a lock whose process is gone
(the job was killed) is taken over, so no stale lock blocks a restarted job.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from mimo_pipes.errors import ConfigError

LOCK_FILE = "lock"
SAVE_FLAG = "--save-state"


def current_job_id() -> str:
    """This job's id: torchrun's run id and rendezvous address (shared by its ranks), else one of this process."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        address = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}"
        return f"torchrun:{os.environ['TORCHELASTIC_RUN_ID']}@{address}"
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class SaveLock:
    """A held lock; :meth:`release` gives it back if this process took it."""

    path: Path
    job: str
    owner: bool  # this process wrote the lock file (others of its job found it there)

    def release(self) -> None:
        if self.owner and _holder(self.path).get("job") == self.job:
            self.path.unlink(missing_ok=True)


def acquire_save_lock(directory: str | Path, job: str, flag: str = SAVE_FLAG) -> SaveLock:
    """Take ``directory``'s save lock for ``job`` (creating the folder); raises ConfigError naming ``flag``
    when another live job holds it."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(flag, f"cannot create {directory} ({error.strerror or error})") from None
    path = directory / LOCK_FILE
    record = json.dumps({"job": job, "host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")})
    for _ in range(3):  # a stale lock taken over by two jobs at once: one of them finds the other's
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _holder(path)
            if not holder:  # just created by another job, not yet written: look again
                time.sleep(0.2)
                holder = _holder(path)
            if holder.get("job") == job:
                return SaveLock(path, job, owner=False)
            _refuse_a_live_holder(holder, directory, flag)
            path.unlink(missing_ok=True)  # its job is gone (or the file is empty): take it over
            continue
        except OSError as error:
            raise ConfigError(flag, f"cannot write {path} ({error.strerror or error})") from None
        with os.fdopen(descriptor, "w") as file:
            file.write(record)
        return SaveLock(path, job, owner=True)
    raise ConfigError(flag, f"{path} keeps changing: another job is taking the lock")


def check_save_lock_free(directory: str | Path, flag: str = SAVE_FLAG) -> None:
    """Refuse (ConfigError naming ``flag``) when another live job holds ``directory``'s lock; takes nothing:
    a check that can run with the other settings, before the job says anything (it takes the lock later)."""
    holder = _holder(Path(directory) / LOCK_FILE)
    if holder.get("job") != current_job_id():
        _refuse_a_live_holder(holder, Path(directory), flag)


def _refuse_a_live_holder(holder: dict, directory: Path, flag: str) -> None:
    if holder and not _gone(holder):
        raise ConfigError(
            flag,
            f"{directory} is locked by another job saving there (process {holder.get('pid')} on "
            f"{holder.get('host')}, since {holder.get('since')}): two jobs saving into one folder replace each "
            f"other's states. Save elsewhere, or delete {directory / LOCK_FILE} if that job is not running",
        ) from None


def _holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _gone(holder: dict) -> bool:
    """Whether the lock's process has ended (known only on its own host)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, TypeError, ValueError):
        return False
    return False
