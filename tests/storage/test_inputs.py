"""rowstore.storage.inputs: the one opener of ingest inputs (regular files only, found without
blocking; sizes bounded before reading) and the one containment check of names that become
paths (no ``..``, no absolute names, symlinks out of the root only when asked for)."""

from __future__ import annotations

import os
import resource
import socket

import pytest
from helpers import raised_without_blocking

from rowstore.errors import FormatError, InputError, OutsideRootError, RowstoreError
from rowstore.storage import inputs
from rowstore.storage.inputs import contained, open_input, open_regular, read_input, walk


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "x.png")
    os.mkfifo(fifo)
    exc = raised_without_blocking(lambda: open_input(fifo, what="image file"), fifo)
    assert isinstance(exc, InputError) and isinstance(exc, ValueError), exc
    assert str(exc) == f"{fifo!r}: image file is a FIFO (named pipe), expected a regular file"
    assert exc.path == fifo
    exc = raised_without_blocking(lambda: read_input(fifo, max_bytes=10), fifo)
    assert isinstance(exc, InputError), exc
    exc = raised_without_blocking(
        lambda: open_regular(fifo), fifo
    )  # the dataset opener: a FormatError
    assert isinstance(exc, FormatError) and "FIFO" in str(exc), exc


def test_other_kinds_are_named(tmp_path):
    with pytest.raises(InputError, match="is a directory, expected a regular file"):
        open_input(str(tmp_path))
    with pytest.raises(InputError, match="is a character device"):
        open_input("/dev/null")
    sock = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(sock)
        with pytest.raises(OSError) as e:  # a socket cannot be opened: ENXIO, not a hang
            open_input(sock)
        assert e.value.errno is not None or isinstance(e.value, RowstoreError)
    with pytest.raises(FileNotFoundError) as e:
        open_input(str(tmp_path / "missing"))
    assert e.value.errno is not None


def test_the_size_bound_is_checked_before_reading(tmp_path):
    """A sparse 3 GiB file: refused from its fstat size; the peak memory shows nothing was
    read. A file at the bound reads whole."""
    big = str(tmp_path / "big")
    with open(big, "wb") as f:
        f.truncate(3 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with pytest.raises(InputError, match=r"is 3221225472 bytes, more than the 1048576 bytes"):
        read_input(big, what="label CSV", max_bytes=1 << 20)
    with pytest.raises(InputError, match="nothing of it was read") as e:
        open_input(big, max_bytes=(3 << 30) - 1)
    assert e.value.path == big
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before < 256 << 20
    small = tmp_path / "small"
    small.write_bytes(b"x" * 1000)
    assert read_input(small, max_bytes=1000) == b"x" * 1000
    with pytest.raises(InputError, match="1000 bytes, more than the 999"):
        read_input(small, max_bytes=999)
    fd, st = open_input(small, max_bytes=1000)
    os.close(fd)
    assert st.st_size == 1000


def test_a_file_that_grows_while_read_stays_within_the_bound(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"a" * 10)
    for extra, limit, ok in ((5, 20, True), (11, 20, False)):
        fd, st = open_input(p, max_bytes=limit)
        try:
            with open(p, "ab") as f:  # appended after fstat
                f.write(b"b" * extra)
            if ok:
                got = inputs._read_bounded(fd, str(p), "file", st.st_size, limit)
                assert got == b"a" * 10 + b"b" * extra
            else:
                with pytest.raises(InputError, match="grew past the 20 bytes"):
                    inputs._read_bounded(fd, str(p), "file", st.st_size, limit)
        finally:
            os.close(fd)
        p.write_bytes(b"a" * 10)


@pytest.mark.parametrize(
    "name, why",
    [
        ("../evil", "'..' component"),
        ("a/../../evil", "'..' component"),
        ("/etc/passwd", "absolute path"),
        ("", "is empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_names_that_climb_out_are_refused(tmp_path, name, why):
    with pytest.raises(OutsideRootError, match=why) as e:
        contained(tmp_path, name, what="split name", follow_links=True)
    assert e.value.name == name and e.value.root == str(tmp_path)
    assert str(e.value).startswith(f"split name {name!r}")


def test_nested_names_only_when_allowed(tmp_path):
    assert contained(tmp_path, "a/b.png", what="image path") == os.path.join(tmp_path, "a/b.png")
    assert contained(tmp_path, "train", what="split", nested=False) == str(tmp_path / "train")
    for name in ("a/b", "."):
        with pytest.raises(OutsideRootError, match="not a single plain name"):
            contained(tmp_path, name, what="split name", nested=False)


def test_symlinks_out_of_the_root_only_when_asked_for(tmp_path):
    root = tmp_path / "root"
    (root / "in").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    os.symlink(tmp_path / "out", root / "away")
    os.symlink(root / "in", root / "here")
    with pytest.raises(OutsideRootError, match="resolves to .* through a symlink") as e:
        contained(root, "away/x.png", what="image path", line=7)
    assert e.value.real == str(tmp_path / "out" / "x.png") and e.value.line == 7
    with pytest.raises(OutsideRootError) as e:  # a table's line: kept on the error
        contained(root, "../x.png", what="'t.csv', line 3: image path", line=3)
    assert e.value.line == 3 and e.value.name == "../x.png"
    assert contained(root, "away/x.png", what="image path", follow_links=True)
    assert contained(root, "here/x.png", what="image path")  # a link that stays inside
    assert contained(root, "missing/x.png", what="image path")  # absence: the opener's
    assert inputs.outside(root, ["away/x.png", "here/x.png", "in/x"]) == [
        ("away/x.png", str(tmp_path / "out" / "x.png"))
    ]


def test_walk_follows_links_inside_and_refuses_links_out(tmp_path):
    root = tmp_path / "root"
    for rel in ("b/2.png", "b/c/3.png", "a/1.png", "0.png", "b/.hidden.png", ".d/4.png"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"")
    os.symlink(root / "b" / "c", root / "a" / "link")  # inside: followed
    os.symlink("..", root / "b" / "up")  # a loop: each real directory walked once
    keep = lambda n: n.endswith(".png")  # noqa: E731
    assert walk(root, keep) == ["0.png", "a/1.png", "a/link/3.png", "b/2.png"]
    # from b: b/up leads back to the root (inside it: followed), each directory once
    assert walk(root, keep, under="b") == ["b/2.png", "b/c/3.png", "b/up/0.png", "b/up/a/1.png"]
    os.symlink("/", root / "b" / "all")
    with pytest.raises(OutsideRootError, match=r"'b/all' under .* is a symlink to '/'") as e:
        walk(root, keep, what="image file or folder")
    assert e.value.real == "/" and e.value.name == "b/all"
    os.remove(root / "b" / "all")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "9.png").write_bytes(b"")
    os.symlink(tmp_path / "out" / "9.png", root / "b" / "9.png")
    with pytest.raises(OutsideRootError, match="'b/9.png'"):
        walk(root, keep)
    assert "b/9.png" in walk(root, keep, follow_links=True)
    os.mkfifo(root / "b" / "f.png")  # listed: whoever opens it refuses it
    assert "b/f.png" in walk(root, keep, follow_links=True)
