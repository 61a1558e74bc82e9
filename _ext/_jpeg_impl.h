/* The C side of _ext/_jpeg.pyx: one JPEG decoded with a crop, a DCT scale and a resize
 * (rj_decode_one), or decoded whole into an image of its own size (rj_decode_whole).
 *
 * Kept in C (not Cython) because libjpeg reports errors by calling error_exit, which must not
 * return: each decode sets a jump point with setjmp and the error manager longjmps back to
 * it, so a corrupt stream becomes a status code, never an abort. Everything a longjmp may
 * leave behind lives in memory the caller owns (the scratch struct), not in locals.
 *
 * Memory: libjpeg's own allocations for one image are bounded by max_work. A progressive or
 * multi-scan image keeps every DCT coefficient of the image (2 bytes per coefficient, 64 per
 * block: jdcoefct.c's whole-image buffer), allocated in jpeg_start_decompress whatever the
 * crop; rj_check_header refuses such an image when that buffer exceeds max_work before
 * anything is allocated, and max_memory_to_use makes libjpeg's memory manager refuse the same
 * (its virtual arrays have no backing store here: JERR_NO_BACKING_STORE). A single-scan image
 * needs only a few rows of its width.
 *
 * The geometry (which crop, which flip) is a pure function of the image size, the op and a
 * 64-bit key; rowstore/reader/image_ops.py states the same function in Python
 * (crop_params) and the tests compare the two.
 */
#ifndef ROWSTORE_JPEG_IMPL_H
#define ROWSTORE_JPEG_IMPL_H

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

enum { RJ_OK = 0, RJ_CORRUPT = 1, RJ_UNSUPPORTED = 2, RJ_NOMEM = 3, RJ_TOO_LARGE = 4, RJ_SIZE = 5 };
enum { RJ_RESIZE = 0, RJ_CENTER = 1, RJ_RRC = 2 };
enum { RJ_INFO = 8 }; /* info per image (doubles): h, w, y0, x0, crop_h, crop_w, flip, dct denominator */
enum { RJ_ROWS = 16 }; /* rows per jpeg_read_scanlines call of a whole decode */

typedef struct {
    int mode;
    int out_h, out_w, channels;
    double scale_lo, scale_hi, logr_lo, logr_hi; /* RandomResizedCrop */
    double fraction;                             /* CenterCrop */
    double flip_p;
    int64_t max_bytes; /* the most bytes of decoded (scaled) crop one image may take */
    int64_t max_work;  /* the most bytes libjpeg may allocate for one image */
    int max_denom;     /* the largest DCT scale denominator (8; 1: no DCT scaling) */
} rj_op;

typedef struct {
    uint8_t* buf; /* decoded rows of the crop */
    size_t cap;
    uint8_t* mid; /* horizontally resized rows */
    size_t mid_cap;
    int32_t* kx; /* coefficients */
    int32_t* ky;
    int* bx;
    int* by;
    size_t kcap, kycap;
    int32_t* ke; /* the horizontal weights, expanded for AVX2 */
    size_t ke_cap;
} rj_scratch;

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int status; /* what the longjmp means: RJ_CORRUPT, RJ_NOMEM or RJ_TOO_LARGE */
} rj_err;

static void rj_error_exit(j_common_ptr cinfo) {
    rj_err* e = (rj_err*)cinfo->err;
    int code = cinfo->err->msg_code;
    e->status = code == JERR_OUT_OF_MEMORY      ? RJ_NOMEM
                : code == JERR_NO_BACKING_STORE ? RJ_TOO_LARGE /* over max_memory_to_use */
                                                : RJ_CORRUPT;
    longjmp(e->jump, 1);
}

/* Warnings (level -1) are corrupt data libjpeg would paper over (a truncated stream padded
 * with grey, a bad Huffman code, extraneous bytes): refused like errors. Trace messages
 * (level >= 0) ignored. */
static void rj_emit_message(j_common_ptr cinfo, int level) {
    if (level < 0) {
        ((rj_err*)cinfo->err)->status = RJ_CORRUPT;
        longjmp(((rj_err*)cinfo->err)->jump, 1);
    }
}

static void rj_output_message(j_common_ptr cinfo) { (void)cinfo; }

/* The status a longjmp left (read from memory: the jump may skip register writes). */
static int rj_jumped(rj_err* e) { return *(volatile int*)&e->status; }

/* Set up cinfo (zeroed first, so that destroying it after an early jump is safe) with the
 * error manager; the caller sets its jump point next, then calls rj_create. */
static void rj_init(struct jpeg_decompress_struct* cinfo, rj_err* err) {
    memset(cinfo, 0, sizeof(*cinfo));
    cinfo->err = jpeg_std_error(&err->pub);
    err->pub.error_exit = rj_error_exit;
    err->pub.emit_message = rj_emit_message;
    err->pub.output_message = rj_output_message;
    err->status = RJ_CORRUPT;
}

static void rj_create(struct jpeg_decompress_struct* cinfo, int64_t max_work) {
    jpeg_create_decompress(cinfo);
    /* jinit_memory_mgr may have read JPEGMEM from the environment: ours decides */
    cinfo->mem->max_memory_to_use = (long)max_work;
}

/* The bytes of libjpeg's whole-image coefficient buffer (jdcoefct.c: a progressive or
 * multi-scan image, each component padded to its sampling factors), 0 for a single scan. */
static int64_t rj_coef_bytes(const struct jpeg_decompress_struct* cinfo) {
    int64_t total = 0;
    int ci;
    if (!cinfo->progressive_mode && cinfo->comps_in_scan >= cinfo->num_components) return 0;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        const jpeg_component_info* c = &cinfo->comp_info[ci];
        int64_t hs = c->h_samp_factor > 0 ? c->h_samp_factor : 1;
        int64_t vs = c->v_samp_factor > 0 ? c->v_samp_factor : 1;
        int64_t bw = ((int64_t)c->width_in_blocks + hs - 1) / hs * hs;
        int64_t bh = ((int64_t)c->height_in_blocks + vs - 1) / vs * vs;
        total += bw * bh * DCTSIZE2 * (int64_t)sizeof(JCOEF);
    }
    return total;
}

