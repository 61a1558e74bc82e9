# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""FLAC and WAV audio decoded into preallocated buffers, a range of values per call, without
the GIL (``audio_decode``: the ``flac``/``wav`` codecs' decode and the reader's audio ops,
``rowstore.reader.audio_ops``), and FLAC encoding (``flac_encode``: the ``flac`` codec's
encode).

Per value (``_audio_impl.h``): the header is parsed and bounds-checked (FLAC: an optional ID3v2
tag, STREAMINFO, the metadata blocks; WAV: the RIFF chunks, ``fmt `` and ``data``), its
channels and frames checked against the ones expected (from the stored shape), then the window
``[start, start + count)`` is decoded: FLAC by libFLAC's stream decoder over the bytes in
memory, seeking to the window's first frame (``FLAC__stream_decoder_seek_absolute``) and
decoding only the frames it covers; WAV read directly. Frames past the value's end are zeros.
libFLAC errors (lost sync, CRC mismatch, a frame unlike the header) return a status code per
value: the kernel never raises for the bytes of a value.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from libc.string cimport memset

cdef extern from "FLAC/stream_decoder.h" nogil:
    ctypedef struct FLAC__StreamDecoder:
        pass
    FLAC__StreamDecoder* FLAC__stream_decoder_new()
    void FLAC__stream_decoder_delete(FLAC__StreamDecoder* d)

cdef extern from "_audio_impl.h" nogil:
    ctypedef struct ra_header:
        int format
        int64_t rate
        int channels
        int bits
        int is_float
        int64_t frames
        int64_t data_off
        int64_t data_len
        int block_align
    int ra_parse(const uint8_t* p, int64_t n, ra_header* h)
    int ra_decode_one(FLAC__StreamDecoder* dec, const uint8_t* p, int64_t n, int64_t expect,
                      int chans, int64_t start, int64_t count, int mono, int otype, uint8_t* out,
                      int64_t* info)
    int64_t ra_flac_encode(const int32_t* x, int64_t frames, int channels, int bits,
                           uint32_t rate, int level, uint8_t* out, int64_t cap)

#: status codes, one per value (0: decoded, or null and zeroed)
AUDIO_OK = 0
AUDIO_CORRUPT = 1      # not FLAC/WAV, or damaged
AUDIO_UNSUPPORTED = 2  # a kind the codecs do not read
AUDIO_NOMEM = 3        # libFLAC could not allocate its decoder
AUDIO_SIZE = 4         # the header's frames or channels are not the ones expected
AUDIO_TRUNCATED = 5    # the audio ends before the frames its header declares
AUDIO_RANGE = 6        # the window starts past the value's end

#: output sample types
OUT_F32 = 0
OUT_I16 = 1
OUT_I32 = 2

#: int64s per value of ``info``: rate, channels, bits, frames, format (1 FLAC, 2 WAV)
INFO = 5
cdef int _INFO = 5


def audio_header(const uint8_t[::1] data not None):
    """``(status, format, rate, channels, bits, is_float, frames, data_offset)`` of one value's
    header, parsed as the decoder parses it."""
    cdef ra_header h
    cdef int s
    with nogil:
        s = ra_parse(&data[0] if data.shape[0] else NULL, data.shape[0], &h)
    return s, h.format, h.rate, h.channels, h.bits, h.is_float, h.frames, h.data_off


