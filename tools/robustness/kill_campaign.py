"""Randomized SIGKILL campaign with counts: crash consistency of every way to write.

    python tools/robustness/kill_campaign.py --kills N [--seed S] [--scenarios NAME ...] [--rows R]
                                  [--out bench/results/kill_campaign.json]

Scenarios (each a child process, this script with ``--child``, killed by SIGKILL):

    writer_w     ``Writer(mode="w")`` replacing an existing file
    writer_a     ``Writer(mode="a")`` appending to it
    ds_append    ``DatasetWriter(mode="a")`` with a small ``shard_bytes`` (about 8 rollovers)
    ds_replace   ``DatasetWriter(mode="w")`` replacing the dataset's content
    two_phase    four ``write_shard`` and one ``commit(mode="a", orphan_grace_s=0)``
    gc           ``gc_dataset(dry_run=False, orphan_grace_s=0)`` after an overwrite: version 1
                 (many shards), version 2 current, uncommitted shards and a stale temporary
    shuffle      ``rowstore shuffle IN OUT --memory 4MiB --tmp WORK`` (the CLI) of a dataset of the
                 new rows: *old* is no ``OUT``, *new* a complete shuffled copy (the permutation
                 of an unkilled reference run); recovery is the next shuffle with the same
                 directories, which must remove every ``.rowstore-shuffle-*`` the killed run left
    dask         ``rowstore.dask.to_rowstore(ddf, mode="a")`` of 4 partitions on a
                 ``LocalCluster`` (2 worker threads in the child: killing it kills the driver
                 mid-write or before its commit, and its workers with it)
    remote       four ``write_shard`` + ``commit(mode="a")`` to ``s3://`` (a moto server this
                 process runs; every trial its own prefix): the bucket's current version must
                 read whole. There is no remote gc: uncommitted shard objects and the local
                 upload staging directories a killed child leaves are counted as leftovers

Rows are int64 ``x``, a str ``s`` of varying length and a float32[16] ``a``, all computed from
``x`` (:func:`rows`), so both possible results of a kill can be recomputed: the *old* content
(before the child ran) and the *new* one. Trials alternate raw and lz4 files. Each (scenario,
compression) is first run once unkilled (calibration: the time from the child's "ready", after
its imports, to its "done"); a trial then kills the child after a delay drawn uniformly from
``[0, 1.1 * T]`` by a ``random.Random(seed)``, so kills span the whole operation and a few land
after it.

After each kill (the invariant):

1. the target reads through ``rowstore.open`` as exactly the old or exactly the new rows (every
   value compared, floats bit for bit), never a mix or an error, and ``rowstore verify`` says OK;
2. recovery works: a fresh ``Writer(mode="a")`` (file) or ``write_shard`` + ``commit(mode="a")``
   (dataset) adds rows, then ``rowstore gc`` (file: ``remove_stale``) or
   ``gc_dataset(dry_run=False, orphan_grace_s=0)`` (dataset); afterwards no ``*.rowstore-tmp``
   is left, every shard file is named by the current version, only its manifest remains, and
   the content is what it read plus the added rows (read and verified again).

Outcomes: ``old``, ``new`` (killed after the new content was published), ``not-killed`` (the
child printed "done" before the signal: must be ``new``), ``VIOLATION`` (anything else: details,
with the seed, trial and delay that reproduce it, in the JSON's ``violations``). For ``gc`` both
contents are version 2's rows; there ``new`` means the kill found nothing left to collect and
``old`` that something was (partly done gc included). ``leftovers`` counts trials after which
the target held a temporary, a shard file the current version does not name, or a manifest other
than the current one's (for datasets that includes the previous version's, which a commit keeps:
there it is every trial). Exit status 1 if any violation.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

import rowstore
from rowstore import STR, Field, Schema
from rowstore.cli import main as cli_main
from rowstore.format import manifest
from rowstore.storage.atomic import TMP_SUFFIX, remove_stale

SCHEMA = Schema([Field("x", "int64"), Field("s", STR), Field("a", "float32", (16,))])
SCENARIOS = (
    "writer_w",
    "writer_a",
    "ds_append",
    "ds_replace",
    "two_phase",
    "gc",
    "shuffle",
    "dask",
    "remote",
)
FILE_SCENARIOS = ("writer_w", "writer_a")
COMPRESSIONS = ("raw", "lz4")
NEW_BASE = 1_000_000  # the child's rows: x in [NEW_BASE, NEW_BASE + rows)
BATCH = 2000
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(ROOT, "bench", "results", "kill_campaign.json")
BUCKET = "rowstore"
S3_ENV = "ROWSTORE_KILL_CAMPAIGN_S3"  # the moto endpoint, for the children of remote trials
# compression -> the rows of an unkilled shuffle (its permutation is a function of the seed)
REFERENCE: dict = {}
SHUFFLE_ARGS = ["--memory", "4MiB", "--seed", "5", "--shard-bytes", "256KiB", "--quiet"]


# -- rows ----------------------------------------------------------------------------------------
def rows(lo: int, hi: int) -> dict:
    """Rows ``x = lo..hi-1`` as columns; every value is a function of ``x``."""
    x = np.arange(lo, hi, dtype=np.int64)
    s = [f"{i}:" + "abcdefghij"[: i % 11] * (1 + i % 3) for i in x.tolist()]
    a = ((x[:, None] * 16 + np.arange(16)) % 1_000_003).astype(np.float32) * np.float32(
        0.25
    ) - np.float32(7)
    return {"x": x, "s": s, "a": a}


def concat(*parts: dict) -> dict:
    return {
        "x": np.concatenate([p["x"] for p in parts]),
        "s": [v for p in parts for v in p["s"]],
        "a": np.concatenate([p["a"] for p in parts]).reshape(-1, 16),
    }


def batches(cols: dict, step: int = BATCH):
    n = len(cols["x"])
    for lo in range(0, n, step):
        yield {k: v[lo : lo + step] for k, v in cols.items()}


def _comp(compression: str):
    return None if compression == "raw" else compression


def _shard_bytes(n: int) -> int:
    return max(20_000, n * 110 // 8)  # ~110 raw bytes a row: about 8 shards of n rows


def target_of(scenario: str, work: str) -> str:
    if scenario == "remote":  # the trial's own prefix in the bucket
        return f"s3://{BUCKET}/{os.path.basename(work)}/ds"
    if scenario == "shuffle":
        return os.path.join(work, "out")
    return os.path.join(work, "data.h5" if scenario in FILE_SCENARIOS else "ds")


def s3_options() -> dict | None:
    endpoint = os.environ.get(S3_ENV)
    if not endpoint:
        return None
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def _opts(scenario: str) -> dict:
    return {"storage_options": s3_options()} if scenario == "remote" else {}


def expected(scenario: str, n: int) -> tuple[dict, dict]:
    """(old, new) content of the target of ``scenario`` with ``n`` new rows."""
    old, new = rows(0, n // 2), rows(NEW_BASE, NEW_BASE + n)
    if scenario in ("writer_w", "ds_replace"):
        return old, new
    if scenario == "shuffle":
        return {}, new  # no output, or the new rows (in the shuffled order: see check_shuffle)
    if scenario == "gc":
        return new, new
    return old, concat(old, new)


# -- the states before the child runs (templates) and the child --------------------------------
def setup(scenario: str, work: str, compression: str, n: int) -> None:
    """Write the old content of ``scenario`` under ``work``."""
    comp, path = _comp(compression), target_of(scenario, work)
    old = rows(0, n // 2)
    if scenario in FILE_SCENARIOS:
        with rowstore.Writer(path, SCHEMA, mode="w", compression=comp) as w:
            for b in batches(old):
                w.write_batch(b)
        return
    if scenario == "shuffle":  # the input; the reference output (unkilled) beside the template
        with rowstore.DatasetWriter(
            os.path.join(work, "in"),
            SCHEMA,
            mode="w",
            compression=comp,
            shard_bytes=_shard_bytes(n),
            block_bytes=64 << 10,
        ) as w:
            for b in batches(rows(NEW_BASE, NEW_BASE + n)):
                w.write_batch(b)
        ref = work + ".reference"
        shutil.rmtree(ref, ignore_errors=True)
        with contextlib.redirect_stdout(io.StringIO()):
            if cli_main(["shuffle", os.path.join(work, "in"), ref, *SHUFFLE_ARGS]) != 0:
                raise SystemExit("the reference shuffle failed")
        REFERENCE[compression] = read_all(ref)
        shutil.rmtree(ref)
        return
    if scenario == "remote":
        return  # written per trial (setup_remote): a bucket prefix is not copied with the template
    if scenario != "gc":
        with rowstore.DatasetWriter(
            path, SCHEMA, mode="w", compression=comp, shard_bytes=_shard_bytes(n)
        ) as w:
            for b in batches(old):
                w.write_batch(b)
        return
    # gc: version 1 in 64 small shards, version 2 (the new rows) replacing it, three shards no
    # version names, and a stale temporary (a file of the temporary's name whose lock nobody holds).
    with rowstore.DatasetWriter(
        path, SCHEMA, mode="w", compression=comp, shard_bytes=_shard_bytes(n) // 16
    ) as w:
        for b in batches(old, 500):
            w.write_batch(b)
    with rowstore.DatasetWriter(
        path, SCHEMA, mode="w", compression=comp, shard_bytes=_shard_bytes(n)
    ) as w:
        for b in batches(rows(NEW_BASE, NEW_BASE + n)):
            w.write_batch(b)
    for i in range(3):
        rowstore.write_shard(path, SCHEMA, rows(-1000 * (i + 1), -1000 * i), compression=comp)
    with open(
        os.path.join(path, manifest.SHARD_DIR, ".part-x.h5.0123456789ab" + TMP_SUFFIX), "wb"
    ) as f:
        f.write(b"left by a killed writer")


def setup_remote(url: str, compression: str, n: int) -> None:
    with rowstore.DatasetWriter(
        url,
        SCHEMA,
        mode="w",
        compression=_comp(compression),
        shard_bytes=_shard_bytes(n),
        storage_options=s3_options(),
    ) as w:
        for b in batches(rows(0, n // 2)):
            w.write_batch(b)


def child(scenario: str, path: str, compression: str, n: int) -> None:
    """The operation that is killed (run as ``--child``); prints "ready" before and "done" after."""
    comp = _comp(compression)
    new = rows(NEW_BASE, NEW_BASE + n)
    if scenario == "dask":  # the cluster is up before "ready": kills land in the write and commit
        import dask

        dask.config.set({"dataframe.convert-string": False})  # keep the ndarray cells of "a"
        import dask.dataframe as dd
        import distributed
        import pandas as pd

        from rowstore.dask import to_rowstore

        cluster = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=None,
            silence_logs=40,
        )
        client = distributed.Client(cluster)
        frame = pd.DataFrame({"x": new["x"], "s": new["s"], "a": list(new["a"])})
        ddf = dd.from_pandas(frame, npartitions=4, sort=False)
    print("ready", flush=True)
    if scenario == "dask":
        to_rowstore(
            ddf,
            path,
            schema=SCHEMA,
            index=False,
            mode="a",
            compression=comp,
            shard_bytes=_shard_bytes(n),
        )
        client.close()
        cluster.close()
    elif scenario == "shuffle":
        work = os.path.dirname(path)
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli_main(["shuffle", os.path.join(work, "in"), path, "--tmp", work, *SHUFFLE_ARGS])
        if rc != 0:
            raise SystemExit(f"rowstore shuffle: exit {rc}")
    elif scenario == "remote":
        step = -(-n // 4)
        opts = s3_options()
        infos = [
            rowstore.write_shard(
                path,
                SCHEMA,
                {k: v[lo : lo + step] for k, v in new.items()},
                compression=comp,
                storage_options=opts,
            )
            for lo in range(0, n, step)
        ]
        rowstore.commit(path, infos, mode="a", storage_options=opts)
    elif scenario in FILE_SCENARIOS:
        with rowstore.Writer(
            path, SCHEMA, mode="w" if scenario == "writer_w" else "a", compression=comp
        ) as w:
            for b in batches(new):
                w.write_batch(b)
    elif scenario in ("ds_append", "ds_replace"):
        mode = "a" if scenario == "ds_append" else "w"
        with rowstore.DatasetWriter(
            path, SCHEMA, mode=mode, compression=comp, shard_bytes=_shard_bytes(n)
        ) as w:
            for b in batches(new):
                w.write_batch(b)
    elif scenario == "two_phase":
        step = -(-n // 4)
        infos = [
            rowstore.write_shard(
                path, SCHEMA, {k: v[lo : lo + step] for k, v in new.items()}, compression=comp
            )
            for lo in range(0, n, step)
        ]
        rowstore.commit(path, infos, mode="a", orphan_grace_s=0)
    elif scenario == "gc":
        rowstore.gc_dataset(path, dry_run=False, orphan_grace_s=0)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    print("done", flush=True)


# -- checks ----------------------------------------------------------------------------------------
class Violation(Exception):
    pass


def read_all(path: str, **kwargs) -> dict:
    with rowstore.open(path, **kwargs) as r:
        b = r.take(np.arange(len(r)))
    return {"x": np.asarray(b["x"]), "s": [str(v) for v in b["s"]], "a": np.asarray(b["a"])}


def same(got: dict, exp: dict) -> bool:
    return (
        got["x"].shape == exp["x"].shape
        and np.array_equal(got["x"], exp["x"])
        and got["s"] == exp["s"]
        and got["a"].shape == exp["a"].shape
        and np.array_equal(got["a"].view(np.uint32), exp["a"].view(np.uint32))
    )


def describe(got: dict, exp: dict) -> str:
    n, m = len(got["x"]), len(exp["x"])
    k = min(n, m)
    bad = [
        i
        for i in range(k)
        if got["x"][i] != exp["x"][i]
        or got["s"][i] != exp["s"][i]
        or not np.array_equal(got["a"][i].view(np.uint32), exp["a"][i].view(np.uint32))
    ][:1]
    return f"{n} rows (expected {m}); first difference at row {bad[0] if bad else k}"


def verify_cli(path: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(["verify", path])
    if rc != 0:
        raise Violation(f"rowstore verify {path}: exit {rc}: {err.getvalue().strip()[-2000:]}")


def temporaries_under(directory: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, n), directory)
        for d, _, names in os.walk(directory)
        for n in names
        if n.endswith(TMP_SUFFIX)
    )


def listing(directory: str) -> list[str]:
    return sorted(
        f"{os.path.relpath(os.path.join(d, n), directory)} {os.path.getsize(os.path.join(d, n))}"
        for d, _, names in os.walk(directory)
        for n in names
    )


def leftovers(scenario: str, work: str) -> list[str]:
    """Temporaries, shard files the current version does not name, and manifests other than
    the current one's (what a clean-up has to remove)."""
    left = temporaries_under(work)
    if scenario in FILE_SCENARIOS:
        return left
    root = target_of(scenario, work)
    named = set(manifest.load(root).shards["path"])
    sdir = os.path.join(root, manifest.SHARD_DIR)
    left += [
        f"{manifest.SHARD_DIR}/{n}"
        for n in sorted(os.listdir(sdir))
        if n.endswith(".h5") and f"{manifest.SHARD_DIR}/{n}" not in named
    ]
    v = manifest.read_pointer(root)[0]
    keep = {
        manifest.LOCK,
        os.path.basename(manifest.manifest_path(v)),
        os.path.basename(manifest.index_path(v)),
    }
    left += [
        f"{manifest.MANIFEST_DIR}/{n}"
        for n in sorted(os.listdir(os.path.join(root, manifest.MANIFEST_DIR)))
        if n not in keep and not n.endswith(TMP_SUFFIX)
    ]
    return left


