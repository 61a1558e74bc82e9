"""One vocabulary: every public read entry point against every shared argument.

:data:`TABLE` declares, for each entry point, the keyword it takes each shared argument by
(rowstore's word, or a Petastorm-compatible spelling mapped to it in :data:`PETASTORM`), and
which shared arguments it accepts only to refuse them (``decode=`` where no image ops apply,
a dealt ``shard=`` where the entry point reads a contiguous part). The checks prove:

- the signatures (explicit parameters, and ``**order`` where it is the order arguments of
  ``EpochSpec``, checked by calling) take exactly the table's shared arguments; the loaders,
  which move through epochs themselves, take the epoch by ``set_epoch`` (or by iterating);
- one set of accepted values: the same invalid value of each argument is refused by every
  entry point that takes it, with the same exception type and a message naming the argument
  (its own spelling for a Petastorm name), when the entry point is made;
- one meaning: ``shard=(rank, world)`` is the dealt part everywhere (``Reader.deal``'s rows;
  the ranks' rows are every row once), ``part=(index, count)`` the contiguous slice of the
  epoch order, and ``shuffle``/``seed``/``window``/``pieces``/``epoch`` give the same row
  order wherever they are taken; ``decode=`` where it cannot apply is one ``ValueError``;
  ``verify`` means "check what is read", the eager scan is ``scan=``; ``mix`` and ``Mixture``
  share the seed default;
- every entry point that takes a path or URL takes ``storage_options``: refused for a local
  path as :func:`rowstore.open` refuses it, and used for an ``s3://`` URL (moto), the endpoint
  and credentials given only through them.

:data:`UNMET` lists the cases the code does not meet yet, with what it does instead.

Spark's converter is made over a dataset directory as ``make_converter`` makes it (no Spark
session: its methods build the loaders), and Ray's reader is :class:`RowstoreDatasource`, its
read tasks run in this process (no Ray cluster).
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import rowstore
from rowstore import Field, Schema
from rowstore.errors import SchemaError
from rowstore.reader import Reader
from rowstore.reader.epochs import EpochSpec
from rowstore.reader.image_ops import Resize
from rowstore.reader.mix import Mixture

torch = pytest.importorskip("torch")
import rowstore.torch as rst  # noqa: E402
from rowstore.petastorm import DataLoader as PetastormDataLoader  # noqa: E402
from rowstore.spark import SparkDatasetConverter  # noqa: E402

N, B = 40, 8  # 5 blocks of 8 rows; the dataset: 2 shards of 25 and 15 rows

SHARED = (
    "shuffle",
    "shard",
    "part",
    "seed",
    "epoch",
    "window",
    "pieces",
    "decode",
    "fields",
    "predicate",
    "transform",
    "num_threads",
    "storage_options",
    "verify",
)
#: Petastorm's spellings and the shared argument each one is, on every entry point taking it.
PETASTORM = {
    "cur_shard": "part",
    "shard_count": "part",
    "schema_fields": "fields",
    "transform_spec": "transform",
    "workers_count": "num_threads",
}
#: The order arguments an ``**order`` catch-all takes (``EpochSpec``'s fields).
ORDER_FIELDS = {f.name for f in dataclasses.fields(EpochSpec)}


# -- the data -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """A file and a 2-shard dataset directory of ``N`` rows (``id`` = row number)."""
    d = tmp_path_factory.mktemp("vocab")
    schema = Schema([Field("id", "int64"), Field("x", "float32", (2,))])
    ids = np.arange(N, dtype=np.int64)
    cols = {"id": ids, "x": np.repeat(ids[:, None], 2, axis=1).astype(np.float32)}
    f, ds = str(d / "f.h5"), str(d / "ds")
    with rowstore.Writer(f, schema, rows_per_block=8) as w:
        w.write_batch(cols)
    with rowstore.DatasetWriter(ds, schema, shard_bytes=400, rows_per_block=8) as w:
        w.write_batch(cols)
    with rowstore.open(ds) as r:
        assert r.layout.num_shards == 2
    return {"file": f, "dataset": ds}


@pytest.fixture(scope="module")
def opened(data):
    """Open readers and one-source mixtures of the file and the dataset, closed at the end."""
    out: dict[Any, Any] = {}
    for p in data.values():
        out[p] = rowstore.open(p)
        out["mix", p] = rowstore.mix([out[p]])
    yield out
    for v in out.values():
        v.close()


def _col(v: Any) -> list[int]:
    if hasattr(v, "numpy"):
        v = v.numpy()
    return np.asarray(v).reshape(-1).tolist()


def _ids(batches: Any) -> list[list[int]]:
    return [_col(b["id"]) for b in batches]


def _flat(batches: list[list[int]]) -> list[int]:
    return [i for b in batches for i in b]


# -- the entry points -----------------------------------------------------------------------
@dataclasses.dataclass
class Entry:
    """One public entry point: ``make(source, **kw)`` builds it (reading nothing where it is
    lazy), ``read(obj, epoch)`` gives the ids of its batches of ``epoch`` (taken its own way:
    ``set_epoch`` for the loaders), ``close(obj)`` ends it."""

    name: str
    make: Callable[..., Any]
    #: shared argument -> its keyword here (a tuple for a pair of Petastorm keywords)
    words: dict[str, Any]
    #: shared arguments accepted (``**order``) only to be refused with a ValueError
    refused: tuple[str, ...] = ()
    read: Callable[[Any, int], list[list[int]]] | None = None
    #: what it reads: "path" (a path or URL, or an open source), "reader", "mixture",
    #: "converter" (Spark's, over its dataset), "dataset" (a torch Dataset)
    source: str = "path"
    #: its **kwargs are EpochSpec's order arguments (or forward to a callable that has them)
    order_kw: bool = False
    close: Callable[[Any], None] = lambda obj: None


def _epoch_set(obj: Any, epoch: int | None) -> Any:
    if epoch is not None:  # None: the epoch the loader was made with (epoch=)
        obj.set_epoch(epoch)
    return obj


def _loader_close(obj: Any) -> None:
    obj.close()


def _reader_of(source: Any, opened: dict) -> Any:
    return opened[source] if isinstance(source, str) else source


def _grain():
    return pytest.importorskip("rowstore.grain")


def _tf():
    return pytest.importorskip("rowstore.tf")


def _ray():
    return pytest.importorskip("rowstore.ray")


def _ray_read(src: Any, epoch: int) -> list[list[int]]:
    assert epoch == 0
    return [t.column("id").to_pylist() for task in src.get_read_tasks(1) for t in task.read_fn()]


def _converter_torch(conv: Any, **kw: Any) -> Any:
    cm = conv.make_torch_dataloader(batch_size=B, num_epochs=1, **kw)
    loader = cm.__enter__()
    loader._cm = cm
    return loader


def _converter_tf(conv: Any, **kw: Any) -> Any:
    cm = conv.make_tf_dataset(batch_size=B, num_epochs=1, **kw)
    ds = cm.__enter__()
    return ds


_ORDER = {w: w for w in ("shuffle", "seed", "window", "pieces", "decode")}
_LOADER = {
    **_ORDER,
    "shard": "shard",
    "epoch": "epoch",  # the first epoch read; set_epoch(e) reads epoch e too
    "fields": "fields",
    "predicate": "predicate",
    "num_threads": "num_threads",
    "storage_options": "storage_options",
}


def entries(opened: dict) -> list[Entry]:
    """The table (see the module): one :class:`Entry` per public entry point."""
    R = lambda s: _reader_of(s, opened)  # noqa: E731
    M = lambda s: opened["mix", s] if isinstance(s, str) else s  # noqa: E731
    batches = {**_ORDER, "part": "part", "epoch": "epoch", "fields": "fields"}
    batches["num_threads"] = "num_threads"
    deal = {**batches, "shard": "shard"}
    del deal["part"]
    out = [
        Entry(
            "rowstore.open",
            lambda s, **kw: rowstore.open(s, **kw),
            {
                "num_threads": "num_threads",
                "storage_options": "storage_options",
                "verify": "verify",
            },
            read=lambda r, e: [_col(r.take(np.arange(len(r)))["id"])],
            close=lambda r: r.close(),
        ),
        Entry(
            "Reader.batches",
            lambda s, **kw: R(s).batches(B, **kw),
            batches,
            refused=("shard",),
            read=lambda it, e: _ids(it),
            source="reader",
            order_kw=True,
        ),
        Entry(
            "Reader.deal",
            lambda s, **kw: R(s).deal(B, **kw),
            deal,
            read=lambda it, e: _ids(it),
            source="reader",
            order_kw=True,
        ),
        Entry(
            "Mixture.batches",
            lambda s, **kw: M(s).batches(B, **kw),
            batches,
            refused=("shard", "decode"),
            read=lambda it, e: _ids(it),
            source="mixture",
            order_kw=True,
        ),
        Entry(
            "Mixture.deal",
            lambda s, **kw: M(s).deal(B, **kw),
            deal,
            refused=("decode",),
            read=lambda it, e: _ids(it),
            source="mixture",
            order_kw=True,
        ),
        Entry(
            "rowstore.mix",
            lambda s, **kw: rowstore.mix([s], **kw),
            {"seed": "seed", "storage_options": "storage_options"},
            close=lambda m: m.close(),
        ),
        Entry(
            "torch.BatchedDataLoader",
            lambda s, **kw: rst.BatchedDataLoader(s, batch_size=B, **kw),
            {**_LOADER, "transform": "transform"},
            read=lambda dl, e: _ids(_epoch_set(dl, e)),
            order_kw=True,
            close=_loader_close,
        ),
        Entry(
            "torch.BatchedDataLoader(cache='memory')",
            lambda s, **kw: rst.BatchedDataLoader(s, batch_size=B, cache="memory", **kw),
            {**_LOADER, "transform": "transform"},
            refused=("decode",),
            read=lambda dl, e: _ids(_epoch_set(dl, e)),
            order_kw=True,
            close=_loader_close,
        ),
        Entry(
            "petastorm.DataLoader",
            lambda s, **kw: PetastormDataLoader(s, batch_size=B, **kw),
            {**_LOADER, "transform": "transform"},
            read=lambda dl, e: _ids(_epoch_set(dl, e)),
            order_kw=True,
            close=_loader_close,
        ),
        Entry(
            "torch.IterableDataset",
            lambda s, **kw: rst.IterableDataset(s, batch_size=B, **kw),
            {**_LOADER, "transform": "transform"},
            read=lambda ds, e: _ids(_epoch_set(ds, e)),
            order_kw=True,
            close=_loader_close,
        ),
        Entry(
            "torch.ResumableDataLoader",
            lambda s, **kw: rst.ResumableDataLoader(
                rst.IterableDataset(s, batch_size=B, **kw), batch_size=None
            ),
            {**_LOADER, "transform": "transform"},
            read=lambda dl, e: _ids(_epoch_set(dl, e)),
            order_kw=True,
            close=lambda dl: dl.dataset.close(),
        ),
        Entry(
            "torch.ElasticBatchSampler",
            lambda s, **kw: rst.ElasticBatchSampler(rst.Dataset(s), batch_size=B, **kw),
            {
                **{k: v for k, v in _LOADER.items() if k not in ("fields", "num_threads")},
                "storage_options": None,
            },
            refused=("decode",),
            read=lambda sm, e: [list(ix) for ix in _epoch_set(sm, e)],
            source="dataset",
            order_kw=True,
            close=_loader_close,
        ),
        Entry(
            "torch.Dataset",
            lambda s, **kw: rst.Dataset(s, **kw),
            {"fields": "fields", "transform": "transform", "storage_options": "storage_options"},
            read=lambda ds, e: [_col(ds.__getitems__(list(range(len(ds)))).columns["id"])],
            close=_loader_close,
        ),
        Entry(
            "make_reader",
            lambda s, **kw: rowstore.make_reader(s, batch_size=B, **kw),
            {
                **{k: k for k in ("shuffle", "seed", "window", "pieces", "predicate")},
                "part": ("cur_shard", "shard_count"),
                "fields": "schema_fields",
                "transform": "transform_spec",
                "num_threads": "workers_count",
                "storage_options": "storage_options",
                "verify": "verify",
            },
            read=lambda rd, e: [[int(row.id) for row in rd]] if e == 0 else None,
            close=lambda rd: rd.stop(),
        ),
        Entry(
            "make_batch_reader",
            lambda s, **kw: rowstore.make_batch_reader(s, batch_size=B, **kw),
            {
                **{k: k for k in ("shuffle", "seed", "window", "pieces", "predicate")},
                "part": ("cur_shard", "shard_count"),
                "epoch": ".iter_batches(epoch)",
                "fields": "schema_fields",
                "transform": "transform_spec",
                "num_threads": "workers_count",
                "storage_options": "storage_options",
                "verify": "verify",
            },
            read=lambda rd, e: [_col(b["id"]) for b in rd.iter_batches(e)],
            close=lambda rd: rd.stop(),
        ),
        Entry(
            "spark converter.make_torch_dataloader",
            _converter_torch,
            {
                **{k: v for k, v in _LOADER.items() if k != "storage_options"},
                "part": ("cur_shard", "shard_count"),
                "transform": "transform",
            },
            read=lambda dl, e: _ids(_epoch_set(dl, e)),
            source="converter",
            order_kw=True,
            close=lambda dl: dl._cm.__exit__(None, None, None),
        ),
        Entry(
            "spark converter.make_tf_dataset",
            _converter_tf,
            {
                **batches,
                "part": ("cur_shard", "shard_count"),
                "predicate": "predicate",
            },
            refused=("shard",),
            read=lambda ds, e: _ids(ds),
            source="converter",
            order_kw=True,
        ),
        Entry(
            "tf.make_dataset",
            lambda s, **kw: _tf().make_dataset(s, batch_size=B, **kw),
            {**batches, "predicate": "predicate", "storage_options": "storage_options"},
            refused=("shard",),
            read=lambda ds, e: _ids(ds),
            order_kw=True,
        ),
        Entry(
            "tf.Loader",
            lambda s, **kw: _tf().Loader(s, batch_size=B, **kw),
            dict(_LOADER),
            read=lambda ld, e: _ids(_epoch_set(ld, e).dataset()),
            order_kw=True,
            close=lambda ld: ld.reader.close(),
        ),
        Entry(
            "grain.EpochDataset",
            lambda s, **kw: _grain().EpochDataset(s, batch_size=B, **kw),
            _LOADER,
            read=lambda ds, e: _ids(iter(ds)) if e in (0, None) else None,
            order_kw=True,
            close=lambda ds: ds.reader.close(),
        ),
        Entry(
            "grain.BatchSource",
            lambda s, **kw: _grain().BatchSource(s, B, **kw),
            {
                **{k: k for k in ("shuffle", "seed", "epoch", "window", "pieces", "fields")},
                "predicate": "predicate",
                "storage_options": "storage_options",
            },
            refused=("shard", "decode"),
            read=lambda bs, e: [_col(bs[g]["id"]) for g in range(len(bs))],
            order_kw=True,
            close=lambda bs: bs.reader.close(),
        ),
        Entry(
            "grain.ReaderSource",
            lambda s, **kw: _grain().ReaderSource(s, **kw),
            {"fields": "fields", "storage_options": "storage_options"},
            read=lambda src, e: [[int(src[i]["id"]) for i in range(len(src))]],
            close=lambda src: src.reader.close(),
        ),
        Entry(
            "ray.RowstoreDatasource",
            lambda s, **kw: _ray().RowstoreDatasource(s, **kw),
            {"fields": "fields", "storage_options": "storage_options"},
            read=_ray_read,
        ),
    ]
    return out


NAMES = [
    "rowstore.open",
    "Reader.batches",
    "Reader.deal",
    "Mixture.batches",
    "Mixture.deal",
    "rowstore.mix",
    "torch.BatchedDataLoader",
    "torch.BatchedDataLoader(cache='memory')",
    "petastorm.DataLoader",
    "torch.IterableDataset",
    "torch.ResumableDataLoader",
    "torch.ElasticBatchSampler",
    "torch.Dataset",
    "make_reader",
    "make_batch_reader",
    "spark converter.make_torch_dataloader",
    "spark converter.make_tf_dataset",
    "tf.make_dataset",
    "tf.Loader",
    "grain.EpochDataset",
    "grain.BatchSource",
    "grain.ReaderSource",
    "ray.RowstoreDatasource",
]


@pytest.fixture(scope="module")
def table(opened) -> dict[str, Entry]:
    got = {e.name: e for e in entries(opened)}
    assert list(got) == NAMES
    return got


@pytest.fixture(scope="module")
def converter(data):
    """Spark's converter of the dataset directory, as ``make_converter`` returns it."""
    return SparkDatasetConverter(data["dataset"], cached=True)


