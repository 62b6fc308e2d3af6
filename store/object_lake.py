"""The lake on object storage (`s3://bucket/prefix`, or any fsspec URL): compaction that
commits exactly once with no rename, and the committed parts that readers read.

Writers stay local: the spool is on each host's disk, as ever (docs/spool.md). Compaction stages
a batch of complete spool files as Parquet with the local lake's DuckDB pass
(`lake.stage_batch`), uploads each part under a name no other run uses
(`<table>/day=D/part-<stem>-<token>-<i>.parquet`), and then commits them by *creating*
`_commits/<seq>.json` (a conditional put, `If-None-Match: *` on S3): the commit names its parts
and the spool files (stems) they came from. Only then are the spool files removed.

- Readers list `_commits/` and read exactly the parts the commits name. A part no commit names
  (its compactor was killed before committing, or lost a race) is never read, and a later
  compaction deletes it once it is older than `orphan_grace_s`.
- A spool file is committed at most once: a compactor reads every commit before creating the
  next number and leaves out the files one already names; when its put finds the number taken
  (another host committed first) it reads the new commits and tries the next number. A file
  found committed is removed from the spool without a second upload (its compactor was killed
  between the commit and the unlink).
- One compaction at a time per home still holds the local lock (`lake.compaction_lock`); hosts
  compacting their own spools into one URL at once are ordered by the conditional put alone.

The store must honour the conditional create (AWS S3, MinIO, moto, GCS through gcsfs, a local
or memory filesystem); docs/object_storage.md says what is and is not supported.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import duckdb
from tracegym.store.home import Home, read_json, write_json
from tracegym.store.lake import (
    STAGING_DIR,
    CompactionReport,
    StagedPart,
    _drop_partial_tail,
    _new_staging,
    batches,
    compaction_lock,
    complete_spool_files,
    lake_dir,
    stage_batch,
)

LAKE_URL_ENV = "TRACEGYM_LAKE_URL"
COMMITS_DIR = "_commits"
TABLES = ("spans", "outcomes", "nightly")
ORPHAN_GRACE_S = 3600.0  # an uncommitted part younger than this may be a live compactor's
MAX_CONFLICTS = 1000  # each conflict is another compactor's commit: progress, but bounded
_COMMIT_NAME = re.compile(r"^([0-9]{20})\.json$")
_CHECKPOINT_NAME = re.compile(r"^([0-9]{20})\.checkpoint\.json$")
CHECKPOINT_EVERY = 100  # a checkpoint after commits 99, 199, ...: readers read one, not 100
MISSING_FSSPEC = "the object lake needs fsspec (and s3fs for s3://): pip install 'tracegym[s3]'"


class CommitConflict(RuntimeError):
    """A commit's sequence number kept being taken (more than MAX_CONFLICTS times)."""


@dataclass(frozen=True)
class LakeConfig:
    """Where a home's lake lives when it is not `<home>/lake`: the home's `lake.json`.

    `storage_options` go to fsspec as they are (an endpoint, a region, a profile name);
    credentials belong in the environment (AWS_ACCESS_KEY_ID ...), not in this file. `cache`:
    readers keep a copy of each committed part they read under `<home>/cache/lake/` (parts never
    change once committed, so a copy never goes stale) and DuckDB reads the copies."""

    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)
    cache: bool = True
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "url": self.url, "storage_options": self.storage_options,
                "cache": self.cache}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LakeConfig:
        return cls(str(data["url"]), dict(data.get("storage_options") or {}),
                   bool(data.get("cache", True)), int(data.get("version", 1)))  # fmt: skip


def read_config(home: Path) -> LakeConfig | None:
    """The home's lake.json, or None (the local lake)."""
    data = read_json(Home.at(home).lake_config, None)
    return LakeConfig.from_dict(data) if data else None


def configured(home: Path, url: str | None = None) -> LakeConfig | None:
    """The lake a home's readers and compaction use: `url`, else $TRACEGYM_LAKE_URL, else the
    home's lake.json, else None (the local lake under `<home>/lake`)."""
    saved = read_config(home)
    url = url or os.environ.get(LAKE_URL_ENV) or None
    if url is None:
        return saved
    if saved and saved.url == url:
        return saved
    return LakeConfig(url)


def set_lake(home: Path, config: LakeConfig) -> None:
    """Point `home`'s lake at `config` (lake.json). Refused while the home has a local lake with
    parts in it: those would no longer be read (moving them is not supported)."""
    local = [p for t in TABLES for p in (lake_dir(home) / t).rglob("*.parquet")]
    saved = read_config(home)
    if local and (saved is None or saved.url != config.url):
        raise ValueError(
            f"{home} already has a local lake ({len(local)} parts under {lake_dir(home)}): "
            "a home reads one lake, and moving parts to object storage is not supported"
        )
    write_json(Home.at(home).lake_config, config.to_dict())