SHUFFLE_PREFIX = ".rowstore-shuffle-"


def shuffle_leftovers(work: str) -> list[str]:
    return sorted(n for n in os.listdir(work) if n.startswith(SHUFFLE_PREFIX)) + temporaries_under(
        work
    )


def check_shuffle(work: str, compression: str, n: int) -> tuple[str, list[str]]:
    """No output, or the complete output of the reference run; the next shuffle with the same
    directories removes what the killed one left."""
    out, ref = os.path.join(work, "out"), REFERENCE[compression]
    outcome = "old"
    if os.path.exists(out):
        try:
            got = read_all(out)
        except Exception as exc:
            raise Violation(f"reading {out}: {type(exc).__name__}: {exc}") from exc
        if not same(got, ref):
            raise Violation(
                f"a visible output that is not the complete shuffle: {describe(got, ref)}"
            )
        verify_cli(out)
        outcome = "new"
    left = shuffle_leftovers(work)
    again = os.path.join(work, "again")
    with contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["shuffle", os.path.join(work, "in"), again, "--tmp", work, *SHUFFLE_ARGS])
    if rc != 0:
        raise Violation(f"the next shuffle failed: exit {rc}")
    if shuffle_leftovers(work):
        raise Violation(f"left after the next shuffle: {shuffle_leftovers(work)}")
    if not same(read_all(again), ref):
        raise Violation("the next shuffle's output is not the reference")
    return outcome, left


