"""Power loss on a real ext4, bounded (fsync ordering tested, not trusted).

An ext4 image on a loop device is mounted ``data=writeback,noauto_da_alloc,commit=300``: data
is not ordered before the metadata that names it, renames do not flush data, and the journal
commits only when asked (an fsync). A writer child runs on it; at a random moment it is stopped
(SIGSTOP, every thread seen stopped: no system call in flight) and the image file is copied: the
copy holds exactly what ext4 had sent to the device, and nothing of the page cache, which a power
cut loses (the kernel's periodic writeback, after 30 s, does not run within a trial). The child
is then killed, the copy repaired as a reboot would (``e2fsck -fy``: journal replay) and mounted
read-only. There the target must read as exactly the old content or exactly the new one, and if
the child had printed "done" (its ``close`` returned) it must be the new one: what rowstore
acknowledged survives the power cut.

What this does not cover: a device whose own volatile cache drops or reorders writes it had
received before a flush (that needs a block-level write log, e.g. dm-log-writes/CrashMonkey;
this machine has no device-mapper), and file systems other than ext4.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT, scaled, wait_until

import rowstore

TOOLS = ("losetup", "mkfs.ext4", "e2fsck", "mount", "umount")
OPTIONS = "data=writeback,noauto_da_alloc,commit=300"
SCHEMA = rowstore.Schema({"x": "int64", "t": rowstore.STR})
OLD, NEW = 1000, 13000
TRIALS = 3  # per scenario


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=scaled(60))


@pytest.fixture(scope="module")
def ext4(tmp_path_factory):
    """``(mountpoint, image)`` of a fresh ext4 image on a loop device (skips where that is not allowed)."""
    if sys.platform != "linux" or os.geteuid() != 0 or not all(shutil.which(t) for t in TOOLS):
        pytest.skip("needs root, loop devices and e2fsprogs")
    d = tmp_path_factory.mktemp("power")
    img, mnt = str(d / "disk.img"), str(d / "mnt")
    os.makedirs(mnt)
    with open(img, "wb") as f:
        f.truncate(32 << 20)
    if _sh("mkfs.ext4", "-q", "-F", img).returncode != 0:
        pytest.skip("mkfs.ext4 failed")
    loop = _sh("losetup", "-f", "--show", img)
    if loop.returncode != 0:
        pytest.skip(f"no loop device: {loop.stderr.strip()}")
    dev = loop.stdout.strip()
    try:
        if _sh("mount", "-o", OPTIONS, dev, mnt).returncode != 0:
            pytest.skip("cannot mount a loop device here")
        try:
            yield mnt, img
        finally:
            _sh("umount", mnt)
    finally:
        _sh("losetup", "-d", dev)


def _rows(lo: int, hi: int) -> dict:
    return {"x": np.arange(lo, hi, dtype=np.int64), "t": [f"r{i}" for i in range(lo, hi)]}


CHILD = """
import sys
import numpy as np, rowstore
path, scenario = sys.argv[1], sys.argv[2]
schema = rowstore.Schema({"x": "int64", "t": rowstore.STR})
def batches():
    for lo in range(OLD, NEW, 2000):
        yield {"x": np.arange(lo, lo + 2000), "t": [f"r{i}" for i in range(lo, lo + 2000)]}
print("ready", flush=True)
if scenario == "append":
    with rowstore.Writer(path, mode="a", rows_per_block=500) as w:
        for b in batches():
            w.write_batch(b)
            print("wrote", flush=True)
else:
    with rowstore.DatasetWriter(path, schema, mode="a", shard_bytes=40_000, rows_per_block=500) as w:
        for b in batches():
            w.write_batch(b)
            print("wrote", flush=True)
