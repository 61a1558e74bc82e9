/* The C side of _ext/_audio.pyx: FLAC (libFLAC's stream decoder and encoder over memory) and
 * WAV (parsed here) audio, decoded into a caller-owned buffer, a window of frames at a time.
 *
 * Kept in C (not Cython) because libFLAC reports through callbacks that take a client pointer.
 * Nothing here raises or aborts: every function returns a status code (RA_*).
 *
 * Bounds: every offset read from the bytes (ID3 tag size, metadata block lengths, RIFF chunk
 * sizes) is checked against the data's length before it is used; a value's frames and
 * channels come from its header and are checked against what the caller expects (the stored
 * shape) before anything is written, and the caller sized the output from those. Nothing is
 * allocated from a size a header gives: libFLAC's own buffers are bounded by the format (a
 * block is at most 65535 frames of at most 8 channels), the WAV path allocates nothing.
 *
 * Sample conversion, the same as libsndfile's (what soundfile returns), for a sample s of a
 * b-bit integer source: float32 s * 2**-(b-1) (a float WAV's samples as they are); int16
 * s << (16-b) or s >> (b-16); int32 s << (32-b). A mono mix-down of C channels: float32 the
 * mean in double of the float32 values, rounded to float32; int16/int32 the floor of the mean
 * of the converted integers. rowstore/codecs/audio.py states the same in NumPy.
 */
#ifndef ROWSTORE_AUDIO_IMPL_H
#define ROWSTORE_AUDIO_IMPL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <FLAC/stream_decoder.h>
#include <FLAC/stream_encoder.h>

enum {
    RA_OK = 0,
    RA_CORRUPT = 1,     /* not FLAC/WAV, or damaged (a bad header, a libFLAC error, lost sync) */
    RA_UNSUPPORTED = 2, /* a kind the codec does not read (compressed WAV, float to int, ...) */
    RA_NOMEM = 3,       /* libFLAC could not allocate its decoder */
    RA_SIZE = 4,        /* the header's frames or channels are not the ones expected */
    RA_TRUNCATED = 5,   /* the audio ends before the frames its header declares */
    RA_RANGE = 6        /* the window starts past the value's end */
};
enum { RA_FLAC = 1, RA_WAV = 2 };
enum { RA_F32 = 0, RA_I16 = 1, RA_I32 = 2 };
enum { RA_MAX_CHANNELS = 8 };

typedef struct {
    int format;       /* RA_FLAC or RA_WAV */
    int64_t rate;     /* frames per second */
    int channels;     /* 1..8 */
    int bits;         /* bits per sample of the source: 4..32 (FLAC), 8/16/24/32 (WAV) */
    int is_float;     /* WAV IEEE float (32-bit) */
    int64_t frames;   /* frames the header declares */
    int64_t data_off; /* WAV: offset of the first sample; FLAC: of the first audio frame */
    int64_t data_len; /* WAV: bytes of sample data in the data chunk */
    int block_align;  /* WAV: bytes per frame */
} ra_header;