def _source(entry: Entry, data, opened, converter, kind: str = "file") -> Any:
    p = data[kind]
    if entry.source == "converter":
        return converter if kind == "dataset" else None
    if entry.source == "mixture":
        return opened["mix", p]
    if entry.source == "reader":
        return opened[p]
    return p


def _kw(entry: Entry, arg: str, value: Any) -> dict[str, Any]:
    """``arg=value`` in ``entry``'s words (a pair ``(i, n)`` split over a Petastorm pair)."""
    word = entry.words.get(arg, arg if arg in entry.refused else None)
    assert isinstance(word, (str, tuple)), (entry.name, arg)
    if isinstance(word, tuple):
        return dict(zip(word, value))
    return {word: value}


def _keyword(word: Any) -> bool:
    """A table word that is a keyword (not ``.set_epoch()``... a method's way)."""
    return isinstance(word, tuple) or (isinstance(word, str) and word.isidentifier())


def _build(entry: Entry, source: Any, **kw: Any) -> Any:
    if entry.source == "converter" and source is None:
        pytest.skip("the converter reads its dataset directory")
    return entry.make(source, **kw)


def _read(entry: Entry, source: Any, at: int = 0, **kw: Any) -> list[list[int]]:
    obj = _build(entry, source, **kw)
    try:
        got = entry.read(obj, at)
    finally:
        entry.close(obj)
    if entry.name.endswith("make_dataset") or entry.name.endswith("make_tf_dataset"):
        gc.collect()  # tf's generators, and the reader they opened, end with them
    return got


