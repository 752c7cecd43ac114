"""The run folder's I/O: the append-only log, atomic writes, the lock and the run's tables (docs/run-folder.md)."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import InputError, RunFolderError
from harness.folder_format import ARMS_CSV, LOCK, LOG, PAIRS_CSV, PLAN, TRIALS_CSV
from harness.folder_format import ENV as ENV  # read from here by the env and the report
from harness.safe_fs import create_exclusive, open_no_follow

if TYPE_CHECKING:  # pandas and the statistics load on first use: a trial's worker reads none of them
    import pandas as pd


class NotARunFolder(RunFolderError, ValueError):
    """Raised for a path that is not a run folder (no plan.json)."""


class CorruptRunFolder(RunFolderError):
    """A run folder file that cannot be what it claims (not JSON, a wrong shape or type, a bad log line)."""


class RunFolderBusy(RunFolderError):
    """Another process is running this folder (it holds the folder's lock)."""


class RunFolderWriteError(RunFolderError):
    """A write into the run folder failed (disk full, read-only, …); the folder is as it was before it."""


def encode_row(row: dict[str, Any]) -> bytes:
    """One log line: the row as JSON, non-finite numbers as null."""
    clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
    return (json.dumps(clean, default=_json_default) + "\n").encode()


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def unnameable(path: str | Path) -> str | None:
    """Why no file system can hold ``path`` (empty, or a name longer than the system allows), else None."""
    if str(path) == "":
        return "it is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in str(path)):
        return "it holds a control character"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return "a name in it is longer than the file system allows"
    return None


def check_can_write(folder: str | Path, what: str, instead: str = "give a writable folder") -> Path:
    """``folder`` as a place a run or a report can write in, or ``InputError`` with one line."""
    why = unnameable(folder)
    if why:
        raise InputError(f"{what} '{folder}': {why}; {instead}")
    path = Path(folder)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise InputError(f"{what} '{folder}': '{existing}' is a file, not a folder; {instead}")
    if not os.access(existing, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        reason = "it is on a read-only file system" if read_only else "permission denied"
        raise InputError(
            f"{what} '{folder}': '{existing}' cannot be written ({reason}); give a writable folder"
        )
    return path


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _parse_row(raw: bytes) -> tuple[str | None, dict[str, Any]]:
    """(what is wrong, row) of one log line; the problem is None for a row the log can hold."""
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text", {}
    except (ValueError, RecursionError) as exc:  # ValueError: bad JSON, or an integer past the parser's limit
        return f"not JSON ({_first_line(exc)})", {}
    if not isinstance(row, dict):
        return "not a JSON object", {}
    if "index" not in row:
        return "no 'index' (every row names its trial)", {}
    index = row["index"]
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return f"'index' is {index!r}"[:100] + ", not a whole number of 0 or more", {}
    return None, row


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may take fewer than it was given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def temporary_path(path: Path) -> Path:
    """Where ``write_atomic`` writes first: a name of this process and thread alone, so writers never meet."""
    return path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write a whole file through a temporary file, fsync and a rename."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    path = Path(path)
    tmp = temporary_path(path)
    try:
        fd = create_exclusive(tmp)  # a link left there is removed, never written through
        try:
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise RunFolderWriteError(f"could not write {path}: {exc.strerror or exc}") from None
    return path


def _whole_lines_end(fd: int, size: int) -> int:
    """Where the log's whole lines end (a torn last line lies past it)."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _open_or_fail(path: Path, what: str) -> int:
    """``path`` opened to read and write (made if absent); ``RunFolderWriteError`` naming ``what`` otherwise."""
    try:
        return open_no_follow(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise RunFolderWriteError(f"{what}: {exc.strerror or exc}") from None


class RunFolder:
    """Paths and I/O of one run folder."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(os.path.abspath(path))  # absolute (never resolved): an arm's chdir cannot move it

    @classmethod
    def open(cls, path: str | Path) -> RunFolder:
        """An existing run folder; ``NotARunFolder`` with one clear line otherwise."""
        folder = cls(path)
        why = unnameable(path)
        if why:
            raise NotARunFolder(f"'{path}' is not a run folder: {why}")
        if not folder.path.is_dir():
            raise NotARunFolder(f"'{path}' is not a run folder: no such directory")
        if not (folder.path / PLAN).is_file():
            raise NotARunFolder(f"'{path}' is not a run folder: it has no {PLAN}")
        return folder

    def file(self, name: str) -> Path:
        return self.path / name

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the folder's exclusive lock while the block runs."""
        fd = _open_or_fail(self.file(LOCK), f"cannot lock run folder '{self.path}'")
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
                raise RunFolderBusy(
                    f"run folder '{self.path}' is in use by another run"
                    + (f" (process {holder})" if holder.isdigit() else "")
                    + "; wait for it to end (or stop it), then resume"
                ) from None
            self._lock_fd = fd
            yield
        finally:
            self._lock_fd = None
            os.close(fd)  # releases the lock

    def _check_lock_held(self, row: dict[str, Any]) -> None:
        """``RunFolderBusy`` where this run holds the lock but ``run.lock`` was removed or replaced."""
        fd = getattr(self, "_lock_fd", None)
        if fd is None:
            return
        held = os.fstat(fd)
        try:
            now = os.lstat(self.file(LOCK))
            same = (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)
        except OSError:
            same = False
        if not same:
            raise RunFolderBusy(
                f"{self.file(LOCK)} was removed or replaced under this run, so a second run may write "
                f"{self.path}; stopped before logging trial {row.get('index', -1) + 1}"
            )

    def name_holder(self) -> None:
        """Write this process's id into ``run.lock`` (held by it), for the message a second run gets."""
        try:
            fd = open_no_follow(self.file(LOCK), os.O_WRONLY | os.O_TRUNC)
            try:
                _write_all(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except OSError:  # the lock itself needs no byte on disk
            pass

    def read_json(self, name: str) -> Any:
        """The JSON value of one of the folder's files (None when absent); ``CorruptRunFolder`` unless JSON."""
        path = self.file(name)
        if path.is_symlink():
            raise CorruptRunFolder(
                f"{path}: a symbolic link (a run folder's files are its own, never followed)"
            )
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_bytes().decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise CorruptRunFolder(f"{path}: not JSON ({_first_line(exc)})") from None

    def write_json(self, name: str, data: Any) -> None:
        write_atomic(self.file(name), json.dumps(data, indent=1, default=_json_default) + "\n")

    def append_row(self, row: dict[str, Any]) -> None:
        """Append one trial row to the log and push it to disk (fsync) before returning."""
        line = encode_row(row)
        self._check_lock_held(row)
        path = self.file(LOG)
        fd = _open_or_fail(path, f"could not open {path}")
        try:
            end = _whole_lines_end(fd, os.fstat(fd).st_size)
            try:
                os.ftruncate(fd, end)
                os.lseek(fd, end, os.SEEK_SET)
                _write_all(fd, line)
                os.fsync(fd)
            except OSError as exc:
                try:
                    os.ftruncate(fd, end)
                    os.fsync(fd)
                except OSError:
                    pass
                raise RunFolderWriteError(
                    f"could not append trial {row.get('index', -1) + 1}'s row to {path}: {exc.strerror or exc}"
                ) from None
        finally:
            os.close(fd)

    def rows(self) -> list[dict[str, Any]]:
        """Every complete row of the log, in the order written (see ``numbered_rows``)."""
        return [row for _, row in self.numbered_rows()]

    def numbered_rows(self) -> list[tuple[int, dict[str, Any]]]:
        """(line number, row) for every complete row of the log."""
        path = self.file(LOG)
        if not os.path.lexists(path):
            return []
        if path.is_symlink() or not path.is_file():
            raise CorruptRunFolder(f"{path}: not a regular file (a run's log is one, written by the run)")
        lines = path.read_bytes().split(b"\n")
        lines.pop()  # what follows the last newline: nothing, or a torn line
        rows: list[tuple[int, dict[str, Any]]] = []
        for number, raw in enumerate(lines, start=1):
            problem, row = _parse_row(raw)
            if problem is not None:
                raise CorruptRunFolder(f"{path}: line {number}: {problem}")
            rows.append((number, row))
        return rows

    def completed_indices(self) -> set[int]:
        return {int(r["index"]) for r in self.rows()}

    def trials(self) -> pd.DataFrame:
        """The log as a tidy table, one row per trial, in schedule order."""
        import pandas as pd

        frame = pd.DataFrame(self.rows())
        if not frame.empty:
            frame = frame.sort_values("index", kind="stable").reset_index(drop=True)
        return frame

    def write_text(self, name: str, text: str) -> Path:
        """Write a text file through ``write_atomic``."""
        return write_atomic(self.file(name), text)

    def write_csv(self, name: str, frame: pd.DataFrame) -> Path:
        """Write a table as CSV through ``write_atomic``."""
        return write_atomic(self.file(name), frame.to_csv(index=False))


class Summaries:
    """The tidy tables of a run, derived from its log and its protocol options (nothing here is written)."""

    def __init__(self, trials: pd.DataFrame, arms: pd.DataFrame, pairs: pd.DataFrame, claims: pd.DataFrame):
        self.trials, self.arms, self.pairs, self.claims = trials, arms, pairs, claims

    def csv_tables(self, paired: bool = True) -> dict[str, pd.DataFrame]:
        """The tables written beside the log: the trials, and for a paired run arms, pairs and claims."""
        if not paired:
            return {TRIALS_CSV: self.trials}
        from harness.stats import claim_tables  # loaded already: these summaries came from the statistics

        return {
            TRIALS_CSV: self.trials,
            ARMS_CSV: self.arms,
            PAIRS_CSV: self.pairs,
            **claim_tables(self.claims),
        }


def summarize_trials(trials: pd.DataFrame, protocol: Any) -> Summaries:
    """Every summary of a run, computed once from its trial log and its ``ProtocolOptions``."""
    from harness import stats

    arms = stats.arm_table(trials)
    pairs = stats.pair_table(trials)
    planned = protocol.pairs if isinstance(protocol.pairs, int) else None  # None: --pairs auto
    claims = stats.claim_table(pairs, stats.ClaimSettings.from_protocol(protocol), planned, trials)
    return Summaries(trials, arms, pairs, claims)
