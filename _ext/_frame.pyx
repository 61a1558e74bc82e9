# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# cython: initializedcheck=False, nonecheck=False
"""Stored chunks: read, verify (CRC-32), check the Blosc2 header, decompress; and compress.

Everything here that needs libblosc2 (linked statically, this module only). A compressed chunk
is a single-chunk Blosc2 frame (what HDF5 filter 32026 stores): a msgpack header, one ordinary
Blosc2 chunk, a trailer. Before a chunk reaches ``blosc2_decompress_ctx`` its header is compared
with the compression the file declares (:func:`_check_chunk`): c-blosc2 resolves user-defined
codec and filter ids by loading plugins, so the bytes of a file must not choose them. Failures
are return codes (``_common.KernelCode``) in ``err``; ``rowstore/kernels.py`` words them.
"""

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from _common cimport (
    E_CHECKSUM, E_CODEC, E_DECOMPRESS, E_DEST, E_FRAME, E_NOMEM, E_SHORT, E_SIZE, _errbuf, _fail, _fits,
    _pread_full,
)
from libblosc2 cimport (
    BLOSC2_CHUNK_BLOCKSIZE, BLOSC2_CHUNK_BLOSC2_FLAGS, BLOSC2_CHUNK_BLOSC2_FLAGS2, BLOSC2_CHUNK_CBYTES,
    BLOSC2_CHUNK_FILTER_CODES, BLOSC2_CHUNK_FILTER_META, BLOSC2_CHUNK_FLAGS, BLOSC2_CHUNK_NBYTES,
    BLOSC2_CHUNK_VERSION, BLOSC2_CHUNK_VERSIONLZ, BLOSC2_CPARAMS_DEFAULTS, BLOSC2_DPARAMS_DEFAULTS,
    BLOSC2_MAX_FILTERS, BLOSC2_MAXBLOCKSIZE, BLOSC2_STORAGE_DEFAULTS, BLOSC2_VERSION_FORMAT,
    BLOSC2_VERSION_FORMAT_STABLE, BLOSC_BITSHUFFLE, BLOSC_BLOSCLZ, BLOSC_BLOSCLZ_FORMAT, BLOSC_DODELTA,
    BLOSC_DOBITSHUFFLE, BLOSC_DOSHUFFLE, BLOSC_EXTENDED_HEADER_LENGTH, BLOSC_LZ4, BLOSC_LZ4_FORMAT,
    BLOSC_LZ4HC, BLOSC_MEMCPYED, BLOSC_NOSHUFFLE, BLOSC_SHUFFLE, BLOSC_ZLIB, BLOSC_ZLIB_FORMAT, BLOSC_ZSTD,
    BLOSC_ZSTD_FORMAT, blosc2_context, blosc2_cparams, blosc2_create_dctx, blosc2_decompress_ctx,
    blosc2_dparams, blosc2_free_ctx, blosc2_init, blosc2_schunk, blosc2_schunk_append_buffer,
    blosc2_schunk_free, blosc2_schunk_new, blosc2_schunk_to_buffer, blosc2_storage, c_bool, zng_crc32,
)

blosc2_init()

#: The frame's msgpack magic ("b2frame\0").
BLOSC2_FRAME_MAGIC = b"b2frame\x00"


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | <uint64_t>_be32(p + 4)


cdef inline int32_t _le32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[3] << 24) | (<uint32_t>p[2] << 16) | (<uint32_t>p[1] << 8) | <uint32_t>p[0])


cdef inline int _codec_format(int compcode) noexcept nogil:
    """The compressor format (bits 5..7 of a chunk's flags) of a Blosc2 compressor code, or -1
    for any code that is not one of the codecs shipped in libblosc2 (lz4 and lz4hc share LZ4)."""
    if compcode == BLOSC_BLOSCLZ:
        return BLOSC_BLOSCLZ_FORMAT
    if compcode == BLOSC_LZ4 or compcode == BLOSC_LZ4HC:
        return BLOSC_LZ4_FORMAT
    if compcode == BLOSC_ZLIB:
        return BLOSC_ZLIB_FORMAT
    if compcode == BLOSC_ZSTD:
        return BLOSC_ZSTD_FORMAT
    return -1


cdef int _check_codec(int compcode, int shuffle) except -1:
    """Refuse (ValueError) a declared compression that is not one our writer produces."""
    if _codec_format(compcode) < 0:
        raise ValueError(f"unknown Blosc2 compressor code {compcode} (expected 0, 1, 2, 4 or 5)")
    if shuffle != BLOSC_NOSHUFFLE and shuffle != BLOSC_SHUFFLE and shuffle != BLOSC_BITSHUFFLE:
        raise ValueError(f"unknown Blosc2 shuffle code {shuffle} (expected 0, 1 or 2)")
    return 0