@dataclass(frozen=True)
class CommittedPart:
    """A part a commit names: its path under the lake's root, table, source stem and rows."""

    path: str
    table: str
    stem: str
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "table": self.table, "stem": self.stem, "rows": self.rows}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommittedPart:
        return cls(str(data["path"]), str(data["table"]), str(data["stem"]), int(data["rows"]))


@dataclass(frozen=True)
class Commit:
    """One `_commits/<seq>.json`: the parts it adds and the spool files they came from."""

    seq: int
    token: str  # the uploading run's: its parts' names carry it
    parts: tuple[CommittedPart, ...]
    sources: tuple[str, ...]  # spool file stems, each committed exactly once in the lake
    host: str = ""
    created_ns: int = 0
    version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version, "seq": self.seq, "token": self.token, "host": self.host,
            "created_ns": self.created_ns, "sources": list(self.sources),
            "parts": [p.to_dict() for p in self.parts],
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Commit:
        return cls(
            int(data["seq"]), str(data["token"]),
            tuple(CommittedPart.from_dict(p) for p in data["parts"]),
            tuple(str(s) for s in data["sources"]), str(data.get("host", "")),
            int(data.get("created_ns", 0)), int(data.get("version", 1)),
        )  # fmt: skip


@dataclass(frozen=True)
class Snapshot:
    """Every commit found by one listing, in sequence order: what a reader reads."""

    commits: tuple[Commit, ...]

    @property
    def next_seq(self) -> int:
        return self.commits[-1].seq + 1 if self.commits else 0

    def stems(self) -> set[str]:
        return {stem for commit in self.commits for stem in commit.sources}

    def parts(self, table: str | None = None) -> list[CommittedPart]:
        return [p for c in self.commits for p in c.parts if table is None or p.table == table]


@dataclass
class ObjectCompactionReport(CompactionReport):
    """What one compaction into an object lake did, beyond the local lake's counts."""

    commits: int = 0
    conflicts: int = 0  # puts that found their sequence number taken by another compactor
    already_committed: int = 0  # spool files a commit already named: removed, not re-uploaded
    orphans_removed: int = 0  # uncommitted parts older than the grace period, deleted


