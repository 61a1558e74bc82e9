# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""The shuffle of epoch orders: Fisher-Yates on SplitMix64, without the GIL.

``rowstore.reader.order.shuffle_reference`` is the same algorithm in Python; the order is a pure
function of the seed (no hidden state).
"""

from libc.stdint cimport int64_t, uint64_t


cdef inline uint64_t _splitmix64(uint64_t* state) noexcept nogil:
    cdef uint64_t z
    state[0] += 0x9E3779B97F4A7C15ULL
    z = state[0]
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef extern from *:
    """
    static inline unsigned long long rowstore_mulhi64(unsigned long long a, unsigned long long b) {
        return (unsigned long long)(((unsigned __int128)a * b) >> 64);
    }
    static inline unsigned long long rowstore_mullo64(unsigned long long a, unsigned long long b) {
        return a * b;
    }
    """
    unsigned long long rowstore_mulhi64(unsigned long long a, unsigned long long b) nogil
    unsigned long long rowstore_mullo64(unsigned long long a, unsigned long long b) nogil


cdef inline uint64_t _bounded(uint64_t* state, uint64_t bound) noexcept nogil:
    """Uniform integer in [0, bound) by Lemire's multiply-shift with rejection (unbiased)."""
    cdef uint64_t x = _splitmix64(state)
    cdef uint64_t lo = rowstore_mullo64(x, bound)
    cdef uint64_t threshold
    if lo < bound:
        threshold = (0 - bound) % bound
        while lo < threshold:
            x = _splitmix64(state)
            lo = rowstore_mullo64(x, bound)
    return rowstore_mulhi64(x, bound)


def shuffle(int64_t[::1] a not None, uint64_t seed):
    """Fisher-Yates shuffle of ``a`` in place, driven by SplitMix64 from ``seed`` (GIL released).

    For i = n-1 down to 1: j = bounded(i + 1) (Lemire's method on SplitMix64 outputs); swap a[i],
    a[j]. ``rowstore.reader.order.shuffle_reference`` is the same algorithm in Python.
    """
    cdef Py_ssize_t i, n = a.shape[0]
    cdef uint64_t state = seed, j
    cdef int64_t t
    with nogil:
        i = n - 1
        while i > 0:
            j = _bounded(&state, <uint64_t>(i + 1))
            t = a[i]
            a[i] = a[j]
            a[j] = t
            i -= 1


def fill_runs(const int64_t[::1] starts not None, const int64_t[::1] counts not None,
              int64_t[::1] out not None):
    """Write run i, ``counts[i]`` consecutive values from ``starts[i]``, into ``out``, the runs
    back to back from ``out[0]`` (what ``np.repeat(starts - first, counts) + np.arange(n)``
    makes, without its temporaries); returns the values written. Refuses (``ValueError``,
    nothing promised of ``out``) a negative count or runs that do not fit in ``out``."""
    cdef Py_ssize_t i, k = 0, m = starts.shape[0], n = out.shape[0]
    cdef int64_t j, c, s
    cdef bint bad = False
    if counts.shape[0] != m:
        raise ValueError("fill_runs: starts and counts differ in length")
    with nogil:
        for i in range(m):
            c = counts[i]
            if c < 0 or c > n - k:
                bad = True
                break
            s = starts[i]
            for j in range(c):
                out[k + j] = s + j
            k += c
    if bad:
        raise ValueError("fill_runs: a count is negative or the runs do not fit in out")
    return k
