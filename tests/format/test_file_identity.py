"""A reader reads only the files it opened: never a FIFO in a file's place (no hang), never a
file replaced or rewritten under it (checked at every descriptor (re)open, after fork and
pickling too), never a v2 file whose footer is gone unless asked; and all readers of a process
share one descriptor budget."""

import os
import pickle
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
from helpers import ROOT

import rowstore as rs
from rowstore import cli
from rowstore.errors import FormatError, StaleFileError
from rowstore.format import footer
from rowstore.writer.commit import commit
from rowstore.writer.dataset import write_shard

SCHEMA = rs.Schema([rs.Field("v", "int64")])


def write_file(path, value, n=100):
    with rs.Writer(path, SCHEMA, rows_per_block=10) as w:
        w.write_batch({"v": np.full(n, value, np.int64)})


def run_child(code: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; a hang is a failure, not a hung suite."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not finish within {timeout} s (a read waiting forever?)")


# -- a FIFO where a file belongs ------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_in_place_of_a_file_or_shard_is_a_format_error_not_a_hang(tmp_path):
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, {"v": np.arange(50)}, name="s0")])
    shard = os.path.join(root, "shards", "s0.h5")
    os.remove(shard)
    os.mkfifo(shard)
    single = str(tmp_path / "pipe.h5")
    os.mkfifo(single)
    proc = run_child(
        f"""
        import rowstore as rs
        from rowstore.errors import FormatError
        from rowstore.format.shards import DatasetLayout
        out = []
        try:
            rs.open({single!r})
        except FormatError as exc:
            out.append("file: " + str(exc))
        r = rs.open({root!r})
        try:
            r.take([0])
        except FormatError as exc:
            out.append("shard: " + str(exc))
        out += ["verify: " + str(e) for e in
        DatasetLayout.open({root!r}).damage(shard_indexes=True)]
        print("\\n".join(out))
    """,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and all("FIFO" in line for line in lines), proc.stdout


# -- files replaced or rewritten under an open reader ----------------------------------------
@pytest.fixture
def replaced(tmp_path):
    """A dataset of two shards (values 1 and 2) and a reader open on its version 1; then
    shard s0 is removed (as gc does) and a new version commits another s0 of the same size
    (values 9)."""
    root = str(tmp_path / "ds")
    commit(
        root, [write_shard(root, SCHEMA, {"v": np.full(50, k)}, name=f"s{k - 1}") for k in (1, 2)]
    )
    r = rs.open(root, max_open_files=1, verify=False)  # unchecked: a stale read would pass silently
    assert r.take([0, 50])["v"].tolist() == [1, 2]  # shard 1's descriptor evicted shard 0's
    shard = os.path.join(root, "shards", "s0.h5")
    size = os.path.getsize(shard)
    os.remove(shard)
    info = write_shard(root, SCHEMA, {"v": np.full(50, 9)}, name="s0")
    assert os.path.getsize(shard) == size
    commit(root, [info])
    yield r
    r.close()


def test_shard_replaced_under_the_same_name_and_size_is_refused_on_reopen(replaced):
    with pytest.raises(StaleFileError, match="s0.h5.*changed since it was opened") as ei:
        replaced.take([0])  # its descriptor was evicted: reopened here
    assert ei.value.path.endswith("s0.h5")
    replaced.close()
    with pytest.raises(StaleFileError):
        replaced.take([1])
    assert replaced.take([50])["v"].tolist() == [2]  # the untouched shard still reads


def test_replaced_shard_is_refused_in_a_pickled_and_a_forked_copy(replaced):
    with pytest.raises(StaleFileError):
        pickle.loads(pickle.dumps(replaced)).take([0])
    if not hasattr(os, "fork"):
        return
    pid = os.fork()
    if pid == 0:
        try:
            replaced.take([0])
            code = 1
        except StaleFileError:
            code = 0
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


def test_shard_replaced_before_its_first_read_is_refused(tmp_path):
    """The identity is taken when the reader opens the dataset, not at the shard's first read."""
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, {"v": np.full(50, 1)}, name="s0")])
    with rs.open(root, verify=False) as r:
        shard = os.path.join(root, "shards", "s0.h5")
        os.remove(shard)
        write_shard(root, SCHEMA, {"v": np.full(50, 9)}, name="s0")
        with pytest.raises(StaleFileError):
            r.take([0])


def test_single_file_overwritten_in_place_with_its_mtime_restored_is_refused(tmp_path):
    p, other = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    write_file(p, 1)
    write_file(other, 2)
    st = os.stat(p)
    with rs.open(p, verify=False) as r:
        assert r.take([0, 1])["v"].tolist() == [1, 1]
        with open(other, "rb") as f:
            data = f.read()
        assert len(data) == st.st_size
        with open(p, "r+b") as f:  # rewritten in place: same inode and size ...
            f.write(data)
        os.utime(
            p, ns=(st.st_atime_ns, st.st_mtime_ns)
        )  # ... and modification time (cp -p, rsync -t)
        r.close()
        with pytest.raises(StaleFileError, match="changed since it was opened"):
            r.take([0, 1])