# -- what the code does not meet yet ----------------------------------------------------------
_CUR_SHARD = "cur_shard/shard_count are the dealt shard (make_reader's: the contiguous part)"
#: Cases of the checks below that the code does not meet yet, each with what it does instead:
#: they are not run (nor expected to fail). Fixing the code removes the entry; a stale entry is
#: an error (:func:`test_every_unmet_case_is_a_case`).
UNMET: dict[tuple[str, str], str] = {
    ("invalid", "spark converter.make_torch_dataloader-part=(0, 0)"): _CUR_SHARD,
    ("invalid", "spark converter.make_torch_dataloader-part=(3, 2)"): _CUR_SHARD,
    ("part", "spark converter.make_torch_dataloader"): _CUR_SHARD,
}


def _run(check: str, ids: list[str], params: list[Any] | None = None) -> list[Any]:
    """The cases of ``check`` (``ids``, or ``params`` with those ids) but :data:`UNMET`'s."""
    params = ids if params is None else params
    return [p for i, p in zip(ids, params) if (check, i) not in UNMET]


def test_every_unmet_case_is_a_case():
    """Each :data:`UNMET` entry names a case of a check (none left over once fixed)."""
    cases = {
        **{
            (c, n): 1
            for c in ("signature", "epoch", "path", "url", "part", "shard refused")
            for n in NAMES
        },
        **{("invalid", i): 1 for i in _case_ids()},
    }
    assert not [k for k in UNMET if k not in cases]