cdef int _check_chunk(const uint8_t* c, int64_t avail, int compcode, int shuffle, int64_t raw_size,
                      int64_t* err, int64_t index) noexcept nogil:
    """Accept only a Blosc2 chunk header that our writer makes for the declared compression.

    ``c`` is the chunk, ``avail`` the bytes the frame has from it on (README_CHUNK_FORMAT.rst of
    c-blosc2 for the layout). Refused with ``E_CODEC``, detail the offending header byte:

    - a format version outside stable..what this library reads, a codec format version not 1;
    - no extended header (the filter pipeline), or delta coding in the flags;
    - a compressor format other than the declared compressor's (lz4 and lz4hc share one); a
      memcpy'd chunk may name format 0 instead (no codec runs for it);
    - a user-defined codec byte other than the declared compressor code, codec metadata;
    - filters other than ``[0, 0, 0, 0, 0, shuffle]`` or ``[shuffle, 0, 0, 0, 0, 0]``, any
      filter metadata;
    - any secondary flag (variable-length blocks) and any Blosc2 flag (dictionary, lazy chunk,
      special values, big-endian, instrumented codec).

    ``E_SIZE`` when nbytes is not ``raw_size``; ``E_FRAME`` when cbytes does not lie within the
    frame (or disagrees with a memcpy'd chunk's size) or blocksize is out of range. 0 or -1.
    """
    cdef int flags, fmt, first, last, i, extended
    cdef int32_t nbytes, blocksize, cbytes
    if avail < BLOSC_EXTENDED_HEADER_LENGTH:
        return _fail(err, E_FRAME, index, avail)
    if not BLOSC2_VERSION_FORMAT_STABLE <= c[BLOSC2_CHUNK_VERSION] <= BLOSC2_VERSION_FORMAT:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_VERSION)
    if c[BLOSC2_CHUNK_VERSIONLZ] != 1:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_VERSIONLZ)
    flags = c[BLOSC2_CHUNK_FLAGS]
    fmt = flags >> 5
    # Both shuffle bits together mean "extended header": the filters are in bytes 16..21.
    extended = BLOSC_DOSHUFFLE | BLOSC_DOBITSHUFFLE
    if (flags & (extended | BLOSC_DODELTA)) != extended:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FLAGS)
    if fmt != _codec_format(compcode) and not (flags & BLOSC_MEMCPYED and fmt == BLOSC_BLOSCLZ_FORMAT):
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FLAGS)
    # The declared shuffle sits in the last filter slot (compress_frame: c-blosc2 puts it there)
    # or in the first (files written through python-blosc2 before compress_frame existed, such as
    # the format-v1 golden file); every other slot is empty, every filter's metadata 0.
    first = c[BLOSC2_CHUNK_FILTER_CODES]
    last = c[BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS - 1]
    if first != 0 or shuffle == BLOSC_NOSHUFFLE:
        if first != shuffle:
            return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES)
        if last != 0:
            return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS - 1)
    elif last != shuffle:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS - 1)
    for i in range(BLOSC2_MAX_FILTERS):
        if 0 < i < BLOSC2_MAX_FILTERS - 1 and c[BLOSC2_CHUNK_FILTER_CODES + i] != 0:
            return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES + i)
        if c[BLOSC2_CHUNK_FILTER_META + i] != 0:
            return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_META + i)
    # Bytes 22 and 23: the user-defined codec slot (our writer puts the compressor code there)
    # and the codec's metadata.
    if c[BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS] != compcode:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS)
    if c[BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS + 1] != 0:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_FILTER_CODES + BLOSC2_MAX_FILTERS + 1)
    if c[BLOSC2_CHUNK_BLOSC2_FLAGS2] != 0:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_BLOSC2_FLAGS2)
    if c[BLOSC2_CHUNK_BLOSC2_FLAGS] != 0:
        return _fail(err, E_CODEC, index, BLOSC2_CHUNK_BLOSC2_FLAGS)
    nbytes = _le32(c + BLOSC2_CHUNK_NBYTES)
    blocksize = _le32(c + BLOSC2_CHUNK_BLOCKSIZE)
    cbytes = _le32(c + BLOSC2_CHUNK_CBYTES)
    if nbytes != raw_size:
        return _fail(err, E_SIZE, index, nbytes)
    if cbytes < BLOSC_EXTENDED_HEADER_LENGTH or cbytes > avail:
        return _fail(err, E_FRAME, index, cbytes)
    if blocksize <= 0 or blocksize > BLOSC2_MAXBLOCKSIZE:
        return _fail(err, E_FRAME, index, blocksize)
    if flags & BLOSC_MEMCPYED and cbytes != <int64_t>nbytes + BLOSC_EXTENDED_HEADER_LENGTH:
        return _fail(err, E_FRAME, index, cbytes)
    return 0