/* What every decode checks after jpeg_read_header, before jpeg_start_decompress allocates:
 * a size, an 8-bit Huffman-coded grey/YCbCr/RGB/CMYK/YCCK image (the jpeg codec's
 * processes), and a coefficient buffer within max_work. */
static int rj_check_header(const struct jpeg_decompress_struct* cinfo, int64_t max_work) {
    if (cinfo->image_height < 1 || cinfo->image_width < 1) return RJ_CORRUPT;
    if (cinfo->jpeg_color_space == JCS_UNKNOWN || cinfo->data_precision != 8 ||
        cinfo->arith_code)
        return RJ_UNSUPPORTED;
    if (rj_coef_bytes(cinfo) > max_work) return RJ_TOO_LARGE;
    return RJ_OK;
}

/* -- colour: the output's channels from any image, as PIL's convert("RGB") / ("L") -------- */
enum { RJ_CONV_NONE = 0, RJ_CONV_RGB2L = 1, RJ_CONV_CMYK = 2 };

/* Set libjpeg's output colour space for c output channels (1 or 3); returns how each decoded
 * row is converted after (RJ_CONV_*). Grey, YCbCr and RGB images decode to RGB by libjpeg (a
 * grey image repeated), grey images to grey; a colour image to grey decodes to RGB, then
 * PIL's rgb2l; a CMYK or YCCK image decodes to libjpeg's CMYK, then PIL's CMYK to RGB (and
 * to grey). */
static int rj_set_out(struct jpeg_decompress_struct* cinfo, int c) {
    if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
        cinfo->out_color_space = JCS_CMYK;
        return RJ_CONV_CMYK;
    }
    if (c == 3) {
        cinfo->out_color_space = JCS_RGB;
        return RJ_CONV_NONE;
    }
    if (cinfo->jpeg_color_space == JCS_GRAYSCALE) {
        cinfo->out_color_space = JCS_GRAYSCALE;
        return RJ_CONV_NONE;
    }
    cinfo->out_color_space = JCS_RGB;
    return RJ_CONV_RGB2L;
}

/* The components libjpeg outputs under a conversion (c: the output's channels). */
static int rj_conv_components(int conv, int c) {
    return conv == RJ_CONV_CMYK ? 4 : conv == RJ_CONV_RGB2L ? 3 : c;
}

