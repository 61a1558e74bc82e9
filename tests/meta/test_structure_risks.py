"""Risks found in a read of the code, each pinned by a test that failed before its fix."""

from __future__ import annotations

import errno
import os
import pickle
import shutil
import signal
import threading

import numpy as np
import pytest
from helpers import scaled

import rowstore
from rowstore import Field, Schema
from rowstore.errors import FormatError


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    pytest.importorskip("imagecodecs")
    path = str(tmp_path_factory.mktemp("risks") / "img.h5")
    schema = Schema([Field("img", "uint8", (8, 8, 3), codec="png"), Field("id", "int64")])
    rng = np.random.default_rng(0)
    with rowstore.Writer(path, schema) as w:
        w.write_batch(
            {"img": rng.integers(0, 255, (64, 8, 8, 3), dtype=np.uint8), "id": np.arange(64)}
        )
    return path


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_while_another_thread_holds_the_descriptor_lock(images):
    """A child forked while a reader thread held the descriptor lock used to block forever in
    its first read (the lock is copied locked; its holder does not exist in the child)."""
    r = rowstore.open(images)
    lock = r._store._lock
    held, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            release.wait(scaled(10))

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(scaled(10))
    pid = os.fork()
    if pid == 0:  # child: must read, not hang
        signal.alarm(int(scaled(20)))
        try:
            ok = r.take([1, 2])["id"].tolist() == [1, 2]
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
    r.close()


def test_decode_threads_are_reused_across_takes(images):
    """A new decode pool per take() (per torch batch on images) started threads every call."""

    def mine(r):  # this reader's decode threads (other tests' readers may have theirs alive)
        pool = r._decoder._pool
        return {t.ident for t in (pool._threads if pool is not None else ())}

    with rowstore.open(images, num_threads=2) as r:
        r.take(np.arange(32))
        before = mine(r)
        for _ in range(5):
            r.take(np.arange(32))
        after = mine(r)
        # The pool starts its threads lazily (up to num_threads), and never replaces them.
        assert before and before <= after and len(after) <= 2
    assert not [t for t in threading.enumerate() if t.ident in after and t.is_alive()]


def test_num_threads_is_validated(images):
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="num_threads"):
            rowstore.open(images, num_threads=bad)


def test_field_is_hashable_and_immutable():
    f = Field("x", "float32", (3,), codec={"id": "raw"})
    g = Field("x", "float32", (3,))
    assert hash(f) == hash(g) and f == g and len({f, g}) == 1
    with pytest.raises(TypeError):
        f.codec["id"] = "png"  # the stored config cannot change under the field
    with pytest.raises(AttributeError):
        f.name = "y"
    assert f.codec == {"id": "raw"} and f.to_json()["codec"] == {"id": "raw"}
    assert pickle.loads(pickle.dumps(f)) == f
    s = Schema([f, Field("y", "str", nullable=True)])
    assert hash(s) == hash(Schema.from_json(s.to_json()))
    assert Field("y", "float32", (3,), codec=f.codec) == Field(
        "y", "float32", (3,)
    )  # a codec mapping is accepted


def test_os_errors_are_not_labelled_malformed(images, tmp_path, monkeypatch):
    """An I/O or permission error while opening is the system's error, not 'malformed file':
    reading a v2 file's footer, and h5py opening a v1 file."""
    import h5py

    from rowstore.format import footer

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", images)

    with monkeypatch.context() as m:
        m.setattr(
            footer.os,
            "pread",
            lambda *a: (_ for _ in ()).throw(OSError(errno.EIO, "Input/output error")),
        )
        with pytest.raises(OSError) as ei:
            rowstore.open(images)
        assert ei.value.errno == errno.EIO and not isinstance(ei.value, FormatError)
    v1 = str(tmp_path / "v1.h5")
    shutil.copyfile(images, v1)
    footer.cut(v1, rowstore.Layout.open(images).footer_offset)  # what the v1 writer left
    monkeypatch.setattr(h5py, "File", refuse)
    with pytest.raises(PermissionError) as ei:
        rowstore.open(v1)
    assert not isinstance(ei.value, FormatError)


