# cython: language_level=3
"""The parts of ``blosc2.h`` (c-blosc2, linked statically from the ``blosc2`` wheel) and of the
zlib-ng inside ``libblosc2.a`` that ``_frame.pyx`` uses. Only that module links the library."""

from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t


cdef extern from "<stdbool.h>":
    ctypedef bint c_bool "bool"


cdef extern from "blosc2.h" nogil:
    enum:
        BLOSC_EXTENDED_HEADER_LENGTH
        BLOSC2_MAXBLOCKSIZE
        BLOSC2_VERSION_FORMAT_STABLE
        BLOSC2_VERSION_FORMAT
        BLOSC_DOSHUFFLE
        BLOSC_MEMCPYED
        BLOSC_DOBITSHUFFLE
        BLOSC_DODELTA
        BLOSC_BLOSCLZ
        BLOSC_LZ4
        BLOSC_LZ4HC
        BLOSC_ZLIB
        BLOSC_ZSTD
        BLOSC_BLOSCLZ_FORMAT
        BLOSC_LZ4_FORMAT
        BLOSC_ZLIB_FORMAT
        BLOSC_ZSTD_FORMAT
        BLOSC_NOSHUFFLE
        BLOSC_SHUFFLE
        BLOSC_BITSHUFFLE
        BLOSC2_MAX_FILTERS
        BLOSC2_CHUNK_VERSION
        BLOSC2_CHUNK_VERSIONLZ
        BLOSC2_CHUNK_FLAGS
        BLOSC2_CHUNK_NBYTES
        BLOSC2_CHUNK_BLOCKSIZE
        BLOSC2_CHUNK_CBYTES
        BLOSC2_CHUNK_FILTER_CODES
        BLOSC2_CHUNK_FILTER_META
        BLOSC2_CHUNK_BLOSC2_FLAGS2
        BLOSC2_CHUNK_BLOSC2_FLAGS

    ctypedef struct blosc2_context:
        pass
    ctypedef struct blosc2_schunk:
        pass
    ctypedef struct blosc2_cparams:
        uint8_t compcode
        uint8_t clevel
        int32_t typesize
        int16_t nthreads
        uint8_t filters[6]
    ctypedef struct blosc2_dparams:
        int16_t nthreads
        void* schunk
        void* postfilter
        void* postparams
        int32_t typesize
    ctypedef struct blosc2_storage:
        bint contiguous
        blosc2_cparams* cparams
        blosc2_dparams* dparams

    const blosc2_cparams BLOSC2_CPARAMS_DEFAULTS
    const blosc2_dparams BLOSC2_DPARAMS_DEFAULTS
    const blosc2_storage BLOSC2_STORAGE_DEFAULTS

    void blosc2_init()
    blosc2_context* blosc2_create_dctx(blosc2_dparams dparams)
    void blosc2_free_ctx(blosc2_context* context)
    int blosc2_decompress_ctx(blosc2_context* context, const void* src, int32_t srcsize,
                              void* dest, int32_t destsize)
    blosc2_schunk* blosc2_schunk_new(blosc2_storage* storage)
    int64_t blosc2_schunk_append_buffer(blosc2_schunk* schunk, const void* src, int32_t nbytes)
    int64_t blosc2_schunk_to_buffer(blosc2_schunk* schunk, uint8_t** cframe, c_bool* needs_free)
    int blosc2_schunk_free(blosc2_schunk* schunk)


cdef extern from *:
    # zlib-ng's CRC-32 inside libblosc2.a: same polynomial and values as zlib.crc32, with the
    # (V)PCLMULQDQ kernels chosen at run time (measured 66 GB/s here, XXH64 9 GB/s).
    """
    unsigned int zng_crc32(unsigned int crc, const unsigned char* buf, size_t len);
    """
    unsigned int zng_crc32(unsigned int crc, const unsigned char* buf, size_t len) nogil


cdef extern from *:
    # zlib-ng's one-shot inflate of a zlib stream (Adler-32 checked), inside libblosc2.a: the
    # IDAT data of PNG images (_png.pyx). Returns Z_OK (0) when the stream ended exactly there.
    """
    int32_t zng_uncompress2(uint8_t* dest, size_t* destLen, const uint8_t* source, size_t* sourceLen);
    """
    int32_t zng_uncompress2(uint8_t* dest, size_t* destLen, const uint8_t* source, size_t* sourceLen) nogil