/* PIL's L of an RGB pixel (Convert.c: L24(rgb) >> 16, ITU-R 601-2 luma). */
static inline uint8_t rj_luma(int r, int g, int b) {
    return (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
}

/* PIL's (x * y + 127.5) / 255, exactly: ImagingUtils.h's MULDIV255. */
static inline int rj_muldiv255(int a, int b) {
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
}

/* One row of n pixels converted from libjpeg's output (rj_conv_components of them) into c
 * channels. CMYK: libjpeg gives the samples as stored, which PIL reads inverted (Adobe's
 * convention, "CMYK;I": C = 255 - stored), then cmyk2rgb: R = CLIP8(nk - C nk / 255) with
 * nk = 255 - K = the stored K. */
static void rj_convert_row(const uint8_t* in, uint8_t* out, size_t n, int conv, int c) {
    size_t x;
    if (conv == RJ_CONV_RGB2L) {
        for (x = 0; x < n; x++, in += 3) out[x] = rj_luma(in[0], in[1], in[2]);
        return;
    }
    for (x = 0; x < n; x++, in += 4) {
        int nk = in[3];
        int r = nk - rj_muldiv255(255 - in[0], nk);
        int g = nk - rj_muldiv255(255 - in[1], nk);
        int b = nk - rj_muldiv255(255 - in[2], nk);
        r = r < 0 ? 0 : r;
        g = g < 0 ? 0 : g;
        b = b < 0 ? 0 : b;
        if (c == 3) {
            out[3 * x] = (uint8_t)r;
            out[3 * x + 1] = (uint8_t)g;
            out[3 * x + 2] = (uint8_t)b;
        } else {
            out[x] = rj_luma(r, g, b);
        }
    }
}

/* Whether the end marker (EOI) follows in the data libjpeg has not read yet, or was read: in
 * entropy-coded data a 0xFF byte is followed by 0x00 (stuffing), a fill 0xFF or a marker, so
 * 0xFF 0xD9 there is the EOI. A memchr over the compressed bytes left: a truncated file (the
 * commonest damage) is seen without decoding the rows a crop does not need. */
static int rj_has_eoi(const struct jpeg_decompress_struct* cinfo) {
    const uint8_t* q = (const uint8_t*)cinfo->src->next_input_byte;
    size_t left = cinfo->src->bytes_in_buffer;
    /* a multi-scan image was read whole by jpeg_start_decompress; else the marker may be
     * read already */
    if (jpeg_input_complete((j_decompress_ptr)cinfo) || cinfo->unread_marker == 0xD9) return 1;
    while (left >= 2) {
        const uint8_t* f = (const uint8_t*)memchr(q, 0xFF, left - 1);
        if (f == NULL) return 0;
        left -= (size_t)(f - q) + 1;
        q = f + 1;
        while (left > 1 && *q == 0xFF) { /* fill bytes */
            q++;
            left--;
        }
        if (*q == 0xD9) return 1;
    }
    return 0;
}

/* -- the random parameters: SplitMix64 from the key ------------------------------------------ */
static inline uint64_t rj_next(uint64_t* s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double rj_uniform(uint64_t* s) { return (double)(rj_next(s) >> 11) * 0x1.0p-53; }

/* A uniform integer in [0, b) (b >= 1): Lemire's multiply-and-reject, as order.py's shuffle. */
static inline uint64_t rj_bounded(uint64_t* s, uint64_t b) {
    uint64_t x = rj_next(s);
    __uint128_t m = (__uint128_t)x * b;
    uint64_t lo = (uint64_t)m;
    if (lo < b) {
        uint64_t t = (0 - b) % b;
        while (lo < t) {
            x = rj_next(s);
            m = (__uint128_t)x * b;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

/* Python's round() (half to even: the current rounding mode, never changed here), as
 * torchvision's parameter code rounds. */
static inline int64_t rj_round(double x) { return (int64_t)nearbyint(x); }

/* The crop box (y0, x0, ch, cw: source pixels, whole but for CenterCrop's) of an h x w image
 * and the flip, from the op and the key: torchvision's boxes (image_ops.crop_params). */
static void rj_crop(const rj_op* op, int64_t h, int64_t w, uint64_t key, double* y0,
                    double* x0, double* ch, double* cw, int* flip) {
    uint64_t s = key;
    int64_t a, b;
    int k;
    double ar;
    *y0 = 0; *x0 = 0; *ch = (double)h; *cw = (double)w;
    if (op->mode == RJ_RRC) {
        double area = (double)h * (double)w;
        for (k = 0; k < 10; k++) {
            double t = area * (op->scale_lo + rj_uniform(&s) * (op->scale_hi - op->scale_lo));
            double r = exp(op->logr_lo + rj_uniform(&s) * (op->logr_hi - op->logr_lo));
            a = rj_round(sqrt(t * r)); /* width */
            b = rj_round(sqrt(t / r)); /* height */
            if (a > 0 && a <= w && b > 0 && b <= h) {
                *ch = (double)b; *cw = (double)a;
                *y0 = (double)rj_bounded(&s, (uint64_t)(h - b + 1));
                *x0 = (double)rj_bounded(&s, (uint64_t)(w - a + 1));
                goto flip;
            }
        }
        /* torchvision's fallback: the whole image, its ratio clamped into the range */
        ar = (double)w / (double)h;
        a = w; b = h;
        if (ar < exp(op->logr_lo)) {
            b = rj_round((double)w / exp(op->logr_lo));
        } else if (ar > exp(op->logr_hi)) {
            a = rj_round((double)h * exp(op->logr_hi));
        }
        if (b < 1) b = 1;
        if (b > h) b = h;
        if (a < 1) a = 1;
        if (a > w) a = w;
        *ch = (double)b; *cw = (double)a;
        *y0 = (double)((h - b) / 2); *x0 = (double)((w - a) / 2);
    } else if (op->mode == RJ_CENTER) {
        /* torchvision's Resize(S) + CenterCrop(out), S = round(min(out_h, out_w) / fraction):
         * the shorter side resized to S, the longer to int(S * long / short), the output's
         * box at round((H' - out_h) / 2), round((W' - out_w) / 2) of that, in source pixels */
        int64_t S = rj_round((double)(op->out_h < op->out_w ? op->out_h : op->out_w) /
                             op->fraction);
        int64_t rh = h <= w ? S : (int64_t)((double)(S * h) / (double)w);
        int64_t rw = h <= w ? (int64_t)((double)(S * w) / (double)h) : S;
        if (S >= 1 && rh >= op->out_h && rw >= op->out_w) {
            double sy = (double)h / (double)rh, sx = (double)w / (double)rw;
            int64_t top = rj_round((double)(rh - op->out_h) / 2.0);
            int64_t left = rj_round((double)(rw - op->out_w) / 2.0);
            *y0 = (double)top * sy;
            *x0 = (double)left * sx;
            *ch = (double)(top + op->out_h) * sy - *y0;
            *cw = (double)(left + op->out_w) * sx - *x0;
        } else {
            /* (a size of another aspect than the resized image's) the largest centred box
             * of the output's aspect, times fraction each way, whole pixels */
            double want = (double)op->out_w / (double)op->out_h;
            double bh = (double)h, bw = (double)w;
            if (bw / bh > want) bw = bh * want; else bh = bw / want;
            b = rj_round(bh * op->fraction);
            a = rj_round(bw * op->fraction);
            if (b < 1) b = 1;
            if (b > h) b = h;
            if (a < 1) a = 1;
            if (a > w) a = w;
            *ch = (double)b; *cw = (double)a;
            *y0 = (double)((h - b) / 2); *x0 = (double)((w - a) / 2);
        }
    }
flip:
    *flip = op->flip_p > 0 && rj_uniform(&s) < op->flip_p;
}

/* -- resampling: PIL's separable triangle (bilinear) filter, antialiased when it shrinks ----- */
#define RJ_PREC 22
enum { RJ_STACK_TAPS = 64 }; /* taps whose weights rj_coeffs computes on its stack */

/* Coefficients of out_size outputs over the input interval [in0, in1) of an in_size axis:
 * output i reads inputs bounds[2i] .. bounds[2i] + bounds[2i+1] - 1 with weights
 * k[i * ksize ...]. Returns ksize (the most taps), or -1 without memory. PIL's
 * precompute_coeffs, with its fixed-point normalisation. */
static int rj_coeffs(double in0, double in1, int in_size, int out_size, int** bounds,
                     int32_t** kk, size_t* cap) {
    double scale = (in1 - in0) / out_size;
    double fs = scale < 1.0 ? 1.0 : scale;
    double support = fs; /* the triangle's support is 1, stretched when shrinking */
    int ksize = (int)ceil(support) * 2 + 1;
    size_t need = (size_t)out_size * (size_t)ksize;
    double wstack[RJ_STACK_TAPS];
    double* w;
    int i, x;
    if (need > *cap) {
        int32_t* nk = (int32_t*)realloc(*kk, need * sizeof(int32_t));
        int* nb;
        if (nk == NULL) return -1;
        *kk = nk;
        /* need >= 3 * out_size: the bounds (2 per output) fit in need ints as long as the
         * coefficients fit in cap */
        nb = (int*)realloc(*bounds, need * sizeof(int));
        if (nb == NULL) return -1;
        *bounds = nb;
        *cap = need;
    }
    w = ksize <= RJ_STACK_TAPS ? wstack : (double*)malloc((size_t)ksize * sizeof(double));
    if (w == NULL) return -1;
    for (i = 0; i < out_size; i++) {
        double center = in0 + (i + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int xmin = (int)(center - support + 0.5), xmax;
        if (xmin < 0) xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double t = (x + xmin - center + 0.5) * ss;
            t = t < 0 ? -t : t;
            w[x] = t < 1.0 ? 1.0 - t : 0.0;
            ww += w[x];
        }
        for (x = 0; x < ksize; x++) {
            double v = (x < xmax && ww != 0.0) ? w[x] / ww : 0.0;
            (*kk)[i * ksize + x] = (int32_t)(v < 0 ? -0.5 + v * (1 << RJ_PREC)
                                                   : 0.5 + v * (1 << RJ_PREC));
        }
        (*bounds)[2 * i] = xmin;
        (*bounds)[2 * i + 1] = xmax;
    }
    if (w != wstack) free(w);
    return ksize;
}

/* The weights are >= 0 and sum to 1 << RJ_PREC, so 255 * 2^22 + 2^21 fits an int32. */
static inline uint8_t rj_clip32(int32_t v) {
    v >>= RJ_PREC;
    return v < 0 ? 0 : (v > 255 ? 255 : (uint8_t)v);
}

/* What one resize reads and writes: the filter's weights each way (kx, ky taps) and the
 * order of the passes. Horizontal first (vfirst 0): mid holds the rows [r0, r1) of src the
 * vertical pass reads, filtered horizontally and flipped (mw = ow * c bytes each). Vertical
 * first: mid holds the oh output rows over the columns [c0, c1) the horizontal pass reads
 * (mw = (c1 - c0) * c bytes each), then the slack bytes a vector load may read past its last
 * row (zeroed; the weights there are 0). */
typedef struct {
    int kx, ky, copy_x, copy_y, vfirst, r0, r1, c0, c1;
    size_t mw;
} rj_plan;

/* The bytes rj_resize's AVX2 horizontal pass may read past the end of its input's last row
 * (rows of w pixels resized to ow): up to kx taps (<= 2 (w / ow + 1) + 1) and a byte past a
 * pixel's last tap; the weights there are 0. For src, the caller allocates and zeroes them. */
static size_t rj_src_slack(int w, int ow, int c) {
    return (size_t)(2 * (w / ow + 2) + 3) * (size_t)c + 64;
}

/* The order of the passes is Pillow's (13, ImagingResampleInner): vertical first when the
 * image (img_h x img_w, all of it, not the box) loses more than twice as many rows as it
 * loses columns, else horizontal first. */
static int rj_plan_resize(int sh, int sw, int c, double by0, double by1, double bx0, double bx1,
                          int oh, int ow, int64_t img_h, int64_t img_w, rj_scratch* s,
                          rj_plan* p) {
    size_t midn, slack = 0;
    p->kx = rj_coeffs(bx0, bx1, sw, ow, &s->bx, &s->kx, &s->kcap);
    if (p->kx < 0) return RJ_NOMEM;
    p->ky = rj_coeffs(by0, by1, sh, oh, &s->by, &s->ky, &s->kycap);
    if (p->ky < 0) return RJ_NOMEM;
    p->copy_x = bx1 - bx0 == ow && bx0 == floor(bx0) && bx0 >= 0 && bx1 <= sw;
    p->copy_y = by1 - by0 == oh && by0 == floor(by0) && by0 >= 0 && by1 <= sh;
    p->vfirst = oh < img_h && img_h - oh > 2 * (img_w - ow);
    if (p->copy_y) {
        p->r0 = (int)by0;
        p->r1 = p->r0 + oh;
    } else {
        p->r0 = s->by[0];
        p->r1 = s->by[2 * (oh - 1)] + s->by[2 * (oh - 1) + 1];
        if (p->r1 <= p->r0) p->r1 = p->r0 + 1;
    }
    if (p->copy_x) {
        p->c0 = (int)bx0;
        p->c1 = p->c0 + ow;
    } else {
        p->c0 = s->bx[0];
        p->c1 = s->bx[2 * (ow - 1)] + s->bx[2 * (ow - 1) + 1];
        if (p->c1 <= p->c0) p->c1 = p->c0 + 1;
    }
    if (p->vfirst) {
        p->mw = (size_t)(p->c1 - p->c0) * c;
        slack = rj_src_slack(p->c1 - p->c0, ow, c);
        midn = (size_t)oh * p->mw + slack;
    } else {
        p->mw = (size_t)ow * c;
        midn = (size_t)(p->r1 - p->r0) * p->mw;
    }
    if (midn > s->mid_cap) {
        uint8_t* m = (uint8_t*)realloc(s->mid, midn);
        if (m == NULL) return RJ_NOMEM;
        s->mid = m;
        s->mid_cap = midn;
    }
    if (slack) memset(s->mid + (size_t)oh * p->mw, 0, slack);
    return RJ_OK;
}

/* ow pixels of row from column c0, copied into m, mirrored with flip. */
static void rj_copy_row(const uint8_t* row, int c0, int ow, int c, int flip, uint8_t* m) {
    int x;
    if (!flip) {
        memcpy(m, row + (size_t)c0 * c, (size_t)ow * c);
        return;
    }
    for (x = 0; x < ow; x++) memcpy(m + (size_t)(ow - 1 - x) * c, row + (size_t)(c0 + x) * c, c);
}

/* One row of the horizontal pass: position x of m shows output xo (ow - 1 - x with flip),
 * the sum of its taps over row (whose column 0 is column c0 of the box's coordinates). */
static void rj_hrow_c(const uint8_t* row, int c0, const rj_plan* p, const rj_scratch* s, int c,
                      int ow, int flip, uint8_t* m) {
    int x, i, j;
    for (x = 0; x < ow; x++) {
        int xo = flip ? ow - 1 - x : x, n = s->bx[2 * xo + 1];
        const uint8_t* in = row + (size_t)(s->bx[2 * xo] - c0) * c;
        const int32_t* k = s->kx + (size_t)xo * p->kx;
        for (i = 0; i < c; i++) {
            int32_t a = 1 << (RJ_PREC - 1);
            for (j = 0; j < n; j++) a += (int32_t)in[j * c + i] * k[j];
            m[(size_t)x * c + i] = rj_clip32(a);
        }
    }
}

/* One row of the vertical pass: d[i] (i < w) is the sum of output row y's taps over the rows
 * of base (stride bytes apart; base's row 0 is row r0 of the box's coordinates). */
static void rj_vrow_c(const uint8_t* base, size_t stride, int r0, const rj_plan* p,
                      const rj_scratch* s, int y, size_t w, uint8_t* d) {
    const int32_t* k = s->ky + (size_t)y * p->ky;
    const uint8_t* b = base + (size_t)(s->by[2 * y] - r0) * stride;
    int j, n = s->by[2 * y + 1];
    size_t i;
    for (i = 0; i < w; i++) {
        int32_t a = 1 << (RJ_PREC - 1);
        for (j = 0; j < n; j++) a += (int32_t)b[(size_t)j * stride + i] * k[j];
        d[i] = rj_clip32(a);
    }
}

/* Resize the box [bx0, bx1) x [by0, by1) of src (sh rows of sw pixels, c channels; part of
 * an img_h x img_w image) to out (oh x ow x c), mirrored left-right with flip, as Pillow's
 * ImagingResample does it: its pass order (rj_plan_resize), its fixed-point weights of
 * RJ_PREC bits (rj_coeffs), each pass rounded and clamped to 8 bits. So the pixels are
 * Pillow's resize(box=..., reducing_gap=None) of the same decoded pixels, to the bit. An axis
 * whose box is the output's size at a whole-pixel offset is copied, not filtered (its weights
 * would be one tap of 1). RJ_OK or RJ_NOMEM. The plain C statement of the arithmetic;
 * rj_resize_avx2 computes the same integers. */
static int rj_resize_c(const uint8_t* src, int sh, int sw, int c, double by0, double by1,
                       double bx0, double bx1, uint8_t* out, int oh, int ow, int flip,
                       int64_t img_h, int64_t img_w, rj_scratch* s) {
    rj_plan p;
    int y, status;
    size_t sstride = (size_t)sw * c, orow = (size_t)ow * c;
    status = rj_plan_resize(sh, sw, c, by0, by1, bx0, bx1, oh, ow, img_h, img_w, s, &p);
    if (status != RJ_OK) return status;
    if (p.vfirst) {
        for (y = 0; y < oh; y++) {
            uint8_t* m = s->mid + (size_t)y * p.mw;
            if (p.copy_y)
                memcpy(m, src + ((size_t)p.r0 + y) * sstride + (size_t)p.c0 * c, p.mw);
            else
                rj_vrow_c(src + (size_t)p.c0 * c, sstride, 0, &p, s, y, p.mw, m);
        }
        for (y = 0; y < oh; y++) {
            const uint8_t* m = s->mid + (size_t)y * p.mw;
            if (p.copy_x)
                rj_copy_row(m, 0, ow, c, flip, out + (size_t)y * orow);
            else
                rj_hrow_c(m, p.c0, &p, s, c, ow, flip, out + (size_t)y * orow);
        }
        return RJ_OK;
    }
    for (y = p.r0; y < p.r1; y++) {
        uint8_t* m = s->mid + (size_t)(y - p.r0) * p.mw;
        if (p.copy_x)
            rj_copy_row(src + (size_t)y * sstride, p.c0, ow, c, flip, m);
        else
            rj_hrow_c(src + (size_t)y * sstride, 0, &p, s, c, ow, flip, m);
    }
    for (y = 0; y < oh; y++) {
        if (p.copy_y)
            memcpy(out + (size_t)y * orow, s->mid + (size_t)y * p.mw, orow);
        else
            rj_vrow_c(s->mid, p.mw, p.r0, &p, s, y, orow, out + (size_t)y * orow);
    }
    return RJ_OK;
}

#if defined(__GNUC__) && defined(__x86_64__)
#define RJ_HAVE_AVX2 1
#include <immintrin.h>

/* 8 int32 sums >> RJ_PREC, clamped to 0..255 as rj_clip32 does (saturating packs), as 4
 * pairs of 8 bytes in the order given: a, b, c, d -> 32 bytes in that order. */
__attribute__((target("avx2"))) static inline __m256i rj_pack32(__m256i a, __m256i b,
                                                                __m256i c, __m256i d) {
    __m256i ab = _mm256_packs_epi32(_mm256_srai_epi32(a, RJ_PREC), _mm256_srai_epi32(b, RJ_PREC));
    __m256i cd = _mm256_packs_epi32(_mm256_srai_epi32(c, RJ_PREC), _mm256_srai_epi32(d, RJ_PREC));
    return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 bytes at p as 8 int32 (an unaligned load). */
__attribute__((target("avx2"))) static inline __m256i rj_load8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}

/* One output row of the vertical pass: m[i] = clip(sum_j base[j * stride + i] * k[j]) for
 * i < mw, the sums held in registers 32 columns at a time. */
__attribute__((target("avx2"))) static void rj_vpass_avx2(const uint8_t* base, size_t stride,
                                                          const int32_t* k, int n, uint8_t* m,
                                                          size_t mw) {
    const __m256i half = _mm256_set1_epi32(1 << (RJ_PREC - 1));
    size_t i = 0;
    int j;
    for (; i + 32 <= mw; i += 32) {
        __m256i a0 = half, a1 = half, a2 = half, a3 = half;
        for (j = 0; j < n; j++) {
            const uint8_t* r = base + (size_t)j * stride + i;
            __m256i kj = _mm256_set1_epi32(k[j]);
            a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(rj_load8(r), kj));
            a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(rj_load8(r + 8), kj));
            a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(rj_load8(r + 16), kj));
            a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(rj_load8(r + 24), kj));
        }
        _mm256_storeu_si256((__m256i*)(m + i), rj_pack32(a0, a1, a2, a3));
    }
    for (; i + 8 <= mw; i += 8) {
        __m256i a0 = half, z = _mm256_setzero_si256();
        __m256i v;
        for (j = 0; j < n; j++)
            a0 = _mm256_add_epi32(
                a0, _mm256_mullo_epi32(rj_load8(base + (size_t)j * stride + i),
                                       _mm256_set1_epi32(k[j])));
        v = rj_pack32(a0, z, z, z);
        _mm_storel_epi64((__m128i*)(m + i), _mm256_castsi256_si128(v));
    }
    for (; i < mw; i++) {
        int32_t a = 1 << (RJ_PREC - 1);
        for (j = 0; j < n; j++) a += (int32_t)base[(size_t)j * stride + i] * k[j];
        m[i] = rj_clip32(a);
    }
}

/* The horizontal pass of a 3-channel row, in output order (the flip already in the tables),
 * four output pixels at a time: pixel p (of group g = p / 4) is the sum over taps j < nt[g]
 * of the 4 bytes at row + st[p] + 3 j (a pixel and the next one's first byte) times the
 * weights (k, k, k, 0) in ke, zero past the pixel's own taps; the row may be read past its end
 * (rj_src_slack). It writes only the row's ow * 3 bytes (a group whose 16-byte store would
 * pass the row's end is stored through tmp). */
__attribute__((target("avx2"))) static void rj_hpass3_avx2(const uint8_t* row, const int* st,
                                                           const int* nt, const int32_t* ke,
                                                           int kst, uint8_t* d, int ow) {
    const __m256i half = _mm256_set1_epi32(1 << (RJ_PREC - 1));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m128i rgb = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    int g, j, groups = (ow + 3) / 4;
    for (g = 0; g < groups; g++) {
        const uint8_t* i0 = row + st[4 * g];
        const uint8_t* i1 = row + st[4 * g + 1];
        const uint8_t* i2 = row + st[4 * g + 2];
        const uint8_t* i3 = row + st[4 * g + 3];
        const __m256i* k = (const __m256i*)(ke + (size_t)g * kst * 16);
        __m256i a = half, b = half, u;
        __m128i v;
        int32_t w0, w1, w2, w3;
        for (j = 0; j < nt[g]; j++) {
            memcpy(&w0, i0 + 3 * j, 4);
            memcpy(&w1, i1 + 3 * j, 4);
            memcpy(&w2, i2 + 3 * j, 4);
            memcpy(&w3, i3 + 3 * j, 4);
            a = _mm256_add_epi32(
                a, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_setr_epi32(w0, w1, 0, 0)),
                                      _mm256_loadu_si256(k + 2 * j)));
            b = _mm256_add_epi32(
                b, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_setr_epi32(w2, w3, 0, 0)),
                                      _mm256_loadu_si256(k + 2 * j + 1)));
        }
        u = _mm256_packs_epi32(_mm256_srai_epi32(a, RJ_PREC), _mm256_srai_epi32(b, RJ_PREC));
        u = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(u, u), order);
        v = _mm_shuffle_epi8(_mm256_castsi256_si128(u), rgb);
        if (12 * g + 16 <= 3 * ow) {
            _mm_storeu_si128((__m128i*)(d + (size_t)g * 12), v); /* 4 bytes over: rewritten */
        } else {
            uint8_t tmp[16];
            _mm_storeu_si128((__m128i*)tmp, v);
            memcpy(d + (size_t)g * 12, tmp, (size_t)(ow - 4 * g < 4 ? ow - 4 * g : 4) * 3);
        }
    }
}