# -- 1. the signatures ----------------------------------------------------------------------
def _signature_words(entry: Entry, opened: dict, converter: Any) -> set[str]:
    """The shared arguments ``entry``'s signature names, in rowstore's words."""
    fn: Any = {
        "rowstore.open": Reader,
        "Reader.batches": Reader.batches,
        "Reader.deal": Reader.deal,
        "Mixture.batches": Mixture.batches,
        "Mixture.deal": Mixture.deal,
        "rowstore.mix": rowstore.mix,
        "torch.BatchedDataLoader": rst.BatchedDataLoader,
        "torch.BatchedDataLoader(cache='memory')": rst.BatchedDataLoader,
        "petastorm.DataLoader": rst.BatchedDataLoader,
        "torch.IterableDataset": rst.IterableDataset,
        "torch.ResumableDataLoader": rst.IterableDataset,
        "torch.ElasticBatchSampler": rst.ElasticBatchSampler,
        "torch.Dataset": rst.Dataset,
        "make_reader": rowstore.make_reader,
        "make_batch_reader": rowstore.make_reader,
        "spark converter.make_torch_dataloader": SparkDatasetConverter.make_torch_dataloader,
        "spark converter.make_tf_dataset": SparkDatasetConverter.make_tf_dataset,
        "tf.make_dataset": lambda: _tf().make_dataset,
        "tf.Loader": lambda: _tf().Loader,
        "grain.EpochDataset": lambda: _grain().EpochDataset,
        "grain.BatchSource": lambda: _grain().BatchSource,
        "grain.ReaderSource": lambda: _grain().ReaderSource,
        "ray.RowstoreDatasource": lambda: _ray().RowstoreDatasource,
    }[entry.name]
    if inspect.isfunction(fn) and fn.__name__ == "<lambda>":
        fn = fn()
    params = inspect.signature(fn).parameters
    names = {PETASTORM.get(p, p) for p in params}
    if entry.name.startswith("spark converter."):  # **dataset_kwargs: the loader's
        target = rst.IterableDataset if "torch" in entry.name else _tf().make_dataset
        names |= {p for p in inspect.signature(target).parameters}
        # the converter's directory is local: storage_options forwarded there are refused
        names -= {"batch_transform", "storage_options"}
    if entry.order_kw:
        names |= ORDER_FIELDS
    return names & set(SHARED)