def outcome_of(got, old, new) -> str:
    """ "old" or "new": which whole content ``got`` is; a :class:`Violation` when it is neither."""
    if same(got, new):
        return "new"
    if same(got, old):
        return "old"
    raise Violation(
        f"a mix: {describe(got, new)} vs the new content; {describe(got, old)} vs the old"
    )


def check_remote(work: str, compression: str, n: int) -> tuple[str, list[str]]:
    """The bucket's current version reads whole (old or new); a next commit works. Uncommitted
    shard objects and local upload staging directories are leftovers (no remote gc)."""
    import fsspec

    url, opts = target_of("remote", work), s3_options()
    old, new = expected("remote", n)
    try:
        got = read_all(url, storage_options=opts)
    except Exception as exc:
        raise Violation(f"reading {url}: {type(exc).__name__}: {exc}") from exc
    outcome = outcome_of(got, old, new)
    fs = fsspec.filesystem("s3", **opts)
    with rowstore.open(url, storage_options=opts) as r:
        named = {p.rstrip("/").rsplit("/", 1)[-1] for p in r.layout.shard_paths}
    objects = [
        p.rsplit("/", 1)[-1]
        for p in fs.ls(url.split("://", 1)[1] + "/" + manifest.SHARD_DIR, refresh=True)
    ]
    staging = work + ".tmp"
    left = [f"{manifest.SHARD_DIR}/{o}" for o in sorted(objects) if o not in named]
    left += (
        [f"(local) {d}" for d in sorted(os.listdir(staging)) if d.startswith("rowstore-upload-")]
        if os.path.isdir(staging)
        else []
    )
    extra = rows(-100, 0)
    rowstore.commit(
        url,
        [
            rowstore.write_shard(
                url, SCHEMA, extra, compression=_comp(compression), storage_options=opts
            )
        ],
        mode="a",
        storage_options=opts,
    )
    after = read_all(url, storage_options=opts)
    if not same(after, concat(got, extra)):
        raise Violation(f"after recovery: {describe(after, concat(got, extra))}")
    return outcome, left