cdef int _frame_decompress(blosc2_context* ctx, const uint8_t* src, int64_t size, int compcode,
                           int shuffle, uint8_t* dst, int64_t raw_size, int64_t* err,
                           int64_t index) noexcept nogil:
    """Decompress a single-chunk Blosc2 frame into exactly ``raw_size`` bytes at ``dst``
    (``dst`` NULL: check the frame's and the chunk's headers only, returning the frame's header
    length; only those ``header length + 32`` bytes of ``src`` are read then).

    Of the frame only the msgpack fields locating the chunk are read (fixarray, the magic, int32
    header_len, uint64 frame_len) and its int64 uncompressed size, which must be ``raw_size``
    (one chunk). The frame's own codec and filter bytes, metalayers and trailer are never
    handed to c-blosc2, so they are not checked; the chunk's header is (:func:`_check_chunk`).
    """
    cdef int64_t hlen, flen
    cdef int32_t cbytes
    cdef int rc, i
    cdef const char* magic = b"b2frame\x00"
    # msgpack: fixarray, fixstr(8) "b2frame\0", int32 header_len, uint64 frame_len, then the
    # flags (fixstr(4)) and int64 uncompressed_size at 0x1D.
    if size < 0x26 or src[0] & 0xF0 != 0x90 or src[1] != 0xA8 or src[10] != 0xD2 or src[15] != 0xCF:
        return _fail(err, E_FRAME, index, 0)
    for i in range(8):
        if src[2 + i] != <uint8_t>magic[i]:
            return _fail(err, E_FRAME, index, 2 + i)
    hlen = _be32(src + 11)
    flen = <int64_t>_be64(src + 16)
    if hlen < 0x26 or flen > size or flen < hlen + BLOSC_EXTENDED_HEADER_LENGTH:
        return _fail(err, E_FRAME, index, hlen)
    if src[0x1D] != 0xD3:
        return _fail(err, E_FRAME, index, 0x1D)
    if <int64_t>_be64(src + 0x1E) != raw_size:
        return _fail(err, E_SIZE, index, <int64_t>_be64(src + 0x1E))
    if _check_chunk(src + hlen, flen - hlen, compcode, shuffle, raw_size, err, index) < 0:
        return -1
    if dst == NULL:
        return hlen  # the headers only (_load_memcpyed)
    cbytes = _le32(src + hlen + BLOSC2_CHUNK_CBYTES)  # checked to lie within the frame
    rc = blosc2_decompress_ctx(ctx, src + hlen, cbytes, dst, <int32_t>raw_size)
    if rc != raw_size:
        return _fail(err, E_DECOMPRESS, index, rc)
    return 0


cdef blosc2_context* _new_dctx() noexcept nogil:
    """A single-threaded decompression context (NULL when it cannot be allocated)."""
    cdef blosc2_dparams dparams = BLOSC2_DPARAMS_DEFAULTS
    dparams.nthreads = 1
    return blosc2_create_dctx(dparams)


def crc32(const uint8_t[::1] data not None, unsigned int value=0):
    """CRC-32 of ``data`` (the per-chunk checksum of format v1; equals ``zlib.crc32``).
    Releases the GIL."""
    cdef unsigned int h
    cdef const uint8_t* p = &data[0] if data.shape[0] else NULL
    with nogil:
        h = zng_crc32(value, p, <size_t>data.shape[0])
    return h


def load_chunks(const int32_t[::1] fds not None,
                const int64_t[::1] offsets not None,
                const int64_t[::1] stored not None,
                const uint64_t[::1] checksums not None,
                int compcode, int shuffle, bint verify,
                uint8_t[::1] dst not None, int64_t raw_size,
                uint8_t[::1] scratch not None,
                int64_t[::1] err not None, int64_t dst_stride=0):
    """Read chunk i (``stored[i]`` bytes at offset ``offsets[i]`` of descriptor ``fds[i]``, or of
    ``fds[0]`` when it holds one) into ``dst[i*dst_stride:]``
    (``dst_stride`` 0: ``raw_size``; a larger stride leaves each chunk's slot a gap after it).

    ``compcode < 0``: chunks are stored raw, each at most ``raw_size`` bytes (a shorter one, a
    file's trimmed last heap chunk, is zero-filled to ``raw_size``; the index checks say which
    chunk may be short). Else chunks are
    single-chunk Blosc2 frames compressed with Blosc2 compressor ``compcode`` and shuffle filter
    ``shuffle`` (the file's declared compression), staged in ``scratch``, their chunk header
    checked against that declaration and decompressed to exactly ``raw_size`` bytes.
    ``verify``: check the CRC-32 of the stored bytes against ``checksums[i]`` first.
    Returns 0, or -1 with ``err = [code, chunk index, detail]``.
    """
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = offsets.shape[0]
    cdef int rc
    cdef blosc2_context* ctx = NULL
    cdef blosc2_context* ctx_last = NULL
    cdef Py_ssize_t fd_step = 0 if fds.shape[0] == 1 else 1
    if stored.shape[0] != n or checksums.shape[0] != n:
        raise ValueError("load_chunks: argument lengths differ")
    if fds.shape[0] != 1 and fds.shape[0] != n:
        raise ValueError("load_chunks: fds must hold one descriptor, or one per chunk")
    if compcode >= 0:
        _check_codec(compcode, shuffle)
    if dst_stride == 0:
        dst_stride = raw_size
    if raw_size <= 0 or dst_stride < raw_size or n and not _fits(n - 1, dst_stride, dst.shape[0] - raw_size):
        return _fail(e, E_DEST, 0, dst.shape[0])
    if n == 0:
        return 0
    with nogil:
        if compcode >= 0:
            ctx = _new_dctx()
            ctx_last = _new_dctx()
        if compcode >= 0 and (ctx == NULL or ctx_last == NULL):
            rc = _fail(e, E_NOMEM, 0, 0)
        else:
            rc = _load(&fds[0], fd_step, n, &offsets[0], &stored[0], &checksums[0], ctx, ctx_last,
                       compcode, shuffle, verify, &dst[0], raw_size, dst_stride,
                       &scratch[0] if scratch.shape[0] else NULL, scratch.shape[0], e)
        if ctx != NULL:
            blosc2_free_ctx(ctx)
        if ctx_last != NULL:
            blosc2_free_ctx(ctx_last)
    return rc


