/* image.c - images in for ZAYA1-VL: PPM and PNG decoding (with its own inflate), and the image processor's
 * preprocessing step by step (image.h). The upstream code it mirrors: transformers'
 * models/qwen2_vl/image_processing_pil_qwen2_vl.py (smart_resize, resize, rescale, normalize, patchify) and
 * Pillow's libImaging/Resample.c (the BICUBIC resampling PIL's Image.resize runs).
 */
#define _POSIX_C_SOURCE 200809L
#include "image.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Files: the whole file in memory, then PPM or PNG by its first bytes
 * ------------------------------------------------------------------------------------------- */

static uint8_t *read_all(const char *path, size_t *n, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { zaya_fail(err, errlen, "cannot open image %s\n  hint: give a .ppm or .png file", path); return NULL; }
    size_t cap = 1 << 16, len = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            uint8_t *more = cap < ((size_t)1 << 31) ? realloc(buf, cap *= 2) : NULL;
            if (!more) free(buf);
            buf = more;
        }
    }
    fclose(f);
    if (!buf) { zaya_fail(err, errlen, "image %s: out of memory or over 2 GB", path); return NULL; }
    *n = len;
    return buf;
}

/* PPM: "P6" (binary) or "P3" (text), width, height, maxval 255, comments (#) between the fields. */
static int ppm_field(const uint8_t *b, size_t n, size_t *at, long *v) {
    for (;;) {
        while (*at < n && (b[*at] == ' ' || b[*at] == '\t' || b[*at] == '\n' || b[*at] == '\r')) (*at)++;
        if (*at < n && b[*at] == '#') {
            while (*at < n && b[*at] != '\n') (*at)++;
            continue;
        }
        break;
    }
    if (*at >= n || b[*at] < '0' || b[*at] > '9') return -1;
    *v = 0;
    while (*at < n && b[*at] >= '0' && b[*at] <= '9' && *v < 1000000) *v = *v * 10 + (b[(*at)++] - '0');
    return 0;
}

