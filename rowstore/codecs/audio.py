"""``flac`` and ``wav`` audio: a waveform of ``float32`` (in [-1, 1]), ``int16`` or ``int32``
samples, ``(frames,)`` for mono or ``(frames, channels)``, stored as a FLAC or WAV file's bytes.

A bytes value (the file as a corpus ships it) is stored as it is after :func:`audio_header`
reads its header (pure Python, bounds-checked, microseconds: nothing is decoded) and checks it
against the field: the codec's ``sample_rate`` (if set), the channels (a 1-D field is mono,
``(frames, C)`` takes C channels) and a sample type the field's dtype holds exactly (``int16``:
sources of at most 16 bits; float WAV: ``float32`` only). An array value is encoded on the
writer's threads: ``flac`` by libFLAC (lossless: the decoded array equals the one written, so a
``float32`` value must hold exact ``bits``-bit samples, ``k / 2**(bits-1)``), ``wav`` as PCM
(``int16``/``int32``) or IEEE float (``float32``) samples, exactly.

Decoding (``kernels.audio_decode``, libFLAC and a WAV reader without the GIL, a range of values
per call) gives soundfile's (libsndfile's) samples for every bit depth: a ``b``-bit integer
sample ``s`` is ``s * 2**-(b-1)`` as float32, ``s << (16-b)`` (or ``s >> (b-16)``) as int16,
``s << (32-b)`` as int32; a float WAV's samples are as stored. Where the kernel was not built
(no ``FLAC/stream_decoder.h``) soundfile decodes, with the same output for valid files.
Damaged bytes (a bad header, a libFLAC error, audio shorter than its header says, a header that
disagrees with the stored shape) are refused with a ``CodecError``, never decoded into made-up
samples (the soundfile fallback refuses less: libsndfile reads FLAC frames that disagree with
their STREAMINFO).

:func:`decode_windows` decodes a window of frames of each value (the reader's audio ops,
:mod:`rowstore.reader.audio_ops`): FLAC seeks to the window, decoding only the frames it
covers.

Supported sources: FLAC of 4-32 bits, 1-8 channels (an ID3v2 tag before it is skipped); WAV
(RIFF) PCM of 8 (unsigned), 16, 24 or 32 bits and 32-bit IEEE float, also as
``WAVE_FORMAT_EXTENSIBLE``, 1-8 channels.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from rowstore import kernels
from rowstore.codecs.abc import Codec, Encoded, FieldLike, ParallelMap, Payloads, serial
from rowstore.errors import CodecError, CodecNotAvailableError, SchemaError

__all__ = [
    "Flac",
    "Wav",
    "AudioHeader",
    "audio_header",
    "sniff_audio_format",
    "decode_windows",
    "AUDIO_DTYPES",
    "MAX_CHANNELS",
]

#: Field dtypes the audio codecs store.
AUDIO_DTYPES = ("float32", "int16", "int32")
#: The most channels a value may have.
MAX_CHANNELS = 8
_MAX_RATE = 1048575  # FLAC's STREAMINFO holds 20 bits


@dataclass(frozen=True)
class AudioHeader:
    """What a FLAC or WAV file's header says about the audio it holds."""

    format: str  # "flac" or "wav"
    sample_rate: int
    channels: int
    bits_per_sample: int
    frames: int
    sample_format: str  # "int" or "float"

    @property
    def seconds(self) -> float:
        return self.frames / self.sample_rate

    @property
    def dtype(self) -> np.dtype:
        """The dtype that holds the samples exactly: float32 (float WAV), int16 (at most 16
        bits) or int32."""
        if self.sample_format == "float":
            return np.dtype(np.float32)
        return np.dtype(np.int16 if self.bits_per_sample <= 16 else np.int32)


class _BadAudio(ValueError):
    """Bytes that are not a valid FLAC/WAV header, or of a kind the codecs do not read."""