#: Bytes of a stored frame read first, where a memcpy'd chunk may follow (its headers fit).
DEF _PEEK = 512


cdef int _load_memcpyed(int fd, int64_t offset, int64_t stored, uint64_t checksum, bint verify,
                        int compcode, int shuffle, uint8_t* slot, int64_t raw_size,
                        uint8_t* scratch, int64_t* err, int64_t index) noexcept nogil:
    """Load one stored frame whose chunk may be memcpy'd: its first ``_PEEK`` bytes go to
    ``scratch``; when they show a memcpy'd chunk of ``raw_size`` bytes, its raw bytes are read
    straight into ``slot`` and the frame's trailer after its headers in ``scratch`` (the CRC-32
    is taken over the three parts in file order), then the headers are checked: returns 1.
    Otherwise the rest of the frame is read after the first bytes (``scratch`` then holds it
    whole, for :func:`_frame_decompress`): returns 0. -1 on an error (``err``). The caller
    ensures ``_PEEK <= stored <= scratch size`` and ``raw_size > _PEEK``."""
    cdef int64_t hlen, start, rest
    cdef uint32_t h
    if _pread_full(fd, scratch, _PEEK, offset, err, index) < 0:
        return -1
    hlen = _be32(scratch + 11) if scratch[10] == 0xD2 else 0
    start = hlen + BLOSC_EXTENDED_HEADER_LENGTH  # the raw bytes of a memcpy'd chunk
    if (hlen < 0x26 or start > _PEEK or stored < start + raw_size
            or not scratch[hlen + BLOSC2_CHUNK_FLAGS] & BLOSC_MEMCPYED):
        return 0
    memcpy(slot, scratch + start, <size_t>(_PEEK - start))
    if _pread_full(fd, slot + _PEEK - start, raw_size - (_PEEK - start), offset + _PEEK, err,
                   index) < 0:
        return -1
    rest = stored - start - raw_size
    if rest and _pread_full(fd, scratch + start, rest, offset + start + raw_size, err, index) < 0:
        return -1
    if verify:
        h = zng_crc32(0, scratch, <size_t>start)
        h = zng_crc32(h, slot, <size_t>raw_size)
        h = zng_crc32(h, scratch + start, <size_t>rest)
        if <uint64_t>h != checksum:
            return _fail(err, E_CHECKSUM, index, 0)
    # The frame's and chunk's headers (memcpy'd, nbytes == raw_size, cbytes within the frame).
    if _frame_decompress(NULL, scratch, stored, compcode, shuffle, NULL, raw_size, err, index) < 0:
        return -1
    if not scratch[hlen + BLOSC2_CHUNK_FLAGS] & BLOSC_MEMCPYED:  # checked above; never
        return _fail(err, E_FRAME, index, hlen + BLOSC2_CHUNK_FLAGS)
    return 1