/* The tables of rj_hpass3_avx2 for a resize, in output order (the flip in them): st (a byte
 * offset per pixel, its first tap's column less c0), nt (taps per group of 4), ke (kx taps
 * per group, 16 weights per tap: (k, k, k, 0) per pixel). NULL without memory. */
static int32_t* rj_htables(const rj_plan* p, rj_scratch* s, int ow, int flip, int c0,
                           int** st, int** nt) {
    int g, i, j, groups = (ow + 3) / 4, kst = p->kx;
    size_t need = (size_t)groups * kst * 16 + (size_t)groups * 5;
    int32_t* ke;
    if (need > s->ke_cap) {
        int32_t* e = (int32_t*)realloc(s->ke, need * sizeof(int32_t));
        if (e == NULL) return NULL;
        s->ke = e;
        s->ke_cap = need;
    }
    ke = s->ke;
    *st = (int*)(ke + (size_t)groups * kst * 16);
    *nt = *st + (size_t)groups * 4;
    for (g = 0; g < groups; g++) {
        int most = 0;
        for (i = 0; i < 4; i++) {
            int q = 4 * g + i, xo = flip ? ow - 1 - q : q, n;
            const int32_t* k;
            if (q >= ow) xo = flip ? 0 : ow - 1; /* padding: computed, not stored */
            k = s->kx + (size_t)xo * p->kx;
            n = s->bx[2 * xo + 1];
            (*st)[q] = (s->bx[2 * xo] - c0) * 3;
            if (n > most) most = n;
            for (j = 0; j < kst; j++) {
                int32_t* e = ke + ((size_t)g * kst + j) * 16 + 4 * i;
                int32_t kj = j < n ? k[j] : 0;
                e[0] = e[1] = e[2] = kj;
                e[3] = 0;
            }
        }
        (*nt)[g] = most;
    }
    return ke;
}