def sniff_audio_format(data: Any) -> str | None:
    """``"flac"`` or ``"wav"`` from the bytes' signature (an ID3v2 tag before FLAC is skipped),
    else None."""
    head = bytes(memoryview(data)[:12])
    if head.startswith(b"fLaC") or head.startswith(b"ID3"):
        return "flac"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "wav"
    return None


def _flac_header(buf: Any, n: int) -> AudioHeader:
    pos = 0
    if n >= 10 and bytes(buf[:3]) == b"ID3":
        size = 0
        for b in bytes(buf[6:10]):
            if b & 0x80:
                raise _BadAudio("invalid ID3v2 tag before the FLAC stream")
            size = (size << 7) | b
        pos = 10 + size + (10 if buf[5] & 0x10 else 0)
    if pos + 42 > n:
        raise _BadAudio(f"not FLAC bytes or truncated ({n} bytes; STREAMINFO ends at {pos + 42})")
    if bytes(buf[pos : pos + 4]) != b"fLaC":
        raise _BadAudio("not FLAC bytes (no fLaC signature)")
    pos += 4
    if buf[pos] & 0x7F != 0 or int.from_bytes(bytes(buf[pos + 1 : pos + 4]), "big") != 34:
        raise _BadAudio("invalid FLAC: the first metadata block is not a 34-byte STREAMINFO")
    s = bytes(buf[pos + 4 : pos + 38])
    min_bs, max_bs = struct.unpack_from(">HH", s, 0)
    rate = (s[10] << 12) | (s[11] << 4) | (s[12] >> 4)
    channels = ((s[12] >> 1) & 7) + 1
    bits = (((s[12] & 1) << 4) | (s[13] >> 4)) + 1
    frames = ((s[13] & 0x0F) << 32) | int.from_bytes(s[14:18], "big")
    if max_bs < 16 or min_bs > max_bs or rate == 0 or bits < 4:
        raise _BadAudio(
            f"invalid FLAC STREAMINFO: block size {min_bs}..{max_bs}, rate {rate}, {bits} bits"
        )
    while True:  # the metadata blocks: each moves >= 4 bytes
        if pos + 4 > n:
            raise _BadAudio("truncated FLAC: it ends inside its metadata")
        last = buf[pos] & 0x80
        length = int.from_bytes(bytes(buf[pos + 1 : pos + 4]), "big")
        if length > n - pos - 4:
            raise _BadAudio("truncated FLAC: a metadata block runs past the end of the data")
        pos += 4 + length
        if last:
            break
    if frames == 0:
        raise _BadAudio("a FLAC stream whose STREAMINFO gives no length (0 frames)")
    return AudioHeader("flac", rate, channels, bits, frames, "int")


_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")