class ObjectLake:
    """A lake under an fsspec URL: its commits, its parts' URLs, uploads and the commit put."""

    def __init__(self, config: LakeConfig) -> None:
        try:
            import fsspec
        except ImportError:
            raise ImportError(MISSING_FSSPEC, name="fsspec") from None
        self.config = config
        self.fs, root = fsspec.core.url_to_fs(config.url, **config.storage_options)
        self.root = root.rstrip("/")
        self.local = "file" in _protocols(self.fs)
        self._commits: dict[int, Commit] = {}  # commits never change once created: cached

    @property
    def url(self) -> str:
        return self.config.url

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def read_url(self, relative: str) -> str:
        """What DuckDB reads for a part: a plain path on a local disk, else the URL its
        registered filesystem (`register`) serves."""
        full = self.path(relative)
        return full if self.local else self.fs.unstrip_protocol(full)

    def local_copies(self, parts: list[CommittedPart], cache: Path) -> list[str]:
        """Paths of local copies of `parts` under `cache`, fetching the missing ones (each into
        a temporary name, then renamed: a reader beside us sees a whole copy or none)."""
        targets = [cache / p.path for p in parts]
        missing = [(p, t) for p, t in zip(parts, targets, strict=True) if not t.exists()]
        if missing:
            temps = [t.with_name(f".{t.name}.{secrets.token_hex(4)}.tmp") for _, t in missing]
            for temp in temps:
                temp.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get([self.path(p.path) for p, _ in missing], [str(t) for t in temps])
                for temp, (_, target) in zip(temps, missing, strict=True):
                    os.replace(temp, target)
            finally:
                for temp in temps:
                    with contextlib.suppress(FileNotFoundError):
                        temp.unlink()
        return [str(t) for t in targets]

    def register(self, con: duckdb.DuckDBPyConnection) -> None:
        """Let `con` read the lake's URLs through fsspec (no DuckDB extension is loaded)."""
        if not self.local:
            con.register_filesystem(self.fs)

    # --- the commit log -------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Every commit, read once each (they are immutable): what is in the lake now. The
        latest checkpoint stands in for the commits it holds (one read, not one per commit)."""
        directory = self.path(COMMITS_DIR)
        try:
            names = self.fs.ls(directory, detail=False, refresh=True)
        except FileNotFoundError:
            names = []
        seqs, checkpoints = {}, {}
        for name in names:
            base = name.rstrip("/").rsplit("/", 1)[-1]
            if match := _COMMIT_NAME.match(base):
                seqs[int(match.group(1))] = name
            elif match := _CHECKPOINT_NAME.match(base):
                checkpoints[int(match.group(1))] = name
        missing = [seq for seq in seqs if seq not in self._commits]
        usable = [c for c in checkpoints if missing and c >= min(missing) and c in seqs]
        if usable:
            self._read_checkpoint(checkpoints[max(usable)])
        new = [name for seq, name in seqs.items() if seq not in self._commits]
        if new:
            for name, data in self.fs.cat(new, on_error="raise").items():
                commit = _parse_commit(name, data)
                self._commits[commit.seq] = commit
        return Snapshot(tuple(self._commits[s] for s in sorted(seqs)))

    def _read_checkpoint(self, name: str) -> None:
        """Take the commits a checkpoint holds; a damaged one is passed over (the commits it
        copies are all still there, each read on its own instead)."""
        with contextlib.suppress(ValueError, KeyError, TypeError, OSError):
            data = json.loads(self.fs.cat_file(name))
            commits = [Commit.from_dict(c) for c in data["commits"]]
            if [c.seq for c in commits] == list(range(int(data["seq"]) + 1)):
                self._commits.update((c.seq, c) for c in commits)

    def write_checkpoint(self, snapshot: Snapshot) -> bool:
        """`_commits/<seq>.checkpoint.json`: every commit up to the last of `snapshot`, so a
        new reader reads one object for them. Its content follows from the commits alone, so
        two compactors writing it write the same; whether this call created it."""
        if not snapshot.commits or snapshot.commits[-1].seq != len(snapshot.commits) - 1:
            return False
        last = snapshot.commits[-1].seq
        data = json.dumps(
            {"version": 1, "seq": last, "commits": [c.to_dict() for c in snapshot.commits]},
            separators=(",", ":"),
        ).encode()
        return self._create(self.path(f"{COMMITS_DIR}/{last:020d}.checkpoint.json"), data)

    def _create(self, target: str, data: bytes) -> bool:
        """Create `target` with `data` unless it exists (a conditional put); whether we did."""
        try:
            if self.local:
                _link_create(target, data)
            else:
                self.fs.pipe_file(target, data, mode="create")
        except FileExistsError:
            return False
        return True

    def create_commit(self, commit: Commit) -> bool:
        """Create `_commits/<seq>.json` unless it exists; whether this call created it."""
        target = self.path(f"{COMMITS_DIR}/{commit.seq:020d}.json")
        data = json.dumps(commit.to_dict(), separators=(",", ":")).encode()
        if not self._create(target, data):
            return False
        # Defence in depth for a store that ignored the condition: read our commit back.
        if not self.local and self.fs.cat_file(target) != data:
            return False
        self._commits[commit.seq] = commit
        return True

    # --- parts ----------------------------------------------------------------------------
    def upload(self, staged: list[StagedPart], token: str) -> list[CommittedPart]:
        """Copy staged parts into the lake under names carrying `token` (never read until a
        commit names them)."""
        parts = [
            CommittedPart(f"{p.table}/{p.day}/part-{p.stem}-{token}-{p.index}.parquet", p.table,
                          p.stem, p.rows)
            for p in staged
        ]  # fmt: skip
        sources = [str(p.path) for p in staged]
        targets = [self.path(p.path) for p in parts]
        if self.local:
            for source, target in zip(sources, targets, strict=True):
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                _fsync(target)
        elif sources:
            self.fs.put(sources, targets)
        return parts

    def remove(self, parts: list[CommittedPart]) -> None:
        """Delete uploaded parts no commit names (a race lost)."""
        if parts:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm([self.path(p.path) for p in parts])

    def vacuum(self, grace_s: float = ORPHAN_GRACE_S) -> int:
        """Delete parts no commit names that are older than `grace_s` (younger ones may be a
        compactor's still on its way to commit); returns how many."""
        self.fs.invalidate_cache()  # listings another process changed since
        referenced = {self.path(p.path) for p in self.snapshot().parts()}
        now = datetime.now(timezone.utc)
        orphans = []
        for table in TABLES:
            try:
                found = self.fs.find(self.path(table))
            except FileNotFoundError:
                continue
            for name in found:
                name = "/" + name.lstrip("/") if self.root.startswith("/") else name
                if not name.endswith(".parquet") or name in referenced:
                    continue
                if _age_s(self.fs.modified(name), now) >= grace_s:
                    orphans.append(name)
        if orphans:
            self.fs.rm(orphans)
        return len(orphans)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _parse_commit(name: str, data: bytes) -> Commit:
    """A commit object; one that does not parse is an error, never skipped (skipping it would
    let its spool files be committed again)."""
    try:
        return Commit.from_dict(json.loads(data))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"damaged lake commit {name}: {exc}") from None