/* rj_resize_c's integers, with AVX2: the horizontal pass of a 3-channel image four output
 * pixels at a time, the vertical pass 32 bytes at a time in registers. src must have
 * rj_src_slack(sw, ow, 3) readable bytes past its last row. */
__attribute__((target("avx2"))) static int rj_resize_avx2(const uint8_t* src, int sh, int sw,
                                                          int c, double by0, double by1,
                                                          double bx0, double bx1, uint8_t* out,
                                                          int oh, int ow, int flip,
                                                          int64_t img_h, int64_t img_w,
                                                          rj_scratch* s) {
    rj_plan p;
    int y, status, *st = NULL, *nt = NULL;
    int32_t* ke = NULL;
    size_t sstride = (size_t)sw * c, orow = (size_t)ow * c;
    if (c != 3)
        return rj_resize_c(src, sh, sw, c, by0, by1, bx0, bx1, out, oh, ow, flip, img_h, img_w,
                           s);
    status = rj_plan_resize(sh, sw, c, by0, by1, bx0, bx1, oh, ow, img_h, img_w, s, &p);
    if (status != RJ_OK) return status;
    if (!p.copy_x) {
        ke = rj_htables(&p, s, ow, flip, p.vfirst ? p.c0 : 0, &st, &nt);
        if (ke == NULL) return RJ_NOMEM;
    }
    if (p.vfirst) {
        for (y = 0; y < oh; y++) {
            uint8_t* m = s->mid + (size_t)y * p.mw;
            if (p.copy_y)
                memcpy(m, src + ((size_t)p.r0 + y) * sstride + (size_t)p.c0 * c, p.mw);
            else
                rj_vpass_avx2(src + (size_t)s->by[2 * y] * sstride + (size_t)p.c0 * c, sstride,
                              s->ky + (size_t)y * p.ky, s->by[2 * y + 1], m, p.mw);
        }
        for (y = 0; y < oh; y++) {
            const uint8_t* m = s->mid + (size_t)y * p.mw;
            if (p.copy_x)
                rj_copy_row(m, 0, ow, c, flip, out + (size_t)y * orow);
            else
                rj_hpass3_avx2(m, st, nt, ke, p.kx, out + (size_t)y * orow, ow);
        }
        return RJ_OK;
    }
    for (y = p.r0; y < p.r1; y++) {
        uint8_t* m = s->mid + (size_t)(y - p.r0) * p.mw;
        if (p.copy_x)
            rj_copy_row(src + (size_t)y * sstride, p.c0, ow, c, flip, m);
        else
            rj_hpass3_avx2(src + (size_t)y * sstride, st, nt, ke, p.kx, m, ow);
    }
    for (y = 0; y < oh; y++) {
        uint8_t* d = out + (size_t)y * orow;
        if (p.copy_y)
            memcpy(d, s->mid + (size_t)y * p.mw, orow);
        else
            rj_vpass_avx2(s->mid + (size_t)(s->by[2 * y] - p.r0) * p.mw, p.mw,
                          s->ky + (size_t)y * p.ky, s->by[2 * y + 1], d, orow);
    }
    return RJ_OK;
}
#else
#define RJ_HAVE_AVX2 0
#endif

