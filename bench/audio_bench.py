"""Speech audio: a random 4 s window of 10-20 s FLAC utterances at 16 kHz, decoded by rowstore's
audio kernel against soundfile, and a speech epoch from FLAC against today's float32 storage.

    python bench/audio_bench.py [--n 256] [--rounds 2] [--passes 3] [--min-pass-s 2]
                                [--out bench/results/audio_bench.json]

Workload: ``--n`` utterances of 10-20 s (uniform) at 16 kHz, mono, 16-bit: speech-like (a
pitch-modulated harmonic series under a syllable-rate envelope, plus noise), encoded as FLAC by
soundfile (libsndfile/libFLAC, as LibriSpeech ships). Each pass decodes a random 4 s window
(64000 frames, float32) of every utterance; the windows are drawn anew each epoch.

* ``kernel``: ``kernels.audio_decode`` (``rowstore.codecs.audio.decode_windows``) over the
  batch on one thread: libFLAC seeks to the window and decodes only the frames it covers;
  ``kernel-t2`` the same with the batch split over 2 threads (the GIL released);
* ``soundfile``: the common user code, ``soundfile.read`` of the whole file, then the slice;
* ``soundfile-seek``: ``soundfile.SoundFile(...).seek(start)`` then ``read(64000)`` (libsndfile
  seeks too);
* ``epoch-flac``: ``Reader.batches(64, decode={"audio": RandomSegment(seconds=4)})`` over a
  rowstore file of the FLAC bytes (the whole read path, ``num_threads=2``); ``epoch-float32``:
  the same utterances stored as today, a raw ``float32 (None,)`` field, read in batches of 64
  and sliced in NumPy (whole utterances are read). Stored bytes of the two files are compared.

torchaudio and torchcodec are tried and reported as missing when they are not installed.

Every system runs in a fresh child process in ``--rounds`` interleaved rounds (the order
reversed every other round); each does a warm-up epoch, then ``--passes`` passes of at least
``--min-pass-s`` seconds. Figures: windows per wall second and per CPU-second (samples per
second for the epochs), medians; ratios: kernel / soundfile per CPU-second, kernel-t2 /
kernel per wall second, stored bytes FLAC / float32. The load average is recorded.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

RATE = 16000
WINDOW = 4 * RATE
BATCH = 64
SYSTEMS = ("kernel", "kernel-t2", "soundfile", "soundfile-seek", "epoch-flac", "epoch-float32")


def utterance(rng: np.random.Generator, seconds: float) -> np.ndarray:
    """Speech-like 16-bit audio as float32 in [-1, 1): harmonics of a wandering pitch under a
    syllable-rate envelope, with noise, quantised to 16 bits."""
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    x = sum(np.sin(k * phase) / k for k in range(1, 8))
    env = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, 6)), 0, None) ** 2
    x = 0.25 * x * env + rng.normal(0, 0.01, n)
    return (np.round(np.clip(x, -1, 1) * 32767) / 32768).astype(np.float32)


def prepare(n: int, tmp: str) -> dict:
    import soundfile as sf

    import rowstore

    rng = np.random.default_rng(0)
    flacs, waves = [], []
    for _ in range(n):
        x = utterance(rng, rng.uniform(10, 20))
        buf = io.BytesIO()
        sf.write(buf, x, RATE, format="FLAC", subtype="PCM_16")
        flacs.append(buf.getvalue())
        waves.append(x)
    blob = os.path.join(tmp, "flacs.npz")
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum([len(f) for f in flacs], out=offsets[1:])
    np.savez(blob, data=np.frombuffer(b"".join(flacs), np.uint8), offsets=offsets)
    flac_path, f32_path = os.path.join(tmp, "flac.h5"), os.path.join(tmp, "f32.h5")
    codec = {"id": "flac", "sample_rate": RATE}
    for path, values, kw in ((flac_path, flacs, {"codec": codec}), (f32_path, waves, {})):
        schema = rowstore.Schema([rowstore.Field("audio", "float32", (None,), **kw)])
        with rowstore.Writer(path, schema) as w:
            w.write_batch({"audio": values})
    return {
        "blob": blob,
        "flac": flac_path,
        "f32": f32_path,
        "seconds": float(sum(len(x) for x in waves) / RATE),
        "flac_file_bytes": os.path.getsize(flac_path),
        "f32_file_bytes": os.path.getsize(f32_path),
        "flac_payload_bytes": int(offsets[-1]),
    }


def passes(epoch, count: int, min_s: float) -> list[list[float]]:
    """``[items per wall second, items per CPU-second]`` of ``count`` passes of whole epochs
    (``epoch(e)`` returns the items it read), after a warm-up epoch."""
    epoch(0)
    e, out = 1, []
    for _ in range(count):
        t, c, k = time.perf_counter(), time.process_time(), 0
        while True:
            k += epoch(e)
            e += 1
            wall = time.perf_counter() - t
            if wall >= min_s:
                break
        out.append([k / wall, k / max(time.process_time() - c, 1e-9)])
    return out


def starts_of(frames: np.ndarray, e: int) -> np.ndarray:
    rng = np.random.default_rng([1, e])
    return (rng.random(len(frames)) * np.maximum(frames - WINDOW + 1, 1)).astype(np.int64)


def child(a) -> dict:
    if a.child.startswith("epoch"):
        import rowstore
        from rowstore.reader.audio_ops import RandomSegment

        if a.child == "epoch-flac":
            r = rowstore.open(a.flac)
            op = {"audio": RandomSegment(seconds=4)}

            def epoch(e):
                k = 0
                for b in r.batches(BATCH, epoch=e, shuffle="full", num_threads=2, decode=op):
                    k += b["audio"].size
                return k
        else:
            r = rowstore.open(a.f32)

            def epoch(e):
                k = 0
                for b in r.batches(BATCH, epoch=e, shuffle="full", num_threads=2):
                    rag = b["audio"]
                    st = starts_of(rag.lengths, e)
                    out = np.zeros((len(rag), WINDOW), np.float32)
                    for i in range(len(rag)):
                        w = rag[i][st[i] : st[i] + WINDOW]
                        out[i, : len(w)] = w
                    k += out.size
                return k

        return {"passes": passes(epoch, a.passes, a.min_pass_s)}
    z = np.load(a.blob)
    data, offsets = z["data"], z["offsets"]
    n = len(offsets) - 1
    from rowstore.codecs.audio import audio_header

    frames = np.array([audio_header(data[offsets[i] : offsets[i + 1]]).frames for i in range(n)])
    if a.child in ("kernel", "kernel-t2"):
        from concurrent.futures import ThreadPoolExecutor

        from rowstore.codecs import Payloads
        from rowstore.codecs.audio import decode_windows

        col = Payloads(data, offsets, None, None)
        out = np.empty((n, WINDOW), np.float32)
        threads = 2 if a.child == "kernel-t2" else 1
        pool = ThreadPoolExecutor(threads)

        def par(fn, m):
            b = np.linspace(0, m, threads + 1).astype(int)
            list(pool.map(lambda i: fn(int(b[i]), int(b[i + 1])), range(threads)))

        def epoch(e):
            st = decode_windows(
                col, out, starts_of(frames, e), np.full(n, WINDOW), frames, np.ones(n),
                np.arange(n) * WINDOW, parallel=par,
            )  # fmt: skip
            assert not st.any()
            return n

    else:
        import soundfile as sf

        payloads = [data[offsets[i] : offsets[i + 1]].tobytes() for i in range(n)]
        seek = a.child == "soundfile-seek"

        def epoch(e):
            st = starts_of(frames, e)
            for i in range(n):
                if seek:
                    with sf.SoundFile(io.BytesIO(payloads[i])) as f:
                        f.seek(int(st[i]))
                        w = f.read(WINDOW, dtype="float32")
                else:
                    x, _ = sf.read(io.BytesIO(payloads[i]), dtype="float32")
                    w = x[st[i] : st[i] + WINDOW]
                assert len(w) == min(WINDOW, frames[i] - st[i])
            return n

    return {"passes": passes(epoch, a.passes, a.min_pass_s)}


def accuracy(blob: str) -> dict:
    """The kernel's windows against soundfile's whole decode sliced, for 32 utterances."""
    import soundfile as sf

    from rowstore.codecs import Payloads
    from rowstore.codecs.audio import audio_header, decode_windows

    z = np.load(blob)
    data, offsets = z["data"], z["offsets"][:33]
    n = len(offsets) - 1
    frames = np.array([audio_header(data[offsets[i] : offsets[i + 1]]).frames for i in range(n)])
    st = starts_of(frames, 7)
    out = np.empty((n, WINDOW), np.float32)
    decode_windows(
        Payloads(data, offsets, None, None), out, st, np.full(n, WINDOW), frames, np.ones(n),
        np.arange(n) * WINDOW,
    )  # fmt: skip
    same = all(
        np.array_equal(
            out[i],
            sf.read(io.BytesIO(data[offsets[i] : offsets[i + 1]].tobytes()), dtype="float32")[0][
                st[i] : st[i] + WINDOW
            ],  # fmt: skip
        )
        for i in range(n)
    )
    return {"utterances": n, "identical_to_soundfile": bool(same)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--min-pass-s", type=float, default=2.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "audio_bench.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--blob", help=argparse.SUPPRESS)
    ap.add_argument("--flac", help=argparse.SUPPRESS)
    ap.add_argument("--f32", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    systems = [s for s in a.systems.split(",") if s]
    peers = {}
    for mod in ("torchaudio", "torchcodec"):
        try:
            __import__(mod)
            peers[mod] = "installed, not benchmarked yet"
        except ImportError:
            peers[mod] = "not installed"
    with tempfile.TemporaryDirectory() as tmp:
        prep = prepare(a.n, tmp)
        runs: dict[str, list] = {s: [] for s in systems}
        for r in range(a.rounds):
            for s in systems if r % 2 == 0 else systems[::-1]:
                cmd = [
                    sys.executable, __file__, "--child", s, "--blob", prep["blob"], "--flac",
                    prep["flac"], "--f32", prep["f32"], "--passes", str(a.passes),
                    "--min-pass-s", str(a.min_pass_s),
                ]  # fmt: skip
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if p.returncode:
                    raise SystemExit(f"{s} failed:\n{p.stderr[-3000:]}")
                runs[s] += json.loads(p.stdout.strip().splitlines()[-1])["passes"]
                print(f"round {r} {s}: {runs[s][-1]}", file=sys.stderr)
        acc = accuracy(prep["blob"])
    med = {
        s: {
            "per_wall_s": statistics.median(p[0] for p in v),
            "per_cpu_s": statistics.median(p[1] for p in v),
        }
        for s, v in runs.items()
        if v
    }
    ratios = {}
    if "kernel" in med and "soundfile" in med:
        ratios["kernel_vs_soundfile_per_cpu_s"] = (
            med["kernel"]["per_cpu_s"] / med["soundfile"]["per_cpu_s"]
        )
    if "kernel" in med and "soundfile-seek" in med:
        ratios["kernel_vs_soundfile_seek_per_cpu_s"] = (
            med["kernel"]["per_cpu_s"] / med["soundfile-seek"]["per_cpu_s"]
        )
    if "kernel" in med and "kernel-t2" in med:
        ratios["kernel_2_threads_vs_1_per_wall_s"] = (
            med["kernel-t2"]["per_wall_s"] / med["kernel"]["per_wall_s"]
        )
    if "epoch-flac" in med and "epoch-float32" in med:
        ratios["epoch_flac_vs_float32_samples_per_wall_s"] = (
            med["epoch-flac"]["per_wall_s"] / med["epoch-float32"]["per_wall_s"]
        )
    ratios["stored_bytes_flac_vs_float32"] = prep["flac_file_bytes"] / prep["f32_file_bytes"]
    result = {
        "bench": "audio",
        "n": a.n,
        "audio_seconds": prep["seconds"],
        "window_frames": WINDOW,
        "units": "windows/s for kernel*/soundfile*, samples/s for epoch-*",
        "median": med,
        "ratios": ratios,
        "stored": {k: v for k, v in prep.items() if k.endswith("bytes")},
        "accuracy": acc,
        "peers": peers,
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