def check(scenario: str, work: str, compression: str, n: int) -> tuple[str, list[str]]:
    """The invariant after a kill: ``(outcome, leftovers)``, outcome "old" or "new"; raises
    :class:`Violation` (or anything else) when it does not hold."""
    if scenario == "shuffle":
        return check_shuffle(work, compression, n)
    if scenario == "remote":
        return check_remote(work, compression, n)
    path = target_of(scenario, work)
    old, new = expected(scenario, n)
    try:
        got = read_all(path)
    except Exception as exc:
        raise Violation(f"reading {path}: {type(exc).__name__}: {exc}") from exc
    outcome = outcome_of(got, old, new)
    verify_cli(path)
    left = leftovers(scenario, work)
    if scenario == "gc":
        outcome = "old" if left else "new"
        if 1 in manifest.versions(path):  # version 1's manifest is removed before its shards
            try:
                v1 = manifest.load(path, 1)
            except rowstore.RowstoreError:
                v1 = None  # its manifest without its sidecar: unreadable, and not current
            if v1 is not None and not all(
                os.path.exists(os.path.join(path, p)) for p in v1.shards["path"]
            ):
                raise Violation(
                    "version 1's manifest is still readable but some of its shards are gone"
                )
    # Recovery: a new writer or commit, then the clean-up, leave no temporary and no orphan.
    extra = rows(-100, 0)
    if scenario in FILE_SCENARIOS:
        with rowstore.Writer(path, mode="a") as w:
            w.write_batch(extra)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if cli_main(["gc", work]) != 0:
                raise Violation(f"rowstore gc {work} failed: {out.getvalue()}")
        if remove_stale(work, dry_run=True)[0] or temporaries_under(work):
            raise Violation(f"temporaries left after recovery: {temporaries_under(work)}")
    else:
        rowstore.commit(
            path,
            [rowstore.write_shard(path, SCHEMA, extra, compression=_comp(compression))],
            mode="a",
            orphan_grace_s=0,
        )
        rowstore.gc_dataset(path, dry_run=False, orphan_grace_s=0)
        still = leftovers(scenario, work)
        if still:
            raise Violation(f"left after commit + gc_dataset(orphan_grace_s=0): {still}")
        if sorted(os.listdir(path)) != [
            manifest.MANIFEST_DIR,
            manifest.POINTER,
            manifest.SHARD_DIR,
        ]:
            raise Violation(f"unexpected files in {path}: {sorted(os.listdir(path))}")
    after = read_all(path)
    if not same(after, concat(got, extra)):
        raise Violation(f"after recovery: {describe(after, concat(got, extra))}")
    verify_cli(path)
    return outcome, left