@pytest.mark.parametrize("name", _run("signature", NAMES))
def test_the_signature_takes_the_tables_arguments(name, table, opened, converter):
    """The shared arguments an entry point's signature accepts are those of the table: taken
    by keyword, or accepted to be refused; an argument the table says is taken another way
    (``set_epoch``) is no keyword of the signature."""
    e = table[name]
    keywords = {a for a, w in e.words.items() if _keyword(w)} | set(e.refused)
    got = _signature_words(e, opened, converter)
    assert got == keywords, (
        f"{name} takes {sorted(got - keywords)} beyond the table and lacks {sorted(keywords - got)}"
    )


@pytest.mark.parametrize("name", NAMES)
def test_order_keywords_are_epoch_specs(name, table, data, opened, converter):
    """Where ``**kwargs`` carries the order arguments, it is ``EpochSpec``'s: a misspelled one
    is a TypeError naming it (not swallowed)."""
    e = table[name]
    if not e.order_kw:
        return
    src = _source(e, data, opened, converter, "dataset")
    with pytest.raises(TypeError, match="windw"):
        _build(e, src, windw=3)


# -- 2. one set of accepted values ----------------------------------------------------------
BAD = [
    ("shuffle", "sometimes", "shuffle"),
    ("window", 0, "window"),
    ("pieces", -1, "pieces"),
    ("seed", -1, "seed"),
    ("seed", "x", "seed"),
    ("shard", (2, 2), "shard"),
    ("shard", (0.5, 2), "shard"),
    ("part", (0, 0), "part|cur_shard"),
    ("part", (3, 2), "part|cur_shard"),
    ("epoch", -1, "epoch"),
    ("num_threads", 0, "num_threads|workers_count"),
    ("decode", {"nope": Resize(4)}, "decode"),
    ("fields", ["nope"], "nope"),
    ("verify", "sometimes", "verify"),
]


