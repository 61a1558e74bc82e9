# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""JPEG decoding of a batch of images into one ``(n, H, W[, C])`` uint8 array, without the GIL:
with a decode-time crop, DCT scale and resize (``jpeg_decode_batch``: ``jpeg`` fields read
through an image op, ``rowstore.reader.image_ops``), or whole, each image the array's size
(``jpeg_decode_whole``: the ``jpeg`` codec's decode).

Per image (``_jpeg_impl.h``, libjpeg-turbo's libjpeg API): the header gives the size; the op
and the image's 64-bit key give the crop and flip; the smallest DCT scale (1/8, 1/4, 1/2, 1)
that keeps the crop at or above the output size is chosen (``scale_num/scale_denom``); only
the crop's columns (``jpeg_crop_scanline``) and rows (``jpeg_skip_scanlines``, then the rows
the filter reads) are decoded; a separable triangle filter resizes the crop to the output,
mirrored for a flip: Pillow's bilinear (antialiased when shrinking) in Pillow 13's arithmetic
and pass order, so at DCT scale 1 the pixels are ``Image.resize(box=..., reducing_gap=None)``'s
to the bit (AVX2 where the CPU has it, the same integers as the plain C: ``jpeg_simd``).
libjpeg errors and warnings (corrupt data) return to a setjmp point as a status code: the
kernel never raises for the bytes of an image and never aborts. libjpeg's own memory per
image is bounded by ``max_work``: a progressive or multi-scan image whose coefficient buffer
would exceed it is refused (``JPEG_TOO_LARGE``) before it is allocated.
"""

from libc.stdint cimport int64_t, uint8_t, uint64_t
from libc.string cimport memset

cdef extern from "_jpeg_impl.h" nogil:
    ctypedef struct rj_op:
        int mode
        int out_h, out_w, channels
        double scale_lo, scale_hi, logr_lo, logr_hi
        double fraction
        double flip_p
        int64_t max_bytes
        int64_t max_work
        int max_denom
    ctypedef struct rj_scratch:
        pass
    int RJ_INFO
    int rj_decode_one(const uint8_t* p, int64_t n, const rj_op* op, uint64_t key, uint8_t* out,
                      rj_scratch* s, double* info)
    int rj_decode_whole(const uint8_t* p, int64_t n, int64_t h, int64_t w, int c,
                        int64_t max_work, uint8_t* out)
    void rj_scratch_free(rj_scratch* s)
    int rj_set_simd(int enabled)
    int rj_use_simd()

#: status codes, one per image (0: decoded, or null and zeroed)
JPEG_OK = 0
JPEG_CORRUPT = 1      # not a JPEG, or damaged (libjpeg error or warning)
JPEG_UNSUPPORTED = 2  # 12-bit, arithmetic-coded, or components libjpeg cannot name
JPEG_NOMEM = 3        # a scratch buffer could not be allocated
JPEG_TOO_LARGE = 4    # the decoded crop would exceed max_bytes, or libjpeg's memory max_work
JPEG_SIZE = 5         # jpeg_decode_whole: the image is not the output's size

#: modes
MODE_RESIZE = 0
MODE_CENTER = 1
MODE_RRC = 2

#: float64s per image of ``info``: h, w, y0, x0, crop_h, crop_w, flip, DCT denominator (the
#: crop in source pixels: whole, but for CenterCrop's torchvision box)
INFO = 8
cdef int _INFO = 8

cdef uint64_t _GOLDEN = 0xD1B54A32D192ED03ULL


def jpeg_simd(enabled=None):
    """Whether ``jpeg_decode_batch``'s resize uses its AVX2 code (where the CPU has it);
    ``enabled`` False forces the plain C code, True restores the choice by the CPU. Both
    compute the same integers."""
    if enabled is not None:
        return bool(rj_set_simd(1 if enabled else 0))
    return bool(rj_use_simd())


def jpeg_decode_batch(const uint8_t[::1] data not None, const int64_t[::1] offsets not None,
                      const uint8_t[::1] nulls, const int64_t[::1] rows not None,
                      uint64_t base, uint8_t[::1] out not None, int out_h, int out_w,
                      int channels, int mode, double scale_lo, double scale_hi, double logr_lo,
                      double logr_hi, double fraction, double flip_p, int64_t max_bytes,
                      int64_t max_work, Py_ssize_t lo, Py_ssize_t hi,
                      uint8_t[::1] status not None, double[:, ::1] info, int max_denom=8):
    """Decode images ``lo..hi`` of a batch: image i is ``data[offsets[i]:offsets[i + 1]]``,
    its key ``base + rows[i] * 0xD1B54A32D192ED03`` (mod 2**64: the SplitMix64 state its crop
    and flip are drawn from), its output ``out[i * out_h * out_w * channels:]`` (``out`` holds
    the whole batch). Null images (``nulls[i]`` nonzero; ``nulls`` uint8 or None) are zeroed.
    ``status[i]`` receives a code per image (``JPEG_OK`` ...; a failed image's slot is
    unspecified), ``info[i]`` (None, or ``n x INFO`` float64) what was done. ``max_bytes``: the
    most bytes of decoded crop per image; ``max_work``: the most bytes libjpeg may allocate per
    image; ``max_denom``: the largest DCT scale denominator (8, 4, 2; 1: no DCT scaling, the
    whole image decoded at full scale before the resize). Returns the number of images not
    decoded."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    cdef int64_t value_bytes, a, b, data_len = data.shape[0]
    cdef const uint8_t* nul = NULL
    cdef double* inf = NULL
    cdef rj_scratch scratch
    cdef rj_op op
    cdef int s
    cdef Py_ssize_t failed = 0
    if channels != 1 and channels != 3:
        raise ValueError("jpeg_decode_batch: channels must be 1 or 3")
    if out_h < 1 or out_w < 1 or out_h > 65535 or out_w > 65535:
        raise ValueError("jpeg_decode_batch: output size must be 1..65535 each way")
    if mode not in (MODE_RESIZE, MODE_CENTER, MODE_RRC):
        raise ValueError("jpeg_decode_batch: unknown mode")
    if mode == MODE_RRC and not (0 < scale_lo <= scale_hi <= 1 and logr_lo <= logr_hi):
        raise ValueError("jpeg_decode_batch: bad scale or ratio range")
    if mode == MODE_CENTER and not (0 < fraction <= 1):
        raise ValueError("jpeg_decode_batch: fraction must be in (0, 1]")
    if max_bytes < 1 or max_work < 1:
        raise ValueError("jpeg_decode_batch: max_bytes and max_work must be positive")
    if n < 0 or lo < 0 or hi < lo or hi > n or status.shape[0] < n or rows.shape[0] < n:
        raise ValueError("jpeg_decode_batch: bad range, rows or status array")
    value_bytes = <int64_t>out_h * out_w * channels
    if out.shape[0] // value_bytes < n:
        raise ValueError("jpeg_decode_batch: out holds fewer bytes than the batch's images")
    if nulls is not None:
        if nulls.shape[0] < n:
            raise ValueError("jpeg_decode_batch: nulls shorter than the batch")
        nul = &nulls[0] if n else NULL
    if info is not None:
        if info.shape[0] < n or info.shape[1] != _INFO:
            raise ValueError("jpeg_decode_batch: info must be n x INFO")
        inf = &info[0, 0] if n else NULL
    if hi == lo:
        return 0
    for i in range(lo, hi + 1):
        a = offsets[i]
        if a < 0 or a > data_len or (i > lo and a < offsets[i - 1]):
            raise ValueError("jpeg_decode_batch: offsets outside the data")
    op.mode = mode
    op.out_h = out_h
    op.out_w = out_w
    op.channels = channels
    op.scale_lo = scale_lo
    op.scale_hi = scale_hi
    op.logr_lo = logr_lo
    op.logr_hi = logr_hi
    op.fraction = fraction
    op.flip_p = flip_p
    op.max_bytes = max_bytes
    op.max_work = max_work
    op.max_denom = max_denom
    memset(&scratch, 0, sizeof(scratch))
    with nogil:
        for i in range(lo, hi):
            if nul != NULL and nul[i]:
                memset(&out[0] + i * value_bytes, 0, <size_t>value_bytes)
                status[i] = 0
                continue
            a, b = offsets[i], offsets[i + 1]
            s = rj_decode_one(&data[0] + a if data_len else NULL, b - a, &op,
                              base + <uint64_t>rows[i] * _GOLDEN, &out[0] + i * value_bytes,
                              &scratch, inf + i * _INFO if inf != NULL else NULL)
            status[i] = <uint8_t>s
            if s != 0:
                failed += 1
        rj_scratch_free(&scratch)
    return failed


def jpeg_decode_whole(const uint8_t[::1] data not None, const int64_t[::1] offsets not None,
                      const uint8_t[::1] nulls, uint8_t[::1] out not None, int64_t height,
                      int64_t width, int channels, int64_t max_work, Py_ssize_t lo,
                      Py_ssize_t hi, uint8_t[::1] status not None):
    """Decode images ``lo..hi`` of a batch whole, at full scale: image i is
    ``data[offsets[i]:offsets[i + 1]]``, a ``height x width`` JPEG of any components, decoded
    to ``channels`` (1 grey, 3 RGB: as PIL's ``convert("L")``/``("RGB")``) straight into
    ``out[i * height * width * channels:]``.
    Null images (``nulls[i]`` nonzero; ``nulls`` uint8 or None) are skipped. ``status[i]``
    receives a code per image (``JPEG_SIZE`` for an image of another size; a failed image's
    slot is partly written); libjpeg's memory per image is bounded by ``max_work``. Returns
    the number of images not decoded."""
    cdef Py_ssize_t n = offsets.shape[0] - 1, i
    cdef int64_t value_bytes, a, b, data_len = data.shape[0]
    cdef const uint8_t* nul = NULL
    cdef int s
    cdef Py_ssize_t failed = 0
    if channels != 1 and channels != 3:
        raise ValueError("jpeg_decode_whole: channels must be 1 or 3")
    if height < 1 or width < 1 or height > 65535 or width > 65535:
        raise ValueError("jpeg_decode_whole: image size must be 1..65535 each way")
    if max_work < 1:
        raise ValueError("jpeg_decode_whole: max_work must be positive")
    if n < 0 or lo < 0 or hi < lo or hi > n or status.shape[0] < n:
        raise ValueError("jpeg_decode_whole: bad range or status array")
    value_bytes = height * width * channels
    if out.shape[0] // value_bytes < n:
        raise ValueError("jpeg_decode_whole: out holds fewer bytes than the batch's images")
    if nulls is not None:
        if nulls.shape[0] < n:
            raise ValueError("jpeg_decode_whole: nulls shorter than the batch")
        nul = &nulls[0] if n else NULL
    if hi == lo:
        return 0
    for i in range(lo, hi + 1):
        a = offsets[i]
        if a < 0 or a > data_len or (i > lo and a < offsets[i - 1]):
            raise ValueError("jpeg_decode_whole: offsets outside the data")
    with nogil:
        for i in range(lo, hi):
            if nul != NULL and nul[i]:
                status[i] = 0
                continue
            a, b = offsets[i], offsets[i + 1]
            s = rj_decode_whole(&data[0] + a if data_len else NULL, b - a, height, width,
                                channels, max_work, &out[0] + i * value_bytes)
            status[i] = <uint8_t>s
            if s != 0:
                failed += 1
    return failed
