"""Filesystem weight transport: atomic versions, LATEST marker, gc that respects readers."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
from pathlib import Path

import pytest

from shared import weights

PAYLOAD_BYTES = 256 * 1024


def _make_payload(src: Path, version: int) -> Path:
    src.mkdir(parents=True, exist_ok=True)
    (src / "model.safetensors").write_bytes(bytes([version % 256]) * PAYLOAD_BYTES)
    (src / "config.json").write_text(f'{{"version": {version}}}')
    return src


def _check_version_dir(path: Path, version: int) -> None:
    blob = (path / "model.safetensors").read_bytes()
    assert blob == bytes([version % 256]) * PAYLOAD_BYTES, f"torn weights in {path}"
    assert (path / "config.json").read_text() == f'{{"version": {version}}}'


def test_publish_writes_a_complete_version_and_advances_latest(tmp_path: Path) -> None:
    root = tmp_path / "w"
    assert weights.latest(root) is None
    path = weights.publish(root, 3, _make_payload(tmp_path / "src3", 3))
    assert path == weights.path_for(root, 3) == root / "v000003"
    _check_version_dir(path, 3)
    assert weights.latest(root) == (3, path)
    assert weights.versions(root) == [3]
    assert not list(root.glob(".tmp-*"))


def test_latest_never_moves_backwards(tmp_path: Path) -> None:
    root = tmp_path / "w"
    weights.publish(root, 5, _make_payload(tmp_path / "s5", 5))
    weights.publish(root, 4, _make_payload(tmp_path / "s4", 4))
    assert weights.latest(root) == (5, weights.path_for(root, 5))


def test_a_published_version_is_immutable(tmp_path: Path) -> None:
    root = tmp_path / "w"
    weights.publish(root, 1, _make_payload(tmp_path / "a", 1))
    weights.publish(root, 1, _make_payload(tmp_path / "b", 9))
    _check_version_dir(weights.path_for(root, 1), 1)


def test_latest_falls_back_to_scanning_when_the_marker_is_missing(tmp_path: Path) -> None:
    root = tmp_path / "w"
    weights.publish(root, 1, _make_payload(tmp_path / "a", 1))
    weights.publish(root, 2, _make_payload(tmp_path / "b", 2))
    (root / weights.LATEST_FILE).unlink()
    assert weights.latest(root) == (2, weights.path_for(root, 2))


def test_failed_write_leaves_no_version_and_no_temp_dir(tmp_path: Path) -> None:
    root = tmp_path / "w"
    with pytest.raises(ValueError, match="not a directory"):
        weights.publish(root, 1, tmp_path / "missing")
    assert weights.versions(root) == [] and not list(root.glob(".tmp-*"))
    assert weights.latest(root) is None


def test_extra_files_are_copied_but_their_weights_are_not(tmp_path: Path) -> None:
    base = _make_payload(tmp_path / "base", 0)
    (base / "tokenizer.json").write_text("{}")
    path = weights.publish(tmp_path / "w", 1, _make_payload(tmp_path / "new", 1), extra_files=base)
    _check_version_dir(path, 1)
    assert (path / "tokenizer.json").exists()


def test_gc_keeps_at_least_the_newest_two_versions(tmp_path: Path) -> None:
    root = tmp_path / "w"
    for v in range(6):
        weights.publish(root, v, _make_payload(tmp_path / f"s{v}", v))
    assert weights.gc(root, keep=0) == [0, 1, 2, 3]
    assert weights.versions(root) == [4, 5]
    assert not list(root.glob(".trash-*"))


def test_gc_skips_a_version_held_by_a_reader_until_it_is_released(tmp_path: Path) -> None:
    root = tmp_path / "w"
    for v in range(4):
        weights.publish(root, v, _make_payload(tmp_path / f"s{v}", v))
    with weights.reading(weights.path_for(root, 0)) as held:
        assert weights.gc(root, keep=2) == [1]
        _check_version_dir(held, 0)
    assert weights.gc(root, keep=2) == [0]


def test_reading_a_collected_version_raises_version_gone(tmp_path: Path) -> None:
    root = tmp_path / "w"
    for v in range(3):
        weights.publish(root, v, _make_payload(tmp_path / f"s{v}", v))
    weights.gc(root)
    with pytest.raises(weights.VersionGone), weights.reading(weights.path_for(root, 0)):
        pass


def _reader(root: str, stop_at: int, result: mp.Queue, ready: mp.Queue) -> None:
    loads = gone = 0
    seen = -1
    ready.put(os.getpid())
    try:
        while seen < stop_at:
            found = weights.latest(root)
            if found is None:
                continue
            version, path = found
            assert version >= seen, f"latest went backwards: {seen} -> {version}"
            try:
                with weights.reading(path) as held:
                    _check_version_dir(held, version)
                    loads += 1
            except weights.VersionGone:
                gone += 1
            seen = version
        result.put(("ok", loads, gone))
    except BaseException as exc:  # report to the parent instead of dying silently
        result.put(("error", repr(exc), os.getpid()))


@pytest.mark.timeout(60)
def test_concurrent_readers_never_see_a_torn_or_deleted_version(tmp_path: Path) -> None:
    root = tmp_path / "w"
    last = 40
    weights.publish(root, 0, _make_payload(tmp_path / "s0", 0))
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    ready: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(str(root), last, results, ready)) for _ in range(3)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=30)
    for v in range(1, last + 1):
        weights.publish(root, v, _make_payload(tmp_path / f"s{v}", v))
        weights.gc(root, keep=2)
    outcomes = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    assert all(o[0] == "ok" for o in outcomes), outcomes
    assert sum(o[1] for o in outcomes) >= len(procs) * 5, outcomes  # they really overlapped the writer
    weights.gc(root, keep=2)  # the last gc inside the loop may have skipped a held version
    assert weights.versions(root) == [last - 1, last]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_a_state_dict_is_saved_as_safetensors(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    state = {"lm_head.weight": torch.arange(6, dtype=torch.float32).view(2, 3)}
    path = weights.publish(tmp_path / "w", 2, state)
    loaded = load_file(str(path / weights.WEIGHTS_FILE))
    assert torch.equal(loaded["lm_head.weight"], state["lm_head.weight"])
