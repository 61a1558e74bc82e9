# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Per-row packing of Python values: the fast path of ``Writer.write(dict)``.

The one kernel that sees objects: :meth:`RowPlan.pack` reads a ``dict`` of Python values and
stores them into a pending row slot of the writer's row buffer (and heap payloads into its
``bytearray`` heap), with the GIL held. It never raises for a value and never words an error:
it accepts only values whose type is exactly the one it knows how to store (``int`` into an
integer field within its range, ``float`` into float32/float64 that stays finite, ``bool``,
the field's own numpy scalar type, a C-contiguous ``ndarray`` of the field's dtype and shape,
``str``, ``bytes``), each stored exactly as the Python path (``validate.check_value`` then
``RowPacker._store``) stores it. For any other row (a missing or extra key, a ``None``, a list,
another dtype, a value out of range or too large) it *declines*: it puts the heap back as it
was, zeroes the slot and returns -1, and the caller takes the Python path, which validates
the row in full and words the error. So a bad row costs this path nothing but its own time.

Plan and buffers. A :class:`RowPlan` is built once per schema from plain descriptors (see
``rowstore/format/_pack.py``) and checks each against the row size, so no store can leave the
slot. It holds the row buffer's ``Py_buffer`` (:meth:`RowPlan.set_rows`, writeable,
C-contiguous) until the next ``set_rows`` or its own end, so the memory cannot move while it
may be written; each ``pack`` checks the slot index against it.
"""

cimport numpy as cnp
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_CheckExact, PyDict_Size
from cpython.exc cimport PyErr_Clear
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.long cimport PyLong_CheckExact
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_CheckExact
from libc.float cimport FLT_MAX
from libc.math cimport fabs, isfinite
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

cnp.import_array()


cdef extern from "Python.h":
    # Declared here without Cython's error checks: a failure declines (the error is cleared).
    PyObject* PyDict_GetItem(object d, object key)
    int PyDict_Next(object d, Py_ssize_t* ppos, PyObject** key, PyObject** value)
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size)
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow)
    int PyByteArray_Resize(object ba, Py_ssize_t size)
    PyObject* PyErr_Occurred()
    PyObject* PyUnicode_AsUTF8String(object s)
    bint PyUnicode_IS_ASCII(object s)
    void Py_DECREF(PyObject* o)


cpdef enum RowKind:
    K_INT = 1     # signed integer scalar: Python int in [lo, hi], or the field's numpy scalar
    K_UINT = 2    # unsigned integer scalar: the same, lo = 0
    K_FLOAT = 3   # float32/float64 scalar: Python float (finite values stay finite), or numpy scalar
    K_BOOL = 4    # bool scalar: True/False, or numpy.bool_
    K_ARRAY = 5   # fixed-shape raw array (ndim >= 1): an exact ndarray of the dtype and shape
    K_STR = 6     # heap: str, its UTF-8 bytes
    K_BYTES = 7   # heap: bytes
    K_VARRAY = 8  # heap: raw array with variable dimensions (their sizes stored as uint32)


cdef struct FieldPlan:
    int kind
    Py_ssize_t offset       # of the value (or heap reference) in the row
    Py_ssize_t null_offset  # of the null flag, -1 for a field that is not nullable
    Py_ssize_t size         # scalar itemsize, fixed array nbytes, element itemsize (K_VARRAY)
    long long lo
    long long hi
    int ndim                # K_ARRAY, K_VARRAY
    Py_ssize_t dims         # index of the field's first dimension in RowPlan._dims (-1: variable)
    Py_ssize_t shape_offset  # K_VARRAY: the uint32 sizes of the variable dimensions
    PyObject* name          # borrowed: RowPlan._keep holds them
    PyObject* scalar_type
    PyObject* descr


cdef class RowPlan:
    """How each field of a schema is stored by the fast path; see the module docstring.

    ``fields``: one tuple per schema field, in order: ``(name, kind, offset, null_offset, size,
    lo, hi, dtype, scalar_type, dims, shape_offset)`` (``dims``: the field's shape, -1 for a
    variable dimension); ``row_size``: bytes of a stored row; ``max_value``, ``max_heap``: the
    format's limits on one payload and on the heap.
    """

    cdef FieldPlan* _f
    cdef cnp.npy_intp* _dims
    cdef Py_ssize_t _n
    cdef Py_ssize_t _row_size
    cdef long long _max_value
    cdef long long _max_heap
    cdef list _keep
    cdef Py_buffer _rows
    cdef bint _held
    cdef Py_ssize_t _nslots

    def __init__(self, list fields, Py_ssize_t row_size, long long max_value, long long max_heap):
        cdef Py_ssize_t i, k, ndims = 0
        cdef FieldPlan* p
        # No __cinit__: the object's memory starts zeroed (NULL pointers, nothing held), and
        # Cython's argument-less __cinit__ wrapper computes NULL + 0 (UBSan reports it).
        if self._f != NULL:
            raise TypeError("RowPlan: already initialised")
        if row_size <= 0 or max_value < 0 or max_heap < 0:
            raise ValueError("RowPlan: row_size must be positive, the limits non-negative")
        for t in fields:
            ndims += len(t[9])
        self._f = <FieldPlan*>malloc(max(1, len(fields)) * sizeof(FieldPlan))
        self._dims = <cnp.npy_intp*>malloc(max(1, ndims) * sizeof(cnp.npy_intp))
        if self._f == NULL or self._dims == NULL:
            raise MemoryError()
        self._keep = []
        self._row_size = row_size
        self._max_value = max_value
        self._max_heap = max_heap
        k = 0
        for i, t in enumerate(fields):
            name, kind, offset, null_offset, size, lo, hi, dtype, scalar_type, dims, shape_offset = t
            p = &self._f[i]
            p.kind = kind
            p.offset = offset
            p.null_offset = null_offset
            p.size = size
            p.lo = lo
            p.hi = hi
            p.ndim = len(dims)
            p.dims = k
            for d in dims:
                self._dims[k] = d
                k += 1
            p.shape_offset = shape_offset
            if not isinstance(name, str) or (dtype is not None and not isinstance(dtype, cnp.dtype)):
                raise ValueError(f"RowPlan: field {i}: name must be a str, dtype a numpy dtype or None")
            self._keep.extend([name, scalar_type, dtype])
            p.name = <PyObject*>name
            p.scalar_type = <PyObject*>scalar_type
            p.descr = <PyObject*>dtype
            _check_field(p, self._dims, row_size, i)
            self._n = i + 1

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._rows)
        free(self._f)
        free(self._dims)

    def set_rows(self, rows):
        """Store into ``rows`` from now on (the packer's row buffer: writeable, C-contiguous,
        a whole number of rows); its buffer is held until the next call."""
        cdef Py_buffer view
        PyObject_GetBuffer(rows, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
        if view.len % self._row_size:
            PyBuffer_Release(&view)
            raise ValueError(f"RowPlan.set_rows: {view.len} bytes is not a whole number of "
                             f"{self._row_size}-byte rows")
        if self._held:
            PyBuffer_Release(&self._rows)
        self._rows = view
        self._held = True
        self._nslots = view.len // self._row_size

    def pack(self, row, Py_ssize_t slot, bytearray heap not None, long long heap_pos):
        """Store ``row`` (a ``dict``) into row slot ``slot``, its payloads appended to ``heap``
        (whose logical end is ``heap_pos``): the new ``heap_pos``, or -1 where the row is left
        to the Python path (``heap`` as it was, the slot zeroed)."""
        if not self._held or slot < 0 or slot >= self._nslots:
            return -1
        if not PyDict_CheckExact(row) or PyDict_Size(row) != self._n:
            return -1  # a missing (nullable) field, an unknown key, another mapping
        cdef uint8_t* dst = <uint8_t*>self._rows.buf + slot * self._row_size
        cdef Py_ssize_t heap_len = PyByteArray_GET_SIZE(heap)
        cdef long long pos = heap_pos
        cdef Py_ssize_t i, it = 0
        cdef PyObject* key
        cdef PyObject* item
        cdef bint in_order = True
        for i in range(self._n):
            # A dict built in schema order with the schema's (interned) names as keys is read in
            # order, without a lookup; any other key order falls back to lookups.
            item = NULL
            if in_order:
                if PyDict_Next(row, &it, &key, &item) and key == self._f[i].name:
                    pass
                else:
                    in_order = False
                    item = NULL
            if item == NULL:
                item = PyDict_GetItem(row, <object>self._f[i].name)
            if item == NULL:
                pos = -1
            else:
                pos = _pack_value(&self._f[i], self._dims, <object>item, dst, heap, pos, self._max_value,
                                  self._max_heap)
            if pos < 0:
                if PyErr_Occurred() != NULL:
                    PyErr_Clear()
                if PyByteArray_GET_SIZE(heap) != heap_len and PyByteArray_Resize(heap, heap_len) < 0:
                    PyErr_Clear()  # (shrinking fails only while the heap is exported; never here)
                memset(dst, 0, self._row_size)
                return -1
        return pos


cdef int _check_field(FieldPlan* p, cnp.npy_intp* dims, Py_ssize_t row_size, Py_ssize_t i) except -1:
    """Refuse a descriptor that could write outside the row."""
    cdef Py_ssize_t width
    if p.kind in (K_INT, K_UINT, K_FLOAT, K_BOOL):
        width = p.size
        ok = (p.size in (1, 2, 4, 8) and (p.kind != K_FLOAT or p.size in (4, 8))
              and (p.kind != K_BOOL or p.size == 1) and p.ndim == 0 and <object>p.scalar_type is not None)
    elif p.kind == K_ARRAY:
        width = p.size
        ok = p.size > 0 and p.ndim >= 1 and <object>p.descr is not None
        for k in range(p.ndim):
            ok = ok and dims[p.dims + k] >= 0
    elif p.kind in (K_STR, K_BYTES):
        width = 16
        ok = p.ndim == 0
    elif p.kind == K_VARRAY:
        width = 16
        ok = p.size > 0 and p.ndim >= 1 and <object>p.descr is not None
        nvar = 0
        for k in range(p.ndim):
            nvar += dims[p.dims + k] < 0
        ok = ok and nvar > 0 and 0 <= p.shape_offset and p.shape_offset + 4 * nvar <= row_size
    else:
        ok = False
        width = 0
    ok = ok and 0 <= p.offset and p.offset + width <= row_size
    ok = ok and (p.null_offset == -1 or 0 <= p.null_offset < row_size)
    if not ok:
        raise ValueError(f"RowPlan: field {i}: descriptor does not fit a {row_size}-byte row or its kind")
    return 0


cdef inline long long _scalar(FieldPlan* p, object v, uint8_t* dst) except -2:
    """Store a scalar value; 0 when stored, -1 to decline."""
    cdef int overflow = 0
    cdef long long x
    cdef double d
    cdef float f
    cdef uint8_t b
    cdef uint64_t raw = 0
    if type(v) is <object>p.scalar_type:  # the field's own numpy scalar type: its bytes
        cnp.PyArray_ScalarAsCtype(v, &raw)
        memcpy(dst, &raw, p.size)
        return 0
    if p.kind == K_INT or p.kind == K_UINT:
        if not PyLong_CheckExact(v):
            return -1
        x = PyLong_AsLongLongAndOverflow(v, &overflow)
        if overflow or (x == -1 and PyErr_Occurred() != NULL) or x < p.lo or x > p.hi:
            return -1
        memcpy(dst, &x, p.size)  # the low bytes of the two's complement (little-endian host)
        return 0
    if p.kind == K_FLOAT:
        if not PyFloat_CheckExact(v):
            return -1
        d = PyFloat_AS_DOUBLE(v)
        if p.size == 8:
            memcpy(dst, &d, 8)
            return 0
        if isfinite(d) and fabs(d) > <double>FLT_MAX:
            return -1  # would become inf in float32: check_value refuses it
        f = <float>d
        memcpy(dst, &f, 4)
        return 0
    if v is True or v is False:  # K_BOOL
        b = 1 if v is True else 0
        dst[0] = b
        return 0
    return -1


cdef inline bint _same_array(FieldPlan* p, cnp.npy_intp* dims, object v, bint variable):
    """An exact ndarray of the field's dtype and shape, C-contiguous."""
    if not cnp.PyArray_CheckExact(v):
        return False
    cdef cnp.ndarray arr = <cnp.ndarray>v
    cdef cnp.PyArray_Descr* descr = cnp.PyArray_DESCR(arr)
    if <PyObject*>descr != p.descr and not cnp.PyArray_EquivTypes(<cnp.dtype>descr, <cnp.dtype>p.descr):
        return False
    if cnp.PyArray_NDIM(arr) != p.ndim or not cnp.PyArray_IS_C_CONTIGUOUS(arr):
        return False
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(arr)
    cdef int k
    cdef cnp.npy_intp want
    for k in range(p.ndim):
        want = dims[p.dims + k]
        if want >= 0:
            if shape[k] != want:
                return False
        elif not variable or shape[k] > 0xFFFFFFFF:
            return False
    return True


