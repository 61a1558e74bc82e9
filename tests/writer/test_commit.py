"""AtomicFile (rowstore.storage.atomic): a temporary file beside the target that replaces it
only on commit, fsynced; exclusive commits never overwrite; abort removes the temporary file."""

from __future__ import annotations

import os

import pytest

from rowstore.storage import atomic as _commit
from rowstore.storage.atomic import AtomicFile


def names(directory):
    return sorted(os.listdir(directory))


def test_temp_beside_target_then_rename(tmp_path):
    target = tmp_path / "data.h5"
    target.write_bytes(b"old")
    af = AtomicFile(target)
    tmp = af.tmp
    assert os.path.dirname(tmp) == str(tmp_path)
    name = os.path.basename(tmp)
    assert name.startswith(".data.h5.") and name.endswith(_commit.TMP_SUFFIX)
    assert os.path.getsize(tmp) == 0 and target.read_bytes() == b"old" and not af.done
    with open(tmp, "wb") as f:
        f.write(b"new")
    af.commit()
    assert af.done and target.read_bytes() == b"new" and names(tmp_path) == ["data.h5"]
    with pytest.raises(ValueError, match="already committed"):
        af.tmp  # noqa: B018
    with pytest.raises(ValueError):
        af.commit()
    af.abort()  # after a commit: nothing to remove, the target stays
    assert target.read_bytes() == b"new"


def test_temp_mode_follows_umask(tmp_path):
    old = os.umask(0o027)
    try:
        af = AtomicFile(tmp_path / "a")
    finally:
        os.umask(old)
    assert os.stat(af.tmp).st_mode & 0o777 == 0o640  # 0o666 less the umask, not mkstemp's 0o600
    af.abort()


def test_temp_names_do_not_collide(tmp_path):
    files = [AtomicFile(tmp_path / "a") for _ in range(20)]
    assert len({f.tmp for f in files}) == 20
    for f in files:
        f.abort()
    assert names(tmp_path) == []


def test_abort_removes_temp_and_is_idempotent(tmp_path):
    target = tmp_path / "data.h5"
    target.write_bytes(b"old")
    af = AtomicFile(target)
    af.abort()
    af.abort()
    assert names(tmp_path) == ["data.h5"] and target.read_bytes() == b"old" and af.done
    af2 = AtomicFile(target)
    os.unlink(af2.tmp)  # someone removed it already: abort still succeeds
    af2.abort()


def test_exclusive_never_overwrites(tmp_path):
    target = tmp_path / "x.h5"
    af = AtomicFile(target, exclusive=True)
    with open(af.tmp, "wb") as f:
        f.write(b"mine")
    target.write_bytes(b"theirs")  # appears before the commit
    with pytest.raises(FileExistsError):
        af.commit()
    assert target.read_bytes() == b"theirs" and not af.done
    af.abort()
    assert names(tmp_path) == ["x.h5"]
    af = AtomicFile(tmp_path / "y.h5", exclusive=True)
    af.commit()
    assert names(tmp_path) == ["x.h5", "y.h5"]


def test_copy_from_keeps_content_and_mode(tmp_path):
    src = tmp_path / "data.h5"
    src.write_bytes(b"0123456789")
    os.chmod(src, 0o604)
    af = AtomicFile(src, copy_from=src)
    assert open(af.tmp, "rb").read() == b"0123456789" and os.stat(af.tmp).st_mode & 0o777 == 0o604
    with open(af.tmp, "ab") as f:
        f.write(b"+")
    assert src.read_bytes() == b"0123456789"
    af.commit()
    assert src.read_bytes() == b"0123456789+" and os.stat(src).st_mode & 0o777 == 0o604


def test_copy_failure_leaves_no_temp(tmp_path):
    with pytest.raises(FileNotFoundError):
        AtomicFile(tmp_path / "data.h5", copy_from=tmp_path / "missing.h5")
    assert names(tmp_path) == []


def test_symlink_target_is_replaced_and_link_kept(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "data.h5").write_bytes(b"old")
    link = tmp_path / "link.h5"
    os.symlink(real / "data.h5", link)
    af = AtomicFile(link)
    assert af.target == str(real / "data.h5") and os.path.dirname(af.tmp) == str(real)
    with open(af.tmp, "wb") as f:
        f.write(b"new")
    af.commit()
    assert os.path.islink(link) and link.read_bytes() == b"new" and names(real) == ["data.h5"]


def test_context_manager(tmp_path):
    target = tmp_path / "m.json"
    with AtomicFile(target) as af:
        with open(af.tmp, "w") as f:
            f.write("{}")
    assert target.read_text() == "{}"
    with pytest.raises(RuntimeError):
        with AtomicFile(target) as af:
            with open(af.tmp, "w") as f:
                f.write("partial")
            raise RuntimeError("boom")
    assert target.read_text() == "{}" and names(tmp_path) == ["m.json"]
    (tmp_path / "e.json").write_text("theirs")
    with pytest.raises(FileExistsError):
        with AtomicFile(tmp_path / "e.json", exclusive=True):
            pass  # the commit fails: the temporary file is removed
    assert names(tmp_path) == ["e.json", "m.json"]


def test_commit_fsyncs_file_then_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), os.path.exists(target)))
        real_fsync(fd)

    target = tmp_path / "data.h5"
    af = AtomicFile(target)
    tmp = af.tmp
    monkeypatch.setattr(os, "fsync", fsync)
    af.commit()
    # the file's content before the rename, the directory entry after it
    assert synced == [(tmp, False), (str(tmp_path), True)]
