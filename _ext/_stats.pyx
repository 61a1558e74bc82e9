# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Statistics of a column of packed rows, without the GIL: the writer's per-block summary.

A column is a strided 2-D view ``(rows, elements per row)`` of the writer's row buffer (the
field of a structured array, reshaped), read where it lies: no copy. Two passes over it, the
block being in cache after the first:

* :func:`moments1`: NaN and infinite elements (NaT for times), the finite ones' count, minimum,
  maximum and sum;
* :func:`moments2`: given their mean and a histogram's bins (power-of-two width ``2**exp``:
  the caller passes ``scale = 2**-exp`` and the first bin index ``base``), the sum of squared
  deviations from the mean (two-pass variance) and the count per bin, and optionally the count
  per integer value ``lo + k`` (small ranges).

Rows whose ``skip`` flag is non-zero (nulls) are left out. Bin and value indexes are clamped to
the arrays given, so no input writes outside them.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.math cimport isinf, isnan
from libc.string cimport memcpy
from libc.stdint cimport INT64_MIN, int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

ctypedef fused num:
    float
    double
    int8_t
    int16_t
    int32_t
    int64_t
    uint8_t
    uint16_t
    uint32_t
    uint64_t

cdef int64_t NAT = INT64_MIN
cdef enum:
    MAX_LOCAL_BINS = 64


def moments1(num[:, :] x, const uint8_t[:] skip, bint has_skip, bint is_time):
    """``(nan, inf, finite, min, max, sum)`` of the elements of ``x`` (rows with ``skip`` set
    left out); min and max are None without finite elements."""
    cdef Py_ssize_t n = x.shape[0], k = x.shape[1], i, j
    cdef int64_t nan = 0, inf = 0, fin = 0
    cdef double total = 0.0, part
    cdef num v, lo = 0, hi = 0
    cdef bint floating = num is float or num is double
    cdef bint seen = False
    if has_skip and skip.shape[0] < n:
        raise ValueError("moments1: skip is shorter than the column")
    with nogil:
        for i in range(n):
            if has_skip and skip[i]:
                continue
            part = 0.0
            for j in range(k):
                v = x[i, j]
                if floating:
                    if isnan(<double>v):
                        nan += 1
                        continue
                    if isinf(<double>v):
                        inf += 1
                        continue
                elif num is int64_t:
                    if is_time and v == NAT:
                        nan += 1
                        continue
                if not seen:
                    lo = v
                    hi = v
                    seen = True
                elif v < lo:
                    lo = v
                elif v > hi:
                    hi = v
                part += <double>v
                fin += 1
            total += part
    if not seen:
        return nan, inf, 0, None, None, 0.0
    return nan, inf, fin, lo, hi, total


def moments1_quick(num[:, :] x):
    """``(min, max, sum)`` of all the elements of ``x``, unchecked: right when no element is
    NaN, infinite or NaT, which a finite sum (and a minimum that is no NaT) shows; else the
    caller asks :func:`moments1`. ``x`` has at least one element. Four independent lanes (the
    loop waits on no one comparison or addition before the next)."""
    cdef Py_ssize_t n = x.shape[0], k = x.shape[1], i, j
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef num v0, v1, v2, v3, l0, l1, l2, l3, h0, h1, h2, h3
    cdef const num* row
    cdef bint inner = x.strides[1] == sizeof(num)
    if n == 0 or k == 0:
        raise ValueError("moments1_quick: an empty column")
    l0 = x[0, 0]
    l1 = l2 = l3 = h0 = h1 = h2 = h3 = l0
    with nogil:
        for i in range(n):
            j = 0
            if inner:
                row = &x[i, 0]
                while j + 4 <= k:
                    v0 = row[j]
                    v1 = row[j + 1]
                    v2 = row[j + 2]
                    v3 = row[j + 3]
                    l0 = v0 if v0 < l0 else l0
                    l1 = v1 if v1 < l1 else l1
                    l2 = v2 if v2 < l2 else l2
                    l3 = v3 if v3 < l3 else l3
                    h0 = v0 if v0 > h0 else h0
                    h1 = v1 if v1 > h1 else h1
                    h2 = v2 if v2 > h2 else h2
                    h3 = v3 if v3 > h3 else h3
                    s0 += <double>v0
                    s1 += <double>v1
                    s2 += <double>v2
                    s3 += <double>v3
                    j += 4
            while j < k:
                v0 = x[i, j]
                l0 = v0 if v0 < l0 else l0
                h0 = v0 if v0 > h0 else h0
                s0 += <double>v0
                j += 1
    l0 = l1 if l1 < l0 else l0
    l2 = l3 if l3 < l2 else l2
    l0 = l2 if l2 < l0 else l0
    h0 = h1 if h1 > h0 else h0
    h2 = h3 if h3 > h2 else h2
    h0 = h2 if h2 > h0 else h0
    return l0, h0, (s0 + s1) + (s2 + s3)