cdef inline long long _heap_append(bytearray heap, const char* data, Py_ssize_t n, uint8_t* ref,
                                   long long pos, long long max_value, long long max_heap) except -2:
    """Append a payload to the heap and store its reference; the new heap position, or -1."""
    cdef uint64_t off = <uint64_t>pos
    cdef uint64_t nb = <uint64_t>n
    cdef Py_ssize_t old
    if n > max_value or pos > max_heap - n:
        return -1
    if n:
        old = PyByteArray_GET_SIZE(heap)
        if PyByteArray_Resize(heap, old + n) < 0:
            return -1
        memcpy(PyByteArray_AS_STRING(heap) + old, data, n)
    memcpy(ref, &off, 8)
    memcpy(ref + 8, &nb, 8)
    return pos + n


cdef long long _pack_value(FieldPlan* p, cnp.npy_intp* dims, object v, uint8_t* dst, bytearray heap,
                           long long pos, long long max_value, long long max_heap) except -2:
    """Store one field's value ``v``: the new heap position, or -1 to decline."""
    cdef Py_ssize_t n
    cdef const char* data
    cdef cnp.ndarray arr
    cdef int k, j
    cdef uint32_t s
    cdef PyObject* enc
    if p.null_offset >= 0:
        if v is None:
            return -1
        dst[p.null_offset] = 0
    if p.kind <= K_BOOL:
        return -1 if _scalar(p, v, dst + p.offset) < 0 else pos
    if p.kind == K_ARRAY:
        if not _same_array(p, dims, v, False):
            return -1
        arr = <cnp.ndarray>v
        if cnp.PyArray_NBYTES(arr) != p.size:
            return -1
        memcpy(dst + p.offset, cnp.PyArray_DATA(arr), p.size)
        return pos
    if p.kind == K_STR:
        if not PyUnicode_CheckExact(v):
            return -1
        if PyUnicode_IS_ASCII(v):  # its own bytes (nothing cached in the str)
            data = PyUnicode_AsUTF8AndSize(v, &n)
            if data == NULL:
                return -1
            return _heap_append(heap, data, n, dst + p.offset, pos, max_value, max_heap)
        enc = PyUnicode_AsUTF8String(v)  # NULL for lone surrogates: the Python path words it
        if enc == NULL:
            return -1
        pos = _heap_append(heap, PyBytes_AS_STRING(<object>enc), PyBytes_GET_SIZE(<object>enc),
                           dst + p.offset, pos, max_value, max_heap)
        Py_DECREF(enc)
        return pos
    if p.kind == K_BYTES:
        if not PyBytes_CheckExact(v):
            return -1
        return _heap_append(heap, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v), dst + p.offset, pos,
                            max_value, max_heap)
    if p.kind == K_VARRAY:
        if not _same_array(p, dims, v, True):
            return -1
        arr = <cnp.ndarray>v
        pos = _heap_append(heap, <const char*>cnp.PyArray_DATA(arr), cnp.PyArray_NBYTES(arr),
                           dst + p.offset, pos, max_value, max_heap)
        if pos < 0:
            return -1
        j = 0
        for k in range(p.ndim):
            if dims[p.dims + k] < 0:
                s = <uint32_t>cnp.PyArray_DIMS(arr)[k]
                memcpy(dst + p.shape_offset + 4 * j, &s, 4)
                j += 1
        return pos
    return -1