cdef int _load_blocks(blosc2_context* ctx, blosc2_context* ctx_last, int fd, int64_t offset,
                      int64_t stored, uint64_t checksum, bint verify, int compcode, int shuffle,
                      uint8_t* slot, int64_t raw_size, uint8_t* scratch, int64_t scratch_size,
                      int64_t index) noexcept nogil:
    """Load one compressed frame Blosc2 block by Blosc2 block, each read into the start of
    ``scratch`` just before it is decompressed into ``slot`` (so the staged bytes are still in
    the core's cache when the codec reads them; staging the chunk whole, 0.6-1 MiB, goes
    through memory, which costs as much as the codec). ``scratch`` holds the frame's first
    ``_PEEK`` bytes on entry (:func:`_load_memcpyed`).

    The blocks of a Blosc2 chunk are compressed independently (the delta filter, the one
    exception, is refused by :func:`_check_chunk`): block j is handed to c-blosc2 as a chunk
    of its own, the chunk's 32-byte header with ``nbytes``, ``cbytes`` and a one-entry
    ``bstarts`` of its own followed by the block's stored bytes; a chunk's last, shorter block
    (compressed unsplit, whatever the flags say) gets the don't-split flag and its own
    context ``ctx_last`` (a context reallocates its buffers when the block size changes). The
    CRC-32 is taken over the frame's bytes in file order as they are read and compared at the
    end.

    A pure fast path: returns 1 when the chunk is in ``slot``, checked as :func:`_load` checks
    it; 0 without having written ``scratch`` when the frame is not laid out for it (headers
    and block offsets beyond the first ``_PEEK`` bytes, blocks not stored in order) or its
    headers are refused; 2 after any other failure (a short read, a block c-blosc2 refuses, a
    CRC mismatch). On 0 and 2 nothing is reported: the caller reads and checks the frame whole,
    which reports exactly what it always has (a bad CRC before a bad header)."""
    cdef uint8_t head[_PEEK]
    cdef int64_t e[3]
    cdef int64_t hlen, cbytes, blocksize, nblocks, bstart, j, lo, hi, got, bsize, have
    cdef int32_t v
    cdef uint32_t h = 0
    cdef uint8_t* c
    cdef blosc2_context* dctx
    hlen = _be32(scratch + 11) if scratch[10] == 0xD2 else 0
    if hlen < 0x26 or hlen + BLOSC_EXTENDED_HEADER_LENGTH > _PEEK:
        return 0
    # The frame's and the chunk's headers, as load_chunks checks them (they lie in the head).
    if _frame_decompress(NULL, scratch, stored, compcode, shuffle, NULL, raw_size, e, index) < 0:
        return 0
    c = scratch + hlen
    if c[BLOSC2_CHUNK_FLAGS] & BLOSC_MEMCPYED:
        return 0
    cbytes = _le32(c + BLOSC2_CHUNK_CBYTES)  # within the frame (checked)
    blocksize = _le32(c + BLOSC2_CHUNK_BLOCKSIZE)  # in 1..BLOSC2_MAXBLOCKSIZE (checked)
    nblocks = (raw_size + blocksize - 1) // blocksize
    bstart = BLOSC_EXTENDED_HEADER_LENGTH + 4 * nblocks  # where block 0 must start
    if nblocks < 2 or hlen + bstart > _PEEK or bstart >= cbytes:
        return 0
    # Block j's stored bytes are [bstarts[j], bstarts[j + 1]) of the chunk, the last one's
    # end is cbytes: c-blosc2 writes them in order (one thread) and back to back.
    if _le32(c + BLOSC_EXTENDED_HEADER_LENGTH) != bstart:
        return 0
    for j in range(1, nblocks):
        v = _le32(c + BLOSC_EXTENDED_HEADER_LENGTH + 4 * j)
        if v <= _le32(c + BLOSC_EXTENDED_HEADER_LENGTH + 4 * (j - 1)) or v >= cbytes:
            return 0
    memcpy(head, scratch, _PEEK)
    if verify:
        h = zng_crc32(0, head, _PEEK)
    have = _PEEK  # bytes of the frame read so far (file order)
    for j in range(nblocks):
        lo = hlen + _le32(head + hlen + BLOSC_EXTENDED_HEADER_LENGTH + 4 * j)
        hi = hlen + (_le32(head + hlen + BLOSC_EXTENDED_HEADER_LENGTH + 4 * (j + 1))
                     if j + 1 < nblocks else cbytes)
        bsize = blocksize if j + 1 < nblocks else raw_size - j * blocksize
        # The block as a chunk of its own: header, bstarts = [36], the block's bytes.
        memcpy(scratch, head + hlen, BLOSC_EXTENDED_HEADER_LENGTH)
        _put_le32(scratch + BLOSC2_CHUNK_NBYTES, <int32_t>bsize)
        _put_le32(scratch + BLOSC2_CHUNK_CBYTES, <int32_t>(BLOSC_EXTENDED_HEADER_LENGTH + 4 + hi - lo))
        _put_le32(scratch + BLOSC_EXTENDED_HEADER_LENGTH, BLOSC_EXTENDED_HEADER_LENGTH + 4)
        dctx = ctx
        if bsize < blocksize:
            scratch[BLOSC2_CHUNK_FLAGS] |= 0x10  # a last, short block is not split
            dctx = ctx_last
        got = 0
        if lo < have:  # the part of the block among the bytes already read
            got = have - lo if hi > have else hi - lo
            memcpy(scratch + BLOSC_EXTENDED_HEADER_LENGTH + 4, head + lo, <size_t>got)
        if got < hi - lo:
            if _pread_full(fd, scratch + BLOSC_EXTENDED_HEADER_LENGTH + 4 + got, hi - lo - got,
                           offset + lo + got, e, index) < 0:
                return 2
            if verify:
                h = zng_crc32(h, scratch + BLOSC_EXTENDED_HEADER_LENGTH + 4 + got,
                              <size_t>(hi - lo - got))
            have = hi
        if blosc2_decompress_ctx(dctx, scratch, <int32_t>(BLOSC_EXTENDED_HEADER_LENGTH + 4 + hi - lo),
                                 slot + j * blocksize, <int32_t>bsize) != bsize:
            return 2
    if have < stored:  # the frame's trailer
        if _pread_full(fd, scratch, stored - have, offset + have, e, index) < 0:
            return 2
        if verify:
            h = zng_crc32(h, scratch, <size_t>(stored - have))
    if verify and <uint64_t>h != checksum:
        return 2
    return 1


