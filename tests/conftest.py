"""Shared test helpers: small schemas, deterministic row generators, write/read helpers and an
exact value comparison. Keep this generic: every test module may use it.

Helpers are plain functions exposed through fixtures (``make_rows``, ``write_file``,
``read_rows``, ``assert_rows_equal``, ``run_python``) so that test modules need no imports from
here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema

#: Text that exercises UTF-8: empty, ASCII, accents, CJK, emoji (4-byte), combining marks, RTL.
TEXTS = (
    "",
    "a",
    "hello world",
    "café",
    "日本語のテキスト",
    "😀🚀👩\u200d👩\u200d👧",
    "e\u0301\u0302 a\u0308",  # combining marks
    "שלום",
    "\x00nul inside",
    "x" * 300,
)


# -- schemas --------------------------------------------------------------------------------
def all_kinds_schema(*, nullable: bool = False) -> Schema:
    """One field of every storage kind: fixed arrays and scalars inline, str/bytes, variable 1-D
    and N-D arrays, a PNG image and a bool. With ``nullable`` every field accepts None."""
    n = nullable
    return Schema(
        [
            Field("fixed", "float32", (2, 3), nullable=n),
            Field("label", "int64", nullable=n),
            Field("flag", "bool", nullable=n),
            Field("text", "str", nullable=n),
            Field("blob", "bytes", nullable=n),
            Field("wave", "float32", (None,), nullable=n),
            Field("grid", "int16", (None, 3, None), nullable=n),
            Field("image", "uint8", (6, 5, 3), codec={"id": "png", "level": 1}, nullable=n),
        ]
    )


# -- values ---------------------------------------------------------------------------------
def _random_numbers(
    rng: np.random.Generator, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    raise AssertionError(f"no generator for {dtype}")


def smooth_image(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: Any = np.uint8
) -> np.ndarray:
    """A smooth gradient image (JPEG reproduces it closely)."""
    h, w = shape[:2]
    top = np.iinfo(np.dtype(dtype)).max
    y, x = np.mgrid[0:h, 0:w]
    base = (x / max(w - 1, 1) * 0.6 + y / max(h - 1, 1) * 0.3 + rng.random() * 0.1) * top
    img = base
    if len(shape) == 3:
        img = np.stack([img * (1 - 0.15 * k) + 10 * k for k in range(shape[2])], axis=-1)
    return np.clip(img, 0, top).astype(dtype)


def make_value(field: Field, rng: np.random.Generator, *, max_len: int = 5) -> Any:
    """A random valid (non-null) value for ``field``; variable dimensions get 0..max_len."""
    if field.dtype == rowstore.STR:
        return TEXTS[int(rng.integers(len(TEXTS)))]
    if field.dtype == rowstore.BYTES:
        return rng.integers(0, 256, size=int(rng.integers(0, 20)), dtype=np.uint8).tobytes()
    codec = field.codec["id"]
    lo = 1 if codec in ("png", "jpeg") else 0  # images cannot be empty
    shape = tuple(int(rng.integers(lo, max_len + 1)) if d is None else d for d in field.shape)
    if codec in ("png", "jpeg"):
        return smooth_image(rng, shape, field.dtype)
    return _random_numbers(rng, field.dtype, shape)


def make_rows(
    schema: Schema, n: int, *, seed: int = 0, null_rate: float = 0.25, max_len: int = 5
) -> list[dict[str, Any]]:
    """``n`` deterministic random rows; nullable fields are None at about ``null_rate``."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        row = {}
        for f in schema:
            if f.nullable and rng.random() < null_rate:
                row[f.name] = None
            else:
                row[f.name] = make_value(f, rng, max_len=max_len)
        rows.append(row)
    return rows