print("done", flush=True)
""".replace("OLD", str(OLD)).replace("NEW", str(NEW))


def _reset(mnt: str, scenario: str) -> str:
    for name in os.listdir(mnt):
        if name != "lost+found":
            p = os.path.join(mnt, name)
            shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
    if scenario == "append":
        path = os.path.join(mnt, "f.h5")
        with rowstore.Writer(path, SCHEMA, rows_per_block=500) as w:
            w.write_batch(_rows(0, OLD))
    else:
        path = os.path.join(mnt, "ds")
        with rowstore.DatasetWriter(path, SCHEMA, rows_per_block=500) as w:
            w.write_batch(_rows(0, OLD))
    _syncfs(mnt)  # the old content is on the device before the trial
    return path


def _syncfs(mnt: str) -> None:
    import ctypes

    fd = os.open(mnt, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), "syncfs failed")
    finally:
        os.close(fd)


def _stopped(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return all(
            open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] in "tT"
            for t in tasks
        )
    except OSError:
        return False


def _power_cut(
    mnt: str, img: str, scenario: str, delay: float | None, copy: str, *, first_batch: bool = False
) -> tuple[str | None, bool, float]:
    """Run the child on a fresh old content; after ``delay`` s (with ``first_batch``, once it
    wrote its first batch) stop it and copy the image (None: let it finish first, then copy).
    Returns (the copy's content "old"/"new"/None, done, the seconds from "ready" to "done"
    when it was let finish)."""
    path = _reset(mnt, scenario)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, path, scenario], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        t0 = time.perf_counter()
        if delay is None:
            while (line := proc.stdout.readline()) == "wrote\n":
                pass
            assert line == "done\n"
            ran = time.perf_counter() - t0
        elif first_batch:
            assert proc.stdout.readline() == "wrote\n"
        else:
            time.sleep(delay)
        proc.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: _stopped(proc.pid) or proc.poll() is not None, interval=0.001)
        shutil.copyfile(img, copy)  # the device's content at the power cut
    finally:
        proc.kill()
        out = proc.communicate(timeout=scaled(60))[0]
    done = delay is None or "done" in out
    assert _sh("e2fsck", "-fy", copy).returncode in (0, 1), (
        "e2fsck could not repair the copy"
    )  # 1: fixed (replayed)
    dev = _sh("losetup", "-f", "--show", copy).stdout.strip()
    view = copy + ".mnt"
    os.makedirs(view, exist_ok=True)
    try:
        assert _sh("mount", "-o", "ro", dev, view).returncode == 0
        try:
            target = os.path.join(view, os.path.basename(path))
            with rowstore.open(target) as r:
                b = r.take(np.arange(len(r)))
            x, t = np.asarray(b["x"]), [str(v) for v in b["t"]]
            content = None
            if t == [f"r{i}" for i in x.tolist()]:
                content = (
                    "old"
                    if np.array_equal(x, np.arange(OLD))
                    else "new"
                    if np.array_equal(x, np.arange(NEW))
                    else None
                )
        finally:
            _sh("umount", view)
    finally:
        _sh("losetup", "-d", dev)
        os.unlink(copy)
    return content, done, ran if delay is None else 0.0


@pytest.mark.parametrize("scenario", ["append", "dataset"])
def test_a_power_cut_leaves_the_old_or_the_new_content_and_keeps_what_was_acknowledged(
    ext4, tmp_path, scenario
):
    mnt, img = ext4
    copy = str(tmp_path / "copy.img")
    content, done, T = _power_cut(
        mnt, img, scenario, None, copy
    )  # finished: acknowledged, so durable
    assert (content, done) == ("new", True)
    rng = random.Random(17)
    seen = []
    for i in range(
        TRIALS
    ):  # the first cut after the first batch (surely mid-write), the others anywhere
        content, done, _ = _power_cut(
            mnt, img, scenario, rng.uniform(0.0, T * 1.1), copy, first_batch=i == 0
        )
        assert content in ("old", "new"), (
            "the device held neither the old nor the new content whole"
        )
        if done:
            assert content == "new", (
                "close() had returned but the new content did not survive the power cut"
            )
        seen.append(content)
    assert seen[0] == "old"  # the cut after the first batch: before the new content was durable