def audio_decode(const uint8_t[::1] data not None, const int64_t[::1] offsets not None,
                 const uint8_t[::1] nulls, const int64_t[::1] starts not None,
                 const int64_t[::1] counts not None, const int64_t[::1] expect,
                 const int32_t[::1] chans not None, const int64_t[::1] out_off not None,
                 uint8_t[::1] out not None, int otype, bint mono, Py_ssize_t lo, Py_ssize_t hi,
                 uint8_t[::1] status not None, int64_t[:, ::1] info):
    """Decode values ``lo..hi`` of a batch: value i is ``data[offsets[i]:offsets[i + 1]]``, a
    FLAC or WAV stream of ``chans[i]`` channels (and exactly ``expect[i]`` frames, where
    ``expect`` is given and ``expect[i] >= 0``); its frames ``starts[i] .. starts[i] +
    counts[i]`` (zeros past its end) go to ``out`` (the whole batch's bytes) from element
    ``out_off[i]`` on, interleaved, as ``otype`` (``OUT_F32``, ``OUT_I16``, ``OUT_I32``),
    mixed down to one channel with ``mono``. Null values (``nulls[i]`` nonzero) are zeroed.
    ``status[i]`` receives a code per value (a failed value's slot is unspecified), ``info[i]``
    (None, or ``n x INFO`` int64) what its header says. Returns the number of values not
    decoded."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    cdef int64_t a, b, data_len = data.shape[0], esize, oc, nelem, ex
    cdef const uint8_t* nul = NULL
    cdef const int64_t* exp = NULL
    cdef int64_t* inf = NULL
    cdef FLAC__StreamDecoder* dec
    cdef int s
    cdef Py_ssize_t failed = 0
    if otype not in (OUT_F32, OUT_I16, OUT_I32):
        raise ValueError("audio_decode: unknown output type")
    esize = 2 if otype == OUT_I16 else 4
    nelem = out.shape[0] // esize
    if n < 0 or lo < 0 or hi < lo or hi > n:
        raise ValueError("audio_decode: bad range")
    if (status.shape[0] < n or starts.shape[0] < n or counts.shape[0] < n or chans.shape[0] < n
            or out_off.shape[0] < n):
        raise ValueError("audio_decode: per-value arrays shorter than the batch")
    if nulls is not None:
        if nulls.shape[0] < n:
            raise ValueError("audio_decode: nulls shorter than the batch")
        nul = &nulls[0] if n else NULL
    if expect is not None:
        if expect.shape[0] < n:
            raise ValueError("audio_decode: expect shorter than the batch")
        exp = &expect[0] if n else NULL
    if info is not None:
        if info.shape[0] < n or info.shape[1] != _INFO:
            raise ValueError("audio_decode: info must be n x INFO")
        inf = &info[0, 0] if n else NULL
    if hi == lo:
        return 0
    for i in range(lo, hi + 1):
        a = offsets[i]
        if a < 0 or a > data_len or (i > lo and a < offsets[i - 1]):
            raise ValueError("audio_decode: offsets outside the data")
    for i in range(lo, hi):
        if chans[i] < 1 or chans[i] > 8:
            raise ValueError("audio_decode: channels must be 1..8")
        oc = 1 if mono else chans[i]
        if starts[i] < 0 or counts[i] < 0 or out_off[i] < 0 or counts[i] > nelem:
            raise ValueError("audio_decode: negative or oversized window")
        if out_off[i] > nelem - counts[i] * oc:
            raise ValueError("audio_decode: out holds fewer elements than the windows")
    dec = FLAC__stream_decoder_new()
    if dec == NULL:
        raise MemoryError("audio_decode: no memory for a FLAC decoder")
    with nogil:
        for i in range(lo, hi):
            oc = 1 if mono else chans[i]
            if nul != NULL and nul[i]:
                memset(&out[0] + out_off[i] * esize, 0, <size_t>(counts[i] * oc * esize))
                status[i] = 0
                continue
            a, b = offsets[i], offsets[i + 1]
            ex = exp[i] if exp != NULL else -1
            s = ra_decode_one(dec, &data[0] + a if data_len else NULL, b - a, ex, chans[i],
                              starts[i], counts[i], mono, otype, &out[0] + out_off[i] * esize,
                              inf + i * _INFO if inf != NULL else NULL)
            status[i] = <uint8_t>s
            if s != 0:
                failed += 1
        FLAC__stream_decoder_delete(dec)
    return failed


def flac_encode(const int32_t[::1] samples not None, int64_t frames, int channels, int bits,
                uint32_t rate, int level, uint8_t[::1] out not None):
    """Encode ``frames`` interleaved frames of ``channels`` integer samples of ``bits`` bits
    (``samples``, ``frames * channels`` int32) at ``rate`` Hz, libFLAC compression ``level``
    (0-8), into ``out``; returns the bytes written, or -1 (``out`` too small), -2 (no memory),
    -3 (libFLAC refused the settings or the samples). Releases the GIL."""
    cdef int64_t r
    if channels < 1 or channels > 8 or bits < 4 or bits > 32 or level < 0 or level > 8:
        raise ValueError("flac_encode: bad channels, bits or level")
    if frames < 0 or samples.shape[0] < frames * channels:
        raise ValueError("flac_encode: fewer samples than frames * channels")
    if rate < 1 or rate > 1048575:
        raise ValueError("flac_encode: sample rate must be 1..1048575")
    with nogil:
        r = ra_flac_encode(&samples[0] if samples.shape[0] else NULL, frames, channels, bits,
                           rate, level, &out[0] if out.shape[0] else NULL, out.shape[0])
    return r