def rows_to_columns(schema: Schema, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows -> the ``write_batch`` form: stacked arrays for inline fields without nulls, lists
    otherwise."""
    cols: dict[str, Any] = {}
    for f in schema:
        vals = [r[f.name] for r in rows]
        if f.inline and all(v is not None for v in vals):
            cols[f.name] = (
                np.stack([np.asarray(v, dtype=f.dtype) for v in vals])
                if vals
                else np.zeros((0,) + f.shape, f.dtype)
            )
        else:
            cols[f.name] = vals
    return cols


# -- files ----------------------------------------------------------------------------------
def write_file(
    path: str | os.PathLike,
    schema: Schema,
    rows: Sequence[Mapping[str, Any]],
    *,
    batch: bool = False,
    **writer_kwargs: Any,
) -> str:
    """Write ``rows`` with one ``Writer`` (row by row, or in one ``write_batch``); return path."""
    with rowstore.Writer(path, schema, **writer_kwargs) as w:
        if batch:
            w.write_batch(rows_to_columns(schema, rows))
        else:
            for r in rows:
                w.write(r)
    return os.fspath(path)


def read_rows(path: str | os.PathLike, **open_kwargs: Any) -> list[dict[str, Any]]:
    """Every row of a file through ``Reader.__getitem__``."""
    r = rowstore.open(path, **open_kwargs)
    try:
        return [r[i] for i in range(len(r))]
    finally:
        r.close()


def assert_value_equal(expected: Any, got: Any, field: Field, where: str = "") -> None:
    """Exact comparison of one value (bit-exact for numbers, so NaN and -0.0 count).

    JPEG fields compare with a tolerance (mean absolute error < 3)."""
    ctx = f"{where}field {field.name!r}"
    if expected is None:
        assert got is None, f"{ctx}: expected None, got {got!r}"
        return
    assert got is not None, f"{ctx}: expected a value, got None"
    if field.dtype == rowstore.STR:
        assert isinstance(got, str) and got == expected, f"{ctx}: {got!r} != {expected!r}"
        return
    if field.dtype == rowstore.BYTES:
        assert isinstance(got, bytes) and got == bytes(expected), f"{ctx}: {got!r} != {expected!r}"
        return
    exp = np.asarray(expected).astype(field.dtype)
    got_arr = np.asarray(got)
    assert got_arr.dtype == field.dtype, f"{ctx}: dtype {got_arr.dtype} != {field.dtype}"
    assert got_arr.shape == exp.shape, f"{ctx}: shape {got_arr.shape} != {exp.shape}"
    if field.codec["id"] == "jpeg":
        err = (
            np.abs(got_arr.astype(np.float64) - exp.astype(np.float64)).mean() if exp.size else 0.0
        )
        assert err < 3, f"{ctx}: jpeg mean abs error {err:.2f} >= 3"
        return
    assert got_arr.tobytes() == exp.tobytes(), f"{ctx}: values differ:\n{got_arr!r}\n!=\n{exp!r}"


def assert_rows_equal(
    schema: Schema, expected: Sequence[Mapping[str, Any]], got: Sequence[Mapping[str, Any]]
) -> None:
    assert len(got) == len(expected), f"{len(got)} rows read, {len(expected)} written"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert set(g) == set(schema.names), f"row {i}: keys {sorted(g)}"
        for f in schema:
            assert_value_equal(e.get(f.name), g[f.name], f, f"row {i}: ")


def assert_batch_equal(
    schema: Schema, expected: Sequence[Mapping[str, Any]], batch: Mapping[str, Any]
) -> None:
    """Check a ``take`` batch (ragged varlen) against the rows it should hold."""
    n = len(expected)
    for f in schema:
        col = batch[f.name]
        assert len(col) == n, f"field {f.name!r}: {len(col)} values, expected {n}"
        nulls = batch.get(f.name + "__null")
        if f.nullable:
            assert nulls is not None and nulls.dtype == np.bool_ and nulls.shape == (n,)
        for i in range(n):
            v = col[i]
            if f.nullable and nulls[i]:
                v = None
            assert_value_equal(expected[i].get(f.name), v, f, f"batch row {i}: ")


def files_in(directory: str | os.PathLike) -> list[str]:
    """Sorted names in ``directory`` (hidden temporary files included)."""
    return sorted(os.listdir(directory))


def run_python(
    code: str, *args: str, timeout: float = 120, **kwargs: Any
) -> subprocess.CompletedProcess:
    """Run ``code`` with this interpreter in a fresh process (text output captured; ``timeout``
    is a hang guard, scaled by ``ROWSTORE_TEST_TIMEOUT_SCALE``: tests/helpers.py)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        **kwargs,
    )


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(
    name: str, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    """Run ``examples/<name>`` with this interpreter, this checkout's rowstore first on
    ``PYTHONPATH`` (worker processes the example starts import it too), extra ``env`` set."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True,
        text=True,
        timeout=scaled(timeout),
        env={**os.environ, "PYTHONPATH": path, **env},
    )


# -- fixtures -------------------------------------------------------------------------------
@pytest.fixture
def h5path(tmp_path) -> str:
    """A path for one .h5 file in a fresh temporary directory (the file does not exist)."""
    return str(tmp_path / "data.h5")


@pytest.fixture
def schema_all_kinds() -> Schema:
    return all_kinds_schema()


@pytest.fixture
def schema_all_nullable() -> Schema:
    return all_kinds_schema(nullable=True)


class _Helpers:
    """The helper functions above, as one fixture: ``def test_x(rs): rs.make_rows(...)``."""

    TEXTS = TEXTS
    all_kinds_schema = staticmethod(all_kinds_schema)
    make_rows = staticmethod(make_rows)
    make_value = staticmethod(make_value)
    smooth_image = staticmethod(smooth_image)
    rows_to_columns = staticmethod(rows_to_columns)
    write_file = staticmethod(write_file)
    read_rows = staticmethod(read_rows)
    assert_value_equal = staticmethod(assert_value_equal)
    assert_rows_equal = staticmethod(assert_rows_equal)
    assert_batch_equal = staticmethod(assert_batch_equal)
    run_python = staticmethod(run_python)
    run_example = staticmethod(run_example)
    files_in = staticmethod(files_in)


@pytest.fixture(scope="session")
def rs() -> _Helpers:
    """Shared helpers (see :class:`_Helpers`)."""
    return _Helpers()


# -- object storage servers (tests/_servers.py: moto S3, a GCS emulator, HTTP with Range, a fault
# proxy)
from _servers import gcs_server, http_factory, s3_server  # noqa: E402, F401


@pytest.fixture(params=["s3", "gs"])
def object_store(request):
    """``(root URL, storage_options)`` of the bucket ``rowstore`` on the moto S3 server, then on
    the GCS emulator: what every writable object store does is tested through this."""
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_server")
    return f"{request.param}://rowstore", server[1]


from helpers import scaled  # noqa: E402


# -- xdist groups (--dist loadgroup): tests marked xdist_group("name") run on one worker ----------
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Give each grouped test its ``@name`` suffix where pytest-xdist's own hook could not.

    xdist (3.8) sets the private ``_nodeid`` that pytest 9 no longer reads, so without this the
    groups were split over both workers: two SparkSessions and two Dask clusters. Harmless where
    xdist's suffix took (nothing to add)."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if not names or item.nodeid.endswith("@" + "_".join(names)):
            continue
        grouped = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):  # pytest 9: the node id is a NodeId object
            from _pytest.nodes import coerce_node_id

            item._id = coerce_node_id(grouped)
        else:
            item._nodeid = grouped


# -- Spark (rowstore.spark): one local[2] session for the whole test session ----------------
@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """The shared SparkSession (tests/_spark.py); skips without pyspark or Java."""
    from _spark import make_session

    session = make_session(str(tmp_path_factory.mktemp("spark")))
    yield session
    session.stop()


# -- Dask: one LocalCluster (2 worker processes) for the whole test session -----------------------
@pytest.fixture(scope="session")
def dask_cluster():
    """The shared ``distributed.LocalCluster``: started on first use (seconds), once per test
    process. Its users are marked ``xdist_group("dask")`` so that under ``-n 2 --dist loadgroup``
    one worker runs them all; each module makes its own ``Client`` of it."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, silence_logs=40
    ) as cluster:
        yield cluster


# -- Ray: one local cluster (2 CPUs, worker processes) for the whole test session ---------------
@pytest.fixture(scope="session")
def ray_cluster():
    """The shared local Ray cluster: started on first use (seconds), once per test process, and
    shut down at the end. Its users are marked ``xdist_group("ray")`` so that under ``-n 2
    --dist loadgroup`` one worker runs them all. No dashboard, a small object store, progress
    bars off; the workers run this interpreter (rowstore is importable there)."""
    ray = pytest.importorskip("ray")
    data = pytest.importorskip("ray.data")

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 << 20,
        log_to_driver=False,
        configure_logging=False,
    )
    ctx = data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield ray
    ray.shutdown()