def _case_ids() -> list[str]:
    return [f"{name}-{arg}={value!r}" for name in NAMES for arg, value, _ in BAD]


def _cases() -> list[Any]:
    params = [
        pytest.param(name, arg, value, match, id=f"{name}-{arg}={value!r}")
        for name in NAMES
        for arg, value, match in BAD
    ]
    return _run("invalid", _case_ids(), params)


@pytest.mark.parametrize("name, arg, value, match", _cases())
def test_an_invalid_value_is_refused_alike(name, arg, value, match, table, data, opened, converter):
    """Every entry point taking ``arg`` refuses the same invalid value when it is made (before
    anything is read), with a ValueError naming the argument (a SchemaError, also a
    ValueError, for a field the file lacks)."""
    e = table[name]
    word = e.words.get(arg)
    if arg in e.refused or not _keyword(word):
        if word == ".set_epoch()":
            obj = _build(e, _source(e, data, opened, converter, "dataset"))
            try:
                with pytest.raises(ValueError, match=match):
                    obj.set_epoch(value)
            finally:
                e.close(obj)
        return
    src = _source(e, data, opened, converter, "dataset")
    want = SchemaError if arg in ("decode", "fields") else ValueError
    with pytest.raises(want, match=match) as got:
        obj = _build(e, src, **_kw(e, arg, value))
        e.close(obj)
    assert type(got.value) is want or arg == "verify", (name, type(got.value))


def test_seed_defaults_are_one(data):
    """``rowstore.mix`` and ``Mixture`` share the seed default, that of every order (0)."""
    default = inspect.signature(rowstore.mix).parameters["seed"].default
    assert default == inspect.signature(Mixture).parameters["seed"].default == EpochSpec().seed
    with rowstore.mix([data["file"]]) as m:
        assert m.seed == default == 0


# -- 3. one meaning -------------------------------------------------------------------------
ORDERS = [
    dict(shuffle=True, seed=3, window=2, pieces=1),
    dict(shuffle="full", seed=5),
    dict(shuffle=False),
    dict(shuffle="block", seed=1, window=1, pieces=4),
]


def _order_kw(e: Entry, order: dict) -> dict:
    out: dict[str, Any] = {}
    for k, v in order.items():
        out.update(_kw(e, k, v))
    return out


def _takes(e: Entry, *args: str) -> bool:
    return all(_keyword(e.words.get(a)) for a in args)


def _ordered(kind: str = "file") -> list[Any]:
    return [pytest.param(n, i, kind, id=f"{n}-order{i}") for n in NAMES for i in range(len(ORDERS))]


@pytest.mark.parametrize("name, i, kind", _ordered("dataset"))
def test_the_order_arguments_give_one_order(name, i, kind, table, data, opened, converter):
    """``shuffle``/``seed``/``window``/``pieces`` give the same epoch order wherever they are
    taken: one consumer's rows are ``Reader.epoch_order``'s, in that order (a mixture: its
    own ``epoch_order``'s rows)."""
    e = table[name]
    order = ORDERS[i]
    if not _takes(e, *order) or e.read is None:
        return
    src = _source(e, data, opened, converter, kind)
    ref = opened["mix", data[kind]] if e.source == "mixture" else opened[data[kind]]
    want = ref.epoch_order(**order)
    want = want[:, 1].tolist() if e.source == "mixture" else want.tolist()
    got = _read(e, src, 0, **_order_kw(e, order))
    assert _flat(got) == want


