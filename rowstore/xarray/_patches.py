""":func:`write_patches`: samples cut out of a gridded Dataset (spatial patches with strides, time
windows, whole kept dimensions), chunk by chunk (with halos) on the active Dask scheduler, written
as shards in parallel, shuffled, optionally stacked into one channel field with normalization
statistics.

This module runs the job: it plans it (:mod:`rowstore.xarray._plan`), builds one Dask task per
region of the grid (each cuts and writes its samples: :mod:`rowstore.xarray._cut`), computes them
(or returns them delayed), and commits the shards, through the global shuffle by default."""

from __future__ import annotations

import math
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rowstore._check import one_of
from rowstore.format import manifest
from rowstore.global_shuffle import shuffle as local_shuffle
from rowstore.writer import commit, write_shard
from rowstore.writer.commit import ShardInfo
from rowstore.writer.file import DEFAULT_BLOCK_BYTES
from rowstore.xarray._cut import combine_moments, write_region
from rowstore.xarray._meta import META_KEY
from rowstore.xarray._plan import PatchPlan, task_regions


def write_patches(
    ds: xr.Dataset,
    path: str | os.PathLike,
    *,
    patch: Mapping[str, int] | None = None,
    stride: Mapping[str, int] | None = None,
    window: Mapping[str, int] | None = None,
    sample_over: Sequence[str] | str | None = None,
    keep: Sequence[str] | str = ("altitude",),
    variables: Sequence[str] | None = None,
    where: str | Callable[[dict], Any] | None = None,
    shuffle: bool = True,
    seed: int = 0,
    stack: bool | Sequence[str] | None = None,
    channels: str = "last",
    stack_name: str = "stack",
    dtype: Any = None,
    sample_dim: str = "sample",
    shard_bytes: int = 64 << 20,
    task_bytes: int = 8 << 20,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    compression: Any = None,
    mode: str = "w",
    memory: int | str = "1GB",
    tmp: str | os.PathLike | None = None,
    compute: bool = True,
) -> Any:
    """Cut samples out of a gridded Dataset into a rowstore dataset directory, one row per sample.

    Parameters
    ----------
    ds : xarray.Dataset
        Numpy- or Dask-backed. Every dimension of a variable written must be in ``patch``,
        ``window``, ``sample_over`` or ``keep``.
    path : str or os.PathLike
        The dataset directory (written as shards, committed once).
    patch : mapping of dim to int
        Patch sizes (default ``{"lat": 9, "lon": 9}``); a patch dimension is stacked spatially.
    stride : mapping of dim to int, optional
        Step between patch origins per dimension; default the patch size for ``patch``
        dimensions (tiles), 1 for ``window`` and ``sample_over`` dimensions. A stride smaller
        than the size overlaps samples. Only whole patches are cut: origins ``0, s, 2s, ...`` up
        to ``size - patch`` (a remainder at the far edge is not covered); a patch larger than its
        dimension is a ``ValueError``.
    window : mapping of dim to int, optional
        Runs of consecutive steps (``{"time": 2}`` for pairs), kept as a dimension of the sample.
    sample_over : sequence of dims, optional
        Every index is its own sample; the dimension is dropped (its coordinate value is stored).
        Default ``("time",)`` when ``ds`` has a ``time`` dimension not in ``patch``/``window``.
    keep : sequence of dims
        Taken whole (e.g. all altitudes). Names that are not dimensions of ``ds`` are ignored.
    variables : sequence of str, optional
        Data variables to write (default all).
    where : "notnull" or callable, optional
        Drop samples: ``"notnull"`` drops those with a NaN (NaT) in any variable written; a
        callable gets a dict of the region's samples (each variable ``(n, ...)`` before
        stacking, plus the origin/coordinate fields) and returns ``n`` bools (True = keep),
        e.g. ``lambda s: s["land"].all(axis=(1, 2))``.
    shuffle, seed : bool, int
        Shuffle the output globally (a uniform permutation of all samples, deterministic for a
        seed and the input's chunking): the samples are written to a temporary dataset beside
        ``path`` and shuffled by the two-pass out-of-core shuffle (:func:`rowstore.shuffle`;
        :func:`rowstore.dask.shuffle` when a ``dask.distributed`` client is current), which
        costs about two more passes over the samples on disk (see :func:`_shuffle_output`).
    memory : int or str
        The shuffle's memory budget (as for :func:`rowstore.shuffle`).
    tmp : str or os.PathLike, optional
        Directory of the shuffle's piles (default: beside ``path``).
    stack : True or sequence of str, optional
        Stack these variables (True: all) into one field ``stack_name`` with a channel
        dimension: each variable's non-patch dimensions (kept levels, window steps) are
        flattened into its channels, in order, then variables are concatenated.
    channels : {"last", "first"}
        Channel-last ``(patch..., C)`` (tf/Keras) or channel-first ``(C, patch...)`` (torch).
    dtype : optional
        Cast floating variables (and the stacked field) to it, e.g. ``"float32"``.
    sample_dim : str
        The sample dimension :func:`open_dataset` gives the result.
    shard_bytes, block_bytes, compression
        Shard and block sizes, block compression (as for :class:`~rowstore.DatasetWriter`).
    task_bytes : int
        Consecutive input chunks along the first moving dimension are merged into one task
        while its input region and its samples each stay within this many bytes (fewer, larger
        shards from finely chunked inputs); with the chunks of the other dimensions it bounds a
        task's memory.
    mode : {"w", "x"}
        As for :func:`~rowstore.commit`.
    compute : bool
        ``False``: return a ``dask.delayed`` that writes and commits.

    Returns
    -------
    int or dask.delayed.Delayed
        The committed version.

    Notes
    -----
    Fields: each variable (shape: its dimensions except ``sample_over``, patch sizes for patch
    and window dimensions) or the stacked field; ``sample_index`` (row-major origin position);
    per moving dimension ``<dim>_origin`` (the index of the sample's first element), and its
    coordinate: ``<dim>`` for ``sample_over`` dimensions (e.g. the time), ``<dim>_values`` the
    patch's vector otherwise. The metadata (user attribute ``"xarray"``) holds the grid
    (sizes, full coordinates), the plan, and per variable (and per channel) the ``mean``,
    ``std`` and ``count`` of the values written (NaN ignored), computed in the same pass.

    Dask-backed inputs are processed chunk by chunk: one task per input chunk (along the moving
    dimensions; consecutive ones merged up to ``task_bytes``) that holds patch origins, reading
    that chunk plus the ``patch - stride`` halo it needs from the next chunks; each task writes
    its samples as shards on the worker
    (:func:`~rowstore.write_shard`), and one :func:`~rowstore.commit` publishes them. Memory
    per task: its input region and its samples (overlapping patches multiply the input).
    Numpy-backed inputs are cut into regions along the first moving dimension of about
    ``task_bytes`` of samples each, on the active scheduler too.
    """
    path = os.fspath(path)
    import dask

    one_of("mode", mode, ("w", "x"))
    plan = PatchPlan(
        ds,
        patch={"lat": 9, "lon": 9} if patch is None else patch,
        stride=stride,
        window=window,
        sample_over=sample_over,
        keep=keep,
        variables=variables,
        stack=stack,
        channels=channels,
        stack_name=stack_name,
        dtype=dtype,
        sample_dim=sample_dim,
    )
    if where is not None and where != "notnull" and not callable(where):
        raise ValueError(f"where must be None, 'notnull' or a callable, got {where!r}")
    sub = _task_input(ds, plan, task_bytes)
    if mode == "x" and (manifest.is_dataset(path) or os.path.exists(path)):
        raise FileExistsError(f"{path!r} exists (mode='x')")
    # the global shuffle's settings; the tasks then write into glob["work"]
    glob = _shuffle_settings(path, memory, seed, tmp, shard_bytes, compute) if shuffle else None
    options = dict(block_bytes=block_bytes, compression=compression)
    target = path if glob is None else glob["work"]
    tasks = _region_tasks(sub, plan, target, where, shard_bytes, task_bytes, options)
    if not compute:
        return dask.delayed(_finish_patches, pure=False)(path, tasks, plan, glob, mode, options)
    return _finish_patches(path, _compute(tasks, glob), plan, glob, mode, options)


