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

from libc.math cimport isinf, isnan
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


cdef inline int64_t _floor(double t) noexcept nogil:
    cdef int64_t b = <int64_t>t
    return b - 1 if t < <double>b else b


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
):
    """The sum of squared deviations of the finite elements from ``mean``; adds each one's bin
    ``floor(v * scale) - base`` to ``bins`` (if it has any entries) and, for integers, its
    value ``v - lo`` to ``values`` (if it has any entries)."""
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