# -- running children ------------------------------------------------------------------------------
def spawn(scenario: str, path: str, compression: str, n: int, tmpdir: str) -> subprocess.Popen:
    os.makedirs(
        tmpdir, exist_ok=True
    )  # the child's TMPDIR (upload staging, dask scratch): counted, then removed
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", scenario, path, compression, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": tmpdir},
    )


def run_trial(
    scenario: str, template: str, work: str, compression: str, n: int, delay: float | None
) -> dict:
    """Copy the template to ``work``, run the child, kill it after ``delay`` s (None: let it
    finish) and check. A dict of what happened."""
    shutil.copytree(template, work, symlinks=True)
    if scenario == "remote":
        setup_remote(target_of(scenario, work), compression, n)
    proc = spawn(scenario, target_of(scenario, work), compression, n, work + ".tmp")
    rec: dict = {}
    try:
        line = proc.stdout.readline()
        t0 = time.perf_counter()
        if line != "ready\n":
            proc.kill()
            _, err = proc.communicate(timeout=60)
            raise Violation(f"child did not start: {line!r} {err[-2000:]}")
        if delay is None:
            done = proc.stdout.readline()
            rec["run_s"] = time.perf_counter() - t0
            out, err = proc.communicate(timeout=300)
            out = done + out
        else:
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=300)
        rec["returncode"] = proc.returncode
        rec["not_killed"] = "done" in out
        if proc.returncode not in (0, -signal.SIGKILL) or (
            proc.returncode == 0 and not rec["not_killed"]
        ):
            raise Violation(f"child failed (exit {proc.returncode}): {err[-3000:]}")
        rec["outcome"], left = check(scenario, work, compression, n)
        rec["leftovers"] = len(left)
        if rec["not_killed"] and rec["outcome"] != "new":
            raise Violation(f"the child finished but the target holds the {rec['outcome']} content")
    except Exception as exc:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
        rec["outcome"] = "VIOLATION"
        rec["error"] = f"{type(exc).__name__}: {exc}"
        rec["traceback"] = traceback.format_exc()[-4000:]
        try:
            rec["files"] = listing(work)
        except OSError:
            pass
    shutil.rmtree(work + ".tmp", ignore_errors=True)
    return rec