/* Whether rj_resize uses the AVX2 code: 1 where the CPU has it (decided once), 0 for the
 * plain C; rj_set_simd(0) forces the C (the tests compare the two). */
static int rj_simd = -1;

static int rj_use_simd(void) {
    int v = __atomic_load_n(&rj_simd, __ATOMIC_RELAXED);
    if (v < 0) {
#if RJ_HAVE_AVX2
        __builtin_cpu_init();
        v = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
        v = 0;
#endif
        __atomic_store_n(&rj_simd, v, __ATOMIC_RELAXED);
    }
    return v;
}

/* Force the plain C resize (0) or allow AVX2 where the CPU has it (1); returns whether AVX2
 * is used now. */
static int rj_set_simd(int enabled) {
    __atomic_store_n(&rj_simd, -1, __ATOMIC_RELAXED);
    if (!enabled) __atomic_store_n(&rj_simd, 0, __ATOMIC_RELAXED);
    return rj_use_simd();
}

static int rj_resize(const uint8_t* src, int sh, int sw, int c, double by0, double by1,
                     double bx0, double bx1, uint8_t* out, int oh, int ow, int flip,
                     int64_t img_h, int64_t img_w, rj_scratch* s) {
#if RJ_HAVE_AVX2
    if (rj_use_simd())
        return rj_resize_avx2(src, sh, sw, c, by0, by1, bx0, bx1, out, oh, ow, flip, img_h,
                              img_w, s);
#endif
    return rj_resize_c(src, sh, sw, c, by0, by1, bx0, bx1, out, oh, ow, flip, img_h, img_w, s);
}

