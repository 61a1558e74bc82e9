"""Spark DataFrames into rowstore: written on the executors, committed once by the driver; and a
converter that caches a DataFrame as a dataset for torch and tf (Petastorm's
``make_spark_converter``).

This is the only module that imports pyspark (``pip install rowstore[spark]``, Java 17).

- :func:`to_rowstore`: every partition is written on its executor as shards
(:func:`rowstore.write_shard`,
  fed the partition's Arrow record batches by ``DataFrame.mapInArrow``: rows never travel to
  the driver); only the small :class:`~rowstore.ShardInfo` of each shard does, and the driver
  commits one manifest version when every task succeeded. A failed job commits nothing and
  removes the shards its tasks wrote; a retried or speculative duplicate task's shards are not
  committed (one result per partition is kept) and are removed after the commit.
- Types: Spark hands partitions over as Arrow, so Spark types map through
  :mod:`rowstore.arrow`'s table: numbers, bool, string, binary, date, timestamp (``TimestampType``
  in UTC, ``TimestampNTZType`` as is), ``ArrayType`` of numbers (nested arrays: n-D, each
  dimension variable), and Spark ML vectors (dense or sparse) as variable-length ``float64``
  arrays. Arrays and images of a rowstore :class:`~rowstore.Schema` go into a DataFrame as binary
  cells made by :func:`to_row` (``.npy`` bytes, or the field's PNG/JPEG codec), with the Spark
  schema :func:`spark_schema` gives; :func:`to_rowstore` with that ``schema=`` decodes them.
- :func:`make_converter`: the DataFrame is written once under a cache directory, keyed by its
  analyzed plan (``semanticHash``), and reused when the same plan is converted again; its
  ``make_torch_dataloader`` yields a ``torch.utils.data.DataLoader``.

The executors must see the dataset directory (``local[*]``, or a filesystem shared by the
cluster); paths may be ``file://`` URLs. Their Python must import this rowstore:
:func:`check_workers` (run before every write job) points a local session started without
``PYSPARK_PYTHON`` at the driver's Python, and otherwise fails at once naming
``PYSPARK_PYTHON``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import itertools
import os
import pickle
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rowstore._check import one_of, positive_int
from rowstore._version import __version__
from rowstore.arrow import _attrs, _columns, _Source, local_path, write_shards
from rowstore.errors import RowstoreError, SchemaError
from rowstore.format import manifest
from rowstore.reader import Reader
from rowstore.schema import BYTES, STR, Field, Schema
from rowstore.writer import commit, write_shard
from rowstore.writer.dataset import DEFAULT_SHARD_BYTES
from rowstore.writer.values import check_value

__all__ = [
    "to_rowstore",
    "to_row",
    "spark_schema",
    "make_converter",
    "SparkDatasetConverter",
    "CACHE_DIR_CONF",
    "check_workers",
]

#: Spark conf key of the converter's parent cache directory (Petastorm's
#: ``SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF``).
CACHE_DIR_CONF = "rowstore.spark.cacheDir"
_RESULT = "partition long, attempt long, infos binary"


# -- schema ---------------------------------------------------------------------------------------
def _vector_columns(df: DataFrame) -> list[str]:
    try:
        from pyspark.ml.linalg import VectorUDT
    except ImportError:  # pragma: no cover - pyspark.ml ships with pyspark
        return []
    return [f.name for f in df.schema.fields if isinstance(f.dataType, VectorUDT)]


def _prepare(df: DataFrame) -> tuple[DataFrame, list[str]]:
    """``df`` with ML vector columns as ``array<double>`` (dense and sparse alike)."""
    vectors = _vector_columns(df)
    if vectors:
        from pyspark.ml.functions import vector_to_array

        df = df.select(
            *[vector_to_array(F.col(c)).alias(c) if c in vectors else F.col(c) for c in df.columns]
        )
    return df, vectors


def _arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = df.sparkSession.conf.get(
        "spark.sql.session.timeZone", "UTC"
    )  # mapInArrow's timestamps carry it
    try:
        return to_arrow_schema(df.schema, timezone=tz)
    except Exception as exc:  # a type Arrow has no form for (maps, nested structs...): name it
        for f in df.schema.fields:
            try:
                to_arrow_schema(T.StructType([f]), timezone=tz)
            except Exception:
                raise SchemaError(
                    f"column {f.name!r}: Spark type {f.dataType.simpleString()} is not supported "
                    "(select or cast it)",
                    field=f.name,
                ) from exc
        raise


def _null_counts(df: DataFrame) -> dict[str, int]:
    """Nulls per column, in one Spark job."""
    row = df.select(
        [F.sum(F.col(c).isNull().cast("long")).alias(f"n{k}") for k, c in enumerate(df.columns)]
    ).first()
    return {c: int(row[k] or 0) for k, c in enumerate(df.columns)} if row is not None else {}


def _plan(df: DataFrame, schema: Schema | None, nullable: str) -> list:
    if nullable not in ("spark", "data"):
        raise ValueError(
            f"nullable must be 'spark' (the DataFrame's flags) or 'data' (columns holding a null), "
            f"got {nullable!r}"
        )
    arrow = _arrow_schema(df)
    if nullable == "data" and schema is None:
        counts = _null_counts(df)

        def has_nulls(c: str) -> bool | None:
            return counts[c] > 0
    else:

        def has_nulls(c: str) -> bool | None:
            return None

    return _columns(_Source(arrow, iter(()), has_nulls), schema, None)


def spark_schema(schema: Schema) -> T.StructType:
    """The Spark schema of rows made by :func:`to_row` (Petastorm's ``Unischema.as_spark_schema``):
    scalars as the matching Spark type, arrays and images as ``BinaryType``."""
    out = []
    for f in schema:
        out.append(T.StructField(f.name, _spark_type(f), f.nullable))
    return T.StructType(out)


_SPARK_NUMBERS = {
    "b": T.BooleanType,
    "i1": T.ByteType,
    "i2": T.ShortType,
    "i4": T.IntegerType,
    "i8": T.LongType,
    "u1": T.ShortType,
    "u2": T.IntegerType,
    "u4": T.LongType,
    "f2": T.FloatType,
    "f4": T.FloatType,
    "f8": T.DoubleType,
}


def _spark_type(f: Field) -> T.DataType:
    if f.dtype == STR:
        return T.StringType()
    if f.dtype == BYTES or f.shape:
        return T.BinaryType()
    dt = f.dtype
    if dt.kind == "M":
        return T.DateType() if np.datetime_data(dt)[0] == "D" else T.TimestampNTZType()
    if dt.kind == "m":
        return T.DayTimeIntervalType()
    key = "b" if dt.kind == "b" else f"{dt.kind}{dt.itemsize}"
    if key not in _SPARK_NUMBERS:
        raise SchemaError(
            f"field {f.name!r}: Spark has no type for {dt} (use a signed or smaller type)",
            field=f.name,
        )
    return _SPARK_NUMBERS[key]()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def to_row(schema: Schema, row: Mapping[str, Any]) -> Row:
    """A Spark ``Row`` of ``row`` (a dict of the schema's fields) for a DataFrame with
    :func:`spark_schema` (Petastorm's ``dict_to_spark_row``).

    Every value is checked against its field first (dtype, shape, nullability, codec limits:
    :class:`~rowstore.errors.RowValidationError` names the field); arrays become ``.npy``
    bytes, images their PNG/JPEG bytes (the field's codec; PNG/JPEG bytes given for an image
    field are checked by their header and kept as they are), times ``datetime``/``date``."""
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a rowstore.Schema, got {type(schema).__name__}")
    extra = [k for k in row if k not in schema]
    if extra:
        raise SchemaError(
            f"row has field(s) {extra} that the schema lacks ({schema.names})", field=str(extra[0])
        )
    missing = [f.name for f in schema if f.name not in row]
    if missing:
        raise SchemaError(f"row lacks field(s) {missing}", field=missing[0])
    values = {}
    for f in schema:
        v = check_value(f, row[f.name], 0)
        if v is None or f.dtype in (STR, BYTES):
            values[f.name] = v
        elif f.shape:
            values[f.name] = (
                bytes(f.codec_obj.payload(v, f)) if f.codec["id"] in ("png", "jpeg") else _npy(v)
            )
        elif f.dtype.kind == "M":
            unit = "D" if np.datetime_data(f.dtype)[0] == "D" else "us"
            values[f.name] = np.asarray(v).astype(f"datetime64[{unit}]").item()
        elif f.dtype.kind == "m":
            values[f.name] = np.asarray(v).astype("timedelta64[us]").item()
        else:
            values[f.name] = np.asarray(v).item()
    return Row(**values)


# -- the executors' Python ----------------------------------------------------------------------
#: (application id, workers' Python) pairs whose workers imported this rowstore.
_CHECKED_WORKERS: set[tuple[str, str]] = set()
_FAILURE_LINES = re.compile(
    r"(Cannot run program[^\n]*|(?:ModuleNotFound|Import)Error:[^\n]*|"
    r"Python in worker has different version[^\n]*)"
)


def _worker_python_error(python: str, detail: str) -> RowstoreError:
    """The error naming ``PYSPARK_PYTHON`` when Spark's Python workers cannot run rowstore."""
    return RowstoreError(
        f"Spark's Python workers run {python!r}, which cannot run this rowstore "
        f"({__version__}, imported by the driver's {sys.executable}): {detail}. Start the "
        f"SparkSession with PYSPARK_PYTHON={sys.executable} in the environment (or the Spark "
        f"conf spark.pyspark.python with spark-submit), or install rowstore {__version__} "
        f"into the workers' Python"
    )


def _failure_text(exc: BaseException) -> str:
    """The line of a failed Spark job's error that says why (not its executor trace)."""
    text = str(exc)
    m = _FAILURE_LINES.search(text)
    if m:
        return m.group(1).strip()
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first[:300]


def check_workers(spark: Any) -> None:
    """Make a session's Python workers run a Python that imports this rowstore, or fail now.

    On a local session (master ``local[...]``) started without ``PYSPARK_PYTHON``, pyspark's
    workers would run the ``python3`` on ``PATH``: they are set to run the driver's Python
    (``sys.executable``) instead. Then one task of one row imports rowstore on a worker (once
    per session and worker Python): where the workers cannot start, cannot import rowstore or
    import another version, a :class:`~rowstore.errors.RowstoreError` naming
    ``PYSPARK_PYTHON`` is raised at once, instead of a failed job's executor trace.
    :func:`to_rowstore` calls it before its job.

    Parameters
    ----------
    spark : pyspark.sql.SparkSession
        The session (a Spark Connect session is left alone: its workers are the server's).
    """
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext on the client
        return
    if (
        str(sc.master).startswith("local")
        and sc.pythonExec == "python3"  # pyspark's default when PYSPARK_PYTHON was unset
        and not os.environ.get("PYSPARK_PYTHON")
        and not sc.getConf().get("spark.pyspark.python", None)
    ):
        sc.pythonExec = sys.executable
    key = (str(sc.applicationId), str(sc.pythonExec))
    if key in _CHECKED_WORKERS:
        return

    def probe(_: Any) -> tuple[str | None, str | None]:  # pickled by value: needs no rowstore
        import importlib

        try:  # what the write job's tasks import
            version = importlib.import_module("rowstore.spark").__version__
        except Exception as exc:
            return None, f"{type(exc).__name__}: {exc}"
        return version, None

    try:
        ((version, error),) = sc.parallelize([0], 1).map(probe).collect()
    except Exception as exc:
        raise _worker_python_error(sc.pythonExec, _failure_text(exc)) from None
    if error is not None:
        raise _worker_python_error(sc.pythonExec, error)
    if version != __version__:
        raise _worker_python_error(sc.pythonExec, f"it imports rowstore {version}")
    _CHECKED_WORKERS.add(key)


# -- writing --------------------------------------------------------------------------------------
def _write_partition(
    root: str,
    cols: list,
    shard_bytes: int,
    job: str,
    options: dict,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """On an executor: the partition's batches as shards; one result row (partition, attempt,
    pickled ShardInfos)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    part, attempt = (ctx.partitionId(), ctx.attemptNumber()) if ctx is not None else (0, 0)
    infos = write_shards(
        root,
        cols,
        batches,
        shard_bytes=shard_bytes,
        name_prefix=f"part-{job}-{part:05d}-{attempt}",
        **options,
    )
    yield pa.RecordBatch.from_pydict(
        {"partition": [part], "attempt": [attempt], "infos": [pickle.dumps(infos)]},
        schema=pa.schema(
            [("partition", pa.int64()), ("attempt", pa.int64()), ("infos", pa.binary())]
        ),
    )


def _remove_job_files(root: str, job: str, keep: set[str]) -> None:
    shards = os.path.join(root, manifest.SHARD_DIR)
    try:
        names = os.listdir(shards)
    except OSError:
        return
    for n in names:
        if n.startswith(f"part-{job}-") and f"{manifest.SHARD_DIR}/{n}" not in keep:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(shards, n))


def to_rowstore(
    df: DataFrame,
    path: str | os.PathLike,
    *,
    schema: Schema | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    mode: str = "w",
    nullable: str = "spark",
    attrs: Mapping[str, Any] | None = None,
    **writer_kwargs: Any,
) -> int:
    """Write a Spark DataFrame as a rowstore dataset directory, each partition on its executor.

    Parameters
    ----------
    df : pyspark.sql.DataFrame
        Columns of the types in the module's notes.
    path : str or os.PathLike
        The dataset directory (or ``file://`` URL), seen by the driver and every executor.
    schema : Schema, optional
        The fields to store, checked against the DataFrame on the driver (names as the columns',
        sanitized; a column a field cannot store is a :class:`~rowstore.errors.SchemaError`
        naming it); binary columns of array fields are decoded (:func:`to_row`'s cells).
        Default: from the Spark types.
    shard_bytes : int
        Largest shard (Arrow bytes of its rows); a partition is one shard or more, never merged
        with another. Shards roll over between the record batches Spark hands over
        (``spark.sql.execution.arrow.maxRecordsPerBatch`` rows, 10,000 by default).
    mode : {"w", "x", "a"}
        As for :func:`rowstore.commit`.
    nullable : {"spark", "data"}
        Without ``schema``: a field is nullable where Spark's column is (``"spark"``), or only
        where the column holds a null (``"data"``: one extra Spark job counts them).
    attrs : dict, optional
        User attributes of the version (an ``"arrow"`` entry is added).
    **writer_kwargs
        ``block_bytes``, ``rows_per_block``, ``compression``, ``heap_chunk_bytes`` for
        :func:`rowstore.write_shard`.

    Returns
    -------
    int
        The version committed. Rows keep the DataFrame's order (partitions in order).
    """
    positive_int("shard_bytes", shard_bytes)
    one_of("mode", mode, ("w", "x", "a"))
    root = os.path.abspath(local_path(path))
    check_workers(df.sparkSession)
    df, vectors = _prepare(df)
    cols = _plan(df, schema, nullable)
    job = uuid.uuid4().hex[:16]
    fn = _bind(_write_partition, root, cols, shard_bytes, job, dict(writer_kwargs))
    committed: set[str] = set()
    try:
        results = df.mapInArrow(fn, _RESULT).collect()
        first: dict[int, list] = {}
        for r in sorted(results, key=lambda r: (r["partition"], r["attempt"])):
            first.setdefault(r["partition"], pickle.loads(r["infos"]))  # one attempt per partition
        infos = [i for p in sorted(first) for i in first[p]]
        if not infos and mode != "a":  # an empty DataFrame: an empty dataset, not an error
            rs_schema = Schema([c.field for c in cols])
            infos = [
                write_shard(
                    root,
                    rs_schema,
                    {f.name: [] for f in rs_schema},
                    name=f"part-{job}-empty",
                    **writer_kwargs,
                )
            ]
        committed = {i.path for i in infos}
        extra = {"spark": {"vectors": vectors}} if vectors else None
        version = (
            commit(root, infos, mode=mode, attrs=_attrs(cols, attrs, extra))
            if infos
            else manifest.load(root).version
        )
    finally:
        _remove_job_files(root, job, committed)  # failed, retried and duplicate attempts' shards
    return version


def _bind(fn: Any, *args: Any) -> Any:
    def bound(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return fn(*args, batches)

    return bound


# -- the converter
# ----------------------------------------------------------------------------------
def _plan_key(df: DataFrame, schema: Schema | None) -> str:
    """A key of the DataFrame's analyzed plan (``semanticHash``: expression ids normalized), its
    schema and the rowstore schema asked for, stable across sessions of one Spark version."""
    import pyspark

    jdf = df._jdf
    h = jdf.queryExecution().analyzed().semanticHash()
    schema_text = schema.to_json_str() if schema is not None else ""
    text = f"{pyspark.__version__}|{h}|{df.schema.json()}|{schema_text}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


class SparkDatasetConverter:
    """A DataFrame materialized as a rowstore dataset, and loaders of it (Petastorm's
    ``SparkDatasetConverter``). Made by :func:`make_converter`.

    Attributes
    ----------
    path : str
        The dataset directory under the cache directory.
    cached : bool
        Whether an existing copy was reused (no Spark job ran).
    """

    def __init__(self, path: str, cached: bool):
        self.path = path
        self.cached = cached
        with manifest_reader(path) as r:
            self._len = len(r)

    def __len__(self) -> int:
        return self._len

    @property
    def dataset_size(self) -> int:
        """Rows (Petastorm's name)."""
        return self._len

    def __repr__(self) -> str:
        return f"SparkDatasetConverter({self.path!r}, rows={self._len}, cached={self.cached})"

    @contextlib.contextmanager
    def make_torch_dataloader(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        workers_count: int | None = None,
        shuffling_queue_capacity: int = 0,
        data_loader_fn: Callable[..., Any] | None = None,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        shuffle: Any = "block",
        seed: int = 0,
        shard: tuple[int, int] | None = None,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        transform: Any = None,
        transform_spec: Any = None,
        **dataset_kwargs: Any,
    ) -> Iterator[Any]:
        """``with converter.make_torch_dataloader(batch_size=...) as loader:`` a
        ``torch.utils.data.DataLoader`` over the cached copy (Petastorm's signature), closed on
        exit.

        The DataLoader wraps a :class:`rowstore.torch.IterableDataset` of whole batches
        (``batch_size`` rows, made by rowstore: the DataLoader's own ``batch_size`` is None and
        it only moves them): it is a :class:`rowstore.torch.ResumableDataLoader`, so
        ``len(loader)``, ``loader.num_workers``, ``state_dict``/``load_state_dict`` (resume on
        any world and number of workers) and ``set_epoch`` work as documented there.

        Parameters
        ----------
        batch_size : int
            Rows per batch (``loader.dataset.batch_size``).
        num_epochs : int or None
            Epochs each ``for`` loop over the loader yields (None: without end, as Petastorm's).
            Epoch ``k`` has the order of (``seed``, ``k``); a loop after a completed one goes
            on with the next epochs, one left early continues where it stopped.
        workers_count : int, optional
            Reader threads in each process (Petastorm's reader pool; rowstore's
            ``num_threads``, as in :func:`rowstore.make_reader`). Default: the reader's in the
            main process, 1 in each DataLoader worker.
        shuffling_queue_capacity : int
            Accepted for Petastorm's signature; rows are already mixed by the epoch order
            (``shuffle=``, ``window=``), so it changes nothing.
        data_loader_fn : callable, optional
            Makes the loader instead: called as ``data_loader_fn(dataset, batch_size=None,
            num_workers=..., pin_memory=...)`` with the IterableDataset (e.g.
            ``functools.partial(torch.utils.data.DataLoader, persistent_workers=True)``, or
            torchdata's ``StatefulDataLoader``); the dataset then yields ``num_epochs`` epochs
            per iteration, which must be an int.
        num_workers : int
            torch DataLoader worker processes; each epoch's batches are dealt to the workers
            (and to the ranks of ``shard``): every row once per epoch.
        pin_memory : bool
            torch's ``pin_memory`` (for ``non_blocking`` copies to a GPU).
        shuffle, seed, shard, cur_shard, shard_count
            The epoch order (``docs/order.md``); ``shard=(rank, world)`` or Petastorm's
            ``cur_shard``/``shard_count`` (default: torch distributed's rank and world size
            when it is initialized).
        transform, transform_spec : callable or TransformSpec, optional
            Applied to each batch (numpy) before it becomes tensors.
        **dataset_kwargs
            The other arguments of :class:`rowstore.torch.IterableDataset`: ``fields``,
            ``drop_last``, ``varlen``, ``window``, ``pieces``, ``with_ids``, ``predicate``...
        """
        import rowstore.torch as rst

        if "device" in dataset_kwargs:
            raise TypeError(
                "make_torch_dataloader yields a torch DataLoader, which has no device=: move "
                "each batch with .to(device) (pin_memory=True for non_blocking copies), or use "
                "rowstore.torch.BatchedDataLoader(converter.path, device=...)"
            )
        if workers_count is not None and dataset_kwargs.get("num_threads") is not None:
            raise ValueError("pass workers_count (Petastorm's name) or num_threads, not both")
        if workers_count is not None:
            dataset_kwargs["num_threads"] = positive_int("workers_count", workers_count)
        del shuffling_queue_capacity  # the epoch order mixes rows (see the docstring)
        num_epochs = positive_int("num_epochs", num_epochs, optional=True)
        per_iteration = 1  # epochs one iteration of the dataset yields
        if data_loader_fn is not None:
            if num_epochs is None:
                raise ValueError(
                    "with data_loader_fn, num_epochs must be an int (the dataset yields that "
                    "many epochs per iteration)"
                )
            per_iteration = num_epochs
        dataset = rst.IterableDataset(
            self.path,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            shard=_shard(shard, cur_shard, shard_count),
            batch_transform=transform if transform is not None else transform_spec,
            num_epochs=per_iteration,
            **dataset_kwargs,
        )
        try:
            if data_loader_fn is None:
                loader = _torch_loader_class()(
                    dataset, num_epochs=num_epochs, num_workers=num_workers, pin_memory=pin_memory
                )
            else:
                loader = data_loader_fn(
                    dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory
                )
            yield loader
        finally:
            dataset.close()

    @contextlib.contextmanager
    def make_tf_dataset(
        self,
        batch_size: int = 32,
        num_epochs: int | None = None,
        *,
        shuffle: str = "block",
        seed: int = 0,
        cur_shard: int | None = None,
        shard_count: int | None = None,
        **dataset_kwargs: Any,
    ) -> Iterator[Any]:
        """``with converter.make_tf_dataset(batch_size=...) as ds:`` a ``tf.data.Dataset``
        (:func:`rowstore.tf.make_dataset`) of ``num_epochs`` epochs (None: repeated without end).

        It reads a contiguous part of each epoch: Petastorm's ``cur_shard``/``shard_count``
        (or ``part=(index, count)``); a dealt ``shard=`` is refused there, as by
        :func:`rowstore.tf.make_dataset` (:class:`rowstore.tf.Loader` deals)."""
        from rowstore.tf import make_dataset

        if cur_shard is not None or shard_count is not None:
            if cur_shard is None or shard_count is None or "part" in dataset_kwargs:
                raise ValueError("pass part=(index, count), or both cur_shard and shard_count")
            dataset_kwargs["part"] = (cur_shard, shard_count)
        if shuffle is True:
            shuffle = "block"
        elif shuffle is False:
            shuffle = "none"
        yield make_dataset(
            self.path,
            batch_size=batch_size,
            num_epochs=num_epochs,
            shuffle=shuffle,
            seed=seed,
            **dataset_kwargs,
        )

    def delete(self) -> None:
        """Remove the cached copy (a later :func:`make_converter` of the DataFrame writes it
        again)."""
        shutil.rmtree(self.path, ignore_errors=True)


def manifest_reader(path: str) -> Any:
    return Reader(path)


def _shard(
    shard: tuple[int, int] | None, cur: int | None, count: int | None
) -> tuple[int, int] | None:
    if cur is None and count is None:
        return shard
    if shard is not None or cur is None or count is None:
        raise ValueError("pass shard=(rank, world), or both cur_shard and shard_count")
    return (cur, count)


@functools.cache
def _torch_loader_class() -> type:
    """The converter's loader class, made on first use (torch is imported only then)."""
    from rowstore.torch import ResumableDataLoader

    class ConverterDataLoader(ResumableDataLoader):
        """A :class:`rowstore.torch.ResumableDataLoader` (a ``torch.utils.data.DataLoader``)
        whose ``for`` loop yields ``num_epochs`` epochs (None: without end)."""

        def __init__(self, dataset: Any, *, num_epochs: int | None, **kwargs: Any):
            super().__init__(dataset, batch_size=None, **kwargs)
            self.num_epochs = num_epochs

        def __iter__(self) -> Iterator[Any]:
            epochs = itertools.count() if self.num_epochs is None else range(self.num_epochs)
            for _ in epochs:  # each completed pass moves the dataset to the next epoch
                yield from super().__iter__()

        def __len__(self) -> int:
            """Batches of the next ``num_epochs`` epochs (this rank's)."""
            if self.num_epochs is None:
                raise TypeError("a loader of num_epochs=None has no length")
            return super().__len__() * self.num_epochs

    return ConverterDataLoader


def make_converter(
    df: DataFrame,
    *,
    cache_dir: str | os.PathLike | None = None,
    schema: Schema | None = None,
    nullable: str = "data",
    shard_bytes: int = 64 << 20,
    **writer_kwargs: Any,
) -> SparkDatasetConverter:
    """Materialize ``df`` once as a rowstore dataset under ``cache_dir`` and return a converter
    (Petastorm's ``make_spark_converter``).

    ``cache_dir`` (a directory or ``file://`` URL, seen by driver and executors) defaults to the
    Spark conf :data:`CACHE_DIR_CONF` (``rowstore.spark.cacheDir``). The copy is named after the
    DataFrame's analyzed plan and schema: converting the same plan again (the same DataFrame,
    or the same query built again) reuses it without a Spark job. A plan over files that later
    change keeps its key: :meth:`SparkDatasetConverter.delete` the stale copy. ``schema``
    (e.g. for :func:`to_row` cells) is :func:`to_rowstore`'s and part of the key; ``nullable``
    defaults to ``"data"`` (fields nullable only where a null occurs); the rest is
    :func:`to_rowstore`'s."""
    if cache_dir is None:
        cache_dir = df.sparkSession.conf.get(CACHE_DIR_CONF, None)
        if not cache_dir:
            raise ValueError(
                f"make_converter needs cache_dir= or the Spark conf {CACHE_DIR_CONF!r} "
                "(spark.conf.set(rowstore.spark.CACHE_DIR_CONF, 'file:///tmp/cache'))"
            )
    parent = os.path.abspath(local_path(cache_dir))
    path = os.path.join(parent, f"rowstore-{_plan_key(df, schema)}")
    if manifest.is_dataset(path):
        return SparkDatasetConverter(path, cached=True)
    to_rowstore(
        df, path, schema=schema, nullable=nullable, shard_bytes=shard_bytes, **writer_kwargs
    )
    return SparkDatasetConverter(path, cached=False)
