"""Hostile FLAC/WAV bytes against the audio kernel and codecs (``_ext/_audio.pyx``,
``rowstore.codecs.audio``).

    python tools/robustness/audio_fuzz.py --cases 2000 [--seed 0]   # mutate, decode, judge
    python tools/robustness/audio_fuzz.py --replay tests/data/fuzz/audio/*
    python tools/robustness/audio_fuzz.py --make-corpus tests/data/fuzz/audio

Seeds are FLAC (16/24-bit, several block sizes, 1-2 channels) and WAV (PCM 8/16/24/32, float,
extensible) files written by soundfile. A case mutates one (bit flips and byte sets in its
header, bytes anywhere, truncation, STREAMINFO's frame count, RIFF chunk sizes) and runs the
oracle: the header parsers (Python and C) agree; the kernel decodes the whole value and random
windows of it (a status per value); the codec decodes it or raises a ``RowstoreError``. Cases run
in a child process, so a crash is caught (its case is saved under ``--out``), and a case that
takes more than ``--timeout`` seconds is a hang. Exit status 1 on any crash, hang or leaked
exception. ``--make-corpus`` writes the hand-made hostile files the tests replay
(tests/kernels/test_audio_kernel.py), each named after what is wrong with it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import struct
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def seeds() -> list[bytes]:
    import soundfile as sf

    rng = np.random.default_rng(0)
    out = []
    specs = [
        ("FLAC", "PCM_16", 1, None),
        ("FLAC", "PCM_24", 2, 1152),
        ("FLAC", "PCM_16", 2, 1152),
        ("WAV", "PCM_16", 1, None),
        ("WAV", "PCM_24", 2, None),
        ("WAV", "PCM_U8", 1, None),
        ("WAV", "FLOAT", 2, None),
        ("WAVEX", "PCM_32", 2, None),
    ]
    from rowstore import kernels

    for fmt, subtype, ch, bs in specs:
        x = rng.uniform(-1, 1, (3000, ch)) * np.linspace(0, 1, 3000)[:, None]
        if bs:  # libFLAC's level 0: 1152-frame blocks
            bits = int(subtype[4:])
            s = np.round(x * (2 ** (bits - 1) - 1)).astype(np.int32)
            out.append(kernels.flac_encode(s, bits, 16000, 0))
            continue
        buf = io.BytesIO()
        with sf.SoundFile(buf, "w", 16000, ch, subtype=subtype, format=fmt) as f:
            f.write(x)
        out.append(buf.getvalue())
    return out


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, list]:
    b = bytearray(data)
    ops: list = []
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 6))
        if kind == 0 and b:  # header bit flip
            i = int(rng.integers(0, min(120, len(b))))
            bit = int(rng.integers(0, 8))
            b[i] ^= 1 << bit
            ops.append(["flip", i, bit])
        elif kind == 1 and b:  # header byte set
            i = int(rng.integers(0, min(120, len(b))))
            v = int(rng.choice([0, 0xFF, 0x7F, 0x80, int(rng.integers(0, 256))]))
            b[i] = v
            ops.append(["set", i, v])
        elif kind == 2 and b:  # any byte
            i = int(rng.integers(0, len(b)))
            v = int(rng.integers(0, 256))
            b[i] = v
            ops.append(["set", i, v])
        elif kind == 3:  # truncation
            n = int(rng.integers(0, len(b) + 1))
            del b[n:]
            ops.append(["truncate", n])
        elif kind == 4 and b[:4] == b"fLaC" and len(b) > 26:  # STREAMINFO's frame count
            n = int(rng.choice([0, 1, 2999, 3001, 2**36 - 1, int(rng.integers(0, 2**36))]))
            b[21] = (b[21] & 0xF0) | (n >> 32)
            b[22:26] = (n & 0xFFFFFFFF).to_bytes(4, "big")
            ops.append(["frames", n])
        elif kind == 5 and b[:4] == b"RIFF":  # a chunk size
            i = b.find(b"data") if rng.integers(0, 2) else b.find(b"fmt ")
            if i >= 0 and i + 8 <= len(b):
                v = int(rng.choice([0, 1, 2**31, 2**32 - 1, int(rng.integers(0, 2**32))]))
                b[i + 4 : i + 8] = struct.pack("<I", v)
                ops.append(["chunk", i, v])
    return bytes(b), ops


def oracle(data: bytes, rng: np.random.Generator) -> None:
    """Raise AssertionError for a wrong outcome; a crash or a hang ends the process."""
    from rowstore import kernels
    from rowstore.codecs import Payloads
    from rowstore.codecs.audio import audio_header, decode_windows
    from rowstore.errors import RowstoreError
    from rowstore.schema import Field

    c = kernels.audio_header(data)
    try:
        h = audio_header(data)
    except RowstoreError:
        assert c[0] != 0, "the C parser accepts what the Python one refuses"
        frames, chans = int(rng.integers(0, 5000)), 2
    else:
        assert c[0] == 0 and c[2:5] == (h.sample_rate, h.channels, h.bits_per_sample), c
        assert c[6] == h.frames
        frames, chans = h.frames, h.channels
    one = Payloads(np.frombuffer(data, np.uint8), np.array([0, len(data)], np.int64), None, None)
    for _ in range(3):
        count = int(min(frames, 20000))
        start = int(rng.integers(0, max(1, frames)))
        for mono in (False, True):
            oc = 1 if mono else chans
            out = np.empty(count * oc, np.float32)
            st = decode_windows(
                one, out, np.array([start]), np.array([count]), None, np.array([chans]),
                np.zeros(1), mono=mono,
            )  # fmt: skip
            assert 0 <= int(st[0]) <= 6
    if frames * chans <= 10**6:
        kind = "wav" if data[:4] == b"RIFF" else "flac"
        f = Field("a", "float32", (None, chans), codec=kind)
        try:
            f.codec_obj.decode(data, (frames, chans), f)
        except RowstoreError:
            pass


def child(seed: int, first: int, count: int, out: str) -> int:
    rng = np.random.default_rng(seed)
    base = seeds()
    progress = os.path.join(out, f"current-{seed}.json")
    bad = 0
    for case in range(first + count):
        src = base[int(rng.integers(0, len(base)))]
        data, ops = mutate(src, rng)
        crng = np.random.default_rng([seed, case])
        if case < first:
            continue
        with open(progress, "w") as fh:
            json.dump({"case": case, "ops": ops, "data": data.hex()}, fh)
        try:
            oracle(data, crng)
        except Exception as exc:  # noqa: BLE001 - every leak is reported
            bad += 1
            name = os.path.join(out, f"WRONG-{seed}-{case}.bin")
            with open(name, "wb") as fh:
                fh.write(data)
            print(f"case {case}: {type(exc).__name__}: {exc} ops={ops} -> {name}", flush=True)
    os.remove(progress)
    return bad


def run_cases(cases: int, seed: int, out: str, timeout: float) -> int:
    os.makedirs(out, exist_ok=True)
    first, failures, chunk = 0, 0, 500
    while first < cases:
        n = min(chunk, cases - first)
        cmd = [sys.executable, __file__, "--child", str(seed), str(first), str(n), out]
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, timeout=timeout * n, capture_output=True, text=True)
            rc, why = p.returncode, "crash"
            sys.stdout.write(p.stdout)
        except subprocess.TimeoutExpired:
            rc, why = -1, "hang"
        prog = os.path.join(out, f"current-{seed}.json")
        if rc != 0 and os.path.exists(prog):  # a crash or a hang: save the case, go on after it
            with open(prog) as fh:
                cur = json.load(fh)
            os.remove(prog)
            name = os.path.join(out, f"{why.upper()}-{seed}-{cur['case']}.bin")
            with open(name, "wb") as fh:
                fh.write(bytes.fromhex(cur["data"]))
            print(f"case {cur['case']}: {why} (rc {rc}) ops={cur['ops']} -> {name}", flush=True)
            failures += 1
            first = cur["case"] + 1
            continue
        failures += rc if rc > 0 else 0
        print(f"cases {first}..{first + n}: {time.monotonic() - t0:.1f} s, rc {rc}", flush=True)
        first += n
    return failures


def replay(paths: list[str]) -> int:
    bad = 0
    for i, path in enumerate(paths):
        with open(path, "rb") as fh:
            data = fh.read()
        try:
            oracle(data, np.random.default_rng(i))
            print(f"ok    {path}")
        except Exception as exc:  # noqa: BLE001
            bad += 1
            print(f"WRONG {path}: {type(exc).__name__}: {exc}")
    return bad


def make_corpus(out: str) -> None:
    """Hand-made hostile files: each is refused by the header parsers or by the decoder."""
    os.makedirs(out, exist_ok=True)
    base = seeds()
    flac16, flac24, wav16, wavf = base[0], base[1], base[3], base[6]

    def frames(b: bytes, n: int) -> bytes:
        a = bytearray(b)
        a[21] = (a[21] & 0xF0) | (n >> 32)
        a[22:26] = (n & 0xFFFFFFFF).to_bytes(4, "big")
        return bytes(a)

    def setb(b: bytes, i: int, v: bytes) -> bytes:
        return b[:i] + v + b[i + len(v) :]

    meta_end = 8 + 34  # a FLAC seed's STREAMINFO ends there (fLaC, header, 34 bytes)
    di, fi = wav16.index(b"data"), wav16.index(b"fmt ")
    cases = {
        "flac-truncated-half.flac": flac16[: len(flac16) // 2],
        "flac-truncated-in-metadata.flac": flac16[:30],
        "flac-frames-more-than-audio.flac": frames(flac16, 9000),
        "flac-frames-fewer-than-audio.flac": frames(flac16, 1000),
        "flac-frames-huge.flac": frames(flac24, 2**36 - 1),
        "flac-frames-zero.flac": frames(flac16, 0),
        "flac-audio-byte-flipped.flac": setb(flac16, len(flac16) // 2, b"\x5a\xa5"),
        "flac-garbage-audio.flac": flac16[:2000] + bytes(range(256)) * 8,
        "flac-streaminfo-length.flac": setb(flac16, 5, b"\x00\x00\x30"),
        "flac-metadata-past-end.flac": setb(flac16, 4, b"\x84\xff\xff\xff"),
        "flac-id3-huge.flac": b"ID3\x04\x00\x00\x7f\x7f\x7f\x7f" + flac16,
        "flac-streaminfo-mono-frames-stereo.flac": setb(flac24, 20, bytes([flac24[20] & 0xF1])),
        "flac-streaminfo-16bit-frames-24bit.flac": setb(flac24, 20, bytes([(flac24[20] & 0xFE)])),
        "flac-blocksize-zero.flac": setb(flac16, 8, b"\x00\x00\x00\x00"),
        "wav-data-past-end.wav": setb(wav16, di + 4, struct.pack("<I", 2**32 - 1)),
        "wav-fmt-past-end.wav": setb(wav16, fi + 4, struct.pack("<I", 2**31)),
        "wav-block-align-zero.wav": setb(wav16, fi + 8 + 12, b"\x00\x00"),
        "wav-zero-channels.wav": setb(wav16, fi + 8 + 2, b"\x00\x00"),
        "wav-adpcm.wav": setb(wav16, fi + 8, b"\x02\x00"),
        "wav-64bit-float.wav": setb(wavf, wavf.index(b"fmt ") + 8 + 14, b"\x40\x00"),
        "wav-no-data-chunk.wav": wav16[:di],
        "wav-riff-only.wav": b"RIFF\x04\x00\x00\x00WAVE",
        "wav-extensible-bad-guid.wav": setb(base[7], base[7].index(b"fmt ") + 8 + 30, b"\x99"),
    }
    assert meta_end < 64
    for name, data in cases.items():
        with open(os.path.join(out, name), "wb") as fh:
            fh.write(data)
    print(f"{len(cases)} files in {out}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cases", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=2.0, help="seconds per case (hang guard)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "audio_fuzz"))
    ap.add_argument("--replay", nargs="*")
    ap.add_argument("--make-corpus")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        seed, first, n, out = a.child
        return 1 if child(int(seed), int(first), int(n), out) else 0
    if a.make_corpus:
        make_corpus(a.make_corpus)
        return 0
    if a.replay is not None:
        return 1 if replay(a.replay) else 0
    return 1 if run_cases(a.cases, a.seed, a.out, a.timeout) else 0


if __name__ == "__main__":
    sys.path.append(ROOT)  # after PYTHONPATH (a sanitized build first)
    sys.exit(main())
