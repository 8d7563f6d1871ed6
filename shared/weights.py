"""Filesystem weight transport: versioned, immutable weight directories under one root.

Where it sits: the trainer publishes weights for param version v with `publish`; the
controller tells rollout workers "load v"; each worker resolves `path_for(root, v)` (or
`latest(root)`) and reloads in place while holding `reading(path)`. `gc` trims old versions.

Layout::

    root/
      v000007/            one complete version (model.safetensors + config/tokenizer files)
      v000008/
      LATEST              "8": the newest published version, replaced atomically
      .locks/v000007.lock flock target: readers hold it shared, gc takes it exclusive
      .tmp-*/ .trash-*/   in-flight writes and deletions, never read

Guarantees: a `vNNNNNN` directory appears only complete (written to a temp dir, fsynced, then
renamed); a version is immutable (publishing an existing version keeps the first copy); gc
never deletes the newest `keep` (>= 2) versions nor one a reader holds, and a deletion first
renames the directory away, so nobody sees a half-deleted version. The locks are `flock`s, so
a crashed reader releases its hold with its process. NCCL/CUDA-IPC transports live elsewhere.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LATEST_FILE = "LATEST"
WEIGHTS_FILE = "model.safetensors"
MIN_KEEP = 2
_VERSION_RE = re.compile(r"^v(\d{6,})$")


class VersionGone(FileNotFoundError):
    """The requested version does not exist (never published, or garbage-collected)."""


def path_for(root: str | Path, version: int) -> Path:
    """Directory of `version` under `root` (whether or not it exists)."""
    if version < 0:
        raise ValueError(f"version must be >= 0, got {version}")
    return Path(root) / f"v{version:06d}"


def versions(root: str | Path) -> list[int]:
    """Complete versions present under `root`, ascending."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = (_VERSION_RE.match(entry.name) for entry in base.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def latest(root: str | Path) -> tuple[int, Path] | None:
    """(version, path) of the newest complete version, or None when nothing is published.

    Monotonic: it follows the LATEST marker, which only ever advances. gc never deletes the
    version the marker names, so a marker naming a gone version was read just before it
    advanced: read it again. Only a missing marker, or one that stays dangling (its version
    removed by hand), falls back to scanning the directories; scanning while a writer runs
    could return a version whose marker is not written yet, and the next call would go back.
    """
    marker = Path(root) / LATEST_FILE
    previous: int | None = None
    while True:
        try:
            version = int(marker.read_text().strip())
        except (FileNotFoundError, ValueError):
            break
        path = path_for(root, version)
        if path.is_dir():
            return version, path
        if version == previous:  # dangling: not a race with a publish
            break
        previous = version
    present = versions(root)
    if not present:
        return None
    return present[-1], path_for(root, present[-1])


def publish(
    root: str | Path,
    version: int,
    payload: Mapping[str, Any] | str | Path,
    *,
    extra_files: str | Path | None = None,
) -> Path:
    """Write `version` atomically and advance LATEST; returns the version's directory.

    `payload` is either a state dict (name -> tensor, saved as `model.safetensors`; needs
    torch + safetensors) or a directory whose regular files are copied. `extra_files` is a
    directory whose regular files that are not weights (config.json, tokenizer files) are
    copied alongside, so every version is a loadable model directory on its own.
    """
    base = Path(root)
    final = path_for(base, version)
    if final.is_dir():
        log.warning("weights v%d already published at %s; keeping the first copy", version, final)
        _advance_latest(base, version)
        return final
    base.mkdir(parents=True, exist_ok=True)
    tmp = base / f".tmp-v{version:06d}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if extra_files is not None:
            _copy_files(Path(extra_files), tmp, skip_weights=True)
        if isinstance(payload, str | Path):
            _copy_files(Path(payload), tmp, skip_weights=False)
        else:
            _save_state_dict(payload, tmp / WEIGHTS_FILE)
        for entry in tmp.iterdir():
            _fsync_path(entry)
        _fsync_path(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            log.warning("weights v%d published concurrently; keeping the other copy", version)
            shutil.rmtree(tmp, ignore_errors=True)
        _fsync_path(base)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _advance_latest(base, version)
    return final


def _save_state_dict(state: Mapping[str, Any], dest: Path) -> None:
    from safetensors.torch import save_file

    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    save_file(tensors, str(dest), metadata={"format": "pt"})


def _copy_files(src: Path, dest: Path, *, skip_weights: bool) -> None:
    if not src.is_dir():
        raise ValueError(f"not a directory: {src}")
    for entry in src.iterdir():
        if not entry.is_file() or entry.name.startswith("."):
            continue
        if skip_weights and (
            entry.suffix in {".safetensors", ".bin", ".pt"} or entry.name.endswith(".index.json")
        ):
            continue
        shutil.copyfile(entry, dest / entry.name)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _advance_latest(base: Path, version: int) -> None:
    """Point LATEST at `version` unless it already names a newer one (atomic replace)."""
    current = latest(base)
    if current is not None and current[0] > version:
        return
    tmp = base / f".tmp-latest-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as fh:
        fh.write(f"{version}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, base / LATEST_FILE)
    _fsync_path(base)


def _lock_path(version_dir: Path) -> Path:
    return version_dir.parent / ".locks" / f"{version_dir.name}.lock"


@contextlib.contextmanager
def reading(version_dir: str | Path) -> Iterator[Path]:
    """Hold `version_dir` against gc while the body loads it; VersionGone if it is not there.

    The existence check happens after the shared lock is taken, so a concurrent gc either
    finishes its deletion first (we raise) or skips this version (we load it).
    """
    path = Path(version_dir)
    lock = _lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
        try:
            if not path.is_dir():
                raise VersionGone(f"weights version directory is gone: {path}")
            yield path
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def gc(root: str | Path, *, keep: int = MIN_KEEP) -> list[int]:
    """Delete all but the newest `max(keep, 2)` versions, skipping any a reader holds.

    Returns the versions deleted. Leftover temp/trash directories from crashed writers are
    removed too.
    """
    base = Path(root)
    present = versions(base)
    keep = max(keep, MIN_KEEP)
    newest = latest(base)
    protected = set(present[-keep:]) | ({newest[0]} if newest else set())
    deleted: list[int] = []
    for version in present:
        if version in protected:
            continue
        if _delete_unless_held(path_for(base, version)):
            deleted.append(version)
    for entry in base.glob(".trash-*"):
        shutil.rmtree(entry, ignore_errors=True)
    if deleted:
        log.info("weights gc under %s deleted versions %s", base, deleted)
    return deleted


def _delete_unless_held(path: Path) -> bool:
    lock = _lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("weights %s is being read; not deleting it now", path.name)
            return False
        if not path.is_dir():  # another gc got here first
            return False
        trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, trash)
        # Unlinking while we hold the lock is safe: a reader that opens it afterwards gets a
        # fresh inode, locks it, and finds the directory gone.
        lock.unlink(missing_ok=True)
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    shutil.rmtree(trash, ignore_errors=True)
    return True