class _Timed(io.StringIO):
    """stdout that notes when "ready" was printed (the child's clock starts there)."""

    ready = 0.0

    def write(self, text: str) -> int:
        if text.startswith("ready"):
            self.ready = time.perf_counter()
        return super().write(text)


def run_inline(scenario: str, template: str, work: str, compression: str, n: int) -> float:
    """The child's operation run (and checked) in this process: its duration."""
    shutil.copytree(template, work, symlinks=True)
    if scenario == "remote":
        setup_remote(target_of(scenario, work), compression, n)
    out = _Timed()
    with contextlib.redirect_stdout(out):
        child(scenario, target_of(scenario, work), compression, n)
    dt = time.perf_counter() - out.ready
    if check(scenario, work, compression, n)[0] != "new":
        raise SystemExit(
            f"calibration run of {scenario}/{compression} did not leave the new content"
        )
    return dt


def campaign(
    kills: int,
    seed: int,
    scenarios: list[str],
    n: int,
    workdir: str | None,
    keep: str | None,
    calibration_runs: int = 2,
    log=print,
) -> dict:
    rng = random.Random(seed)
    plan = [
        (scenarios[i % len(scenarios)], COMPRESSIONS[(i // len(scenarios)) % 2])
        for i in range(kills)
    ]
    base = tempfile.mkdtemp(prefix="kill-campaign-", dir=workdir)
    templates: dict = {}
    calibration: dict = {}
    trials: list = []
    violations: list = []
    t_start = time.time()
    try:
        for key in sorted(set(plan), key=plan.index):  # templates and calibration, first use order
            scenario, comp = key
            templates[key] = tpl = os.path.join(base, f"template-{scenario}-{comp}")
            os.makedirs(tpl)
            setup(scenario, tpl, comp, n)
            runs = []
            for _ in range(calibration_runs):
                rec = run_trial(scenario, tpl, os.path.join(base, "calibrate"), comp, n, None)
                shutil.rmtree(os.path.join(base, "calibrate"), ignore_errors=True)
                if rec["outcome"] == "VIOLATION":
                    raise SystemExit(
                        f"calibration run of {scenario}/{comp} failed: "
                        f"{rec['error']}\n{rec['traceback']}"
                    )
                runs.append(rec["run_s"])
            if (
                not runs
            ):  # --calibration-runs 0: the operation timed in this process (no interpreter start)
                runs.append(run_inline(scenario, tpl, os.path.join(base, "calibrate"), comp, n))
                shutil.rmtree(os.path.join(base, "calibrate"), ignore_errors=True)
            calibration[f"{scenario}/{comp}"] = T = max(runs)
            log(f"calibrated {scenario}/{comp}: {T * 1000:.0f} ms from ready to done")
        for i, (scenario, comp) in enumerate(plan):
            T = calibration[f"{scenario}/{comp}"]
            delay = rng.uniform(0.0, 1.1 * T)
            work = os.path.join(base, f"trial-{i}")
            rec = run_trial(scenario, templates[(scenario, comp)], work, comp, n, delay)
            rec.update(
                trial=i,
                scenario=scenario,
                compression=comp,
                delay_s=round(delay, 6),
                fraction=round(delay / T, 4),
            )
            trials.append(rec)
            if rec["outcome"] == "VIOLATION":
                rec.update(
                    seed=seed,
                    rows=n,
                    reproduce=f"python tools/robustness/kill_campaign.py --seed {seed} --rows {n} "
                    f"--only-trial {i} --kills {kills} --scenarios {' '.join(scenarios)}",
                )
                violations.append(rec)
                log(
                    f"VIOLATION trial {i} {scenario}/{comp} at {delay * 1000:.1f} ms: "
                    f"{rec['error']}"
                )
                if keep:
                    dst = os.path.join(keep, f"trial-{i}-{scenario}-{comp}")
                    shutil.rmtree(dst, ignore_errors=True)
                    shutil.copytree(work, dst, symlinks=True)
            shutil.rmtree(work, ignore_errors=True)
            if (i + 1) % 25 == 0:
                log(
                    f"{i + 1}/{kills} kills, {len(violations)} violations, "
                    f"{time.time() - t_start:.0f} s"
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return {
        "trials": trials,
        "violations": violations,
        "calibration_s": calibration,
        "elapsed_s": round(time.time() - t_start, 1),
    }


def summarize(trials: list, scenarios: list[str]) -> dict:
    out = {}
    for s in scenarios:
        ts = [t for t in trials if t["scenario"] == s]
        killed = [t for t in ts if not t.get("not_killed") and t["outcome"] != "VIOLATION"]
        out[s] = {
            "kills": len(ts),
            "old": sum(t["outcome"] == "old" for t in killed),
            "new": sum(t["outcome"] == "new" for t in killed),
            "not_killed": sum(
                bool(t.get("not_killed")) and t["outcome"] != "VIOLATION" for t in ts
            ),
            "violations": sum(t["outcome"] == "VIOLATION" for t in ts),
            "leftovers": sum(t.get("leftovers", 0) > 0 for t in ts),
            "median_fraction": round(statistics.median(t["fraction"] for t in ts), 3)
            if ts
            else None,
        }
    return out


def table(summary: dict) -> str:
    head = [
        "scenario",
        "kills",
        "old",
        "new",
        "not-killed",
        "violations",
        "leftovers",
        "median kill at",
    ]
    rows_ = [
        [
            s,
            *(str(v[k]) for k in ("kills", "old", "new", "not_killed", "violations", "leftovers")),
            "-" if v["median_fraction"] is None else f"{v['median_fraction']:.2f} of the run",
        ]
        for s, v in summary.items()
    ]
    tot = [
        sum(v[k] for v in summary.values())
        for k in ("kills", "old", "new", "not_killed", "violations", "leftovers")
    ]
    rows_.append(["total", *map(str, tot), ""])
    w = [max(len(r[i]) for r in [head, *rows_]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * x for x in w]), *map(fmt, rows_)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        scenario, path, comp, n = argv[1:5]
        child(scenario, path, comp, int(n))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kills",
        type=int,
        default=200,
        help="kills in all (round robin over scenarios; default 200)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    p.add_argument(
        "--rows",
        type=int,
        default=30_000,
        help="rows each child writes (default 30000; the old content has half)",
    )
    p.add_argument(
        "--out", default=DEFAULT_OUT, help="JSON of the counts, trials and violations ('-': none)"
    )
    p.add_argument(
        "--workdir",
        help="where the trials' directories go (default: the system's temporary directory)",
    )
    p.add_argument(
        "--keep-violations", metavar="DIR", help="copy the directory of each violating trial here"
    )
    p.add_argument(
        "--calibration-runs",
        type=int,
        default=2,
        metavar="K",
        help="unkilled child runs per scenario and compression; the longest sets the run time T "
        "(default 2; "
        "0: time the operation once in this process instead, faster)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="merge into the JSON at --out: its scenarios not run now are kept (with their runs)",
    )
    p.add_argument(
        "--only-trial",
        type=int,
        metavar="I",
        help="replay: the same plan and delays, but run (and report) trial I only",
    )
    args = p.parse_args(argv)
    if args.kills < 1 or args.rows < 8:
        p.error("--kills must be >= 1 and --rows >= 8")
    scenarios = list(dict.fromkeys(args.scenarios))
    if args.only_trial is not None:
        with s3_server(scenarios):
            return replay(args, scenarios)
    with s3_server(scenarios):
        res = campaign(
            args.kills,
            args.seed,
            scenarios,
            args.rows,
            args.workdir,
            args.keep_violations,
            max(0, args.calibration_runs),
            log=lambda m: print(m, file=sys.stderr, flush=True),
        )
    summary = summarize(res["trials"], scenarios)
    print(table(summary))
    print(
        f"{args.kills} kills in {res['elapsed_s']:.0f} s, seed {args.seed}, {args.rows} rows a "
        f"child; "
        f"{len(res['violations'])} violation(s)"
    )
    if args.out != "-":
        run = {
            "seed": args.seed,
            "kills": args.kills,
            "rows": args.rows,
            "scenarios": scenarios,
            "elapsed_s": res["elapsed_s"],
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "rowstore": rowstore.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "calibration_s": res["calibration_s"],
        }
        trials = [
            {
                k: t.get(k)
                for k in (
                    "trial",
                    "scenario",
                    "compression",
                    "delay_s",
                    "fraction",
                    "outcome",
                    "not_killed",
                    "leftovers",
                    "returncode",
                )
            }
            for t in res["trials"]
        ]
        doc = merge(args.out if args.merge else None, run, summary, res["violations"], trials)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    return 1 if res["violations"] else 0


@contextlib.contextmanager
def s3_server(scenarios: list[str]):
    """A moto S3 server (tests/_servers.py) for the remote scenario, its endpoint in the
    environment the children inherit; nothing without it."""
    if "remote" not in scenarios or os.environ.get(S3_ENV):
        yield
        return
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import _servers

    with _servers.moto_s3(BUCKET) as (endpoint, _):
        os.environ[S3_ENV] = endpoint
        try:
            yield
        finally:
            del os.environ[S3_ENV]


def merge(path: str | None, run: dict, summary: dict, violations: list, trials: list) -> dict:
    """The results document: with ``path`` (an earlier one), its scenarios not in ``summary``
    are kept with their trials and the runs that made them."""
    old: dict = {}
    if path and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
    ran = set(summary)
    old_runs = old.get("runs") or (
        [
            {
                k: old[k]
                for k in (
                    "seed",
                    "kills",
                    "rows",
                    "scenarios",
                    "elapsed_s",
                    "python",
                    "platform",
                    "cpus",
                    "rowstore",
                    "date",
                    "calibration_s",
                )
                if k in old
            }
        ]
        if old
        else []
    )
    kept_runs = [r for r in old_runs if set(r.get("scenarios", ())) - ran]
    merged = {k: v for k, v in old.get("summary", {}).items() if k not in ran}
    merged.update(summary)
    return {
        "tool": "tools/robustness/kill_campaign.py",
        "kills": sum(v["kills"] for v in merged.values()),
        "scenarios": list(merged),
        "runs": [*kept_runs, run],
        "summary": merged,
        "violations": [v for v in old.get("violations", []) if v.get("scenario") not in ran]
        + violations,
        "trials": [t for t in old.get("trials", []) if t.get("scenario") not in ran] + trials,
    }


def replay(args, scenarios: list[str]) -> int:
    """Trial ``--only-trial`` of the campaign ``--seed/--kills/--scenarios`` (the same delay:
    the RNG draws in the same order), after a fresh calibration of its scenario."""
    rng = random.Random(args.seed)
    plan = [
        (scenarios[i % len(scenarios)], COMPRESSIONS[(i // len(scenarios)) % 2])
        for i in range(args.kills)
    ]
    fractions = [
        rng.uniform(0.0, 1.1) for _ in plan
    ]  # uniform(0, 1.1 T) == T * uniform(0, 1.1) draw for draw
    scenario, comp = plan[args.only_trial]
    base = tempfile.mkdtemp(prefix="kill-replay-", dir=args.workdir)
    try:
        tpl = os.path.join(base, "template")
        os.makedirs(tpl)
        setup(scenario, tpl, comp, args.rows)
        T = run_trial(scenario, tpl, os.path.join(base, "calibrate"), comp, args.rows, None)[
            "run_s"
        ]
        delay = fractions[args.only_trial] * T
        rec = run_trial(scenario, tpl, os.path.join(base, "trial"), comp, args.rows, delay)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        json.dumps(
            {
                "trial": args.only_trial,
                "scenario": scenario,
                "compression": comp,
                "delay_s": delay,
                **rec,
            },
            indent=1,
        )
    )
    return 1 if rec["outcome"] == "VIOLATION" else 0


if __name__ == "__main__":
    sys.exit(main())