/* -- one image --------------------------------------------------------------------------------- */

/* Decode the n bytes at p per op into out (op->out_h x op->out_w x op->channels), the
 * geometry drawn from key; info (RJ_INFO int64s, or NULL) gets what was done. Returns a
 * status code; never aborts, never writes outside out and the scratch. */
static int rj_decode_one(const uint8_t* p, int64_t n, const rj_op* op, uint64_t key,
                         uint8_t* out, rj_scratch* s, double* info) {
    struct jpeg_decompress_struct cinfo;
    rj_err err;
    int64_t h, w, c0, c1, r0, r1, d, img_h, img_w;
    double y0, x0, ch, cw;
    int flip, status = RJ_OK, c = op->channels, conv;
    JSAMPARRAY tmp = NULL;
    JDIMENSION xoff, xw;
    double sy, sx;
    size_t need, stride, slack;
    int64_t y;

    if (n <= 0 || n > 0xFFFFFFFFLL) return RJ_CORRUPT;
    rj_init(&cinfo, &err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return rj_jumped(&err);
    }
    rj_create(&cinfo, op->max_work);
    jpeg_mem_src(&cinfo, (const unsigned char*)p, (unsigned long)n);
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_CORRUPT;
    }
    status = rj_check_header(&cinfo, op->max_work);
    if (status != RJ_OK) {
        jpeg_destroy_decompress(&cinfo);
        return status;
    }
    h = cinfo.image_height;
    w = cinfo.image_width;
    conv = rj_set_out(&cinfo, c);
    rj_crop(op, h, w, key, &y0, &x0, &ch, &cw, &flip);
    /* the smallest DCT scale 1/d that keeps the crop at or above the output size */
    for (d = op->max_denom >= 8 ? 8 : op->max_denom >= 4 ? 4 : op->max_denom >= 2 ? 2 : 1; d > 1;
         d /= 2)
        if (ch >= (double)op->out_h * d && cw >= (double)op->out_w * d) break;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)d;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != rj_conv_components(conv, c)) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_UNSUPPORTED;
    }
    /* the crop in scaled pixels, and the rows and columns the filter reads around it */
    /* scaled pixel k covers source pixels [k d, (k + 1) d): the scale is exactly 1/d (the
     * last, partial block rounds output_width up, not the scale) */
    sy = 1.0 / (double)d;
    sx = 1.0 / (double)d;
    {
        double fy = (double)ch * sy / op->out_h, fx = (double)cw * sx / op->out_w;
        double py = (fy < 1 ? 1 : fy) + 1, px = (fx < 1 ? 1 : fx) + 1;
        r0 = (int64_t)floor(y0 * sy - py);
        r1 = (int64_t)ceil((y0 + ch) * sy + py);
        c0 = (int64_t)floor(x0 * sx - px);
        c1 = (int64_t)ceil((x0 + cw) * sx + px);
    }
    if (r0 < 0) r0 = 0;
    if (c0 < 0) c0 = 0;
    if (r1 > (int64_t)cinfo.output_height) r1 = cinfo.output_height;
    if (c1 > (int64_t)cinfo.output_width) c1 = cinfo.output_width;
    img_h = cinfo.output_height; /* the scaled image, before the crop narrows output_width */
    img_w = cinfo.output_width;
    xoff = (JDIMENSION)c0;
    xw = (JDIMENSION)(c1 - c0);
    if (c0 > 0 || c1 < (int64_t)cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &xoff, &xw); /* widened to iMCU boundaries */
    if (conv != RJ_CONV_NONE) /* a row as libjpeg outputs it, freed with cinfo */
        tmp = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                         cinfo.output_width * cinfo.output_components, 1);
    stride = (size_t)cinfo.output_width * (size_t)c;
    need = stride * (size_t)(r1 - r0);
    slack = rj_src_slack((int)cinfo.output_width, op->out_w, c);
    if ((int64_t)need > op->max_bytes) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_TOO_LARGE;
    }
    if (need + slack > s->cap) {
        uint8_t* b = (uint8_t*)realloc(s->buf, need + slack);
        if (b == NULL) {
            jpeg_destroy_decompress(&cinfo);
            return RJ_NOMEM;
        }
        s->buf = b;
        s->cap = need + slack;
    }
    memset(s->buf + need, 0, slack); /* what the resize may read past the last row */
    if (r0 > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)r0) != (JDIMENSION)r0) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_CORRUPT;
    }
    for (y = r0; y < r1;) {
        JSAMPROW row = s->buf + (size_t)(y - r0) * stride;
        JDIMENSION got = jpeg_read_scanlines(&cinfo, tmp != NULL ? tmp : &row, 1);
        if (got != 1) {
            jpeg_destroy_decompress(&cinfo);
            return RJ_CORRUPT;
        }
        if (tmp != NULL) rj_convert_row(tmp[0], row, cinfo.output_width, conv, c);
        y += got;
    }
    if (r1 == (int64_t)cinfo.output_height) {
        jpeg_finish_decompress(&cinfo); /* reads on to the end marker: a damaged tail is seen */
    } else {
        /* the rows below the crop are not decoded; a stream cut short (no end marker after
         * the data read so far) is refused all the same, as the whole decode refuses it */
        int eoi = rj_has_eoi(&cinfo);
        jpeg_abort_decompress(&cinfo);
        if (!eoi) {
            jpeg_destroy_decompress(&cinfo);
            return RJ_CORRUPT;
        }
    }
    {
        double by0 = y0 * sy - r0, by1 = (y0 + ch) * sy - r0;
        double bx0 = x0 * sx - (double)xoff, bx1 = (x0 + cw) * sx - (double)xoff;
        status = rj_resize(s->buf, (int)(r1 - r0), (int)cinfo.output_width, c, by0, by1, bx0,
                           bx1, out, op->out_h, op->out_w, flip, img_h, img_w, s);
    }
    jpeg_destroy_decompress(&cinfo);
    if (info != NULL) {
        info[0] = (double)h; info[1] = (double)w; info[2] = y0; info[3] = x0;
        info[4] = ch; info[5] = cw; info[6] = flip; info[7] = (double)d;
    }
    return status;
}

