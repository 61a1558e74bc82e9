"""rowstore.from_audio: speech corpora (a LibriSpeech-like folder tree, a Common-Voice-like TSV
manifest) to a dataset, FLAC/WAV bytes as they are, transcripts and speakers exact; damaged
and hostile files refused or skipped with their reasons; the ``from-audio`` command."""

from __future__ import annotations

import io
import os
import struct
import sys

import numpy as np
import pytest
from helpers import raised_without_blocking, stored_payloads

import rowstore
import rowstore.audio
from rowstore import RowValidationError
from rowstore.cli import main
from rowstore.errors import InputError, OutsideRootError
from rowstore.format import manifest

sf = pytest.importorskip("soundfile")

RATE = 16000


def clip(k: int, frames: int = RATE // 2, channels: int = 1) -> np.ndarray:
    """Half a second of a tone and noise, int16 (as corpora's 16-bit files hold)."""
    t = np.arange(frames) / RATE
    rng = np.random.default_rng(k)
    x = 0.3 * np.sin(2 * np.pi * (220 + 40 * k) * t) + 0.05 * rng.standard_normal(frames)
    x = np.stack([x * (1 - 0.3 * c) for c in range(channels)], axis=-1)
    return (x * 32767).astype(np.int16)


def encode(samples: np.ndarray, fmt: str = "FLAC", rate: int = RATE) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


def put(path, data: bytes) -> bytes:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return data


#: LibriSpeech's layout: speaker/chapter/speaker-chapter-utt.flac, one transcript per chapter.
LIBRI = {
    ("19", "198"): ["NORTHANGER ABBEY", "CHAPTER ONE", "NO ONE WHO HAD EVER SEEN CATHERINE"],
    ("26", "495"): ["IT WAS THE BEST OF TIMES", "HE'D SAID SO  TWICE"],
}


@pytest.fixture
def libri(tmp_path):
    """A LibriSpeech-like subset: 5 FLAC files of 0.5 s and their ``*.trans.txt``; returns
    (root, expected rows in order: (path, bytes, transcript, speaker, chapter, id))."""
    root = tmp_path / "train-clean-100"
    rows = []
    k = 0
    for (spk, chap), texts in sorted(LIBRI.items()):
        lines = []
        for u, text in enumerate(texts):
            utt = f"{spk}-{chap}-{u:04d}"
            rel = f"{spk}/{chap}/{utt}.flac"
            rows.append((rel, put(str(root / rel), encode(clip(k))), text, spk, chap, utt))
            lines.append(f"{utt} {text}\n")
            k += 1
        put(str(root / spk / chap / f"{spk}-{chap}.trans.txt"), "".join(lines).encode())
    return root, rows


def test_librispeech_tree_ingests_exactly(libri, tmp_path):
    root, rows = libri
    out = tmp_path / "ds"
    done = rowstore.from_audio(root, out)
    assert done.rows == done.files == len(rows) and not done.skipped
    assert done.speakers == 2 and done.audio_seconds == pytest.approx(len(rows) * 0.5)
    f = done.schema["audio"]
    assert (f.codec["id"], str(f.dtype), f.shape) == ("flac", "float32", (None,))
    assert done.schema.names == ["audio", "transcript", "speaker", "chapter", "id", "path"]
    assert stored_payloads(out, "audio") == [r[1] for r in rows]  # byte-identical
    with rowstore.open(out) as r:
        assert len(r) == len(rows)
        for k, (rel, data, text, spk, chap, utt) in enumerate(rows):
            got = r[k]
            assert (got["transcript"], got["speaker"], got["chapter"], got["id"]) == (
                text,
                spk,
                chap,
                utt,
            )
            assert got["path"] == rel
            want, _ = sf.read(io.BytesIO(data), dtype="float32")
            np.testing.assert_array_equal(got["audio"], want)
        meta = r.layout.user_attrs["audio"]
    assert meta["layout"] == "librispeech" and meta["sample_rate"] == RATE
    assert meta["skipped"] == [] and meta["files"] == len(rows)


def test_speaker_folders_and_wav_files(tmp_path):
    """VCTK-like: <speaker>/<utt>.wav, no transcripts: a wav field, the folder is the
    speaker; stereo files give a (None, 2) field."""
    root = tmp_path / "vctk"
    blobs = [
        put(str(root / spk / f"{spk}_{u:03d}.wav"), encode(clip(u, 4000, 2), "WAV"))
        for spk in ("p225", "p226")
        for u in range(2)
    ]
    done = rowstore.from_audio(root, tmp_path / "ds")
    assert done.schema.names == ["audio", "speaker", "id", "path"]
    f = done.schema["audio"]
    assert (f.codec["id"], f.shape) == ("wav", (None, 2))
    assert stored_payloads(tmp_path / "ds", "audio") == blobs
    with rowstore.open(tmp_path / "ds") as r:
        assert [r[k]["speaker"] for k in range(4)] == ["p225", "p225", "p226", "p226"]
        assert r[3]["id"] == "p226_001"


@pytest.fixture
def common_voice(tmp_path):
    """A Common-Voice-like release: clips/*.flac and train.tsv naming them (bare names,
    relative to clips/), sentences with quotes and commas, empty cells."""
    root = tmp_path / "cv" / "en"
    header = "client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccents\tlocale"
    sentences = ['He said "hi", then left.', "Ça va? Très bien.", "", "It's 3 o'clock"]
    lines, blobs = [header], []
    for k, s in enumerate(sentences):
        name = f"common_voice_en_{k:05d}.flac"
        blobs.append(put(str(root / "clips" / name), encode(clip(10 + k))))
        age = "" if k == 1 else "twenties"
        lines.append(f"c{k % 2:040x}\t{name}\t{s}\t{k}\t0\t{age}\tfemale\t\ten")
    put(str(root / "train.tsv"), ("\n".join(lines) + "\n").encode())
    return root / "train.tsv", sentences, blobs


def test_common_voice_tsv_ingests_exactly(common_voice, tmp_path):
    tsv, sentences, blobs = common_voice
    out = tmp_path / "ds"
    done = rowstore.from_audio(tsv, out)
    assert done.rows == 4 and done.speakers == 2
    names = done.schema.names
    assert names[:3] == ["audio", "transcript", "speaker"] and names[-1] == "path"
    assert set(names[3:-1]) == {"up_votes", "down_votes", "age", "gender", "accents", "locale"}
    assert stored_payloads(out, "audio") == blobs
    with rowstore.open(out) as r:
        assert [r[k]["transcript"] for k in range(4)] == sentences
        assert [r[k]["speaker"] for k in range(4)] == [f"c{k % 2:040x}" for k in range(4)]
        assert [r[k]["age"] for k in range(4)] == ["twenties", "", "twenties", "twenties"]
        assert r[3]["up_votes"] == "3" and r[2]["path"] == "common_voice_en_00002.flac"
        assert r.layout.user_attrs["audio"]["layout"] == "manifest"


def test_manifest_columns_by_role_and_csv(tmp_path):
    root = tmp_path / "m"
    data = put(str(root / "a" / "x.wav"), encode(clip(1), "WAV"))
    put(str(root / "list.csv"), b'file,text,who\na/x.wav,"one, two",s1\n')
    done = rowstore.from_audio(
        root / "list.csv", tmp_path / "ds", columns={"path": "file", "speaker": "who"}
    )
    assert done.schema.names == ["audio", "transcript", "speaker", "path"]
    with rowstore.open(tmp_path / "ds") as r:
        assert (r[0]["transcript"], r[0]["speaker"], r[0]["path"]) == ("one, two", "s1", "a/x.wav")
    assert stored_payloads(tmp_path / "ds", "audio") == [data]
    with pytest.raises(InputError, match="no column 'nope'"):
        rowstore.from_audio(root / "list.csv", tmp_path / "d2", columns={"path": "nope"})


def test_manifest_rows_naming_no_file(common_voice, tmp_path):
    tsv, _, _ = common_voice
    os.remove(tsv.parent / "clips" / "common_voice_en_00001.flac")
    with pytest.raises(FileNotFoundError, match="line 3: no such file"):
        rowstore.from_audio(tsv, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()
    put(str(tsv.parent / "clips" / "common_voice_en_00003.flac"), b"fLaC")  # damaged
    done = rowstore.from_audio(tsv, tmp_path / "ds", on_error="skip")
    assert done.rows == 2 and done.files == 4
    assert done.skipped[0] == ("common_voice_en_00001.flac", f"{str(tsv)!r}, line 3: no such file")
    assert done.skipped[1][0] == "common_voice_en_00003.flac"  # as the manifest writes it


def test_manifest_paths_stay_inside_its_folder(tmp_path):
    root = tmp_path / "m"
    put(str(tmp_path / "secret.flac"), encode(clip(0)))
    put(str(root / "t.tsv"), b"path\tsentence\n../secret.flac\thi\n")
    for mode in ("raise", "skip"):
        with pytest.raises(OutsideRootError, match="line 2: audio path '../secret.flac'") as e:
            rowstore.from_audio(root / "t.tsv", tmp_path / "ds", on_error=mode)
        assert e.value.line == 2
    done = rowstore.from_audio(root / "t.tsv", tmp_path / "ds", allow_outside=True)
    assert done.rows == 1


# -- damaged and hostile files --------------------------------------------------------------------
def _huge_flac(data: bytes) -> bytes:
    """A FLAC whose STREAMINFO declares 2**36 - 1 frames (the 36-bit field's largest)."""
    b = bytearray(data)
    assert b[:4] == b"fLaC"
    at = 8 + 13  # STREAMINFO: ... 4 bits of bits-per-sample, then 36 bits of total samples
    b[at] = (b[at] & 0xF0) | 0x0F
    b[at + 1 : at + 5] = b"\xff\xff\xff\xff"
    return bytes(b)


def _huge_wav(data: bytes) -> bytes:
    """A WAV whose data chunk declares 4 GiB - 2 bytes of samples it does not have."""
    at = data.index(b"data")
    return data[: at + 4] + struct.pack("<I", 0xFFFFFFFE) + data[at + 8 :]


@pytest.fixture
def hostile(libri, tmp_path):
    """The LibriSpeech tree with damaged files among the good ones (in tree order)."""
    root, rows = libri
    good = rows[0][1]
    chapter = root / "19" / "198"
    put(str(chapter / "19-198-0003.flac"), b"")  # zero bytes
    put(str(chapter / "19-198-0004.flac"), good[: len(good) // 3])  # truncated
    put(str(chapter / "19-198-0005.flac"), _huge_flac(good))
    put(str(chapter / "19-198-0006.flac"), _huge_wav(encode(clip(3), "WAV")))
    os.makedirs(chapter / "19-198-0007.flac")  # a directory named like a file: not a file
    put(str(chapter / "19-198-0007.flac" / "inner.txt"), b"x")
    return root, rows


BAD = {
    "19/198/19-198-0003.flac",
    "19/198/19-198-0004.flac",
    "19/198/19-198-0005.flac",
    "19/198/19-198-0006.flac",
}


def test_damaged_files_are_refused_naming_the_first(hostile, tmp_path):
    root, _ = hostile
    with pytest.raises(RowValidationError, match="audio file '19/198/19-198-0003.flac': row 3"):
        rowstore.from_audio(root, tmp_path / "ds")
    assert not os.path.exists(tmp_path / "ds" / manifest.POINTER)
    shards = tmp_path / "ds" / "shards"
    assert not shards.exists() or not os.listdir(shards)  # nothing left behind


def test_damaged_files_are_skipped_with_reasons(hostile, tmp_path):
    root, rows = hostile
    done = rowstore.from_audio(root, tmp_path / "ds", on_error="skip")
    assert done.rows == len(rows) and done.files == len(rows) + len(BAD)
    why = dict(done.skipped)
    assert [p for p, _ in done.skipped] == sorted(BAD)  # in file order
    assert why["19/198/19-198-0003.flac"] == "not FLAC or WAV bytes (0 bytes)"
    assert why["19/198/19-198-0004.flac"].startswith("its end does not decode")
    assert "more than a value may hold" in why["19/198/19-198-0005.flac"]
    assert why["19/198/19-198-0006.flac"].startswith("truncated WAV")
    assert stored_payloads(tmp_path / "ds", "audio") == [r[1] for r in rows]
    with rowstore.open(tmp_path / "ds") as r:
        assert [r[k]["id"] for k in range(len(r))] == [x[5] for x in rows]
        meta = r.layout.user_attrs["audio"]
    assert {s["path"] for s in meta["skipped"]} == BAD and meta["skipped_count"] == len(BAD)
    assert "skipped 4 files" in str(done)


def test_damaged_first_file_is_skipped_before_the_field_is_decided(tmp_path):
    root = tmp_path / "t"
    put(str(root / "s" / "a.flac"), b"fLaC\x00\x00")
    good = put(str(root / "s" / "b.flac"), encode(clip(2)))
    done = rowstore.from_audio(root, tmp_path / "ds", on_error="skip")
    assert done.skipped[0][0] == "s/a.flac" and done.rows == 1
    assert stored_payloads(tmp_path / "ds", "audio") == [good]
    with pytest.raises(RowValidationError, match="audio file 's/a.flac': row 0"):
        rowstore.from_audio(root, tmp_path / "d2")


def test_symlink_out_of_the_tree_is_refused(libri, tmp_path):
    root, _ = libri
    put(str(tmp_path / "secret" / "x.flac"), encode(clip(9)))
    os.symlink(tmp_path / "secret" / "x.flac", root / "19" / "198" / "z.flac")
    for mode in ("raise", "skip"):
        with pytest.raises(OutsideRootError, match="z.flac"):
            rowstore.from_audio(root, tmp_path / "ds", on_error=mode)
    done = rowstore.from_audio(root, tmp_path / "ds", allow_outside=True)
    assert done.rows == 6


def test_a_link_to_the_root_is_not_walked(libri, tmp_path):
    root, _ = libri
    os.symlink("/", root / "26" / "everything")
    with pytest.raises(OutsideRootError, match="everything"):
        rowstore.from_audio(root, tmp_path / "ds", on_error="skip")


def test_a_file_larger_than_a_value_is_refused_before_it_is_read(libri, tmp_path):
    """A sparse 3 GiB file named .flac: refused from its size, nothing of it read."""
    root, rows = libri
    big = root / "26" / "495" / "26-495-0099.flac"
    with open(big, "wb") as fh:
        fh.truncate(3 << 30)
    with pytest.raises(InputError, match="3221225472 bytes, more than"):
        rowstore.from_audio(root, tmp_path / "ds")
    done = rowstore.from_audio(root, tmp_path / "ds", on_error="skip")
    assert done.rows == len(rows) and done.skipped[0][0] == "26/495/26-495-0099.flac"


def test_a_fifo_named_like_audio_is_refused_without_blocking(libri, tmp_path):
    root, rows = libri
    fifo = str(root / "26" / "495" / "26-495-0009.flac")
    os.mkfifo(fifo)
    exc = raised_without_blocking(lambda: rowstore.from_audio(root, tmp_path / "ds"), fifo)
    assert isinstance(exc, InputError) and "FIFO" in str(exc)
    done = rowstore.from_audio(root, tmp_path / "d2", on_error="skip")
    assert done.rows == len(rows)
    assert done.skipped[0][0] == "26/495/26-495-0009.flac" and "FIFO" in done.skipped[0][1]


def test_files_of_another_rate_are_refused_or_skipped(libri, tmp_path):
    root, rows = libri
    put(str(root / "26" / "495" / "26-495-0002.flac"), encode(clip(7), rate=8000))
    with pytest.raises(RowValidationError, match="26-495-0002.flac': row 5"):
        rowstore.from_audio(root, tmp_path / "ds")
    done = rowstore.from_audio(root, tmp_path / "ds", on_error="skip")
    assert [p for p, _ in done.skipped] == ["26/495/26-495-0002.flac"]
    assert "8000" in done.skipped[0][1]


def test_codec_option_transcodes_the_other_format(tmp_path):
    root = tmp_path / "t"
    a = clip(1)
    flac = put(str(root / "s" / "a.flac"), encode(a))
    put(str(root / "s" / "b.wav"), encode(clip(2), "WAV"))
    done = rowstore.from_audio(root, tmp_path / "ds", dtype="int16")
    assert done.schema["audio"].codec["id"] == "flac"  # any .flac file: the default
    assert stored_payloads(tmp_path / "ds", "audio")[0] == flac
    with rowstore.open(tmp_path / "ds") as r:
        np.testing.assert_array_equal(r[0]["audio"], a[:, 0])
        np.testing.assert_array_equal(r[1]["audio"], clip(2)[:, 0])  # lossless
    done = rowstore.from_audio(root, tmp_path / "d2", codec="wav")
    assert done.schema["audio"].codec["id"] == "wav"
    with rowstore.open(tmp_path / "d2") as r:
        np.testing.assert_array_equal(r[0]["audio"], a[:, 0] / np.float32(32768))


def test_worker_processes_keep_the_files_order_and_skip(hostile, tmp_path, monkeypatch):
    """Two worker processes, each writing a run of files: rows in tree order, skipped files
    reported from both, progress counted across them."""
    root, rows = hostile
    monkeypatch.setattr(rowstore.audio, "_MIN_PART_FILES", 2)
    seen = []
    real = rowstore.audio.Progress

    class Counting(real):
        def update(self, rows, nbytes):
            seen.append(rows)
            super().update(rows, nbytes)

    monkeypatch.setattr(rowstore.audio, "Progress", Counting)
    done = rowstore.from_audio(root, tmp_path / "ds", on_error="skip", workers=2)
    assert {p for p, _ in done.skipped} == BAD
    assert stored_payloads(tmp_path / "ds", "audio") == [r[1] for r in rows]
    assert len(manifest.load(str(tmp_path / "ds")).shards["path"]) == 2
    assert sum(seen) == len(rows) + len(BAD)
    # Raising: the first bad file in order, though another worker may fail first; the shards
    # written are removed, nothing is published.
    with pytest.raises(RowValidationError, match="19-198-0003.flac': row 3"):
        rowstore.from_audio(root, tmp_path / "bad", workers=2)
    assert not os.path.exists(tmp_path / "bad")  # no shard, no directory left behind


def test_no_audio_files(tmp_path):
    os.makedirs(tmp_path / "empty" / "x.flac")
    with pytest.raises(FileNotFoundError, match="no readable audio file"):
        rowstore.from_audio(tmp_path / "empty", tmp_path / "ds")
    with pytest.raises(ValueError, match="on_error"):
        rowstore.from_audio(tmp_path / "empty", tmp_path / "ds", on_error="ignore")


# -- the command --------------------------------------------------------------------------------
def test_cli_from_audio(hostile, tmp_path, capsys):
    root, rows = hostile
    out = str(tmp_path / "ds")
    assert main(["from-audio", str(root), out]) == 1
    assert "row 3" in capsys.readouterr().err
    assert main(["from-audio", str(root), out, "--on-error", "skip", "--no-path"]) == 0
    cap = capsys.readouterr()
    assert f"{len(rows)} utterances (flac, float32 (None,)" in cap.out
    assert "skipped 4 files" in cap.out and "19/198/19-198-0004.flac: " in cap.out
    assert "from-audio" in cap.err or "tqdm" not in sys.modules  # the progress bar
    with rowstore.open(out) as r:
        assert "path" not in r.schema.names and len(r) == len(rows)


def test_malformed_manifests_and_transcripts_name_file_and_line(libri, tmp_path):
    root, _ = libri
    m = tmp_path / "m"
    put(str(m / "a.flac"), encode(clip(1)))
    put(str(m / "latin.tsv"), "path\tsentence\na.flac\tcaf\xe9\n".encode("latin-1"))
    put(str(m / "short.tsv"), b"path\tsentence\tage\na.flac\thi\n")
    put(str(m / "bom.csv"), b"\xef\xbb\xbfpath,sentence\na.flac,hi\n")
    for name, match in (
        ("latin.tsv", r"line 2: byte 0xe9 \(offset 24\) is not UTF-8"),
        ("short.tsv", "line 2: 2 cells, the header has 3"),
    ):
        for mode in ("raise", "skip"):
            with pytest.raises(InputError, match=match):
                rowstore.from_audio(m / name, tmp_path / "ds", on_error=mode)
    assert rowstore.from_audio(m / "bom.csv", tmp_path / "ds").rows == 1  # BOM dropped
    trans = root / "19" / "198" / "19-198.trans.txt"
    with open(trans, "a") as fh:
        fh.write("19-198-0001 AGAIN\n")
    with pytest.raises(InputError, match=r"line 4: utterance '19-198-0001' again"):
        rowstore.from_audio(root, tmp_path / "d2")