static inline uint32_t ra_le16(const uint8_t* p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }
static inline uint32_t ra_le32(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint32_t ra_be24(const uint8_t* p) {
    return ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | (uint32_t)p[2];
}

/* -- headers --------------------------------------------------------------------------------- */
static int ra_parse_flac(const uint8_t* p, int64_t n, ra_header* h) {
    int64_t pos = 0;
    if (n >= 10 && p[0] == 'I' && p[1] == 'D' && p[2] == '3') { /* an ID3v2 tag first */
        int64_t size = 0;
        for (int i = 6; i < 10; i++) {
            if (p[i] & 0x80) return RA_CORRUPT;
            size = (size << 7) | p[i];
        }
        pos = 10 + size + ((p[5] & 0x10) ? 10 : 0);
    }
    if (pos + 4 + 4 + 34 > n) return RA_CORRUPT;
    if (memcmp(p + pos, "fLaC", 4) != 0) return RA_CORRUPT;
    pos += 4;
    if ((p[pos] & 0x7F) != 0 || ra_be24(p + pos + 1) != 34) return RA_CORRUPT; /* STREAMINFO */
    const uint8_t* s = p + pos + 4;
    uint32_t min_bs = ((uint32_t)s[0] << 8) | s[1], max_bs = ((uint32_t)s[2] << 8) | s[3];
    uint32_t rate = ((uint32_t)s[10] << 12) | ((uint32_t)s[11] << 4) | (s[12] >> 4);
    int channels = ((s[12] >> 1) & 7) + 1;
    int bits = (((s[12] & 1) << 4) | (s[13] >> 4)) + 1;
    int64_t frames = ((int64_t)(s[13] & 0x0F) << 32) | ((int64_t)s[14] << 24) |
                     ((int64_t)s[15] << 16) | ((int64_t)s[16] << 8) | (int64_t)s[17];
    if (max_bs < 16 || min_bs > max_bs || rate == 0 || bits < 4) return RA_CORRUPT;
    /* the metadata blocks, up to the last one: each moves >= 4 bytes */
    for (;;) {
        if (pos + 4 > n) return RA_CORRUPT;
        int last = p[pos] & 0x80;
        int64_t len = ra_be24(p + pos + 1);
        if (len > n - pos - 4) return RA_CORRUPT;
        pos += 4 + len;
        if (last) break;
    }
    h->format = RA_FLAC;
    h->rate = rate;
    h->channels = channels;
    h->bits = bits;
    h->is_float = 0;
    h->frames = frames;
    h->data_off = pos;
    h->data_len = n - pos;
    h->block_align = 0;
    if (frames == 0) return RA_UNSUPPORTED; /* an unknown length (or no audio) */
    return RA_OK;
}

static const uint8_t RA_GUID_TAIL[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                                         0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};

static int ra_parse_wav(const uint8_t* p, int64_t n, ra_header* h) {
    int have_fmt = 0, tag = 0, channels = 0, bits = 0, align = 0;
    int64_t rate = 0, pos = 12;
    if (n < 12 || memcmp(p, "RIFF", 4) != 0 || memcmp(p + 8, "WAVE", 4) != 0) return RA_CORRUPT;
    for (;;) { /* chunks: each moves >= 8 bytes */
        if (pos + 8 > n) return RA_CORRUPT; /* no data chunk */
        int64_t size = ra_le32(p + pos + 4);
        const uint8_t* body = p + pos + 8;
        if (memcmp(p + pos, "fmt ", 4) == 0) {
            if (size < 16 || size > n - pos - 8) return RA_CORRUPT;
            tag = (int)ra_le16(body);
            channels = (int)ra_le16(body + 2);
            rate = ra_le32(body + 4);
            align = (int)ra_le16(body + 12);
            bits = (int)ra_le16(body + 14);
            if (tag == 0xFFFE) { /* WAVE_FORMAT_EXTENSIBLE: the sub-format's GUID */
                if (size < 40 || ra_le16(body + 16) < 22) return RA_CORRUPT;
                if (memcmp(body + 26, RA_GUID_TAIL, 14) != 0) return RA_UNSUPPORTED;
                tag = (int)ra_le16(body + 24);
            }
            have_fmt = 1;
        } else if (memcmp(p + pos, "data", 4) == 0) {
            if (!have_fmt) return RA_CORRUPT;
            if (size > n - pos - 8) return RA_TRUNCATED;
            if (tag != 1 && tag != 3) return RA_UNSUPPORTED; /* compressed (ADPCM, mu-law...) */
            if (tag == 1 && bits != 8 && bits != 16 && bits != 24 && bits != 32)
                return RA_UNSUPPORTED;
            if (tag == 3 && bits != 32) return RA_UNSUPPORTED; /* 64-bit float */
            if (channels < 1 || channels > RA_MAX_CHANNELS) return RA_UNSUPPORTED;
            if (rate == 0 || align != channels * (bits / 8)) return RA_CORRUPT;
            h->format = RA_WAV;
            h->rate = rate;
            h->channels = channels;
            h->bits = bits;
            h->is_float = tag == 3;
            h->frames = size / align;
            h->data_off = pos + 8;
            h->data_len = size;
            h->block_align = align;
            return RA_OK;
        }
        if (size > n - pos - 8) return RA_CORRUPT;
        pos += 8 + size + (size & 1);
    }
}

static int ra_parse(const uint8_t* p, int64_t n, ra_header* h) {
    memset(h, 0, sizeof(*h));
    if (p == NULL || n < 4) return RA_CORRUPT;
    if (memcmp(p, "RIFF", 4) == 0) return ra_parse_wav(p, n, h);
    return ra_parse_flac(p, n, h);
}

/* -- conversion ------------------------------------------------------------------------------ */
static inline float ra_norm(int bits) { return (float)(1.0 / (double)(1ULL << (bits - 1))); }

static inline int32_t ra_to_int(int32_t s, int bits, int otype) {
    if (otype == RA_I16) {
        if (bits > 16) return s >> (bits - 16);
        return (int32_t)(int16_t)(uint16_t)((uint32_t)s << (16 - bits));
    }
    return (int32_t)((uint32_t)s << (32 - bits));
}

static inline int64_t ra_floor_div(int64_t a, int64_t c) {
    return a >= 0 ? a / c : -((-a + c - 1) / c);
}

/* Store frame f (channels ch[0..channels-1], as integers of `bits` bits, or floats when
 * `fl`) at frame index j of the output. */
typedef struct {
    uint8_t* out; /* the value's first output element */
    int otype;
    int oc; /* output channels: 1 (mono mix-down or mono source) or the source's */
    int channels, bits;
} ra_sink;

static inline void ra_put_int(const ra_sink* k, int64_t j, const int32_t* v) {
    int c = k->channels;
    if (k->otype == RA_F32) {
        float nrm = ra_norm(k->bits);
        float* o = (float*)k->out + j * k->oc;
        if (k->oc == c) {
            for (int i = 0; i < c; i++) o[i] = (float)v[i] * nrm;
        } else {
            double acc = 0.0;
            for (int i = 0; i < c; i++) acc += (double)((float)v[i] * nrm);
            o[0] = (float)(acc / c);
        }
        return;
    }
    if (k->oc == c) {
        if (k->otype == RA_I16) {
            int16_t* o = (int16_t*)k->out + j * k->oc;
            for (int i = 0; i < c; i++) o[i] = (int16_t)ra_to_int(v[i], k->bits, RA_I16);
        } else {
            int32_t* o = (int32_t*)k->out + j * k->oc;
            for (int i = 0; i < c; i++) o[i] = ra_to_int(v[i], k->bits, RA_I32);
        }
        return;
    }
    int64_t acc = 0;
    for (int i = 0; i < c; i++) acc += ra_to_int(v[i], k->bits, k->otype);
    if (k->otype == RA_I16)
        ((int16_t*)k->out)[j] = (int16_t)ra_floor_div(acc, c);
    else
        ((int32_t*)k->out)[j] = (int32_t)ra_floor_div(acc, c);
}

static inline void ra_put_float(const ra_sink* k, int64_t j, const float* v) {
    float* o = (float*)k->out + j * k->oc;
    if (k->oc == k->channels) {
        for (int i = 0; i < k->channels; i++) o[i] = v[i];
    } else {
        double acc = 0.0;
        for (int i = 0; i < k->channels; i++) acc += (double)v[i];
        o[0] = (float)(acc / k->channels);
    }
}

/* -- WAV ------------------------------------------------------------------------------------- */
static void ra_wav_frames(const uint8_t* p, const ra_header* h, int64_t start, int64_t count,
                          const ra_sink* k) {
    const uint8_t* d = p + h->data_off + start * h->block_align;
    int32_t v[RA_MAX_CHANNELS];
    float fv[RA_MAX_CHANNELS];
    int c = h->channels, b = h->bits / 8;
    for (int64_t j = 0; j < count; j++, d += h->block_align) {
        if (h->is_float) {
            for (int i = 0; i < c; i++) {
                uint32_t u = ra_le32(d + 4 * i);
                memcpy(&fv[i], &u, 4);
            }
            ra_put_float(k, j, fv);
            continue;
        }
        for (int i = 0; i < c; i++) {
            const uint8_t* q = d + b * i;
            switch (b) {
                case 1: v[i] = (int32_t)q[0] - 128; break;
                case 2: v[i] = (int16_t)ra_le16(q); break;
                case 3:
                    v[i] = (int32_t)(((uint32_t)q[0] << 8) | ((uint32_t)q[1] << 16) |
                                     ((uint32_t)q[2] << 24)) >> 8;
                    break;
                default: v[i] = (int32_t)ra_le32(q); break;
            }
        }
        ra_put_int(k, j, v);
    }
}

/* -- FLAC ------------------------------------------------------------------------------------ */
typedef struct {
    const uint8_t* p;
    int64_t n, pos;
    ra_sink sink;
    int64_t frames; /* the header's */
    int64_t start;  /* the first frame wanted */
    int64_t want;   /* frames wanted */
    int64_t got;    /* frames written */
    int err;
} ra_flac;

static FLAC__StreamDecoderReadStatus ra_read(const FLAC__StreamDecoder* d, FLAC__byte buf[],
                                             size_t* bytes, void* cd) {
    ra_flac* f = (ra_flac*)cd;
    (void)d;
    int64_t left = f->n - f->pos;
    if (left <= 0) {
        *bytes = 0;
        return FLAC__STREAM_DECODER_READ_STATUS_END_OF_STREAM;
    }
    if ((int64_t)*bytes > left) *bytes = (size_t)left;
    memcpy(buf, f->p + f->pos, *bytes);
    f->pos += (int64_t)*bytes;
    return FLAC__STREAM_DECODER_READ_STATUS_CONTINUE;
}

static FLAC__StreamDecoderSeekStatus ra_seek(const FLAC__StreamDecoder* d, FLAC__uint64 off,
                                             void* cd) {
    ra_flac* f = (ra_flac*)cd;
    (void)d;
    if (off > (FLAC__uint64)f->n) return FLAC__STREAM_DECODER_SEEK_STATUS_ERROR;
    f->pos = (int64_t)off;
    return FLAC__STREAM_DECODER_SEEK_STATUS_OK;
}

static FLAC__StreamDecoderTellStatus ra_tell(const FLAC__StreamDecoder* d, FLAC__uint64* off,
                                             void* cd) {
    (void)d;
    *off = (FLAC__uint64)((ra_flac*)cd)->pos;
    return FLAC__STREAM_DECODER_TELL_STATUS_OK;
}

static FLAC__StreamDecoderLengthStatus ra_length(const FLAC__StreamDecoder* d, FLAC__uint64* len,
                                                 void* cd) {
    (void)d;
    *len = (FLAC__uint64)((ra_flac*)cd)->n;
    return FLAC__STREAM_DECODER_LENGTH_STATUS_OK;
}

static FLAC__bool ra_eof(const FLAC__StreamDecoder* d, void* cd) {
    ra_flac* f = (ra_flac*)cd;
    (void)d;
    return f->pos >= f->n;
}

static FLAC__StreamDecoderWriteStatus ra_write(const FLAC__StreamDecoder* d, const FLAC__Frame* fr,
                                               const FLAC__int32* const buf[], void* cd) {
    ra_flac* f = (ra_flac*)cd;
    (void)d;
    if (f->err) return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
    const FLAC__FrameHeader* hd = &fr->header;
    int c = f->sink.channels;
    if ((int)hd->channels != c || (int)hd->bits_per_sample != f->sink.bits ||
        hd->number_type != FLAC__FRAME_NUMBER_TYPE_SAMPLE_NUMBER) {
        f->err = RA_CORRUPT; /* a frame unlike the stream's header */
        return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
    }
    int64_t first = (int64_t)hd->number.sample_number, bs = hd->blocksize;
    if (first != f->start + f->got || first + bs > f->frames) {
        f->err = RA_SIZE; /* audio out of order, or more of it than the header declares */
        return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT;
    }
    int64_t k = f->want - f->got;
    if (k > bs) k = bs;
    int32_t v[RA_MAX_CHANNELS];
    for (int64_t j = 0; j < k; j++) {
        for (int i = 0; i < c; i++) v[i] = buf[i][j];
        ra_put_int(&f->sink, f->got + j, v);
    }
    f->got += k;
    if (f->got >= f->want) return FLAC__STREAM_DECODER_WRITE_STATUS_ABORT; /* done */
    return FLAC__STREAM_DECODER_WRITE_STATUS_CONTINUE;
}

static void ra_error(const FLAC__StreamDecoder* d, FLAC__StreamDecoderErrorStatus st, void* cd) {
    (void)d;
    (void)st;
    ra_flac* f = (ra_flac*)cd;
    if (!f->err) f->err = RA_CORRUPT;
}

/* Decode frames [start, start + want) of a FLAC stream (header h) into the sink. */
static int ra_flac_frames(FLAC__StreamDecoder* dec, const uint8_t* p, int64_t n,
                          const ra_header* h, int64_t start, int64_t want, const ra_sink* k) {
    ra_flac f;
    memset(&f, 0, sizeof(f));
    f.p = p;
    f.n = n;
    f.sink = *k;
    f.frames = h->frames;
    f.start = start;
    f.want = want;
    if (want <= 0) return RA_OK;
    FLAC__stream_decoder_set_md5_checking(dec, false);
    if (FLAC__stream_decoder_init_stream(dec, ra_read, ra_seek, ra_tell, ra_length, ra_eof, ra_write,
                                         NULL, ra_error,
                                         &f) != FLAC__STREAM_DECODER_INIT_STATUS_OK) {
        FLAC__stream_decoder_finish(dec);
        return RA_NOMEM;
    }
    int ok = FLAC__stream_decoder_process_until_end_of_metadata(dec);
    if (ok && !f.err && start > 0) {
        ok = FLAC__stream_decoder_seek_absolute(dec, (FLAC__uint64)start);
        if (!ok && !f.err && f.got < f.want) f.err = RA_CORRUPT; /* the seek found no frame */
    }
    while (ok && !f.err && f.got < f.want) {
        FLAC__StreamDecoderState st = FLAC__stream_decoder_get_state(dec);
        if (st == FLAC__STREAM_DECODER_END_OF_STREAM || st == FLAC__STREAM_DECODER_ABORTED) break;
        ok = FLAC__stream_decoder_process_single(dec);
    }
    FLAC__StreamDecoderState st = FLAC__stream_decoder_get_state(dec);
    FLAC__stream_decoder_finish(dec);
    /* the data ended before the window did: truncated (a cut inside a frame is also a libFLAC
     * error, reported first; the end of the data is what went wrong) */
    if (f.got < f.want && st == FLAC__STREAM_DECODER_END_OF_STREAM && f.err != RA_SIZE)
        return RA_TRUNCATED;
    if (f.err) return f.err;
    if (f.got < f.want) {
        if (st == FLAC__STREAM_DECODER_MEMORY_ALLOCATION_ERROR) return RA_NOMEM;
        return st == FLAC__STREAM_DECODER_END_OF_STREAM ? RA_TRUNCATED : RA_CORRUPT;
    }
    return RA_OK;
}

/* One value: parse its header, check it against the expected frames (`expect` >= 0: exactly
 * that many, for a whole decode) and channels (`chans`), then decode frames [start, start +
 * count) into `out` (count * oc elements of otype), zeros past the value's end. `info` (if not
 * NULL) gets rate, channels, bits, frames, format. */
static int ra_decode_one(FLAC__StreamDecoder* dec, const uint8_t* p, int64_t n, int64_t expect,
                         int chans, int64_t start, int64_t count, int mono, int otype, uint8_t* out,
                         int64_t* info) {
    ra_header h;
    int s = ra_parse(p, n, &h);
    if (info != NULL) {
        info[0] = h.rate;
        info[1] = h.channels;
        info[2] = h.bits;
        info[3] = h.frames;
        info[4] = h.format;
    }
    if (s != RA_OK) return s;
    if (h.channels != chans || (expect >= 0 && h.frames != expect)) return RA_SIZE;
    if (h.is_float && otype != RA_F32) return RA_UNSUPPORTED;
    if (start < 0 || start > h.frames) return RA_RANGE;
    ra_sink k;
    k.out = out;
    k.otype = otype;
    k.channels = h.channels;
    k.bits = h.bits;
    k.oc = mono ? 1 : h.channels;
    int64_t have = h.frames - start;
    int64_t m = count < have ? count : have;
    int64_t esize = otype == RA_I16 ? 2 : 4;
    if (m < count) memset(out + m * k.oc * esize, 0, (size_t)((count - m) * k.oc * esize));
    if (h.format == RA_WAV) {
        ra_wav_frames(p, &h, start, m, &k);
        return RA_OK;
    }
    return ra_flac_frames(dec, p, n, &h, start, m, &k);
}

/* -- encoding -------------------------------------------------------------------------------- */
typedef struct {
    uint8_t* out;
    int64_t cap, pos, len;
    int over;
} ra_enc;

static FLAC__StreamEncoderWriteStatus ra_ewrite(const FLAC__StreamEncoder* e,
                                                const FLAC__byte buf[], size_t bytes,
                                                uint32_t samples, uint32_t frame, void* cd) {
    ra_enc* w = (ra_enc*)cd;
    (void)e;
    (void)samples;
    (void)frame;
    if ((int64_t)bytes > w->cap - w->pos) {
        w->over = 1;
        return FLAC__STREAM_ENCODER_WRITE_STATUS_FATAL_ERROR;
    }
    memcpy(w->out + w->pos, buf, bytes);
    w->pos += (int64_t)bytes;
    if (w->pos > w->len) w->len = w->pos;
    return FLAC__STREAM_ENCODER_WRITE_STATUS_OK;
}

static FLAC__StreamEncoderSeekStatus ra_eseek(const FLAC__StreamEncoder* e, FLAC__uint64 off,
                                              void* cd) {
    ra_enc* w = (ra_enc*)cd;
    (void)e;
    if (off > (FLAC__uint64)w->len) return FLAC__STREAM_ENCODER_SEEK_STATUS_ERROR;
    w->pos = (int64_t)off;
    return FLAC__STREAM_ENCODER_SEEK_STATUS_OK;
}

static FLAC__StreamEncoderTellStatus ra_etell(const FLAC__StreamEncoder* e, FLAC__uint64* off,
                                              void* cd) {
    (void)e;
    *off = (FLAC__uint64)((ra_enc*)cd)->pos;
    return FLAC__STREAM_ENCODER_TELL_STATUS_OK;
}

/* Encode `frames` interleaved frames of `channels` integer samples of `bits` bits into out
 * (cap bytes); returns the encoded length, or -1 (out too small), -2 (no memory), -3
 * (libFLAC refused the settings or the samples). */
static int64_t ra_flac_encode(const int32_t* x, int64_t frames, int channels, int bits,
                              uint32_t rate, int level, uint8_t* out, int64_t cap) {
    FLAC__StreamEncoder* e = FLAC__stream_encoder_new();
    ra_enc w;
    int64_t r = -3;
    if (e == NULL) return -2;
    memset(&w, 0, sizeof(w));
    w.out = out;
    w.cap = cap;
    FLAC__stream_encoder_set_verify(e, false);
    FLAC__stream_encoder_set_compression_level(e, (uint32_t)level);
    FLAC__stream_encoder_set_channels(e, (uint32_t)channels);
    FLAC__stream_encoder_set_bits_per_sample(e, (uint32_t)bits);
    FLAC__stream_encoder_set_sample_rate(e, rate);
    FLAC__stream_encoder_set_total_samples_estimate(e, (FLAC__uint64)frames);
    if (FLAC__stream_encoder_init_stream(e, ra_ewrite, ra_eseek, ra_etell, NULL, &w) ==
        FLAC__STREAM_ENCODER_INIT_STATUS_OK) {
        int ok = 1;
        for (int64_t done = 0; ok && done < frames;) {
            int64_t k = frames - done > 65536 ? 65536 : frames - done;
            ok = FLAC__stream_encoder_process_interleaved(e, x + done * channels, (uint32_t)k);
            done += k;
        }
        ok = FLAC__stream_encoder_finish(e) && ok;
        r = ok ? w.len : (w.over ? -1 : -3);
    }
    FLAC__stream_encoder_delete(e);
    return r;
}

#endif
