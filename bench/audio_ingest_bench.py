"""Ingest of a speech corpus: a LibriSpeech-like tree of FLAC files into a dataset, same files,
same run.

    python bench/audio_ingest_bench.py [--n 2000] [--seconds 14] [--repeats 3] [--workers N]
        [--quick] [--out bench/results/audio_ingest_bench.json]

The source is ``n`` 16 kHz mono 16-bit FLAC files of ``seconds - 2`` to ``seconds + 4`` s
(12-18 s by default, as LibriSpeech's utterances are; speech-like: gliding harmonics gated into
syllables, a noise floor),
written by ``soundfile`` under ``<speaker>/<chapter>/`` with a ``*.trans.txt`` per chapter,
made once and read from the page cache by every contender. Each case reads the files itself
inside its timed part; the cases run interleaved, their order rotated each round, the first
round a warm-up:

* ``from_audio``: ``rowstore.from_audio`` (bytes as they are, header checked, the end of
  every FLAC file decoded, transcripts, speakers, fsync'd and committed; its default workers,
  or ``--workers``) and ``from_audio_1``: ``workers=1``;
* ``decode_float32``: what a user does without it: each file decoded by ``soundfile`` to
  ``float32`` and the samples written with ``DatasetWriter.write_batch`` (the same transcript,
  speaker, chapter and id fields), in this process.

Checked after each run: the rows and, for ``from_audio``, that the stored bytes equal the
source files' (every file). Reported: median seconds of the timed rounds, files/s, hours of
audio per second, bytes written, and each case's time over ``from_audio``'s (above 1: faster).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np
import soundfile as sf

import rowstore

RATE = 16000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from _ingest_rounds import emit, medians, rounded, timed_rounds  # noqa: E402
from helpers import stored_payloads  # noqa: E402


def speechlike(rng: np.random.Generator, frames: int) -> np.ndarray:
    """16-bit samples with speech's rough texture: gliding harmonics gated into syllables,
    plus a noise floor (FLAC compresses them about as it does speech)."""
    t = np.arange(frames) / RATE
    f0 = 110 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(k * phase) / k for k in range(1, 6))
    gate = (np.sin(2 * np.pi * 3.1 * t + rng.uniform(0, 6)) > -0.2).astype(np.float64)
    x = 0.25 * voice * gate + 0.01 * rng.standard_normal(frames)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


def make_source(root: str, n: int, seconds: float) -> tuple[list[str], int, float]:
    """``n`` FLAC files under ``root/<speaker>/<chapter>/``: their paths (tree order), total
    bytes and hours of audio."""
    rng = np.random.default_rng(0)
    paths, total, frames_total = [], 0, 0
    per_chapter = 20
    for c in range((n + per_chapter - 1) // per_chapter):
        spk, chap = str(100 + c // 3), str(1000 + c)
        d = os.path.join(root, spk, chap)
        os.makedirs(d, exist_ok=True)
        lines = []
        for u in range(min(per_chapter, n - c * per_chapter)):
            utt = f"{spk}-{chap}-{u:04d}"
            frames = int(RATE * rng.uniform(seconds - 2 if seconds > 4 else seconds, seconds + 4))
            p = os.path.join(d, utt + ".flac")
            sf.write(p, speechlike(rng, frames), RATE, format="FLAC", subtype="PCM_16")
            paths.append(p)
            total += os.path.getsize(p)
            frames_total += frames
            lines.append(f"{utt} WORDS OF UTTERANCE {u} IN CHAPTER {chap}\n")
        with open(os.path.join(d, f"{spk}-{chap}.trans.txt"), "w") as fh:
            fh.writelines(lines)
    return sorted(paths), total, frames_total / RATE / 3600


def run_from_audio(src: str, dest: str, workers: int | None) -> None:
    rowstore.from_audio(src, dest, workers=workers)


def run_decode_float32(src: str, paths: list[str], dest: str) -> None:
    """soundfile decode + float32 write: the same rows and text fields as from_audio's."""
    texts = {}
    schema = rowstore.Schema(
        [
            rowstore.Field("audio", "float32", (None,)),
            rowstore.Field("transcript", "str"),
            rowstore.Field("speaker", "str"),
            rowstore.Field("chapter", "str"),
            rowstore.Field("id", "str"),
        ]
    )
    with rowstore.DatasetWriter(dest, schema) as w:
        for lo in range(0, len(paths), 256):
            batch: dict[str, list] = {n: [] for n in schema.names}
            for p in paths[lo : lo + 256]:
                d = os.path.dirname(p)
                utt = os.path.basename(p)[: -len(".flac")]
                spk, chap, _ = utt.split("-")
                if d not in texts:
                    with open(os.path.join(d, f"{spk}-{chap}.trans.txt")) as fh:
                        texts[d] = dict(line.rstrip("\n").split(" ", 1) for line in fh)
                samples, _ = sf.read(p, dtype="float32")
                batch["audio"].append(samples)
                batch["transcript"].append(texts[d][utt])
                batch["speaker"].append(spk)
                batch["chapter"].append(chap)
                batch["id"].append(utt)
            w.write_batch(batch)


def check(dest: str, paths: list[str], same_bytes: bool) -> None:
    with rowstore.open(dest) as r:
        assert len(r) == len(paths), (len(r), len(paths))
    if same_bytes:
        stored = stored_payloads(dest, "audio")
        for p, b in zip(paths, stored):
            with open(p, "rb") as fh:
                assert fh.read() == b, p


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000, help="FLAC files (default 2000)")
    ap.add_argument("--seconds", type=float, default=14.0, help="mean seconds a file")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds (after one warm-up)")
    ap.add_argument(
        "--workers", type=int, help="from_audio's processes (default: from_audio's default)"
    )
    ap.add_argument("--quick", action="store_true", help="n=60, 2 s files, 1 repeat")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.seconds, args.repeats = 60, 2.0, 1
    tmp = tempfile.mkdtemp(prefix="audio_ingest_bench_")
    try:
        src = os.path.join(tmp, "train-clean")
        t0 = time.perf_counter()
        paths, total, hours = make_source(src, args.n, args.seconds)
        print(
            f"{args.n} FLAC files, {hours:.2f} h of audio: {total / 1e6:.1f} MB "
            f"({total / args.n / 1e3:.1f} kB each), made in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        cases = {
            "from_audio": lambda d: run_from_audio(src, d, args.workers),
            "from_audio_1": lambda d: run_from_audio(src, d, 1),
            "decode_float32": lambda d: run_decode_float32(src, paths, d),
        }
        same = {"from_audio": True, "from_audio_1": True, "decode_float32": False}
        times, sizes, loads = timed_rounds(
            cases, tmp, args.repeats, lambda name, d: check(d, paths, same[name])
        )
        med = medians(times)
        result = {
            "bench": "audio_ingest_bench",
            "n": args.n,
            "mean_seconds_per_file": args.seconds,
            "audio_hours": round(hours, 3),
            "source_mb": round(total / 1e6, 1),
            "workers": args.workers,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "load_avg_1m_per_round": loads,
            "python": platform.python_version(),
            "rowstore": rowstore.__version__,
            "stored_bytes_equal_source": True,  # checked every round (check())
            **rounded(times, med),
            "files_per_s": {k: round(args.n / v) for k, v in med.items()},
            "audio_hours_per_s": {k: round(hours / v, 3) for k, v in med.items()},
            "written_mb": {k: round(v / 1e6, 1) for k, v in sizes.items()},
            "time_over_from_audio": {k: round(v / med["from_audio"], 2) for k, v in med.items()},
        }
        return emit(result, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
