"""A speech table stored as FLAC, read as fixed-size random windows in torch.

One row per utterance: the waveform, speaker id, transcript, a test-split flag and the dataset's
name (the speech table of examples/pandas_speech.py). The waveforms go in as FLAC files' bytes
(what LibriSpeech and most corpora ship; soundfile writes them here), stored as they are after a
header check; the loader decodes a random 1 s window of each utterance (libFLAC seeks to it,
without the GIL), padded with zeros where an utterance is shorter: fixed-shape float32 batches,
the same windows after a resume. The FLAC file takes a fraction of the float32 table's bytes.

    python examples/audio_segments.py [OUT_DIR]
"""

import io
import os
import sys
import tempfile

import numpy as np

import rowstore
from rowstore import RandomSegment

RATE = 16000


def speech_table(n: int, seed: int = 0) -> list[dict]:
    """Utterances of 0.5 to 3 s: a voiced tone under a syllable envelope, 16-bit samples."""
    rng = np.random.default_rng(seed)
    words = ["yes", "no", "up", "down", "left", "right"]
    rows = []
    for i in range(n):
        t = np.arange(int(rng.uniform(0.5, 3.0) * RATE)) / RATE
        x = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 250) * t) * np.sin(2 * np.pi * 3 * t) ** 2
        x = np.round((x + rng.normal(0, 0.01, len(t))) * 32767) / 32768
        rows.append(
            {
                "wave": x.astype(np.float32),
                "speaker": f"spk{i % 7:02d}",
                "transcript": " ".join(rng.choice(words, 3)),
                "test": bool(rng.random() < 0.2),
                "dataset": str(rng.choice(["commonvoice", "librispeech"])),
            }
        )
    return rows


def flac_bytes(wave: np.ndarray) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, wave, RATE, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def main(out_dir: str) -> None:
    rows = speech_table(200)
    schema = rowstore.Schema(
        [
            rowstore.Field("audio", "float32", (None,), codec={"id": "flac", "sample_rate": RATE}),
            rowstore.Field("speaker", "str"),
            rowstore.Field("transcript", "str"),
            rowstore.Field("test", "bool"),
            rowstore.Field("dataset", "str"),
        ]
    )
    path = os.path.join(out_dir, "speech_flac.h5")
    with rowstore.Writer(path, schema) as w:
        for r in rows:
            w.write({"audio": flac_bytes(r["wave"]), **{k: r[k] for k in schema.names[1:]}})
    f32 = os.path.join(out_dir, "speech_f32.h5")
    plain = rowstore.Schema([rowstore.Field("audio", "float32", (None,)), *list(schema)[1:]])
    with rowstore.Writer(f32, plain) as w:
        for r in rows:
            w.write({"audio": r["wave"], **{k: r[k] for k in schema.names[1:]}})
    ratio = os.path.getsize(path) / os.path.getsize(f32)
    print(f"stored bytes, FLAC / float32: {ratio:.2f}")

    with rowstore.open(path) as r:  # whole utterances: ragged, exactly the waveforms written
        back = r.take([0, 1])["audio"]
        print(
            "whole utterances exact:", all(np.array_equal(back[i], rows[i]["wave"]) for i in (0, 1))
        )

    from rowstore.torch import BatchedDataLoader

    kw = dict(
        batch_size=32,
        shuffle="full",
        seed=1,
        fields=["audio", "speaker", "test"],
        decode={"audio": RandomSegment(seconds=1.0)},
    )
    with BatchedDataLoader(path, **kw) as dl:
        it = iter(dl)
        first = next(it)
        state = dl.state_dict()  # saved after one batch
        second = next(it)
    audio = first["audio"]
    print(f"batch: audio {tuple(audio.shape)} {audio.dtype}, speakers {first['speaker'][:2]}")
    with BatchedDataLoader(path, **kw) as dl:
        dl.load_state_dict(state)
        again = next(iter(dl))
    print("resumed batch identical:", bool((again["audio"] == second["audio"]).all()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(tmp)