@pytest.mark.parametrize("name", _run("epoch", NAMES))
def test_epoch_selects_the_epoch(name, table, data, opened, converter):
    """``epoch`` (a keyword, ``set_epoch``, ``iter_batches(epoch)``) reads that epoch's order
    wherever it is taken; the first epoch read is epoch 0."""
    e = table[name]
    order = dict(shuffle=True, seed=3, window=2, pieces=1)
    if e.read is None or not _takes(e, *order):
        return
    src = _source(e, data, opened, converter, "dataset")
    ref = opened["mix", data["dataset"]] if e.source == "mixture" else opened[data["dataset"]]

    def want(epoch: int) -> list[int]:
        w = ref.epoch_order(epoch=epoch, **order)
        return w[:, 1].tolist() if e.source == "mixture" else w.tolist()

    word = e.words.get("epoch")
    kw = _order_kw(e, order)
    if word == "epoch":
        assert _flat(_read(e, src, None, epoch=2, **kw)) == want(2)
        probe = _build(e, src, **kw)
        sets = hasattr(probe, "set_epoch")
        e.close(probe)
        if sets:  # a loader: set_epoch(e) reads epoch e, whatever epoch= it was made with
            assert _flat(_read(e, src, 2, **kw)) == want(2)
            assert _flat(_read(e, src, 3, epoch=2, **kw)) == want(3)
    elif word in (".set_epoch()", ".iter_batches(epoch)"):
        assert _flat(_read(e, src, 2, **kw)) == want(2)
    assert _flat(_read(e, src, 0, **kw)) == want(0)
    if word != "epoch" and e.order_kw:  # accepted by **order: refused, or that epoch
        try:
            got = _flat(_read(e, src, 0, epoch=2, **kw))
        except (TypeError, ValueError) as exc:
            assert "epoch" in str(exc)
        else:
            assert got == want(2), f"{name}(epoch=2) reads epoch 0, not epoch 2"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("world", [2, 3])
def test_shard_is_the_dealt_part(name, world, table, data, opened, converter):
    """``shard=(rank, world)`` is ``Reader.deal``'s dealt part everywhere it is taken (a
    mixture: ``Mixture.deal``'s): the same batches, and the ranks' rows are every row once."""
    e = table[name]
    if not _takes(e, "shard") or e.read is None:
        return
    kind = "dataset"
    src = _source(e, data, opened, converter, kind)
    ref = opened["mix", data[kind]] if e.source == "mixture" else opened[data[kind]]
    order = dict(shuffle=True, seed=2, window=2, pieces=1)
    every = []
    for rank in range(world):
        want = _ids(ref.deal(B, shard=(rank, world), **order))
        got = _read(e, src, 0, **_kw(e, "shard", (rank, world)), **_order_kw(e, order))
        assert got == want, rank
        every += _flat(got)
    assert sorted(every) == sorted(_flat(_ids(ref.deal(B, **order))))


@pytest.mark.parametrize("name", _run("part", NAMES))
def test_part_is_the_contiguous_slice(name, table, data, opened, converter):
    """``part=(index, count)`` (Petastorm's ``cur_shard``/``shard_count``) is the contiguous
    slice of the epoch order everywhere it is taken: the parts in turn are the order."""
    e = table[name]
    if not _takes(e, "part") or e.read is None:
        return
    kind = "dataset"
    src = _source(e, data, opened, converter, kind)
    ref = opened["mix", data[kind]] if e.source == "mixture" else opened[data[kind]]
    order = dict(shuffle=True, seed=2, window=2, pieces=1)
    whole = ref.epoch_order(**order)
    whole = whole[:, 1].tolist() if e.source == "mixture" else whole.tolist()
    got = []
    for i in range(3):
        part = _flat(_read(e, src, 0, **_kw(e, "part", (i, 3)), **_order_kw(e, order)))
        assert part == _flat(_ids(ref.batches(B, part=(i, 3), **order)))
        got += part
    assert got == whole


@pytest.mark.parametrize("name", _run("shard refused", NAMES))
def test_a_dealt_shard_is_refused_where_a_part_is_read(name, table, data, opened, converter):
    """Where ``shard=`` is accepted only to be refused (a contiguous reader), it is a
    ValueError pointing to what deals."""
    e = table[name]
    if "shard" not in e.refused:
        return
    src = _source(e, data, opened, converter, "dataset")
    with pytest.raises(ValueError, match="deal|EpochDataset"):
        _build(e, src, shard=(0, 2))