def test_decode_error_keeps_type_of_missing_dependency(images, monkeypatch):
    """A codec whose optional dependency is missing raises CodecNotAvailableError (what to
    install), not a FormatError calling the file corrupt."""
    from rowstore.codecs import image
    from rowstore.errors import CodecNotAvailableError

    def missing():
        raise CodecNotAvailableError(
            "the png/jpeg codecs need imagecodecs: pip install 'rowstore[images]'"
        )

    from rowstore.reader import _decode

    with rowstore.open(images) as r:
        want = r.take([0, 1])["img"]
        monkeypatch.setattr(image, "_imagecodecs", missing)
        # PNGs of a fixed shape are decoded by rowstore's own kernel: no imagecodecs needed.
        assert np.array_equal(r.take([0, 1])["img"], want)
        monkeypatch.setattr(_decode, "PNG_KERNEL", False)  # the codec's path needs imagecodecs
        with pytest.raises(CodecNotAvailableError):
            r.take([0, 1])


def test_kernel_error_keeps_code_block_and_path(tmp_path):
    """A payload reference outside its block's heap range: the kernel's code, the block and the
    path reach the caller (the heap paths used to drop them)."""
    import h5py

    path = str(tmp_path / "refs.h5")
    schema = Schema([Field("id", "int64"), Field("v", "float32", (None,))])
    with rowstore.Writer(path, schema, rows_per_block=8) as w:
        for i in range(32):
            w.write({"id": i, "v": np.arange(i % 5 + 1, dtype=np.float32)})
    with h5py.File(path, "r") as f:
        info = f["rowstore/rows"].id.get_chunk_info(2)
        dt = f["rowstore/rows"].dtype
    # Row 17 (block 2, row 1): point its offset at heap byte 0 (block 0's range).
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 1 * dt.itemsize + dt.fields["v"][1])
        fh.write((0).to_bytes(8, "little"))
    with rowstore.open(path, verify=False) as r:
        with pytest.raises(FormatError) as ei:
            r.take([17])
    e = ei.value
    assert e.path == path and e.block == 2 and getattr(e, "code", None) is not None


def test_close_while_a_read_is_in_flight_defers_closing_the_descriptor(images):
    """Closing a reader while another thread reads must not free the descriptor number under
    that read (the next open file would get it, and the read would read that file)."""
    r = rowstore.open(images)
    store = r._store
    (fd,) = store._acquire([0])  # a read in flight on "another thread"
    r.close()
    os.fstat(fd)  # still this file's descriptor
    assert not store.is_open
    assert r.take([3])["id"].tolist() == [3]  # new reads open a new descriptor
    store._release([fd])
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the last read that used it
    r.close()


def test_errors_pickle_with_their_context():
    """Errors raised in worker processes cross a pickle: their context must survive it (a
    kernel error's keyword-only constructor could not be replayed from its args)."""
    from rowstore import kernels

    err = kernels.KernelError(
        "'/x.h5': block 3: bad", code=4, index=1, detail=7, path="/x.h5", block=3
    )
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is kernels.KernelError and str(back) == str(err)
    assert (back.code, back.index, back.detail, back.path, back.block) == (4, 1, 7, "/x.h5", 3)
    fe = pickle.loads(pickle.dumps(FormatError("bad", path="/p", block=2, field="f", row=9)))
    assert (fe.path, fe.block, fe.field, fe.row) == ("/p", 2, "f", 9)
    ve = pickle.loads(pickle.dumps(rowstore.RowValidationError("row 3: bad", field="x", row=3)))
    assert isinstance(ve, TypeError) and (ve.field, ve.row) == ("x", 3)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_closes_its_copy_of_the_parents_descriptor(images):
    r = rowstore.open(images)
    r.take([0])
    (parent_fd,) = r._store._fds.values()
    pid = os.fork()
    if pid == 0:
        try:
            os.fstat(parent_fd)
            leaked = True
        except OSError:
            leaked = False
        ok = not leaked and r.take([5])["id"].tolist() == [5]
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    os.fstat(parent_fd)  # the parent's stays open
    assert r.take([6])["id"].tolist() == [6]
    r.close()