cdef inline int64_t _floor(double t) noexcept nogil:
    cdef int64_t b = <int64_t>t
    return b - 1 if t < <double>b else b


cdef inline int64_t _bin(double w, double scale, int64_t base, Py_ssize_t nb) noexcept nogil:
    cdef int64_t b = _floor(w * scale) - base
    if b < 0:
        return 0
    if b >= nb:
        return nb - 1
    return b


cdef inline double _clean_row(
    const num* row, Py_ssize_t k, double mean, double scale, int64_t base, Py_ssize_t nb,
    int64_t* local,
) noexcept nogil:
    """moments2's loop over one row of ``k`` contiguous elements, none NaN, infinite or NaT:
    its squared deviations' sum; its bins added to the four interleaved copies ``local``
    (four elements at a time, in four independent lanes)."""
    cdef double p0 = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0, w0, w1, w2, w3
    cdef int64_t* l1 = local + nb
    cdef int64_t* l2 = local + 2 * nb
    cdef int64_t* l3 = local + 3 * nb
    cdef Py_ssize_t j = 0
    while j + 4 <= k:
        w0 = <double>row[j]
        w1 = <double>row[j + 1]
        w2 = <double>row[j + 2]
        w3 = <double>row[j + 3]
        p0 += (w0 - mean) * (w0 - mean)
        p1 += (w1 - mean) * (w1 - mean)
        p2 += (w2 - mean) * (w2 - mean)
        p3 += (w3 - mean) * (w3 - mean)
        local[_bin(w0, scale, base, nb)] += 1
        l1[_bin(w1, scale, base, nb)] += 1
        l2[_bin(w2, scale, base, nb)] += 1
        l3[_bin(w3, scale, base, nb)] += 1
        j += 4
    while j < k:
        w0 = <double>row[j]
        p0 += (w0 - mean) * (w0 - mean)
        local[_bin(w0, scale, base, nb)] += 1
        j += 1
    return (p0 + p1) + (p2 + p3)