@pytest.mark.parametrize("name", NAMES)
def test_decode_where_it_cannot_apply_is_one_error(name, table, data, opened, converter):
    """``decode=`` where no image ops apply is one ValueError, with one wording, wherever the
    entry point accepts the order arguments; where it takes no order arguments at all, it is
    Python's TypeError for an unknown keyword."""
    e = table[name]
    src = _source(e, data, opened, converter, "dataset")
    op = {"x": Resize(4)}
    if "decode" in e.refused:
        with pytest.raises(ValueError, match="does not apply decode= image ops") as got:
            _build(e, src, decode=op)
        assert type(got.value) is ValueError
    elif "decode" not in e.words:
        with pytest.raises(TypeError, match="decode"):
            _build(e, src, decode=op)


@pytest.mark.parametrize("name", NAMES)
def test_predicate_and_fields_mean_one_thing(name, table, data, opened, converter):
    """``predicate`` is a function of a batch dict keeping one bool per row (the same rows
    everywhere), and ``fields`` the fields read."""
    e = table[name]
    if e.read is None:
        return
    src = _source(e, data, opened, converter, "dataset")
    if _takes(e, "predicate"):
        got = _flat(_read(e, src, 0, **_kw(e, "predicate", lambda b: b["id"] % 3 == 0)))
        assert sorted(got) == list(range(0, N, 3))
    if _takes(e, "fields"):
        assert sorted(_flat(_read(e, src, 0, **_kw(e, "fields", ["id"])))) == list(range(N))


def test_verify_checks_what_is_read_and_scan_is_the_eager_scan(data):
    """``verify`` means one thing (check what is read: True, False or "always") wherever it is
    a keyword; the eager scan of every chunk is ``scan=``, never ``verify=``."""
    from rowstore.format.index import Layout
    from rowstore.format.shards import DatasetLayout

    for call in (rowstore.open, Reader, rowstore.make_reader, rowstore.make_batch_reader):
        for ok in (True, False, "always"):
            obj = call(data["file"], verify=ok)
            (obj.reader if hasattr(obj, "stop") else obj).close()
        with pytest.raises(ValueError, match="verify must be True, False or 'always'"):
            call(data["file"], verify="sometimes")
    for fn in (Layout.open, rowstore.restore_pointer):
        params = inspect.signature(fn).parameters
        assert "scan" in params and "verify" not in params, fn
    assert "verify" not in inspect.signature(DatasetLayout.open).parameters
    public = [getattr(rowstore, n) for n in rowstore.__all__]
    for obj in public:
        if not callable(obj):
            continue
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            continue
        if "verify" in params:
            assert params["verify"].default is True, obj


# -- 4. storage_options ---------------------------------------------------------------------
@pytest.mark.parametrize("name", _run("path", NAMES))
def test_a_path_entry_point_takes_storage_options(name, table, data):
    """Every entry point that takes a path or URL takes ``storage_options``; for a local path
    it refuses them as :func:`rowstore.open` does (the same error and message)."""
    e = table[name]
    if e.source != "path":
        return
    assert e.words.get("storage_options") == "storage_options", name
    opts = {"anon": False}
    with pytest.raises(ValueError, match="storage_options") as want:
        rowstore.open(data["file"], storage_options=opts)
    with pytest.raises(ValueError, match="storage_options") as got:
        e.close(_build(e, data["file"], storage_options=opts))
    assert str(got.value) == str(want.value)


@pytest.fixture(scope="module")
def s3_urls(data, s3_server):
    """The file and the dataset on moto S3 (under ``s3://rowstore/vocabulary/``), and the
    options that reach it (endpoint and credentials)."""
    fsspec = pytest.importorskip("fsspec")
    _, opts = s3_server
    fs = fsspec.filesystem("s3", **opts)
    fs.put(data["file"], "rowstore/vocabulary/f.h5")
    fs.put(data["dataset"] + "/", "rowstore/vocabulary/ds/", recursive=True)
    urls = {"file": "s3://rowstore/vocabulary/f.h5", "dataset": "s3://rowstore/vocabulary/ds"}
    return urls, opts


@pytest.mark.parametrize("name", _run("url", NAMES))
def test_storage_options_reach_a_url(name, table, data, opened, s3_urls):
    """An ``s3://`` URL is read with the endpoint and credentials given only through
    ``storage_options``: the same rows as the local copy; the reader's threads end with it."""
    e = table[name]
    if e.source != "path" or e.words.get("storage_options") != "storage_options":
        return
    urls, opts = s3_urls
    before = set(threading.enumerate())
    for kind in ("file", "dataset"):
        if e.read is None:
            e.close(_build(e, urls[kind], storage_options=opts))
            continue
        got = _read(e, urls[kind], 0, storage_options=opts)
        assert got == _read(e, data[kind], 0), kind
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith("rowstore")]
    assert not left
