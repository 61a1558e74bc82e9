"""gc and reads stay inside what a dataset is: a directory whose pointer is lost is refused (and
its pointer can be restored from the newest sound version), the newest manifest that loads keeps
its shards, a killed shuffle's work directories are listed and removed, and links that lead out
of a dataset (a shard, ``shards/`` or ``_manifests/`` as a symlink) are neither read nor followed
by gc unless asked for."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

import rowstore
from rowstore import BYTES, Field, Schema
from rowstore.cli import main as cli_main
from rowstore.errors import FormatError
from rowstore.format import manifest
from rowstore.storage.localdir import LocalDir
from rowstore.writer.commit import commit, commit_to
from rowstore.writer.dataset import write_shard
from rowstore.writer.gc import gc, restore_pointer

SCHEMA = Schema([Field("x", "int64"), Field("t", BYTES)])


def cols(lo, hi):
    x = np.arange(lo, hi, dtype=np.int64)
    return {"x": x, "t": [str(i).encode() * 3 for i in x]}


def xs(root, **kw):
    with rowstore.open(root, **kw) as r:
        return r.take(np.arange(len(r)))["x"]


def tree(root):
    """Every path under ``root`` with its size (links as links)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(top, n)
            out[os.path.relpath(p, root)] = os.lstat(p).st_size
    return out


def make_old(path, age=7200):
    t = time.time() - age
    os.utime(path, (t, t), follow_symlinks=False)


def three_versions(root):
    """v1: shard a (0..10); v2: a + b (0..20); v3: a + b + c (0..30). Returns the infos."""
    a, b, c = (write_shard(root, SCHEMA, cols(lo, lo + 10), rows_per_block=4) for lo in (0, 10, 20))
    commit(root, [a])
    commit(root, [b], mode="a")
    commit(root, [c], mode="a")
    return a, b, c


def write_pointer(root, version):
    with open(os.path.join(root, manifest.manifest_path(version)), "rb") as f:
        crc = zlib.crc32(f.read())
    with open(os.path.join(root, manifest.POINTER), "w") as f:
        json.dump(
            {
                "format": manifest.FORMAT_NAME,
                "format_version": 1,
                "version": version,
                "manifest": manifest.manifest_path(version),
                "manifest_crc32": crc,
            },
            f,
        )


# -- a lost pointer ------------------------------------------------------------------------------
def test_gc_refuses_a_dataset_whose_pointer_is_missing(tmp_path, capsys):
    root = str(tmp_path / "ds")
    three_versions(root)
    for p in os.listdir(os.path.join(root, "shards")):
        make_old(os.path.join(root, "shards", p))
    os.remove(os.path.join(root, manifest.POINTER))
    before = tree(root)
    with pytest.raises(FormatError, match="repair"):
        gc(root, dry_run=False, orphan_grace_s=0)
    assert cli_main(["gc", root, "--delete", "--grace", "0"]) == 1
    err = capsys.readouterr().err
    assert "not a readable rowstore dataset" in err and f"rowstore repair {root}" in err
    assert tree(root) == before  # nothing removed, as rowstore.open refuses it too
    with pytest.raises(FormatError):
        rowstore.open(root)


def test_gc_keeps_what_the_newest_loading_manifest_names(tmp_path):
    """A pointer put back to an older version: the newer versions' manifest and shards stay."""
    root = str(tmp_path / "ds")
    a, b, c = three_versions(root)
    for info in (a, b, c):
        make_old(os.path.join(root, info.path))
    write_pointer(root, 1)
    r = gc(root, dry_run=False, orphan_grace_s=0)
    assert r.shards == [] and manifest.versions(root) == [1, 3]
    assert r.current == 1 and r.kept_versions == [1] and r.spared == 3
    write_pointer(root, 3)
    assert np.array_equal(xs(root), np.arange(30))


def test_restore_pointer_picks_the_newest_sound_version(tmp_path, capsys):
    root = str(tmp_path / "ds")
    a, b, c = three_versions(root)
    os.remove(os.path.join(root, c.path))  # v3 names a shard that is gone
    os.remove(os.path.join(root, manifest.POINTER))
    before = tree(root)

    r = rowstore.restore_pointer(root, dry_run=True)
    assert r.version == 2 and [v for v, _ in r.skipped] == [3] and "missing" in r.problem
    assert "cannot be opened" in r.skipped[0][1] and tree(root) == before

    assert cli_main(["repair", root]) == 0
    out = capsys.readouterr().out
    assert "skipped version 3" in out and "made version 2 current" in out
    assert manifest.read_pointer(root)[0] == 2 and np.array_equal(xs(root), np.arange(20))
    assert gc(root).current == 2  # gc works on it again

    r = rowstore.restore_pointer(root)  # a pointer that loads is left alone
    assert r.version is None and r.current == 2
    assert cli_main(["repair", root]) == 0 and "nothing to repair" in capsys.readouterr().out