def _age_s(modified: datetime, now: datetime) -> float:
    if modified.tzinfo is None:
        modified = modified.replace(tzinfo=timezone.utc)
    return (now - modified).total_seconds()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_create(target: str, data: bytes) -> None:
    """Create `target` with `data` atomically on a local disk, FileExistsError if it exists:
    a hard link of a complete temporary file (a reader never sees half of a commit)."""
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, target)
    finally:
        os.unlink(tmp)
    with contextlib.suppress(OSError):
        _fsync(folder)


def open_lake(home: Path, url: str | None = None) -> ObjectLake | None:
    """The object lake `home` reads and compacts into (see `configured`), or None."""
    config = configured(home, url)
    return ObjectLake(config) if config else None


def commit_parts(
    lake: ObjectLake, parts: list[CommittedPart], stems: list[str], token: str,
    report: ObjectCompactionReport,
) -> Commit | None:  # fmt: skip
    """Commit `parts` of the spool files `stems`, at the next free sequence number, leaving out
    (and deleting) the parts of any stem another commit names by then; None when none is left."""
    for _ in range(MAX_CONFLICTS):
        snapshot = lake.snapshot()
        taken = snapshot.stems()
        lost = [p for p in parts if p.stem in taken]
        lake.remove(lost)
        parts = [p for p in parts if p.stem not in taken]
        stems = [s for s in stems if s not in taken]
        if not stems:
            return None
        commit = Commit(snapshot.next_seq, token, tuple(parts), tuple(stems),
                        socket.gethostname(), time.time_ns())  # fmt: skip
        if lake.create_commit(commit):
            if (commit.seq + 1) % CHECKPOINT_EVERY == 0:
                lake.write_checkpoint(Snapshot((*snapshot.commits, commit)))
            return commit
        report.conflicts += 1
    raise CommitConflict(f"gave up committing to {lake.url}: {MAX_CONFLICTS} conflicts")


def compact_batch(
    con: duckdb.DuckDBPyConnection, home: Path, lake: ObjectLake, paths: list[Path],
    report: ObjectCompactionReport,
) -> None:  # fmt: skip
    """Commit complete spool files `paths` into `lake` once, then remove them from the spool."""
    committed = lake.snapshot().stems()
    todo = [p for p in paths if p.stem not in committed]
    report.already_committed += len(paths) - len(todo)
    if todo:
        staging = _new_staging(home, todo[0].stem)
        staged = stage_batch(con, staging, todo)
        report.bad_lines += staged.bad_lines
        token = secrets.token_hex(8)
        uploaded = lake.upload(staged.parts, token)
        commit = commit_parts(lake, uploaded, [p.stem for p in todo], token, report)
        if commit is not None:
            report.commits += 1
            report.parts += len(commit.parts)
            report.spans += sum(p.rows for p in commit.parts)
        shutil.rmtree(staging, ignore_errors=True)
    for path in paths:
        path.unlink()  # every one is in a commit now (ours or another's)
    report.files += len(paths)


def compact(
    home: Path,
    lake: ObjectLake,
    con: duckdb.DuckDBPyConnection | None = None,
    *,
    batch_files: int = 64,
    wait: bool = True,
    orphan_grace_s: float = ORPHAN_GRACE_S,
) -> ObjectCompactionReport:
    """Compact every complete spool file under `home` into `lake`, a commit per batch, then
    delete uncommitted parts older than `orphan_grace_s`. Holds the home's local compaction
    lock throughout (`wait` off: returns at once, `busy`, when another process holds it)."""
    home = Path(home)
    report = ObjectCompactionReport()
    ready, report.skipped_live = complete_spool_files(home)
    if not ready:
        return report
    with compaction_lock(home, wait=wait) as held:
        if not held:
            report.busy = True
            return report
        shutil.rmtree(lake_dir(home) / STAGING_DIR, ignore_errors=True)
        ready, report.skipped_live = complete_spool_files(home)
        own = con is None
        con = con or duckdb.connect()
        try:
            for batch in batches(ready, batch_files):
                for path in batch:
                    report.truncated_lines += _drop_partial_tail(path)
                compact_batch(con, home, lake, batch, report)
        finally:
            if own:
                con.close()
        report.orphans_removed = lake.vacuum(orphan_grace_s)
    return report