def _wav_header(buf: Any, n: int) -> AudioHeader:
    if n < 12 or bytes(buf[:4]) != b"RIFF" or bytes(buf[8:12]) != b"WAVE":
        raise _BadAudio("not WAV bytes (no RIFF/WAVE signature)")
    pos, fmt = 12, None
    while True:  # chunks: each moves >= 8 bytes
        if pos + 8 > n:
            raise _BadAudio("invalid WAV: it ends before its data chunk")
        kind = bytes(buf[pos : pos + 4])
        (size,) = struct.unpack_from("<I", buf, pos + 4)
        body = pos + 8
        if kind == b"fmt ":
            if size < 16 or size > n - body:
                raise _BadAudio(f"invalid WAV: a fmt chunk of {size} bytes")
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", buf, body)
            if tag == 0xFFFE:  # WAVE_FORMAT_EXTENSIBLE: the sub-format's GUID
                if size < 40 or struct.unpack_from("<H", buf, body + 16)[0] < 22:
                    raise _BadAudio("invalid WAV: a WAVE_FORMAT_EXTENSIBLE fmt chunk too short")
                if bytes(buf[body + 26 : body + 40]) != _GUID_TAIL:
                    raise _BadAudio("a WAV of an unknown sub-format GUID")
                (tag,) = struct.unpack_from("<H", buf, body + 24)
            fmt = (tag, channels, rate, align, bits)
        elif kind == b"data":
            if fmt is None:
                raise _BadAudio("invalid WAV: a data chunk before the fmt chunk")
            if size > n - body:
                raise _BadAudio(
                    f"truncated WAV: its data chunk declares {size} bytes, {n - body} follow"
                )
            tag, channels, rate, align, bits = fmt
            if tag not in (1, 3):
                raise _BadAudio(f"a compressed WAV (format tag 0x{tag:04X}); only PCM and float")
            if (tag == 1 and bits not in (8, 16, 24, 32)) or (tag == 3 and bits != 32):
                kind_ = "float" if tag == 3 else "PCM"
                raise _BadAudio(
                    f"a {bits}-bit {kind_} WAV; the wav codec reads 8/16/24/32-bit PCM "
                    "and 32-bit float"
                )
            if not 1 <= channels <= MAX_CHANNELS:
                raise _BadAudio(f"a WAV of {channels} channels (1..{MAX_CHANNELS} are read)")
            if rate == 0 or align != channels * (bits // 8):
                raise _BadAudio(f"invalid WAV: rate {rate}, block align {align}")
            return AudioHeader(
                "wav", rate, channels, bits, size // align, "float" if tag == 3 else "int"
            )
        if size > n - body:
            raise _BadAudio(f"invalid WAV: a {kind!r} chunk runs past the end of the data")
        pos = body + size + (size & 1)


def _header(data: Any) -> AudioHeader:
    buf = data if isinstance(data, bytes) else memoryview(data).cast("B")
    n = len(buf)
    if n >= 4 and bytes(buf[:4]) == b"RIFF":
        return _wav_header(buf, n)
    return _flac_header(buf, n)


def audio_header(data: Any) -> AudioHeader:
    """The header of FLAC or WAV bytes (the format from the signature): sample rate, channels,
    bits per sample, frames. Bounds-checked, pure Python, nothing decoded. Raises
    :class:`~rowstore.errors.CodecError` for bytes that are neither, damaged or truncated
    headers, and kinds the codecs do not read (compressed WAV, more than 8 channels, a FLAC
    stream of unknown length)."""
    fmt = sniff_audio_format(data)
    try:
        if fmt is None:
            raise _BadAudio(f"not FLAC or WAV bytes ({len(memoryview(data).cast('B'))} bytes)")
        return _header(data)
    except _BadAudio as exc:
        raise CodecError(str(exc), codec=fmt) from None


# -- sample conversion (the kernel's, in NumPy: the fallback and the encoders' inverse) ---------
def _from_ints(s: np.ndarray, bits: int, dtype: np.dtype) -> np.ndarray:
    """b-bit integer samples (int64) as ``dtype``, as libsndfile converts them."""
    if dtype == np.float32:
        return s.astype(np.float32) * np.float32(2.0 ** -(bits - 1))
    if dtype == np.int16:
        return (s >> (bits - 16) if bits > 16 else s << (16 - bits)).astype(np.int16)
    return (s << (32 - bits)).astype(np.int32)


def _to_ints(value: np.ndarray, bits: int, what: str) -> np.ndarray:
    """The b-bit integer samples (int32) whose :func:`_from_ints` is ``value`` exactly, or a
    ``CodecError`` naming the first sample that is not one."""
    if value.dtype == np.float32:
        s = value.astype(np.float64) * 2.0 ** (bits - 1)
        r = np.rint(s)
        bad = (r != s) | (r < -(2 ** (bits - 1))) | (r > 2 ** (bits - 1) - 1)
    elif value.dtype == np.int16:
        x = value.astype(np.int64)
        r = x >> (16 - bits) if bits < 16 else x << (bits - 16)
        bad = _from_ints(r, bits, np.dtype(np.int16)) != value
    else:
        x = value.astype(np.int64)
        r = x >> (32 - bits)
        bad = (r << (32 - bits)) != x
    if bad.any():
        i = int(np.flatnonzero(bad.reshape(-1))[0])
        v = value.reshape(-1)[i]
        raise CodecError(
            f"{what}: sample {i} ({v!r}) is not an exact {bits}-bit sample, which FLAC stores "
            f"losslessly (a float32 value must be k * 2**{-(bits - 1)})"
            if value.dtype == np.float32
            else f"{what}: sample {i} ({v!r}) does not fit {bits} bits (choose bits=24)",
            codec="flac",
        )
    return r.astype(np.int32)


def _mix(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``frames x C`` samples mixed down to ``frames``: float32 the mean in double, integers
    the floor of the mean (the kernel's)."""
    if dtype == np.float32:
        return (x.astype(np.float64).sum(axis=1) / x.shape[1]).astype(np.float32)
    return np.floor_divide(x.astype(np.int64).sum(axis=1), x.shape[1]).astype(dtype)


# -- decoding -----------------------------------------------------------------------------------
def _soundfile():
    try:
        import soundfile
    except ImportError as exc:  # pragma: no cover - exercised only without both
        raise CodecNotAvailableError(
            "rowstore was built without libFLAC (no audio kernel) and soundfile is not installed: "
            "pip install 'rowstore[audio]' (or soundfile)"
        ) from exc
    return soundfile


class _Refused(CodecError):
    """A value the fallback decoder refuses, with the kernel's status code."""

    def __init__(self, status: int, codec: str | None = None):
        super().__init__(kernels.AUDIO_WHY[status], codec=codec)
        self.status = status


def _decode_reference(
    payload: Any, start: int, count: int, expect: int, chans: int, mono: bool, dtype: np.dtype
) -> np.ndarray:
    """One value's window decoded with soundfile (libsndfile): ``count x C`` (``count`` for
    ``mono``) of ``dtype``, zeros past the value's end: the kernel's output, without it.
    Raises ``CodecError`` where the kernel refuses the value."""
    try:
        hdr = audio_header(payload)
    except CodecError:
        raise _Refused(kernels.AUDIO_CORRUPT) from None
    if hdr.channels != chans or (expect >= 0 and hdr.frames != expect):
        raise _Refused(kernels.AUDIO_SIZE, hdr.format)
    if hdr.sample_format == "float" and dtype != np.float32:
        raise _Refused(kernels.AUDIO_UNSUPPORTED, hdr.format)
    if not 0 <= start <= hdr.frames:
        raise _Refused(kernels.AUDIO_RANGE, hdr.format)
    m = min(count, hdr.frames - start)
    out = np.zeros((count, 1 if mono else chans), dtype)
    if m > 0:
        sf = _soundfile()
        try:
            with sf.SoundFile(io.BytesIO(bytes(memoryview(payload).cast("B")))) as f:
                if f.frames != hdr.frames or f.channels != chans:
                    raise _Refused(kernels.AUDIO_SIZE, hdr.format)
                if start:
                    f.seek(start)
                x = f.read(m, dtype=np.dtype(dtype).name, always_2d=True)
        except CodecError:
            raise
        except Exception:  # libsndfile's errors on damaged bytes
            raise _Refused(kernels.AUDIO_CORRUPT, hdr.format) from None
        if len(x) != m:
            raise _Refused(kernels.AUDIO_TRUNCATED, hdr.format)
        out[:m] = _mix(x, dtype)[:, None] if mono and chans > 1 else x
    return out[:, 0] if mono else out


def decode_windows(
    src: Payloads,
    out: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    expect: np.ndarray | None,
    channels: np.ndarray,
    out_offsets: np.ndarray,
    *,
    mono: bool = False,
    parallel: ParallelMap = serial,
) -> np.ndarray:
    """Decode a window of each value of a batch: value i's frames ``starts[i] .. starts[i] +
    counts[i]`` (zeros past its end), ``channels[i]`` channels (mixed to one with ``mono``),
    into the flat ``out`` (float32/int16/int32, C-contiguous) from element ``out_offsets[i]``
    on; ``expect[i] >= 0`` asks for exactly that many frames in the value's header. Null
    values are zeroed. With the kernel each range of values is one call without the GIL on
    ``parallel``'s threads (FLAC seeks to the window); else soundfile, value by value. Returns
    the status per value (``kernels.AUDIO_*``; 0 decoded)."""
    n = len(src)
    status = np.zeros(n, np.uint8)
    starts = np.ascontiguousarray(starts, np.int64)
    counts = np.ascontiguousarray(counts, np.int64)
    chans = np.ascontiguousarray(channels, np.int32)
    offs = np.ascontiguousarray(out_offsets, np.int64)
    exp = None if expect is None else np.ascontiguousarray(expect, np.int64)
    if kernels.AUDIO_AVAILABLE:

        def run(lo: int, hi: int) -> None:
            kernels.audio_decode(
                src.data, src.offsets, src.nulls, starts, counts, exp, chans, offs, out,
                mono=mono, lo=lo, hi=hi, status=status,
            )  # fmt: skip

        parallel(run, n)
        return status
    flat = out.reshape(-1)
    for i in range(n):
        oc = 1 if mono else int(chans[i])
        dst = flat[offs[i] : offs[i] + counts[i] * oc]
        if src.is_null(i):
            dst[...] = 0
            continue
        try:
            x = _decode_reference(
                src.payload(i), int(starts[i]), int(counts[i]),
                -1 if exp is None else int(exp[i]), int(chans[i]), mono, out.dtype,
            )  # fmt: skip
        except _Refused as exc:
            status[i] = exc.status
            continue
        dst[...] = x.reshape(-1)
    return status


def status_error(codec_id: str, status: int) -> CodecError | MemoryError:
    """The error of a value the kernel did not decode."""
    if status == kernels.AUDIO_NOMEM:
        return MemoryError(f"no memory to decode {codec_id} audio")
    why = kernels.AUDIO_WHY.get(status, f"status {status}")
    return CodecError(f"{codec_id} payload does not decode: {why}", codec=codec_id)


# -- the codecs ---------------------------------------------------------------------------------
def _check_rate(rate: Any, codec_id: str) -> int | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= _MAX_RATE:
        raise CodecError(
            f"{codec_id} sample_rate must be an int in 1..{_MAX_RATE} or None, got {rate!r}",
            codec=codec_id,
        )
    return rate


class _Audio(Codec):
    releases_gil = True  # the kernel decodes without the GIL
    encode_releases_gil = True  # libFLAC encodes without it; a WAV is a header and a copy
    accepts_encoded = True  # FLAC/WAV bytes are stored as they are (header checked)

    def __init__(self, sample_rate: int | None = None):
        self.sample_rate = _check_rate(sample_rate, self.codec_id)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "sample_rate": self.sample_rate}

    def _fail(self, field: FieldLike, why: str) -> CodecError:
        return CodecError(
            f"field {field.name!r}: codec {self.codec_id!r}: {why}",
            codec=self.codec_id,
            field=field.name,
        )

    def check_field(self, field: FieldLike) -> None:
        name = field.name
        if field.dtype in ("str", "bytes") or np.dtype(field.dtype).name not in AUDIO_DTYPES:
            raise SchemaError(
                f"field {name!r}: codec {self.codec_id!r} stores {'/'.join(AUDIO_DTYPES)} audio, "
                f"got dtype {field.dtype}",
                field=name,
            )
        shape = field.shape
        if len(shape) not in (1, 2) or (
            len(shape) == 2 and shape[1] is not None and not 1 <= shape[1] <= MAX_CHANNELS
        ):
            raise SchemaError(
                f"field {name!r}: codec {self.codec_id!r} needs shape (frames,) (mono) or "
                f"(frames, channels) with 1..{MAX_CHANNELS} channels (None: variable), got "
                f"{shape}",
                field=name,
            )

    def inspect_encoded(self, data: memoryview, field: FieldLike) -> tuple[tuple[int, ...], Any]:
        """``(frames,)`` (a 1-D field: mono only) or ``(frames, channels)`` and the field's
        dtype, from the header, after checking it against the codec and the field."""
        try:
            hdr = audio_header(data)
        except CodecError as exc:
            raise self._fail(field, str(exc)) from None
        if hdr.format != self.codec_id:
            raise self._fail(field, f"got {hdr.format.upper()} bytes, not {self.codec_id.upper()}")
        if self.sample_rate is not None and hdr.sample_rate != self.sample_rate:
            raise self._fail(
                field, f"the audio's sample rate is {hdr.sample_rate} Hz, the field's "
                f"{self.sample_rate} Hz (resample it, or declare sample_rate={hdr.sample_rate})"
            )  # fmt: skip
        dtype = np.dtype(field.dtype)
        if hdr.sample_format == "float" and dtype != np.float32:
            raise self._fail(field, f"float samples do not go into a {dtype} field (float32)")
        if dtype == np.int16 and hdr.bits_per_sample > 16:
            raise self._fail(
                field, f"{hdr.bits_per_sample}-bit samples do not fit an int16 field exactly "
                "(declare int32 or float32)"
            )  # fmt: skip
        if len(field.shape) == 1:
            if hdr.channels != 1:
                raise self._fail(
                    field, f"{hdr.channels}-channel audio for a mono field (declare shape "
                    f"(None, {hdr.channels}))"
                )  # fmt: skip
            return (hdr.frames,), dtype
        return (hdr.frames, hdr.channels), dtype

    def check_value(self, value: Any, field: FieldLike) -> None:
        if isinstance(value, Encoded):
            return
        frames = value.shape[0]
        channels = value.shape[1] if value.ndim == 2 else 1
        if frames == 0:
            raise self._fail(field, "an empty waveform (0 frames) is not stored")
        if not 1 <= channels <= MAX_CHANNELS:
            raise self._fail(field, f"{channels} channels (1..{MAX_CHANNELS} are stored)")
        if self.sample_rate is None:
            raise self._fail(
                field, "encoding an array needs the sample rate: declare "
                f"codec={{'id': {self.codec_id!r}, 'sample_rate': ...}} (bytes values carry "
                "their own)"
            )  # fmt: skip
        self._check_samples(value, field)

    def _check_samples(self, value: np.ndarray, field: FieldLike) -> None:
        """Codec-specific limits on an array's samples."""

    def decode_into(self, src, out: np.ndarray) -> None:
        data = src if isinstance(src, np.ndarray) else np.frombuffer(src, np.uint8)
        one = Payloads(data, np.array([0, len(data)], np.int64), None, None)
        if out.ndim not in (1, 2):
            raise CodecError(f"{self.codec_id} audio decodes into (frames,) or (frames, C)")
        dst = out if out.flags.c_contiguous and out.flags.writeable else np.empty_like(out)
        chans = out.shape[1] if out.ndim == 2 else 1
        status = decode_windows(
            one, dst, np.zeros(1), np.array([out.shape[0]]), np.array([out.shape[0]]),
            np.array([chans]), np.zeros(1),
        )  # fmt: skip
        if status[0]:
            raise status_error(self.codec_id, int(status[0]))
        if dst is not out:
            out[...] = dst

    def decode_batch(self, src: Payloads, out: np.ndarray, parallel: ParallelMap = serial) -> None:
        """All values of a batch in kernel calls (one per range of values, on ``parallel``'s
        threads): ``out`` is ``n x frames[ x C]`` for a fixed shape, flat for variable ones."""
        n = len(src)
        if src.shapes is not None:
            frames = src.shapes[:, 0]
            chans = src.shapes[:, 1] if src.shapes.shape[1] == 2 else np.ones(n, np.int64)
            elems = src.element_offsets()
            assert elems is not None  # variable shapes have element offsets
            offs = elems[:-1]
        else:
            frames = np.full(n, out.shape[1], np.int64)
            chans = np.full(n, out.shape[2] if out.ndim == 3 else 1, np.int64)
            offs = np.arange(n, dtype=np.int64) * int(np.prod(out.shape[1:]))
        if not (out.flags.c_contiguous and out.flags.writeable):
            super().decode_batch(src, out, parallel)
            return
        if n and (chans.min() < 1 or chans.max() > MAX_CHANNELS):
            raise CodecError(f"{self.codec_id}: a stored shape of other than 1..8 channels")
        status = decode_windows(
            src, out, np.zeros(n, np.int64), frames, frames, chans, offs, parallel=parallel
        )
        bad = np.flatnonzero(status)
        if len(bad):
            raise status_error(self.codec_id, int(status[bad[0]]))


class Flac(_Audio):
    """Lossless FLAC. ``sample_rate``: the audio's rate in Hz (checked against bytes values;
    needed to encode arrays). ``bits``: the sample size arrays are encoded at (16 or 24;
    default 16, 24 for int32 fields): a float32 array must hold exact ``bits``-bit samples
    (``k / 2**(bits-1)``). ``level``: libFLAC's compression level 0-8 (default 5)."""

    codec_id = "flac"

    def __init__(self, sample_rate: int | None = None, bits: int | None = None, level: int = 5):
        super().__init__(sample_rate)
        if bits is not None and bits not in (16, 24):
            raise CodecError(f"flac bits must be 16, 24 or None, got {bits!r}", codec="flac")
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 8:
            raise CodecError(f"flac level must be an int in 0..8, got {level!r}", codec="flac")
        self.bits = bits
        self.level = level
        self._freeze()

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "bits": self.bits, "level": self.level}

    def _bits(self, dtype: np.dtype) -> int:
        if self.bits is not None:
            return self.bits
        return 24 if dtype == np.int32 else 16

    def _check_samples(self, value: np.ndarray, field: FieldLike) -> None:
        _to_ints(value, self._bits(value.dtype), f"field {field.name!r}")

    def encode(self, value: Any, field: FieldLike) -> bytes:
        arr = np.ascontiguousarray(value)
        bits = self._bits(arr.dtype)
        s = _to_ints(arr, bits, f"field {field.name!r}").reshape(arr.shape[0], -1)
        assert self.sample_rate is not None  # check_value requires it
        if kernels.AUDIO_AVAILABLE:
            return kernels.flac_encode(s, bits, self.sample_rate, self.level)
        buf = io.BytesIO()  # soundfile takes int32 samples at full scale
        _soundfile().write(
            buf, (s.astype(np.int64) << (32 - bits)).astype(np.int32), self.sample_rate,
            format="FLAC", subtype=f"PCM_{bits}",
        )  # fmt: skip
        return buf.getvalue()


class Wav(_Audio):
    """WAV (RIFF): ``int16``/``int32`` arrays as 16/32-bit PCM, ``float32`` as 32-bit IEEE
    float, exactly. ``sample_rate``: the audio's rate in Hz (checked against bytes values;
    needed to encode arrays)."""

    codec_id = "wav"

    def __init__(self, sample_rate: int | None = None):
        super().__init__(sample_rate)
        self._freeze()

    def encode(self, value: Any, field: FieldLike) -> bytes:
        arr = np.ascontiguousarray(value, np.asarray(value).dtype.newbyteorder("<"))
        frames = arr.shape[0]
        channels = arr.shape[1] if arr.ndim == 2 else 1
        bits = arr.dtype.itemsize * 8
        tag = 3 if arr.dtype.kind == "f" else 1
        data = arr.tobytes()
        assert self.sample_rate is not None  # check_value requires it
        align = channels * bits // 8
        fmt = struct.pack(
            "<HHIIHH", tag, channels, self.sample_rate, self.sample_rate * align, align, bits
        )
        body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
        body += b"data" + struct.pack("<I", len(data)) + data + b"\0" * (len(data) & 1)
        assert frames * align == len(data)
        return b"RIFF" + struct.pack("<I", len(body)) + body