def test_restore_pointer_passes_over_damaged_versions_and_a_corrupt_pointer(tmp_path):
    root = str(tmp_path / "ds")
    a, b, c = three_versions(root)
    with open(os.path.join(root, manifest.index_path(3)), "r+b") as f:  # v3's sidecar damaged
        f.seek(20)
        f.write(b"\xff")
    shard_b = os.path.join(root, b.path)  # b (in v2 and v3) replaced by another file of its size
    data = bytearray(open(shard_b, "rb").read())
    with open(shard_b, "wb") as f:
        f.write(bytes(len(data)))
    with open(os.path.join(root, manifest.POINTER), "w") as f:
        f.write("{not json")
    r = rowstore.restore_pointer(root)
    assert r.version == 1 and [v for v, _ in r.skipped] == [3, 2] and "not valid JSON" in r.problem
    assert "CRC-32" in r.skipped[0][1] and np.array_equal(xs(root), np.arange(10))


def test_restore_pointer_with_no_sound_version_writes_nothing(tmp_path, capsys):
    root = str(tmp_path / "ds")
    a, b, c = three_versions(root)
    os.remove(os.path.join(root, a.path))  # in every version
    os.remove(os.path.join(root, manifest.POINTER))
    with pytest.raises(FormatError, match="no version .* is sound"):
        rowstore.restore_pointer(root)
    assert not os.path.exists(os.path.join(root, manifest.POINTER))
    assert cli_main(["repair", root]) == 1 and "nothing was written" in capsys.readouterr().err
    assert cli_main(["repair", str(tmp_path / "missing")]) == 1


def test_restore_pointer_scan_reads_the_chunks(tmp_path):
    root = str(tmp_path / "ds")
    a, b, c = three_versions(root)
    L = rowstore.Layout.open(os.path.join(root, c.path))
    with open(os.path.join(root, c.path), "r+b") as f:  # a flipped byte in one of c's blocks
        off = int(L.blocks["offset"][0])
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.remove(os.path.join(root, manifest.POINTER))
    assert rowstore.restore_pointer(root, dry_run=True).version == 3  # sizes and indexes agree
    r = rowstore.restore_pointer(root, scan=True)
    assert r.version == 2 and [v for v, _ in r.skipped] == [3]


