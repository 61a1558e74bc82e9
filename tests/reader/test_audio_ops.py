"""Decode-time audio ops (``decode={"audio": RandomSegment(samples=...)}``) through the reader and
the torch loaders: fixed-shape batches from variable-length FLAC/WAV utterances, each row's
window soundfile's samples sliced at the start :func:`segment_start` draws from (seed, epoch,
field, dataset row): the same in every entry point, on every world size, after a resume and with
0 or 2 DataLoader workers; the fallback (soundfile) decodes the same; a damaged stored value is
a FormatError naming field and row; declarations are checked."""

from __future__ import annotations

import io

import numpy as np
import pytest

import rowstore
from rowstore.errors import FormatError, SchemaError
from rowstore.reader import audio_ops as ao
from rowstore.reader import image_ops
from rowstore.schema import Field, Schema

sf = pytest.importorskip("soundfile")

N = 30
RATE = 16000
WIN = ao.RandomSegment(samples=3000)


def encode(x, fmt, subtype):
    buf = io.BytesIO()
    sf.write(buf, x, RATE, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """A file of N rows: a mono FLAC utterance of 1000..12000 frames (some shorter than the
    window), a stereo 24-bit WAV one (nullable), an id; and the stored bytes."""
    path = str(tmp_path_factory.mktemp("speech") / "speech.h5")
    schema = Schema(
        [
            Field("audio", "float32", (None,), codec={"id": "flac", "sample_rate": RATE}),
            Field("stereo", "float32", (None, 2), codec="wav", nullable=True),
            Field("id", "int64"),
        ]
    )
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N):
        n = int(rng.integers(1000, 12000))
        x = np.sin(np.arange(n) / (5 + i)) * 0.5 + rng.uniform(-0.3, 0.3, n)
        st = None if i % 7 == 3 else encode(rng.uniform(-1, 1, (n // 2, 2)), "WAV", "PCM_24")
        rows.append({"audio": encode(x, "FLAC", "PCM_16"), "stereo": st, "id": i})
    with rowstore.Writer(path, schema, rows_per_block=8) as w:
        for r in rows:
            w.write(r)
    return path, rows


@pytest.fixture
def reader(speech):
    r = rowstore.open(speech[0])
    yield r
    r.close()


def expected(data, op, seed, epoch, field, row, dtype="float32"):
    """Row ``row``'s window: soundfile decodes the whole value, then it is sliced at the start
    drawn for its key and padded with zeros."""
    x = sf.read(io.BytesIO(data), dtype=dtype, always_2d=True)[0]
    n = ao.window_frames(op, RATE, field)
    key = image_ops.row_key(image_ops.image_base(seed, epoch, field), row)
    start = ao.segment_start(len(x), n, key) if isinstance(op, ao.RandomSegment) else op.start
    w = x[start : start + n]
    out = np.zeros((n, w.shape[1]), w.dtype)
    out[: len(w)] = w
    return out


def by_row(batches, field):
    out = {}
    for b in batches:
        for i, row in enumerate(b["__id"]):
            out[int(row)] = np.asarray(b[field][i])
    return out


def test_windows_are_soundfile_samples_sliced(speech, reader):
    path, rows = speech
    b = list(reader.batches(N, shuffle="none", seed=4, epoch=2, decode={"audio": WIN}))[0]
    assert b["audio"].shape == (N, 3000) and b["audio"].dtype == np.float32
    for i in range(N):
        want = expected(rows[i]["audio"], WIN, 4, 2, "audio", i)[:, 0]
        np.testing.assert_array_equal(b["audio"][i], want)
        if len(sf.read(io.BytesIO(rows[i]["audio"]))[0]) < 3000:
            assert not b["audio"][i, -1]  # padded with zeros


def test_segment_mono_int16_and_stereo(speech, reader):
    path, rows = speech
    seg = ao.Segment(700, 2500, mono=True, dtype="int16")
    d = {"stereo": seg, "audio": ao.RandomSegment(seconds=0.25, dtype="int16")}
    b = list(reader.batches(N, shuffle="none", seed=1, decode=d))[0]
    assert b["stereo"].shape == (N, 2500) and b["stereo"].dtype == np.int16
    assert b["audio"].shape == (N, 4000) and b["audio"].dtype == np.int16
    for i in range(N):
        if rows[i]["stereo"] is None:
            assert not b["stereo"][i].any() and b["stereo__null"][i]
            continue
        x = sf.read(io.BytesIO(rows[i]["stereo"]), dtype="int16")[0][700:3200]
        want = np.zeros(2500, np.int16)
        want[: len(x)] = np.floor_divide(x.astype(np.int64).sum(1), 2)
        np.testing.assert_array_equal(b["stereo"][i], want)
    both = ao.Segment(10, 200)
    st = list(reader.batches(N, shuffle="none", decode={"stereo": both}))[0]["stereo"]
    assert st.shape == (N, 200, 2)
    x = sf.read(io.BytesIO(rows[0]["stereo"]), dtype="float32")[0]
    np.testing.assert_array_equal(st[0], x[10:210])
    got = image_ops.decoded_schema(reader.schema, d)
    assert got["stereo"].shape == (2500,) and got["stereo"].dtype == np.int16
    assert got["audio"].shape == (4000,) and got["stereo"].nullable


def test_whole_utterances_without_an_op_are_ragged_and_exact(speech, reader):
    rows = speech[1]
    b = reader.take(np.arange(N))
    for i in range(N):
        np.testing.assert_array_equal(
            b["audio"][i], sf.read(io.BytesIO(rows[i]["audio"]), dtype="float32")[0]
        )
        assert bool(b["stereo__null"][i]) == (rows[i]["stereo"] is None)
        if rows[i]["stereo"] is not None:
            want = sf.read(io.BytesIO(rows[i]["stereo"]), dtype="float32")[0]
            np.testing.assert_array_equal(b["stereo"][i], want)


def test_windows_depend_on_seed_epoch_and_row_only(reader):
    r = reader
    d = {"audio": WIN}
    e0 = by_row(r.deal(8, shuffle="full", seed=1, epoch=0, with_ids=True, decode=d), "audio")
    again = by_row(r.deal(6, shuffle="block", seed=1, epoch=0, with_ids=True, decode=d), "audio")
    e1 = by_row(r.deal(8, shuffle="full", seed=1, epoch=1, with_ids=True, decode=d), "audio")
    assert sorted(e0) == list(range(N))
    assert all(np.array_equal(e0[k], again[k]) for k in e0)
    long_rows = [k for k in e0 if e0[k][-1] != 0]
    assert sum(np.array_equal(e0[k], e1[k]) for k in long_rows) < 3  # new epoch, new windows
    parts = {}
    for rank in range(3):  # elastic: three consumers decode each row as one does
        dealt = r.deal(4, shuffle="full", seed=1, epoch=0, shard=(rank, 3), with_ids=True, decode=d)
        parts.update(by_row(dealt, "audio"))
    assert sorted(parts) == sorted(e0) and all(np.array_equal(e0[k], parts[k]) for k in e0)


def test_the_fallback_decodes_the_same(reader, monkeypatch):
    d = {"audio": WIN, "stereo": ao.Segment(5, 4000, mono=True)}
    fast = list(reader.batches(N, shuffle="none", seed=3, decode=d))[0]
    monkeypatch.setattr(rowstore.kernels, "AUDIO_AVAILABLE", False)
    slow = list(reader.batches(N, shuffle="none", seed=3, decode=d))[0]
    for name in d:
        np.testing.assert_array_equal(fast[name], slow[name])


def test_torch_loaders_resume_exactly_with_0_and_2_workers_and_elastically(speech):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from rowstore.torch import BatchedDataLoader, IterableDataset, ResumableDataLoader

    path = speech[0]
    kw = dict(batch_size=6, seed=5, shuffle="full", decode={"audio": WIN}, fields=["audio", "id"])
    whole = list(BatchedDataLoader(path, **kw))
    assert whole[0]["audio"].shape == (6, 3000) and whole[0]["audio"].dtype == torch.float32
    want = {int(i): a for b in whole for i, a in zip(b["id"], b["audio"])}
    dl = BatchedDataLoader(path, **kw)
    it = iter(dl)
    head = [next(it) for _ in range(2)]
    state = dl.state_dict()
    it.close()
    resumed = BatchedDataLoader(path, **kw)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(head) + len(rest) == len(whole)
    for a, b in zip(head + rest, whole):
        assert torch.equal(a["audio"], b["audio"]) and torch.equal(a["id"], b["id"])
    for workers in (0, 2):
        ds = IterableDataset(path, **kw)
        extra = {"multiprocessing_context": "fork"} if workers else {}
        got = list(DataLoader(ds, batch_size=None, num_workers=workers, **extra))
        rows = {int(i): a for b in got for i, a in zip(b["id"], b["audio"])}
        assert sorted(rows) == sorted(want)
        assert all(torch.equal(rows[k], want[k]) for k in want)
    # elastic: saved after 3 batches of 2 workers, resumed on 2 ranks without workers
    dl = ResumableDataLoader(
        IterableDataset(path, **kw), batch_size=None, num_workers=2,
        multiprocessing_context="fork",
    )  # fmt: skip
    rows = {}
    for k, b in enumerate(dl):
        rows.update({int(i): a for i, a in zip(b["id"], b["audio"])})
        if k == 2:
            break
    state = dl.state_dict()
    for rank in range(2):
        dl2 = ResumableDataLoader(IterableDataset(path, shard=(rank, 2), **kw), batch_size=None)
        dl2.load_state_dict(state)
        for b in dl2:
            for i, a in zip(b["id"], b["audio"]):
                assert int(i) not in rows
                rows[int(i)] = a
    assert sorted(rows) == list(range(N))
    assert all(torch.equal(rows[k], want[k]) for k in want)


def test_a_damaged_stored_flac_names_field_and_row(tmp_path, speech):
    rows = speech[1]
    path = str(tmp_path / "bad.h5")
    schema = Schema([Field("audio", "float32", (None,), codec="flac")])
    good = rows[0]["audio"]
    damaged = bytearray(rows[1]["audio"])
    hdr = rowstore.codecs.audio.audio_header(bytes(damaged))
    cut = bytes(damaged[: len(damaged) // 2])  # the header intact, half the audio gone
    assert rowstore.codecs.audio.audio_header(cut) == hdr
    with rowstore.Writer(path, schema) as w:
        w.write({"audio": good})
        w.write({"audio": cut})
    with rowstore.open(path) as r:
        with pytest.raises(
            FormatError, match=r"field 'audio': row 1: stored audio does not decode .*truncated"
        ) as ei:
            list(r.batches(2, decode={"audio": ao.Segment(0, 10**6)}))
        assert ei.value.field == "audio" and ei.value.row == 1
        with pytest.raises(FormatError, match="row 1") as ei:
            r.take([0, 1])
        assert ei.value.row == 1
        np.testing.assert_array_equal(
            r.take([0])["audio"][0], sf.read(io.BytesIO(good), dtype="float32")[0]
        )


def test_declarations_are_checked(reader, tmp_path):
    with pytest.raises(SchemaError, match="flac or wav"):
        list(reader.batches(4, decode={"id": WIN}))
    with pytest.raises(SchemaError, match="sample_rate"):
        list(reader.batches(4, decode={"stereo": ao.RandomSegment(seconds=1.0, mono=True)}))
    with pytest.raises(ValueError, match="short must be 'pad'"):
        ao.RandomSegment(samples=10, short="drop")
    with pytest.raises(ValueError, match="one of them"):
        ao.RandomSegment(seconds=1.0, samples=10)
    with pytest.raises(ValueError, match="dtype"):
        ao.Segment(0, 10, dtype="float64")
    f = Field("a", "float32", (None, None), codec="wav")
    with pytest.raises(SchemaError, match="mono=True"):
        image_ops.decoded_schema(Schema([f]), {"a": ao.Segment(0, 10)})
    assert image_ops.decoded_schema(Schema([f]), {"a": ao.Segment(0, 10, mono=True)})[
        "a"
    ].shape == (10,)


def test_segment_start_is_uniform_and_in_range():
    rng = np.random.default_rng(0)
    starts = [ao.segment_start(103, 100, int(k)) for k in rng.integers(0, 2**63, 4000)]
    assert set(starts) == {0, 1, 2, 3}
    assert max(np.bincount(starts)) < 1.15 * 1000
    assert ao.segment_start(50, 100, 7) == 0 and ao.segment_start(100, 100, 7) == 0