# -- one descriptor budget per process --------------------------------------------------------
def test_readers_and_mixes_share_one_descriptor_budget(tmp_path):
    """Under ``ulimit -n`` 64, each reader of a 40-shard dataset may keep 16 descriptors; six
    such readers and a mix of them kept 96+ and failed with EMFILE."""
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, {"v": np.full(5, k)}) for k in range(40)])
    proc = run_child(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64,
        resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        import numpy as np
        import rowstore as rs
        rows = np.arange(0, 200, 5)  # one row of every shard
        readers = [rs.open({root!r}) for _ in range(6)]
        for r in readers:
            assert sorted(r.take(rows)["v"].tolist()) == list(range(40))
        held = sum(r._store.open_count() for r in readers)
        assert held <= 32, held  # half of ulimit -n for all readers together
        m = rs.mix([({root!r}, 1.0)] * 4, seed=0)
        n = sum(len(batch["v"]) for batch in m.deal(50, shuffle="full"))
        assert n == 800, n  # four sources of 200 rows
        print("ok", held)
    """)
    assert proc.returncode == 0 and proc.stdout.startswith("ok"), proc.stderr[-3000:]


# -- a v2 file whose footer is gone -----------------------------------------------------------
def test_new_files_record_that_they_have_a_footer(tmp_path):
    p = str(tmp_path / "a.h5")
    write_file(p, 1)
    with h5py.File(p, "r") as f:
        assert f["rowstore"].attrs["has_footer"] == 1
    assert rs.Layout.open(p).footer_offset > 0


def test_file_edited_with_h5py_loses_its_footer_and_is_refused_unless_allowed(tmp_path, capsys):
    p = str(tmp_path / "a.h5")
    with rs.Writer(p, SCHEMA, rows_per_block=10) as w:
        w.write_batch({"v": np.arange(100)})
    with h5py.File(p, "r+") as f:  # two index entries swapped; libhdf5 cuts the footer at close
        b = f["rowstore/blocks"][()]
        b[[0, 1]] = b[[1, 0]]
        b["first_row"][[0, 1]] = [0, 10]
        b["num_rows"][[0, 1]] = 10
        f["rowstore/blocks"][...] = b
    with pytest.raises(FormatError, match="footer is gone.*allow_missing_footer=True"):
        rs.open(p)
    with pytest.raises(FormatError, match="footer is gone"):
        rs.Layout.open(p)
    assert cli.main(["info", p]) == 1
    assert "footer is gone" in capsys.readouterr().err
    with rs.open(p, allow_missing_footer=True) as r:  # opted in: v1's guarantees only
        assert r.take([0])["v"].tolist() == [10]
    assert cli.main(["info", "--allow-missing-footer", p]) == 0
    assert "footer missing" in capsys.readouterr().out


def test_v1_golden_file_without_the_marker_still_reads():
    with rs.open(os.path.join(ROOT, "tests", "data", "golden_v1.h5")) as r:
        assert len(r) > 0


# -- rowstore verify runs libhdf5 on footer-less shards in a child ---------------------------
def test_dataset_verify_checks_a_footerless_shard_in_a_child(tmp_path, capsys):
    """A footer-less (v1) shard's index is parsed by libhdf5 in a child process: the check
    still finds a shard whose own index disagrees with the manifest, and libhdf5 never runs in
    the verifying process (where damaged metadata could hang it)."""
    root = str(tmp_path / "ds")
    commit(root, [write_shard(root, SCHEMA, {"v": np.arange(100)}, name="s0", rows_per_block=10)])
    shard = os.path.join(root, "shards", "s0.h5")
    size = os.path.getsize(shard)
    with h5py.File(shard, "r+") as f:  # a v1 shard (no footer) whose own index was edited
        g = f["rowstore"]
        g.attrs["format_version"] = 1
        if "has_footer" in g.attrs:
            del g.attrs["has_footer"]
        b = g["blocks"][()]
        b["checksum"][3] ^= 1
        g["blocks"][...] = b
    with open(shard, "ab") as f:  # the size the manifest records (the footer's bytes, zeroed)
        f.write(b"\0" * (size - os.path.getsize(shard)))
    code = f"""
        import sys
        from rowstore import cli
        sys.modules["h5py"] = None  # any libhdf5 use in this process fails
        sys.exit(cli.main(["verify", {root!r}]))
    """
    proc = run_child(code)
    assert proc.returncode == 1, proc.stderr
    assert "own index disagrees with the dataset's manifest" in proc.stderr, proc.stderr


def test_remote_file_without_its_footer_is_refused_unless_allowed(tmp_path, http_factory):
    d = str(tmp_path / "srv")
    os.makedirs(d)
    p = os.path.join(d, "a.h5")
    write_file(p, 7)
    footer.cut(p, rs.Layout.open(p).footer_offset)  # as libhdf5 leaves it after an edit
    srv = http_factory(d)
    with pytest.raises(FormatError, match="footer is gone"):
        rs.open(srv.url + "/a.h5")
    with rs.open(srv.url + "/a.h5", allow_missing_footer=True) as r:
        assert r.take([0, 99])["v"].tolist() == [7, 7]


def test_a_reader_collected_while_another_holds_the_budget_lock_does_not_deadlock(tmp_path):
    """All stores share one lock: a Reader whose finalizer runs (garbage collection) on the
    thread that holds it, inside another reader's read, must not wait for it forever."""
    p = str(tmp_path / "a.h5")
    write_file(p, 3)
    proc = run_child(
        f"""
        import gc
        import rowstore as rs
        from rowstore.storage import local as _store
        keep = rs.open({p!r})
        keep.take([0])
        victim = rs.open({p!r})
        victim.take([0])
        cycle = [victim]
        cycle.append(cycle)  # only the collector frees it
        del victim, cycle
        real = _store.LocalStore._evict_locked
        def evict(self, budget):  # collect inside the critical section, as an allocation may
            gc.collect()
            real(self, budget)
        _store.LocalStore._evict_locked = evict
        assert keep.take([1])["v"].tolist() == [3]
        _store.LocalStore._evict_locked = real
        assert not _store._BUDGET.pending
        print("ok")
    """,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