# -- gc of missing paths and of killed shuffles ----------------------------------------------------
def test_gc_of_a_missing_path_fails(tmp_path, capsys):
    assert cli_main(["gc", str(tmp_path / "missing.h5")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["gc", str(tmp_path / "no" / "such" / "dir")]) == 1
    with pytest.raises(FileNotFoundError):
        gc(str(tmp_path / "missing"))
    # A file never completed: its killed first writer's temporary is there, the file is not.
    tmp = tmp_path / ".new.h5.0123456789ab.rowstore-tmp"
    tmp.write_bytes(b"partial")
    assert cli_main(["gc", str(tmp_path / "new.h5")]) == 0 and not tmp.exists()


KILLED_SHUFFLE = textwrap.dedent("""
    import os, signal, sys
    import rowstore
    import rowstore.global_shuffle as gs

    def die(*args, **kwargs):  # pass 1 is done: its piles are on disk
        os.kill(os.getpid(), signal.SIGKILL)

    gs.pile_task = die
    rowstore.shuffle(sys.argv[1], sys.argv[2], memory="4MiB", seed=1)
""")


def shuffle_dirs(parent):
    from rowstore.global_shuffle._work import PREFIX

    return sorted(n for n in os.listdir(parent) if n.startswith(PREFIX))


def test_gc_lists_and_removes_a_killed_shuffles_directories(tmp_path, capsys):
    from rowstore.global_shuffle._work import LockedDir

    src = str(tmp_path / "in")
    with rowstore.DatasetWriter(src, SCHEMA) as w:
        w.write_batch(cols(0, 20_000))
    child = subprocess.run(
        [sys.executable, "-c", KILLED_SHUFFLE, src, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    left = shuffle_dirs(tmp_path)
    assert [n.split(".")[1] for n in left] == ["rowstore-shuffle-out", "rowstore-shuffle-piles"]
    assert sum(sum(tree(tmp_path / n).values()) for n in left) > 100_000  # piles on disk
    live = LockedDir(str(tmp_path), "piles")  # a run still going: kept
    try:
        assert cli_main(["gc", "--dry-run", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        for n in left:
            assert f"stale: {tmp_path / n} (a killed shuffle's" in out
        assert f"kept (a shuffle is running): {live.path}" in out
        assert "would remove 2 killed shuffle" in out
        assert shuffle_dirs(tmp_path) == sorted(left + [os.path.basename(live.path)])
        assert cli_main(["gc", str(tmp_path)]) == 0
        assert "removed 2 killed shuffle director(ies)" in capsys.readouterr().out
        assert shuffle_dirs(tmp_path) == [os.path.basename(live.path)]
    finally:
        live.remove()
    assert np.array_equal(xs(src), np.arange(20_000))


# -- links out of the dataset ----------------------------------------------------------------------
def linked_out(tmp_path, how):
    """A dataset whose shard (``how="shard"``) or whole ``shards/`` (``"dir"``) is a symlink to a
    copy outside it, with matching bytes and CRCs."""
    root = str(tmp_path / "ds")
    info = write_shard(root, SCHEMA, cols(0, 10), rows_per_block=4)
    commit(root, [info])
    outside = tmp_path / "elsewhere"
    if how == "shard":
        outside.mkdir()
        target = outside / os.path.basename(info.path)
        shutil.move(os.path.join(root, info.path), target)
        os.symlink(target, os.path.join(root, info.path))
    else:
        shutil.move(os.path.join(root, "shards"), outside)
        os.symlink(outside, os.path.join(root, "shards"))
    return root, info, outside


@pytest.mark.parametrize("how", ["shard", "dir"])
def test_a_shard_linked_out_of_the_dataset_is_refused(tmp_path, capsys, how):
    root, info, outside = linked_out(tmp_path, how)
    with pytest.raises(FormatError, match="outside the dataset directory"):
        rowstore.open(root)
    with pytest.raises(FormatError, match="allow_outside_links"):
        rowstore.open([root, root])
    for cmd in ("info", "verify", "head"):
        assert cli_main([cmd, root]) == 1
        assert "outside the dataset directory" in capsys.readouterr().err
    assert np.array_equal(xs(root, allow_outside_links=True), np.arange(10))
    assert cli_main(["verify", root, "--allow-outside-links"]) == 0
    url = "file://" + os.path.abspath(root)  # read through fsspec's local filesystem: the same rule
    with pytest.raises(FormatError, match="outside the dataset directory"):
        rowstore.open(url, storage_options={})
    assert np.array_equal(xs(url, storage_options={}, allow_outside_links=True), np.arange(10))


def test_links_inside_the_dataset_are_followed(tmp_path):
    root = str(tmp_path / "ds")
    info = write_shard(root, SCHEMA, cols(0, 10), rows_per_block=4)
    commit(root, [info])
    os.mkdir(os.path.join(root, "store"))
    shutil.move(os.path.join(root, info.path), os.path.join(root, "store", "s.h5"))
    os.symlink(os.path.join("..", "store", "s.h5"), os.path.join(root, info.path))
    os.symlink(root, tmp_path / "alias")  # the root itself through a link: its real path counts
    assert np.array_equal(xs(root), np.arange(10))
    assert np.array_equal(xs(str(tmp_path / "alias")), np.arange(10))


def test_gc_does_not_delete_through_a_linked_shards_directory(tmp_path, capsys):
    root, info, outside = linked_out(tmp_path, "dir")
    victim = outside / "precious.h5"  # a file of someone else's, where shards/ points
    victim.write_bytes(b"not yours")
    make_old(victim)
    with pytest.raises(FormatError, match="outside the dataset directory"):
        gc(root, dry_run=False, orphan_grace_s=0)
    assert cli_main(["gc", root, "--delete", "--grace", "0"]) == 1
    assert "outside the dataset directory" in capsys.readouterr().err
    with pytest.warns(RuntimeWarning, match="outside the dataset directory"):  # commit's clean-up
        commit(root, [], mode="a", orphan_grace_s=0)
    assert victim.exists()
    r = gc(root, dry_run=False, orphan_grace_s=0, allow_outside_links=True)  # asked for
    assert r.shards == ["shards/precious.h5"] and not victim.exists()
    assert np.array_equal(xs(root, allow_outside_links=True), np.arange(10))


def test_gc_does_not_delete_through_a_linked_manifests_directory(tmp_path):
    root = str(tmp_path / "ds")
    three_versions(root)
    outside = tmp_path / "elsewhere"
    shutil.move(os.path.join(root, "_manifests"), outside)
    os.symlink(outside, os.path.join(root, "_manifests"))
    before = tree(outside)
    with pytest.raises(FormatError, match="outside the dataset directory"):
        gc(root, dry_run=False, orphan_grace_s=0)
    with pytest.raises(FormatError, match="outside the dataset directory"):
        rowstore.open(root)
    assert tree(outside) == before


def test_gc_removes_an_orphan_link_not_its_target(tmp_path):
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, cols(0, 10))])
    target = tmp_path / "kept.h5"
    target.write_bytes(b"someone's file")
    link = os.path.join(root, "shards", "orphan.h5")
    os.symlink(target, link)
    make_old(link)
    r = gc(root, dry_run=False, orphan_grace_s=0)
    assert r.shards == ["shards/orphan.h5"] and not os.path.lexists(link)
    assert target.read_bytes() == b"someone's file"


class _Unconditional(LocalDir):
    """A directory committed to as a store without conditional writes commits (unique names),
    as a copy of a gs:// dataset holds them; the first pointer write of :attr:`lose` commits
    is lost (another commit's pointer landed over it)."""

    conditional = False

    def __init__(self, root, lose=0):
        super().__init__(root)
        self.lose = lose

    def replace(self, rel, data, *, expect=...):
        if rel == manifest.POINTER and self.lose:
            self.lose -= 1
            return
        super().replace(rel, data, expect=expect)


def test_gc_and_restore_tell_versions_by_manifest_name(tmp_path):
    """Versions under unique names (one of them overtaken, never current): restore_pointer
    picks the newest sound manifest by name, gc keeps the current chain's manifests and the
    shards they name, and removes the others' manifests, sidecars and the chain's old ones."""
    root = str(tmp_path / "ds")
    a = write_shard(root, SCHEMA, cols(0, 10))
    assert commit_to(_Unconditional(root), [a]) == 1
    b = write_shard(root, SCHEMA, cols(10, 20))
    assert commit_to(_Unconditional(root), [b], mode="a") == 2
    c = write_shard(root, SCHEMA, cols(20, 30))
    assert commit_to(_Unconditional(root, lose=1), [c], mode="a") == 4  # 3 was overtaken
    names = manifest.manifest_names(root)
    assert [manifest.version_of(n) for n in names] == [1, 2, 3, 4]
    assert all(n != manifest.manifest_path(manifest.version_of(n)) for n in names)
    current = manifest.pointer(root).manifest
    assert current == names[-1] and manifest.parent_of(root, current) == names[1]
    assert np.array_equal(xs(root), np.arange(30)) and len(rowstore.open(root, version=2)) == 20
    os.remove(os.path.join(root, manifest.POINTER))
    assert restore_pointer(root).version == 4 and manifest.pointer(root).manifest == current
    r = gc(root, dry_run=False, keep_versions=1, orphan_grace_s=0)
    assert r.current == 4 and r.kept_versions == [4] and r.spared is None
    assert sorted(os.listdir(os.path.join(root, manifest.MANIFEST_DIR))) == sorted(
        [".lock", os.path.basename(current), os.path.basename(manifest.index_of(current))]
    )
    assert np.array_equal(xs(root), np.arange(30))


def test_a_uniquely_named_manifest_leading_out_is_refused(tmp_path):
    """A local dataset whose versions have unique names (a copy of a gs:// dataset): its
    manifest and sidecar are held inside the directory like fixed-name ones."""
    root = str(tmp_path / "ds")
    a = write_shard(root, SCHEMA, cols(0, 10))
    assert commit_to(_Unconditional(root), [a]) == 1
    current = manifest.pointer(root).manifest
    side = os.path.join(root, manifest.index_of(current))
    moved = str(tmp_path / "elsewhere.index")
    os.replace(side, moved)
    os.symlink(moved, side)
    with pytest.raises(FormatError, match="outside"):
        rowstore.open(root)
    assert len(rowstore.open(root, allow_outside_links=True)) == 10