static int read_ppm(const char *path, const uint8_t *b, size_t n, ZayaImage *img, char *err, size_t errlen) {
    size_t at = 2;
    long w, h, maxval;
    if (ppm_field(b, n, &at, &w) || ppm_field(b, n, &at, &h) || ppm_field(b, n, &at, &maxval) || w < 1 || h < 1 ||
        w > 65535 || h > 65535)
        return zaya_fail(err, errlen, "image %s: malformed PPM header\n  expected: P6 or P3, width, height, maxval "
                         "(each 1..65535)", path);
    if (maxval != 255)
        return zaya_fail(err, errlen, "image %s: PPM maxval %ld\n  expected: 255 (8-bit samples)\n  hint: convert it, "
                         "e.g. to PNG", path, maxval);
    const size_t need = (size_t)w * (size_t)h * 3;
    img->rgb = malloc(need);
    if (!img->rgb) return zaya_fail(err, errlen, "image %s: out of memory for %ld x %ld pixels", path, w, h);
    img->width = (int)w, img->height = (int)h;
    if (b[1] == '6') {
        at++;   /* the single whitespace after maxval */
        if (n < at || n - at < need) {
            free(img->rgb), img->rgb = NULL;
            return zaya_fail(err, errlen, "image %s is truncated\n  expected: %zu bytes of pixels\n  found:    %zu",
                             path, need, n < at ? 0 : n - at);
        }
        memcpy(img->rgb, b + at, need);
        return 0;
    }
    for (size_t i = 0; i < need; i++) {
        long v;
        if (ppm_field(b, n, &at, &v) || v > 255) {
            free(img->rgb), img->rgb = NULL;
            return zaya_fail(err, errlen, "image %s: P3 sample %zu is missing or over 255 (truncated?)", path, i);
        }
        img->rgb[i] = (uint8_t)v;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Inflate (RFC 1951) inside a zlib stream (RFC 1950), for PNG's IDAT data
 * ------------------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *in;
    size_t n, pos;        /* bytes */
    uint32_t bits;        /* bit buffer, least significant first */
    int nbits;
    uint8_t *out;
    size_t out_len, out_cap;
    int bad;
} Inflate;

static int getbits(Inflate *z, int need) {
    while (z->nbits < need) {
        if (z->pos >= z->n) { z->bad = 1; return 0; }
        z->bits |= (uint32_t)z->in[z->pos++] << z->nbits;
        z->nbits += 8;
    }
    const int v = (int)(z->bits & ((1u << need) - 1));
    z->bits >>= need;
    z->nbits -= need;
    return v;
}

/* A canonical Huffman code: count[len] codes of each length, symbols in code order. */
typedef struct { short count[16], symbol[320]; } Huffman;

static int build(Huffman *h, const short *lengths, int n) {
    short offs[16];
    memset(h->count, 0, sizeof h->count);
    for (int s = 0; s < n; s++) h->count[lengths[s]]++;
    h->count[0] = 0;
    int left = 1;
    for (int len = 1; len < 16; len++) {
        left = left * 2 - h->count[len];
        if (left < 0) return -1;   /* over-subscribed */
    }
    offs[1] = 0;
    for (int len = 1; len < 15; len++) offs[len + 1] = (short)(offs[len] + h->count[len]);
    for (int s = 0; s < n; s++)
        if (lengths[s]) h->symbol[offs[lengths[s]]++] = (short)s;
    return 0;
}

static int decode(Inflate *z, const Huffman *h) {
    int code = 0, first = 0, index = 0;
    for (int len = 1; len < 16; len++) {
        code |= getbits(z, 1);
        const int count = h->count[len];
        if (code - count < first) return h->symbol[index + (code - first)];
        index += count;
        first = (first + count) << 1;
        code <<= 1;
        if (z->bad) return -1;
    }
    z->bad = 1;
    return -1;
}

static int put(Inflate *z, uint8_t byte) {
    if (z->out_len == z->out_cap) { z->bad = 1; return -1; }   /* more data than the image holds */
    z->out[z->out_len++] = byte;
    return 0;
}

static const short len_base[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99,
                                   115, 131, 163, 195, 227, 258};
static const short len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const short dist_base[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025,
                                    1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const short dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11,
                                     12, 12, 13, 13};

static int codes(Inflate *z, const Huffman *lit, const Huffman *dist) {
    for (;;) {
        int sym = decode(z, lit);
        if (z->bad || sym < 0) return -1;
        if (sym < 256) { if (put(z, (uint8_t)sym)) return -1; continue; }
        if (sym == 256) return 0;
        sym -= 257;
        if (sym >= 29) return -1;
        const int len = len_base[sym] + getbits(z, len_extra[sym]);
        const int ds = decode(z, dist);
        if (z->bad || ds < 0 || ds >= 30) return -1;
        const size_t d = (size_t)dist_base[ds] + (size_t)getbits(z, dist_extra[ds]);
        if (z->bad || d > z->out_len) return -1;
        for (int k = 0; k < len; k++)
            if (put(z, z->out[z->out_len - d])) return -1;
    }
}

static int inflate_block_fixed(Inflate *z) {
    static Huffman lit, dist;
    static int ready;
    if (!ready) {
        short l[288];
        for (int s = 0; s < 288; s++) l[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
        build(&lit, l, 288);
        for (int s = 0; s < 30; s++) l[s] = 5;
        build(&dist, l, 30);
        ready = 1;
    }
    return codes(z, &lit, &dist);
}

static int inflate_block_dynamic(Inflate *z) {
    static const short order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    const int nlen = getbits(z, 5) + 257, ndist = getbits(z, 5) + 1, ncode = getbits(z, 4) + 4;
    short lengths[320] = {0};
    Huffman lencode, lit, dist;
    if (z->bad || nlen > 286 || ndist > 30) return -1;
    for (int k = 0; k < ncode; k++) lengths[order[k]] = (short)getbits(z, 3);
    if (z->bad || build(&lencode, lengths, 19)) return -1;
    for (int k = 0; k < nlen + ndist;) {
        int sym = decode(z, &lencode), rep = 0;
        short v = 0;
        if (z->bad || sym < 0) return -1;
        if (sym < 16) { lengths[k++] = (short)sym; continue; }
        if (sym == 16) {
            if (k == 0) return -1;
            v = lengths[k - 1], rep = 3 + getbits(z, 2);
        } else rep = sym == 17 ? 3 + getbits(z, 3) : 11 + getbits(z, 7);
        if (z->bad || k + rep > nlen + ndist) return -1;
        while (rep--) lengths[k++] = v;
    }
    if (lengths[256] == 0 || build(&lit, lengths, nlen) || build(&dist, lengths + nlen, ndist)) return -1;
    return codes(z, &lit, &dist);
}

/* zlib stream in[0..n) -> out[0..cap); returns the bytes written, or -1 when the stream is corrupt,
 * truncated, fails its Adler-32, or holds more than cap bytes. */
static long zlib_inflate(const uint8_t *in, size_t n, uint8_t *out, size_t cap) {
    if (n < 6 || (in[0] & 15) != 8 || ((in[0] << 8) | in[1]) % 31 || (in[1] & 32)) return -1;
    Inflate z = {in, n, 2, 0, 0, out, 0, cap, 0};
    int last;
    do {
        last = getbits(&z, 1);
        const int type = getbits(&z, 2);
        if (z.bad) return -1;
        if (type == 0) {   /* stored: byte-aligned LEN, NLEN, then LEN bytes */
            z.bits = 0, z.nbits = 0;
            if (z.pos + 4 > z.n) return -1;
            const unsigned len = z.in[z.pos] | z.in[z.pos + 1] << 8, nlen = z.in[z.pos + 2] | z.in[z.pos + 3] << 8;
            z.pos += 4;
            if (len != (~nlen & 0xffff) || z.pos + len > z.n || z.out_len + len > z.out_cap) return -1;
            memcpy(z.out + z.out_len, z.in + z.pos, len);
            z.out_len += len, z.pos += len;
        } else if (type == 1 ? inflate_block_fixed(&z) : type == 2 ? inflate_block_dynamic(&z) : -1) {
            return -1;
        }
    } while (!last);
    z.pos -= (size_t)(z.nbits / 8);   /* unread whole bytes of the bit buffer */
    if (z.pos + 4 > z.n) return -1;
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < z.out_len; i++) a = (a + z.out[i]) % 65521, b = (b + a) % 65521;
    const uint32_t want = (uint32_t)z.in[z.pos] << 24 | (uint32_t)z.in[z.pos + 1] << 16 | (uint32_t)z.in[z.pos + 2] << 8 |
                          z.in[z.pos + 3];
    return (b << 16 | a) == want ? (long)z.out_len : -1;
}

/* ---------------------------------------------------------------------------------------------
 * PNG (8-bit, not interlaced): chunks with their CRC checked, IDAT inflated, scanlines unfiltered
 * ------------------------------------------------------------------------------------------- */

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static int paeth(int a, int b, int c) {
    const int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

static int read_png(const char *path, const uint8_t *b, size_t n, ZayaImage *img, char *err, size_t errlen) {
    uint32_t w = 0, h = 0;
    int depth = 0, type = -1, interlace = 0, have_header = 0, have_end = 0, n_palette = 0;
    uint8_t palette[256 * 3];
    uint8_t *idat = NULL;
    size_t idat_len = 0;
    for (size_t at = 8; at < n && !have_end;) {
        if (n - at < 12 || be32(b + at) > n - at - 12) {
            free(idat);
            return zaya_fail(err, errlen, "image %s: PNG chunk at byte %zu runs past the end of the file (truncated)",
                             path, at);
        }
        const uint32_t len = be32(b + at);
        const uint8_t *type_at = b + at + 4, *data = b + at + 8;
        if (zaya_crc32(0, type_at, (size_t)len + 4) != be32(data + len)) {
            free(idat);
            return zaya_fail(err, errlen, "image %s: PNG chunk %.4s at byte %zu fails its CRC (corrupt file)", path,
                             (const char *)type_at, at);
        }
        if (!memcmp(type_at, "IHDR", 4) && len == 13) {
            w = be32(data), h = be32(data + 4), depth = data[8], type = data[9], interlace = data[12];
            have_header = data[10] == 0 && data[11] == 0;
        } else if (!memcmp(type_at, "PLTE", 4) && len % 3 == 0 && len <= 768) {
            memcpy(palette, data, len);
            n_palette = (int)len / 3;
        } else if (!memcmp(type_at, "IDAT", 4)) {
            uint8_t *more = realloc(idat, idat_len + len + 1);
            if (!more) { free(idat); return zaya_fail(err, errlen, "image %s: out of memory", path); }
            idat = more;
            memcpy(idat + idat_len, data, len);
            idat_len += len;
        } else if (!memcmp(type_at, "IEND", 4)) {
            have_end = 1;
        }
        at += (size_t)len + 12;
    }
    const int channels = type == 0 ? 1 : type == 2 ? 3 : type == 3 ? 1 : type == 4 ? 2 : type == 6 ? 4 : 0;
    const char *why = !have_end ? "no IEND chunk (truncated)" : !have_header ? "no valid IHDR chunk" :
                      w < 1 || h < 1 || w > 65535 || h > 65535 ? "a size outside 1..65535" :
                      depth != 8 || !channels ? "a bit depth or color type other than 8-bit gray, gray+alpha, RGB, "
                                                "RGBA or palette" :
                      interlace ? "interlacing (Adam7)" : type == 3 && !n_palette ? "a palette image without PLTE" :
                      !idat ? "no IDAT data" : NULL;
    if (why) {
        free(idat);
        return zaya_fail(err, errlen, "image %s: PNG with %s\n  hint: zaya.c reads 8-bit, non-interlaced PNGs; "
                         "convert the image (e.g. to PPM)", path, why);
    }
    const size_t stride = (size_t)w * channels, raw_len = (stride + 1) * h;
    uint8_t *raw = malloc(raw_len + 1), *px = malloc(stride * h + 1);
    img->rgb = malloc((size_t)w * h * 3);
    long got = raw && px && img->rgb ? zlib_inflate(idat, idat_len, raw, raw_len) : -2;
    free(idat);
    if (got != (long)raw_len) {
        free(raw), free(px), free(img->rgb), img->rgb = NULL;
        return zaya_fail(err, errlen, got == -2 ? "image %s: out of memory" :
                         "image %s: PNG image data is corrupt or has the wrong size (expected %zu bytes after inflate)",
                         path, raw_len);
    }
    for (uint32_t y = 0; y < h; y++) {   /* unfilter: each scanline's filter byte, then its bytes */
        const uint8_t *src = raw + (size_t)y * (stride + 1) + 1;
        uint8_t *cur = px + (size_t)y * stride, *prev = y ? cur - stride : NULL;
        const int f = src[-1];
        for (size_t i = 0; i < stride; i++) {
            const int a = i >= (size_t)channels ? cur[i - channels] : 0, up = prev ? prev[i] : 0;
            const int c = prev && i >= (size_t)channels ? prev[i - channels] : 0;
            const int pred = f == 0 ? 0 : f == 1 ? a : f == 2 ? up : f == 3 ? (a + up) / 2 : f == 4 ? paeth(a, up, c) : -1;
            if (pred < 0) {
                free(raw), free(px), free(img->rgb), img->rgb = NULL;
                return zaya_fail(err, errlen, "image %s: PNG scanline %u has filter type %d\n  expected: 0..4", path, y, f);
            }
            cur[i] = (uint8_t)(src[i] + pred);
        }
    }
    for (size_t p = 0; p < (size_t)w * h; p++) {   /* to RGB as PIL's convert("RGB"): alpha dropped */
        const uint8_t *s = px + p * channels;
        uint8_t *o = img->rgb + p * 3;
        if (type == 3) {
            const int k = s[0] < n_palette ? s[0] : 0;
            memcpy(o, palette + 3 * k, 3);
        } else if (channels <= 2) o[0] = o[1] = o[2] = s[0];
        else memcpy(o, s, 3);
    }
    free(raw), free(px);
    img->width = (int)w, img->height = (int)h;
    return 0;
}

int zaya_image_read(const char *path, ZayaImage *img, char *err, size_t errlen) {
    memset(img, 0, sizeof *img);
    size_t n = 0;
    uint8_t *b = read_all(path, &n, err, errlen);
    if (!b) return -1;
    int rc;
    if (n >= 8 && !memcmp(b, "\x89PNG\r\n\x1a\n", 8)) rc = read_png(path, b, n, img, err, errlen);
    else if (n >= 2 && b[0] == 'P' && (b[1] == '6' || b[1] == '3')) rc = read_ppm(path, b, n, img, err, errlen);
    else rc = zaya_fail(err, errlen, "image %s is neither PNG nor PPM (P6/P3)\n  hint: convert it, e.g. "
                        "`convert photo.jpg photo.png` (ImageMagick) or `pnmtopng`", path);
    free(b);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The processor: smart resize, PIL BICUBIC, rescale, normalize, patches
 * ------------------------------------------------------------------------------------------- */

int zaya_smart_resize(int height, int width, int factor, int min_pixels, int max_pixels, int *out_h, int *out_w,
                      char *err, size_t errlen) {
    const double hi = height > width ? height : width, lo = height < width ? height : width;
    if (hi / lo > 200)
        return zaya_fail(err, errlen, "image of %d x %d pixels: aspect ratio %.1f\n  expected: under 200 (HF "
                         "smart_resize refuses it too)", width, height, hi / lo);
    int h = (int)nearbyint((double)height / factor) * factor, w = (int)nearbyint((double)width / factor) * factor;
    if ((double)h * w > max_pixels) {   /* Python round() = round half to even = nearbyint */
        const double beta = sqrt((double)height * width / max_pixels);
        h = (int)floor(height / beta / factor) * factor, w = (int)floor(width / beta / factor) * factor;
        h = h > factor ? h : factor, w = w > factor ? w : factor;
    } else if ((double)h * w < min_pixels) {
        const double beta = sqrt((double)min_pixels / ((double)height * width));
        h = (int)ceil(height * beta / factor) * factor, w = (int)ceil(width * beta / factor) * factor;
    }
    *out_h = h, *out_w = w;
    return 0;
}

static double bicubic(double x) {   /* Pillow's bicubic_filter, a = -0.5 */
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

#define PRECISION_BITS (32 - 8 - 2)

/* Pillow's precompute_coeffs + normalize_coeffs_8bpc: for each output index its first input index,
 * its number of inputs, and their fixed-point weights (ksize per output). Returns ksize. */
static int coefficients(int in_size, int out_size, int **bounds, int **weights) {
    const double scale = (double)in_size / out_size, filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = 2.0 * filterscale;
    const int ksize = (int)ceil(support) * 2 + 1;
    double *k = malloc(sizeof(double) * (size_t)ksize);
    *bounds = malloc(sizeof(int) * 2 * (size_t)out_size);
    *weights = calloc((size_t)out_size * ksize, sizeof(int));
    if (!k || !*bounds || !*weights) { free(k); return -1; }
    for (int xx = 0; xx < out_size; xx++) {
        const double center = (xx + 0.5) * scale, ss = 1.0 / filterscale;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        xmin = xmin < 0 ? 0 : xmin;
        xmax = (xmax > in_size ? in_size : xmax) - xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; x++) ww += k[x] = bicubic((x + xmin - center + 0.5) * ss);
        for (int x = 0; x < xmax; x++) {
            const double v = ww != 0.0 ? k[x] / ww : k[x];
            (*weights)[(size_t)xx * ksize + x] = (int)(v < 0 ? -0.5 + v * (1 << PRECISION_BITS) : 0.5 + v * (1 << PRECISION_BITS));
        }
        (*bounds)[2 * xx] = xmin, (*bounds)[2 * xx + 1] = xmax;
    }
    free(k);
    return ksize;
}

static uint8_t clip8(int v) {
    if (v >= 1 << PRECISION_BITS << 8) return 255;
    if (v <= 0) return 0;
    return (uint8_t)(v >> PRECISION_BITS);
}

/* One pass of Pillow's ImagingResampleHorizontal_8bpc / ImagingResampleVertical_8bpc: in [h, w, 3] resized
 * along one axis, horizontal (to out_len columns: out [h, out_len, 3]) or vertical (to out_len rows: out
 * [out_len, w, 3]); each output the fixed-point sum of its inputs times their weights, rounded to 8 bits.
 * Returns -1 when out of memory. */
static int resample_pass(const uint8_t *in, int w, int h, uint8_t *out, int out_len, int horizontal) {
    int *bounds = NULL, *weights = NULL;
    const int ksize = coefficients(horizontal ? w : h, out_len, &bounds, &weights);
    const size_t step = horizontal ? 3 : (size_t)w * 3;   /* from one input of a sum to the next */
    for (int i = 0; ksize > 0 && i < out_len; i++) {
        const int first = bounds[2 * i], n = bounds[2 * i + 1];
        const int *k = weights + (size_t)i * ksize;
        for (int j = 0; j < (horizontal ? h : w); j++)    /* the rows (horizontal) or columns (vertical) */
            for (int ch = 0; ch < 3; ch++) {
                const uint8_t *src = in + (horizontal ? (size_t)j * w + first : (size_t)first * w + j) * 3 + ch;
                int ss = 1 << (PRECISION_BITS - 1);
                for (int x = 0; x < n; x++) ss += src[x * step] * k[x];
                out[(horizontal ? (size_t)j * out_len + i : (size_t)i * w + j) * 3 + ch] = clip8(ss);
            }
    }
    free(bounds), free(weights);
    return ksize > 0 ? 0 : -1;
}

int zaya_resize_bicubic(const uint8_t *in, int w, int h, uint8_t *out, int out_w, int out_h) {
    /* Pillow 13's ImagingResampleInner: the vertical pass first when the height shrinks by more than twice
     * the width's change ("to make the horizontal pass faster"), else horizontal then vertical (Pillow <= 12
     * always did the horizontal pass first; the two orders round differently). Each pass only if its size
     * changes. */
    if (out_w == w && out_h == h) {
        memcpy(out, in, (size_t)out_h * out_w * 3);
        return 0;
    }
    if (out_h == h) return resample_pass(in, w, h, out, out_w, 1);
    if (out_w == w) return resample_pass(in, w, h, out, out_h, 0);
    const int vertical_first = h - out_h > 0 && h - out_h > (w - out_w) * 2;
    const int mid_w = vertical_first ? w : out_w, mid_h = vertical_first ? out_h : h;
    uint8_t *mid = malloc((size_t)mid_w * mid_h * 3 + 1);
    int rc = mid ? 0 : -1;
    if (!rc) rc = resample_pass(in, w, h, mid, vertical_first ? out_h : out_w, !vertical_first);   /* first pass */
    if (!rc) rc = resample_pass(mid, mid_w, mid_h, out, vertical_first ? out_w : out_h, vertical_first);  /* second */
    free(mid);
    return rc;
}

int zaya_image_pixels(const ZayaImage *img, const ZayaVisionConfig *c, float **pixels, int *grid_h, int *grid_w,
                      char *err, size_t errlen) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f}, stdev[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    const int P = c->patch_size, M = c->spatial_merge_size, T = c->temporal_patch_size, C = c->in_channels;
    int h, w;
    if (C != 3)
        return zaya_fail(err, errlen, "the vision tower takes %d channels\n  expected: 3 (RGB images)", C);
    if (zaya_smart_resize(img->height, img->width, P * M, ZAYA_IMAGE_MIN_PIXELS, ZAYA_IMAGE_MAX_PIXELS, &h, &w, err,
                          errlen) != 0)
        return -1;
    uint8_t *rgb = malloc((size_t)h * w * 3);
    float *x = malloc(sizeof(float) * (size_t)h * w * 3);
    *pixels = malloc(sizeof(float) * (size_t)h * w * 3 * T);
    if (!rgb || !x || !*pixels) {
        free(rgb), free(x), free(*pixels), *pixels = NULL;
        return zaya_fail(err, errlen, "out of memory for a %d x %d image", w, h);
    }
    if (zaya_resize_bicubic(img->rgb, img->width, img->height, rgb, w, h) != 0) {   /* PIL resize(BICUBIC) */
        free(rgb), free(x), free(*pixels), *pixels = NULL;
        return zaya_fail(err, errlen, "out of memory resizing a %d x %d image to %d x %d", img->width, img->height, w,
                         h);
    }
    for (size_t i = 0; i < (size_t)h * w * 3; i++) {                           /* rescale (float64), normalize */
        const float v = (float)((double)rgb[i] * (1.0 / 255.0));
        x[i] = (v - mean[i % 3]) / stdev[i % 3];
    }
    const int gh = h / P, gw = w / P;
    /* patchify: row ((bh * gw/M + bw) * M + mh) * M + mw, inside a row (ch, t, ph, pw) */
    for (int bh = 0; bh < gh / M; bh++)
        for (int bw = 0; bw < gw / M; bw++)
            for (int mh = 0; mh < M; mh++)
                for (int mw = 0; mw < M; mw++) {
                    float *row = *pixels + ((((size_t)bh * (gw / M) + bw) * M + mh) * M + mw) * (size_t)(3 * T * P * P);
                    for (int ch = 0; ch < 3; ch++)
                        for (int t = 0; t < T; t++)
                            for (int ph = 0; ph < P; ph++)
                                for (int pw = 0; pw < P; pw++) {
                                    const int yy = (bh * M + mh) * P + ph, xx = (bw * M + mw) * P + pw;
                                    row[((ch * T + t) * P + ph) * P + pw] = x[((size_t)yy * w + xx) * 3 + ch];
                                }
                }
    free(rgb), free(x);
    *grid_h = gh, *grid_w = gw;
    return 0;
}