/* Decode the n bytes at p whole, at full scale, straight into out: h rows of w * c samples
 * (c 1: grey, 3: RGB; any image converted to them as PIL's convert does: rj_set_out), the
 * image's own size (RJ_SIZE for another size). Reads to the end marker: every warning on the way is
 * a refusal. A failed image leaves out partly written. Allocates nothing but libjpeg's
 * memory (at most max_work). */
static int rj_decode_whole(const uint8_t* p, int64_t n, int64_t h, int64_t w, int c,
                           int64_t max_work, uint8_t* out) {
    struct jpeg_decompress_struct cinfo;
    rj_err err;
    JSAMPROW rows[RJ_ROWS];
    JSAMPARRAY tmp = NULL;
    size_t stride = (size_t)w * (size_t)c;
    int status, conv;

    if (n <= 0 || n > 0xFFFFFFFFLL) return RJ_CORRUPT;
    rj_init(&cinfo, &err);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return rj_jumped(&err);
    }
    rj_create(&cinfo, max_work);
    jpeg_mem_src(&cinfo, (const unsigned char*)p, (unsigned long)n);
    if (jpeg_read_header(&cinfo, TRUE) != JPEG_HEADER_OK) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_CORRUPT;
    }
    status = rj_check_header(&cinfo, max_work);
    if (status == RJ_OK && ((int64_t)cinfo.image_height != h || (int64_t)cinfo.image_width != w))
        status = RJ_SIZE;
    if (status != RJ_OK) {
        jpeg_destroy_decompress(&cinfo);
        return status;
    }
    conv = rj_set_out(&cinfo, c);
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != rj_conv_components(conv, c) ||
        (int64_t)cinfo.output_height != h || (int64_t)cinfo.output_width != w) {
        jpeg_destroy_decompress(&cinfo);
        return RJ_UNSUPPORTED;
    }
    if (conv != RJ_CONV_NONE) /* rows as libjpeg outputs them, freed with cinfo */
        tmp = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE,
                                         cinfo.output_width * cinfo.output_components, RJ_ROWS);
    while (cinfo.output_scanline < cinfo.output_height) {
        JDIMENSION y = cinfo.output_scanline, m = cinfo.output_height - y, k, got;
        if (m > RJ_ROWS) m = RJ_ROWS;
        for (k = 0; k < m; k++) rows[k] = out + ((size_t)y + k) * stride;
        got = jpeg_read_scanlines(&cinfo, tmp != NULL ? tmp : rows, m);
        if (got == 0) {
            jpeg_destroy_decompress(&cinfo);
            return RJ_CORRUPT;
        }
        if (tmp != NULL)
            for (k = 0; k < got; k++) rj_convert_row(tmp[k], rows[k], (size_t)w, conv, c);
    }
    jpeg_finish_decompress(&cinfo); /* on to the end marker: a damaged tail is seen */
    jpeg_destroy_decompress(&cinfo);
    return RJ_OK;
}

static void rj_scratch_free(rj_scratch* s) {
    free(s->buf);
    free(s->mid);
    free(s->kx);
    free(s->ky);
    free(s->bx);
    free(s->by);
    free(s->ke);
    memset(s, 0, sizeof(*s));
}

#endif