cdef inline void _put_le32(uint8_t* p, int32_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = u & 0xFF
    p[1] = (u >> 8) & 0xFF
    p[2] = (u >> 16) & 0xFF
    p[3] = u >> 24


def memcpyed_starts(const int32_t[::1] fds not None, const int64_t[::1] offsets not None,
                    const int64_t[::1] stored not None, int compcode, int shuffle, int64_t raw_size,
                    int64_t[::1] out not None, int64_t[::1] err not None):
    """Where the raw bytes of each stored frame's chunk lie in the file, if it is memcpy'd:
    frame i (``stored[i]`` bytes at ``offsets[i]`` of ``fds[i]``, or ``fds[0]``) has its first
    bytes read and its frame and chunk headers checked as :func:`load_chunks` checks them
    (the file's codec, ``raw_size`` bytes, within the frame); ``out[i]`` is then the file
    offset of its ``raw_size`` raw bytes (a memcpy'd chunk: they lie there as they are, so a
    payload can be read straight from the file), or -1 for a compressed chunk. Says nothing
    of the bytes' checksum (a reader checks the chunk whole once, as for uncompressed chunks).
    Returns 0, or -1 with ``err`` (a bad header: ``E_FRAME``/``E_SIZE``/``E_CODEC``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = offsets.shape[0], i
    cdef Py_ssize_t fd_step = 0 if fds.shape[0] == 1 else 1
    cdef uint8_t head[_PEEK]
    cdef int64_t hlen, start, got
    cdef int rc = 0
    if stored.shape[0] != n or out.shape[0] != n or (fds.shape[0] != 1 and fds.shape[0] != n):
        raise ValueError("memcpyed_starts: argument lengths differ")
    _check_codec(compcode, shuffle)
    if raw_size <= 0:
        raise ValueError("memcpyed_starts: raw_size must be positive")
    with nogil:
        for i in range(n):
            out[i] = -1
            if stored[i] <= 0 or offsets[i] < 0:
                rc = _fail(e, E_SIZE, i, stored[i])
                break
            got = stored[i] if stored[i] < _PEEK else _PEEK
            if _pread_full(fds[i * fd_step], head, got, offsets[i], e, i) < 0:
                rc = -1
                break
            hlen = _be32(head + 11) if got >= 0x26 and head[10] == 0xD2 else 0
            start = hlen + BLOSC_EXTENDED_HEADER_LENGTH
            if hlen < 0x26 or start > got or stored[i] < start + raw_size \
                    or not head[hlen + BLOSC2_CHUNK_FLAGS] & BLOSC_MEMCPYED:
                continue  # compressed (or not a frame: load_chunks says which)
            # The headers, as load_chunks checks them (they lie in the first bytes read).
            if _frame_decompress(NULL, head, stored[i], compcode, shuffle, NULL, raw_size, e, i) < 0:
                rc = -1
                break
            out[i] = offsets[i] + start
    return rc


cdef int _load(const int32_t* fds, Py_ssize_t fd_step, Py_ssize_t n, const int64_t* offsets,
               const int64_t* stored, const uint64_t* checksums, blosc2_context* ctx,
               blosc2_context* ctx_last, int compcode,
               int shuffle, bint verify, uint8_t* dst, int64_t raw_size, int64_t dst_stride,
               uint8_t* scratch, int64_t scratch_size, int64_t* err) noexcept nogil:
    """The loop of :func:`load_chunks` (arguments checked there; ``ctx`` NULL: stored raw;
    ``ctx_last`` a second context, for the short last blocks of :func:`_load_blocks`)."""
    cdef Py_ssize_t i
    cdef uint8_t* target
    cdef int rc
    for i in range(n):
        if stored[i] <= 0 or offsets[i] < 0:
            return _fail(err, E_SIZE, i, stored[i])
        if ctx != NULL:
            if stored[i] > scratch_size:
                return _fail(err, E_DEST, i, stored[i])
            target = scratch
            if stored[i] >= _PEEK and raw_size > _PEEK:
                # A memcpy'd chunk is read straight into its slot; any other is staged whole.
                rc = _load_memcpyed(fds[i * fd_step], offsets[i], stored[i], checksums[i],
                                    verify, compcode, shuffle, dst + i * dst_stride, raw_size,
                                    scratch, err, i)
                if rc < 0:
                    return -1
                if rc == 1:
                    continue
                rc = _load_blocks(ctx, ctx_last, fds[i * fd_step], offsets[i], stored[i],
                                  checksums[i], verify, compcode, shuffle, dst + i * dst_stride,
                                  raw_size, scratch, scratch_size, i)
                if rc == 1:
                    continue
                # The frame whole (its first bytes are still there unless _load_blocks ran).
                if rc == 0:
                    rc = _pread_full(fds[i * fd_step], scratch + _PEEK, stored[i] - _PEEK,
                                     offsets[i] + _PEEK, err, i)
                else:
                    rc = _pread_full(fds[i * fd_step], scratch, stored[i], offsets[i], err, i)
                if rc < 0:
                    return -1
                if verify and <uint64_t>zng_crc32(0, target, <size_t>stored[i]) != checksums[i]:
                    return _fail(err, E_CHECKSUM, i, 0)
                if _frame_decompress(ctx, target, stored[i], compcode, shuffle,
                                     dst + i * dst_stride, raw_size, err, i) < 0:
                    return -1
                continue
        else:
            if stored[i] > raw_size:
                return _fail(err, E_SIZE, i, stored[i])
            target = dst + i * dst_stride
        if _pread_full(fds[i * fd_step], target, stored[i], offsets[i], err, i) < 0:
            return -1
        if ctx == NULL and stored[i] < raw_size:
            memset(target + stored[i], 0, <size_t>(raw_size - stored[i]))
        if verify and <uint64_t>zng_crc32(0, target, <size_t>stored[i]) != checksums[i]:
            return _fail(err, E_CHECKSUM, i, 0)
        if ctx != NULL and _frame_decompress(ctx, target, stored[i], compcode, shuffle,
                                             dst + i * dst_stride, raw_size, err, i) < 0:
            return -1
    return 0


def decode_chunks(const uint8_t[::1] src not None,
                  const int64_t[::1] src_offsets not None,
                  const int64_t[::1] stored not None,
                  const uint64_t[::1] checksums not None,
                  int compcode, int shuffle, bint verify,
                  uint8_t[::1] dst not None, int64_t raw_size,
                  int64_t[::1] err not None, int64_t dst_stride=0):
    """:func:`load_chunks` for bytes already in memory (fetched by ranged requests): chunk i is
    ``stored[i]`` bytes at ``src_offsets[i]`` of ``src``; it goes, checked and decompressed, to
    ``dst[i*dst_stride:]`` exactly as :func:`load_chunks` puts it (same codes, same checks: a
    range outside ``src`` is ``E_SHORT`` with detail the bytes ``src`` holds from the offset).
    Compressed chunks are decompressed straight from ``src`` (no staging). Returns 0 or -1
    (``err``)."""
    cdef int64_t* e = _errbuf(err)
    cdef Py_ssize_t n = src_offsets.shape[0]
    cdef int rc
    cdef blosc2_context* ctx = NULL
    if stored.shape[0] != n or checksums.shape[0] != n:
        raise ValueError("decode_chunks: argument lengths differ")
    if compcode >= 0:
        _check_codec(compcode, shuffle)
    if dst_stride == 0:
        dst_stride = raw_size
    if raw_size <= 0 or dst_stride < raw_size or n and not _fits(n - 1, dst_stride, dst.shape[0] - raw_size):
        return _fail(e, E_DEST, 0, dst.shape[0])
    if n == 0:
        return 0
    with nogil:
        if compcode >= 0:
            ctx = _new_dctx()
        if compcode >= 0 and ctx == NULL:
            rc = _fail(e, E_NOMEM, 0, 0)
        else:
            rc = _decode(&src[0] if src.shape[0] else NULL, src.shape[0], n, &src_offsets[0], &stored[0],
                         &checksums[0], ctx, compcode, shuffle, verify, &dst[0], raw_size, dst_stride, e)
        if ctx != NULL:
            blosc2_free_ctx(ctx)
    return rc


cdef int _decode(const uint8_t* src, int64_t src_len, Py_ssize_t n, const int64_t* src_offsets,
                 const int64_t* stored, const uint64_t* checksums, blosc2_context* ctx, int compcode,
                 int shuffle, bint verify, uint8_t* dst, int64_t raw_size, int64_t dst_stride,
                 int64_t* err) noexcept nogil:
    """The loop of :func:`decode_chunks` (arguments checked there; ``ctx`` NULL: stored raw)."""
    cdef Py_ssize_t i
    cdef const uint8_t* chunk
    for i in range(n):
        if stored[i] <= 0 or src_offsets[i] < 0:
            return _fail(err, E_SIZE, i, stored[i])
        if src_offsets[i] > src_len or stored[i] > src_len - src_offsets[i]:
            return _fail(err, E_SHORT, i, src_len - src_offsets[i] if src_offsets[i] <= src_len else 0)
        if ctx == NULL and stored[i] > raw_size:
            return _fail(err, E_SIZE, i, stored[i])
        chunk = src + src_offsets[i]
        if verify and <uint64_t>zng_crc32(0, chunk, <size_t>stored[i]) != checksums[i]:
            return _fail(err, E_CHECKSUM, i, 0)
        if ctx == NULL:
            memcpy(dst + i * dst_stride, chunk, <size_t>stored[i])
            if stored[i] < raw_size:
                memset(dst + i * dst_stride + stored[i], 0, <size_t>(raw_size - stored[i]))
        elif _frame_decompress(ctx, chunk, stored[i], compcode, shuffle, dst + i * dst_stride, raw_size,
                               err, i) < 0:
            return -1
    return 0


def decompress_frame(const uint8_t[::1] src not None, uint8_t[::1] dst not None, int compcode,
                     int shuffle, int64_t[::1] err not None):
    """Decompress one single-chunk Blosc2 frame, declared compressed with Blosc2 compressor
    ``compcode`` and shuffle filter ``shuffle``, into all of ``dst`` (its header checked as in
    :func:`load_chunks`). Returns 0 or -1 (see ``err``)."""
    cdef int64_t* e = _errbuf(err)
    cdef int rc
    cdef blosc2_context* ctx
    _check_codec(compcode, shuffle)
    if src.shape[0] == 0 or dst.shape[0] == 0:
        return _fail(e, E_SIZE, 0, dst.shape[0])
    with nogil:
        ctx = _new_dctx()
        if ctx == NULL:
            rc = _fail(e, E_NOMEM, 0, 0)
        else:
            rc = _frame_decompress(ctx, &src[0], src.shape[0], compcode, shuffle, &dst[0], dst.shape[0], e, 0)
            blosc2_free_ctx(ctx)
    return rc


def compress_frame(const uint8_t[::1] src not None, uint8_t[::1] dst not None, int compcode, int clevel,
                   int shuffle, int typesize, int64_t[::1] err not None):
    """Compress ``src`` into a single-chunk Blosc2 frame (what HDF5 filter 32026 stores) in
    ``dst`` with Blosc2 compressor ``compcode`` and shuffle filter ``shuffle``; returns the
    frame's length, or -1 (``err``). Runs without the GIL, so a writer compresses blocks on
    several threads. An all-zero ``src`` is stored memcpy'd (clevel 0): Blosc2 would make it a
    "special" chunk that a frame records only in its index."""
    cdef int64_t* e = _errbuf(err)
    cdef blosc2_cparams cparams = BLOSC2_CPARAMS_DEFAULTS
    cdef blosc2_dparams dparams = BLOSC2_DPARAMS_DEFAULTS
    cdef blosc2_storage storage = BLOSC2_STORAGE_DEFAULTS
    cdef blosc2_schunk* sc = NULL
    cdef uint8_t* frame = NULL
    cdef c_bool needs_free = False
    cdef int64_t n = src.shape[0], length = -1, i
    cdef bint zero = True
    _check_codec(compcode, shuffle)
    if n <= 0 or n > 0x7FFF0000 or typesize < 1 or typesize > 255 or not 0 <= clevel <= 9:
        raise ValueError("compress_frame: bad arguments")
    with nogil:
        for i in range(n):
            if src[i] != 0:
                zero = False
                break
        cparams.compcode = <uint8_t>compcode
        cparams.clevel = 0 if zero else <uint8_t>clevel
        cparams.typesize = typesize
        cparams.nthreads = 1
        cparams.filters[BLOSC2_MAX_FILTERS - 1] = <uint8_t>shuffle
        dparams.nthreads = 1
        storage.contiguous = True
        storage.cparams = &cparams
        storage.dparams = &dparams
        sc = blosc2_schunk_new(&storage)
        if sc == NULL:
            _fail(e, E_NOMEM, 0, 0)
        elif blosc2_schunk_append_buffer(sc, &src[0], <int32_t>n) < 0:
            _fail(e, E_FRAME, 0, 0)
        else:
            length = blosc2_schunk_to_buffer(sc, &frame, &needs_free)
            if length < 0:
                _fail(e, E_FRAME, 0, length)
            elif length > dst.shape[0]:
                _fail(e, E_DEST, 0, length)
                length = -1
            else:
                memcpy(&dst[0], frame, <size_t>length)
            if needs_free:
                free(frame)
        if sc != NULL:
            blosc2_schunk_free(sc)
    return length