def _task_input(ds: xr.Dataset, plan: PatchPlan, task_bytes: int) -> xr.Dataset:
    """The variables written, without their coordinates, chunked for the tasks: a Dask-backed
    input as it is chunked (chunks unified), a numpy-backed one into regions along the first
    moving dimension of about ``task_bytes`` of samples each."""
    sub = ds[plan.variables].drop_vars(list(ds[plan.variables].coords))
    if not sub.chunks and plan.moving:
        d0 = plan.moving[0]
        per_step = max(1, plan.row_nbytes * math.prod(plan.counts[d] for d in plan.moving[1:]))
        origins = max(1, task_bytes // per_step)
        sub = sub.chunk({d0: max(1, origins * plan.stride[d0])})
    return sub.unify_chunks()


def _shuffle_settings(
    path: str, memory: int | str, seed: int, tmp: Any, shard_bytes: int, cluster: bool
) -> dict:
    """The global shuffle's settings: the temporary datasets beside ``path`` the tasks write into
    (``work``) and the shuffle writes (``staged``), under names no other writer picks;
    ``cluster``: shuffle on the current ``dask.distributed`` client, if any."""
    parent, name = os.path.split(os.path.abspath(path))
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    return dict(
        work=os.path.join(parent, f".{name}.patches-{tag}"),
        staged=os.path.join(parent, f".{name}.shuffled-{tag}"),
        memory=memory,
        seed=seed,
        tmp=None if tmp is None else os.fspath(tmp),
        shard_bytes=shard_bytes,
        cluster=cluster,
    )


def _region_tasks(
    sub: xr.Dataset,
    plan: PatchPlan,
    target: str,
    where: Any,
    shard_bytes: int,
    task_bytes: int,
    options: dict,
) -> list:
    """One delayed :func:`~rowstore.xarray._cut.write_region` per region of
    :func:`~rowstore.xarray._plan.task_regions`, writing its shards into ``target``."""
    import dask

    task = dask.delayed(write_region, pure=False)
    # one key in the graph (it holds the grid's coordinates), not one copy per task
    shared = dask.delayed(plan, traverse=False)
    chunks = dict(sub.chunks) if sub.chunks else {}
    return [
        task(sub.isel(sl), shared, start, counts, i, target, where, shard_bytes, options)
        for i, (start, counts, sl) in enumerate(task_regions(plan, chunks, task_bytes))
    ]


def _compute(tasks: list, glob: dict | None) -> list:
    """The tasks' results, computed on the active scheduler; on failure the shuffle's work
    dataset is removed."""
    import dask

    try:
        return list(dask.compute(*tasks))
    except BaseException:
        if glob is not None:
            shutil.rmtree(glob["work"], ignore_errors=True)
        raise


def _finish_patches(
    path: str, results: list, plan: PatchPlan, glob: dict | None, mode: str, options: dict
) -> int:
    """Commit what the tasks wrote, with the metadata and the combined statistics."""
    infos = [i for r in results for i in r[0]]
    stats = combine_moments(plan, [r[1] for r in results])
    return _shuffle_output(
        path,
        infos,
        plan,
        shuffle=glob,
        mode=mode,
        attrs={META_KEY: plan.metadata(stats)},
        options=options,
    )


def _shuffle_output(
    path: str,
    infos: list[ShardInfo],
    plan: PatchPlan,
    *,
    shuffle: dict | None,
    mode: str,
    attrs: dict,
    options: dict,
) -> int:
    """Commit the shards the tasks wrote as one version of ``path``: the shuffle step of
    :func:`write_patches`, in one place.

    ``shuffle`` None: the tasks wrote into ``path``; their shards are committed in task order.
    Otherwise the tasks wrote into a temporary dataset (``shuffle["work"]``): it is committed
    there, globally shuffled by the two-pass out-of-core shuffle (:func:`rowstore.shuffle`, or
    :func:`rowstore.dask.shuffle` on the current ``dask.distributed`` client: the same output)
    through ``shuffle["memory"]`` into a staging dataset beside ``path``, whose shard files are
    then moved into ``path`` and committed there (``mode``); both temporaries are removed,
    whatever happens. The order is a uniform permutation of the samples, a pure function of
    ``seed`` and the input's chunking.
    """
    if not infos:  # every sample dropped: an empty shard carries the schema
        root = path if shuffle is None else shuffle["work"]
        infos = [
            write_shard(
                root,
                plan.schema,
                {f.name: np.empty((0, *f.shape), f.numpy_dtype) for f in plan.schema},
                **options,
            )
        ]
    if shuffle is None:
        return commit(path, infos, mode=mode, attrs=attrs)
    work, staged = shuffle["work"], shuffle["staged"]
    try:
        commit(work, infos, mode="x", attrs=attrs)
        kwargs = dict(
            memory=shuffle["memory"],
            seed=shuffle["seed"],
            tmp=shuffle["tmp"],
            shard_bytes=shuffle["shard_bytes"],
            block_bytes=options["block_bytes"],
            compression="same",
        )
        client = _distributed_client() if shuffle["cluster"] else None
        if client is not None:
            from rowstore.dask import shuffle as dask_shuffle

            dask_shuffle(work, staged, client=client, **kwargs)
        else:
            local_shuffle(work, staged, **kwargs)
        moved = ShardInfo.committed(staged)
        os.makedirs(os.path.join(path, "shards"), exist_ok=True)
        for info in moved:  # part-<32 hex> names: unique, so they never overwrite a shard of path
            os.replace(os.path.join(staged, info.path), os.path.join(path, info.path))
        return commit(path, moved, mode=mode, attrs=attrs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staged, ignore_errors=True)


def _distributed_client() -> Any:
    """The current ``dask.distributed`` client, or None (no cluster in use)."""
    try:
        import distributed

        return distributed.get_client()
    except (ImportError, ValueError):
        return None