def moments2(
    num[:, :] x,
    const uint8_t[:] skip,
    bint has_skip,
    bint is_time,
    double mean,
    double scale,
    int64_t base,
    int64_t[:] bins,
    int64_t lo,
    int64_t[:] values,
    bint clean=False,
):
    """The sum of squared deviations of the finite elements from ``mean``; adds each one's bin
    ``floor(v * scale) - base`` to ``bins`` (if it has any entries) and, for integers, its
    value ``v - lo`` to ``values`` (if it has any entries). ``clean``: the caller knows that no
    element is NaN, infinite or NaT (a tighter loop then, for rows of contiguous elements)."""
    cdef Py_ssize_t n = x.shape[0], k = x.shape[1], i, j
    cdef Py_ssize_t nb = bins.shape[0], nv = values.shape[0]
    cdef double m2 = 0.0, d, p0, p1, t
    cdef int64_t b
    cdef num v
    cdef num* row
    cdef int64_t* hist = &bins[0] if nb else NULL
    # four interleaved copies of the bins (merged at the end): consecutive elements in one bin
    # do not wait on each other's increment
    cdef int64_t local[4 * MAX_LOCAL_BINS]
    cdef bint split = 0 < nb <= MAX_LOCAL_BINS
    cdef Py_ssize_t q
    cdef bint floating = num is float or num is double
    cdef bint inner = k == 0 or x.strides[1] == sizeof(num)
    if has_skip and skip.shape[0] < n:
        raise ValueError("moments2: skip is shorter than the column")
    row = NULL
    with nogil:
        if split:
            for q in range(4 * nb):
                local[q] = 0
        if clean and inner and split and not nv and k:
            for i in range(n):
                if has_skip and skip[i]:
                    continue
                m2 += _clean_row(&x[i, 0], k, mean, scale, base, nb, local)
            n = 0  # done
        for i in range(n):
            if has_skip and skip[i]:
                continue
            p0 = 0.0
            p1 = 0.0
            if inner and k:
                row = &x[i, 0]
            for j in range(k):
                v = row[j] if inner else x[i, j]
                if floating:
                    if isnan(<double>v) or isinf(<double>v):
                        continue
                elif num is int64_t:
                    if is_time and v == NAT:
                        continue
                d = <double>v - mean
                if j & 1:
                    p1 += d * d
                else:
                    p0 += d * d
                if nb:
                    t = <double>v * scale
                    b = _floor(t) - base
                    if b < 0:
                        b = 0
                    elif b >= nb:
                        b = nb - 1
                    if split:
                        local[(j & 3) * nb + b] += 1
                    else:
                        hist[b] += 1
                if nv and not floating:
                    if num is uint64_t:
                        b = <int64_t>(v - <uint64_t>lo)
                    else:
                        b = <int64_t>v - lo
                    if 0 <= b < nv:
                        values[b] += 1
            m2 += p0 + p1
        if split:
            for q in range(nb):
                hist[q] += local[q] + local[nb + q] + local[2 * nb + q] + local[3 * nb + q]
    return m2


def gather(const uint8_t[:] heap, const int64_t[:] offsets, const int64_t[:] nbytes, uint8_t[:] out):
    """Copy the payloads ``heap[offsets[i] : offsets[i] + nbytes[i]]`` one after another into
    ``out``; returns the bytes copied. Raises ValueError for a payload outside ``heap`` or one
    that does not fit ``out`` (nothing is read or written outside them)."""
    cdef Py_ssize_t n = offsets.shape[0], m = heap.shape[0], cap = out.shape[0], i
    cdef int64_t a, b, at = 0
    if nbytes.shape[0] < n:
        raise ValueError("gather: nbytes is shorter than offsets")
    for i in range(n):
        a = offsets[i]
        b = nbytes[i]
        if a < 0 or b < 0 or a > m or b > m - a or b > cap - at:
            raise ValueError(f"gather: payload {i} ({a}, {b} bytes) outside the heap or output")
        at += b
    at = 0
    with nogil:
        for i in range(n):
            b = nbytes[i]
            if b:
                memcpy(&out[at], &heap[offsets[i]], <size_t>b)
                at += b
    return at


def count_payloads(
    const uint8_t[:] heap,
    const int64_t[:] offsets,
    const int64_t[:] nbytes,
    dict counts,
    Py_ssize_t limit,
):
    """Add one to ``counts[payload bytes]`` for each payload ``heap[offsets[i] : offsets[i] +
    nbytes[i]]``; stops and returns False as soon as ``counts`` holds more than ``limit``
    keys (True otherwise). Raises ValueError for a payload outside ``heap``."""
    cdef Py_ssize_t n = offsets.shape[0], m = heap.shape[0], i
    cdef int64_t a, b
    cdef const char* base = <const char*>&heap[0] if m else NULL
    cdef bytes key
    cdef object c
    if nbytes.shape[0] < n:
        raise ValueError("count_payloads: nbytes is shorter than offsets")
    for i in range(n):
        a = offsets[i]
        b = nbytes[i]
        if a < 0 or b < 0 or a > m or b > m - a:
            raise ValueError(f"count_payloads: payload {i} ({a}, {b} bytes) outside the heap")
        key = PyBytes_FromStringAndSize(base + a, b) if b else b""
        c = counts.get(key)
        counts[key] = 1 if c is None else c + 1
        if len(counts) > limit:
            return False
    return True
