/* dequantize.c - the GGUF dequantizer that export_weights.py drives for a port's GGUF: ggml's to_float at C speed.
 *
 *   zaya-dequantize MODEL.gguf      then, on standard input, one request per line:
 *       TYPE OFFSET NBYTES          a ggml type name (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 *                                   Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), a byte offset in the file, whole blocks
 *   and answers each on standard output with the float32 values (little-endian).
 *
 *   zaya-dequantize MODEL.gguf --into BLOB      the exporter's path to the disk: for each blob tensor a line
 *       DTYPE BLOB_OFFSET NPIECES BLOB_NAME     DTYPE f32 or bf16 (bf16 refused unless every value is exact)
 *   then NPIECES lines
 *       TYPE OFFSET NBYTES GGUF_NAME            pieces of the GGUF whose values, in order, are the tensor's
 *   writes the values straight into the existing file BLOB from byte BLOB_OFFSET (pwrite, 64-bit offsets) and
 *   answers "CRC NBYTES": the CRC-32 (zlib's) of the bytes written and their count. Python writes only the
 *   header, the directory, the padding and the tokenizer. Memory: 17 MB of buffers, whatever the model size.
 *
 *   zaya-dequantize --mlx       MLX's affine dequantization for mlx_weights.py (an MLX-saved folder): each request
 *       a line "affine BITS GROUP SDTYPE CT OD ROWS PACKED" then its words, scales and biases on standard input;
 *       the values answered in dtype OD (serve_mlx below says each field).
 *
 * The values are those of ggml's dequantize_row_* (ggml/src/ggml-quants.c, block layouts of ggml-common.h),
 * bit for bit: each value is the same float32 expression in the same order (compiled with -ffp-contract=off; the
 * products are exact in float32 anyway, so a fused multiply-add would not change a value). gguf.py's
 * Python dequantizer is the plain twin and the fallback (ZAYA_GGUF_PYTHON=1); test/test_gguf.py compares the two,
 * byte for byte, on every type, and both against ggml's own recorded output (test/fixtures/gguf), and the blobs
 * the two paths write.
 * Errors (a bad request, a GGUF cut short since it was parsed, a failed write) go to standard error in the
 * project's form (what, where, expected vs found, hint); the exit status is 1.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* IEEE half to float32, exact (ggml's GGML_FP16_TO_FP32). */
static float fp16(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | man << 13;            /* inf, NaN */
    else if (exp != 0) bits = sign | (exp + 112) << 23 | man << 13;    /* normal: rebias 15 -> 127 */
    else if (man == 0) bits = sign;                                    /* zero */
    else {                                                             /* subnormal: normalize */
        int e = 113;
        uint32_t m = man;
        while (!(m & 0x400)) { m <<= 1; e--; }
        bits = sign | (uint32_t)e << 23 | (m & 0x3ff) << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {   /* get_scale_min_k4 */
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

static const int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* One block of each type: x = its bytes, y = its values. */
static void dq_f32(const uint8_t *x, float *y) { memcpy(y, x, 4); }
static void dq_f16(const uint8_t *x, float *y) { *y = fp16(x); }
static void dq_bf16(const uint8_t *x, float *y) {
    const uint32_t b = ((uint32_t)x[0] | (uint32_t)x[1] << 8) << 16;
    memcpy(y, &b, 4);
}

static void dq_q8_0(const uint8_t *x, float *y) {
    const float d = fp16(x);
    for (int j = 0; j < 32; j++) y[j] = (int8_t)x[2 + j] * d;
}
static void dq_q4_0(const uint8_t *x, float *y) {
    const float d = fp16(x);
    const uint8_t *qs = x + 2;
    for (int j = 0; j < 16; j++) { y[j] = ((qs[j] & 0x0F) - 8) * d; y[j + 16] = ((qs[j] >> 4) - 8) * d; }
}
static void dq_q4_1(const uint8_t *x, float *y) {
    const float d = fp16(x), m = fp16(x + 2);
    const uint8_t *qs = x + 4;
    for (int j = 0; j < 16; j++) { y[j] = (qs[j] & 0x0F) * d + m; y[j + 16] = (qs[j] >> 4) * d + m; }
}
static void dq_q5_0(const uint8_t *x, float *y) {
    const float d = fp16(x);
    const uint32_t qh = (uint32_t)x[2] | (uint32_t)x[3] << 8 | (uint32_t)x[4] << 16 | (uint32_t)x[5] << 24;
    const uint8_t *qs = x + 6;
    for (int j = 0; j < 16; j++) {
        const int x0 = ((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
        const int x1 = ((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
        y[j] = x0 * d;
        y[j + 16] = x1 * d;
    }
}
static void dq_q5_1(const uint8_t *x, float *y) {
    const float d = fp16(x), m = fp16(x + 2);
    const uint32_t qh = (uint32_t)x[4] | (uint32_t)x[5] << 8 | (uint32_t)x[6] << 16 | (uint32_t)x[7] << 24;
    const uint8_t *qs = x + 8;
    for (int j = 0; j < 16; j++) {
        const int x0 = (qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
        const int x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}
static void dq_q2_k(const uint8_t *x, float *y) {   /* scales[16] qs[64] d dmin */
    const float d = fp16(x + 80), min = fp16(x + 82);
    const uint8_t *q = x + 16;
    int is = 0;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; half++) {
                const uint8_t sc = x[is++];
                const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (int8_t)((q[l + 16 * half] >> shift) & 3) - ml;
            }
}
static void dq_q3_k(const uint8_t *x, float *y) {   /* hmask[32] qs[64] scales[12] d */
    const float d_all = fp16(x + 108);
    const uint8_t *q = x + 32, *hm = x;
    uint32_t aux[4];
    memcpy(aux, x + 96, 12);
    const uint32_t tmp = aux[2], kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    int8_t scales[16];
    memcpy(scales, aux, 16);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m <<= 1)
            for (int half = 0; half < 2; half++) {
                const float dl = d_all * (scales[is++] - 32);
                for (int l = 16 * half; l < 16 * half + 16; l++)
                    *y++ = dl * ((int8_t)((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            }
}
static void dq_q4_k(const uint8_t *x, float *y) {   /* d dmin scales[12] qs[128] */
    const float d = fp16(x), min = fp16(x + 2);
    const uint8_t *q = x + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
        uint8_t sc, m;
        k4_scale_min(is, x + 4, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        k4_scale_min(is + 1, x + 4, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
    }
}
static void dq_q5_k(const uint8_t *x, float *y) {   /* d dmin scales[12] qh[32] qs[128] */
    const float d = fp16(x), min = fp16(x + 2);
    const uint8_t *ql = x + 48, *qh = x + 16;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
        uint8_t sc, m;
        k4_scale_min(is, x + 4, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        k4_scale_min(is + 1, x + 4, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
}
static void dq_q6_k(const uint8_t *x, float *y) {   /* ql[128] qh[64] scales[16] d */
    const float d = fp16(x + 208);
    const uint8_t *ql = x, *qh = x + 128;
    const int8_t *sc = (const int8_t *)(x + 192);
    for (int n = 0; n < 256; n += 128, y += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            const int is = l / 16;
            const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l + 0] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
}
static void dq_iq4_nl(const uint8_t *x, float *y) {
    const float d = fp16(x);
    const uint8_t *qs = x + 2;
    for (int j = 0; j < 16; j++) { y[j] = d * kvalues_iq4nl[qs[j] & 0xf]; y[j + 16] = d * kvalues_iq4nl[qs[j] >> 4]; }
}
static void dq_iq4_xs(const uint8_t *x, float *y) {   /* d scales_h(u16) scales_l[4] qs[128] */
    const float d = fp16(x);
    const unsigned scales_h = (unsigned)x[2] | (unsigned)x[3] << 8;
    const uint8_t *qs = x + 8;
    for (int ib = 0; ib < 8; ib++, y += 32, qs += 16) {
        const int ls = ((x[4 + ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; j++) {
            y[j] = dl * kvalues_iq4nl[qs[j] & 0xf];
            y[j + 16] = dl * kvalues_iq4nl[qs[j] >> 4];
        }
    }
}

static const struct { const char *name; int qk, bytes; void (*fn)(const uint8_t *, float *); } TYPES[] = {
    {"F32", 1, 4, dq_f32}, {"F16", 1, 2, dq_f16}, {"BF16", 1, 2, dq_bf16}, {"Q8_0", 32, 34, dq_q8_0},
    {"Q4_0", 32, 18, dq_q4_0}, {"Q4_1", 32, 20, dq_q4_1}, {"Q5_0", 32, 22, dq_q5_0}, {"Q5_1", 32, 24, dq_q5_1},
    {"Q2_K", 256, 84, dq_q2_k}, {"Q3_K", 256, 110, dq_q3_k}, {"Q4_K", 256, 144, dq_q4_k}, {"Q5_K", 256, 176, dq_q5_k},
    {"Q6_K", 256, 210, dq_q6_k}, {"IQ4_NL", 32, 18, dq_iq4_nl}, {"IQ4_XS", 256, 136, dq_iq4_xs},
};

/* CRC-32 (IEEE, as zlib.crc32 and tensor.h's zaya_crc32, its byte-at-a-time twin), sixteen bytes a step
 * ("slicing-by-16": T[k][b] is the CRC of byte b followed by k zero bytes). */
static uint32_t crc_table[16][256];

static void crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (int k = 1; k < 16; k++)
        for (int i = 0; i < 256; i++)
            crc_table[k][i] = crc_table[0][crc_table[k - 1][i] & 0xFF] ^ (crc_table[k - 1][i] >> 8);
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (; n >= 16; n -= 16, p += 16) {
        const uint32_t a = crc ^ le32(p), b = le32(p + 4), c = le32(p + 8), d = le32(p + 12);
        crc = crc_table[15][a & 0xFF] ^ crc_table[14][(a >> 8) & 0xFF] ^ crc_table[13][(a >> 16) & 0xFF] ^
              crc_table[12][a >> 24] ^ crc_table[11][b & 0xFF] ^ crc_table[10][(b >> 8) & 0xFF] ^
              crc_table[9][(b >> 16) & 0xFF] ^ crc_table[8][b >> 24] ^ crc_table[7][c & 0xFF] ^
              crc_table[6][(c >> 8) & 0xFF] ^ crc_table[5][(c >> 16) & 0xFF] ^ crc_table[4][c >> 24] ^
              crc_table[3][d & 0xFF] ^ crc_table[2][(d >> 8) & 0xFF] ^ crc_table[1][(d >> 16) & 0xFF] ^
              crc_table[0][d >> 24];
    }
    for (; n; n--, p++) crc = crc_table[0][(crc ^ *p) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* The project's error text (gguf.message): what, where, expected vs found, a hint; then exit status 1. */
static int fail(const char *what, const char *where, const char *expected, const char *found, const char *hint) {
    fprintf(stderr, "%s\n  where:    %s\n", what, where);
    if (expected) fprintf(stderr, "  expected: %s\n  found:    %s\n", expected, found);
    if (hint) fprintf(stderr, "  hint:     %s\n", hint);
    return 1;
}

static const char *const HINT_TRUNCATED = "the file is incomplete; download or convert it again";

enum { CHUNK = 1 << 20 };   /* input bytes per read; at most 256/84 values per byte (Q2_K) */

typedef struct {
    const char *path;         /* the GGUF */
    int fd;
    uint8_t *in;              /* CHUNK bytes */
    float *out;               /* 4 * CHUNK values */
} Source;

static void place(char *where, size_t n, const Source *s, const char *tensor) {   /* "FILE: tensor 'NAME'" */
    if (tensor) snprintf(where, n, "%s: tensor '%s'", s->path, tensor);
    else snprintf(where, n, "%s", s->path);
}

/* Reads n bytes at offset of the GGUF; a short read (the file cut since it was opened) is refused. */
static int read_at(Source *s, uint8_t *buf, size_t n, long long offset, const char *tensor) {
    for (size_t got = 0; got < n;) {
        const ssize_t r = pread(s->fd, buf + got, n - got, (off_t)(offset + (long long)got));
        if (r > 0) { got += (size_t)r; continue; }
        char where[512], want[96], found[96];
        struct stat st;
        place(where, sizeof where, s, tensor);
        snprintf(want, sizeof want, "%zu bytes of data at byte %lld", n, offset);
        if (r < 0) return fail("cannot read the GGUF", where, want, strerror(errno), NULL);
        snprintf(found, sizeof found, "a file of %lld bytes", fstat(s->fd, &st) == 0 ? (long long)st.st_size : -1LL);
        return fail("GGUF file is truncated", where, want, found, HINT_TRUNCATED);
    }
    return 0;
}

/* Checks a piece request: a known type, whole blocks, inside the file. t is set to the type's index. */
static int check_piece(Source *s, const char *type, long long offset, long long nbytes, const char *tensor, size_t *t) {
    char where[512], want[160], found[96];
    place(where, sizeof where, s, tensor);
    for (*t = 0; *t < sizeof TYPES / sizeof TYPES[0] && strcmp(TYPES[*t].name, type); (*t)++) {}
    if (*t == sizeof TYPES / sizeof TYPES[0])
        return fail("unsupported type", where, "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, "
                    "Q6_K, IQ4_NL or IQ4_XS", type, "export_weights.py asks only for these (gguf.py's SUPPORTED)");
    if (offset < 0 || nbytes < 0 || nbytes % TYPES[*t].bytes) {
        snprintf(want, sizeof want, "a non-negative offset and whole %d-byte blocks of %s", TYPES[*t].bytes, type);
        snprintf(found, sizeof found, "%lld bytes at byte %lld", nbytes, offset);
        return fail("bad request", where, want, found, "a request is TYPE OFFSET NBYTES (dequantize.c's header)");
    }
    struct stat st;
    if (fstat(s->fd, &st) != 0) return fail("cannot read the GGUF", where, NULL, NULL, strerror(errno));
    if (offset > (long long)st.st_size || nbytes > (long long)st.st_size - offset) {
        snprintf(want, sizeof want, "%lld bytes of data at byte %lld", nbytes, offset);
        snprintf(found, sizeof found, "a file of %lld bytes", (long long)st.st_size);
        return fail("GGUF file is truncated", where, want, found, HINT_TRUNCATED);
    }
    return 0;
}

/* Dequantizes nbytes at offset, CHUNK bytes at a time, handing each run of values to emit(ctx, values, n). */
static int dequantize_piece(Source *s, size_t t, long long offset, long long nbytes, const char *tensor,
                            int (*emit)(void *, float *, size_t), void *ctx) {
    const long long bs = TYPES[t].bytes, per_chunk = CHUNK / bs * bs;
    for (long long done = 0; done < nbytes;) {
        const size_t n = (size_t)(nbytes - done < per_chunk ? nbytes - done : per_chunk);
        if (read_at(s, s->in, n, offset + done, tensor)) return 1;
        const size_t blocks = n / (size_t)bs;
        for (size_t b = 0; b < blocks; b++) TYPES[t].fn(s->in + b * (size_t)bs, s->out + b * (size_t)TYPES[t].qk);
        if (emit(ctx, s->out, blocks * (size_t)TYPES[t].qk)) return 1;
        done += (long long)n;
    }
    return 0;
}

static int emit_stdout(void *ctx, float *v, size_t n) {
    (void)ctx;
    if (fwrite(v, sizeof(float), n, stdout) == n) return 0;
    return fail("cannot write the values", "standard output", NULL, NULL, strerror(errno));
}

/* --into: one blob tensor's values written at its offset in the blob, in its dtype, with their CRC-32. */
typedef struct {
    int fd;
    const char *blob, *name;
    int bf16;                 /* 0: float32 values; 1: bf16 (the top halves; refused unless exact) */
    long long pos;            /* where the next byte goes */
    long long written;
    uint32_t crc;
} Sink;

static int emit_blob(void *ctx, float *v, size_t n) {   /* v: the piece's values, rewritten in place for bf16 */
    Sink *k = ctx;
    const uint8_t *bytes = (const uint8_t *)v;
    size_t nb = 4 * n;
    if (k->bf16) {   /* in place: value i's top 16 bits (little-endian bytes 2, 3) to bytes 2i, 2i + 1 */
        uint8_t *b = (uint8_t *)v;
        for (size_t i = 0; i < n; i++) {
            if (b[4 * i] | b[4 * i + 1]) {
                char where[320];
                snprintf(where, sizeof where, "%s (value %lld)", k->name, k->written / 2 + (long long)i);
                return fail("tensor has float32 values that bf16 cannot hold exactly", where, NULL, NULL,
                            "export with --dtype fp32 (or int8)");
            }
            b[2 * i] = b[4 * i + 2];
            b[2 * i + 1] = b[4 * i + 3];
        }
        nb = 2 * n;
    }
    k->crc = crc32_update(k->crc, bytes, nb);
    for (size_t put = 0; put < nb;) {
        const ssize_t r = pwrite(k->fd, bytes + put, nb - put, (off_t)(k->pos + (long long)put));
        if (r <= 0) {
            char where[640];
            snprintf(where, sizeof where, "%s: tensor %s at byte %lld", k->blob, k->name, k->pos + (long long)put);
            return fail("cannot write the blob", where, NULL, NULL, r < 0 ? strerror(errno) : "no bytes written");
        }
        put += (size_t)r;
    }
    k->pos += (long long)nb;
    k->written += (long long)nb;
    return 0;
}

/* Strips the line's newline; returns 0 at end of input. */
static int next_line(char **line, size_t *cap) {
    const ssize_t n = getline(line, cap, stdin);
    if (n < 0) return 0;
    if (n > 0 && (*line)[n - 1] == '\n') (*line)[n - 1] = '\0';
    return 1;
}

static int serve_values(Source *s) {   /* TYPE OFFSET NBYTES -> the values on standard output */
    char *line = NULL, type[32];
    size_t cap = 0, t;
    long long offset, nbytes;
    int rc = 0;
    while (!rc && next_line(&line, &cap)) {
        if (sscanf(line, "%31s %lld %lld", type, &offset, &nbytes) != 3) {
            rc = fail("bad request", "standard input", "TYPE OFFSET NBYTES", line, NULL);
            break;
        }
        rc = check_piece(s, type, offset, nbytes, NULL, &t) ||
             dequantize_piece(s, t, offset, nbytes, NULL, emit_stdout, NULL);
        if (!rc && fflush(stdout) != 0)
            rc = fail("cannot write the values", "standard output", NULL, NULL, strerror(errno));
    }
    free(line);
    return rc;
}

static int serve_blob(Source *s, const char *blob) {   /* requests of --into (the header) -> "CRC NBYTES" lines */
    Sink k = {.blob = blob};
    k.fd = open(blob, O_WRONLY);
    if (k.fd < 0) return fail("cannot open the blob for writing", blob, NULL, NULL, strerror(errno));
    char *line = NULL, dtype[8], type[32];
    size_t cap = 0, t;
    long long offset, nbytes;
    int npieces, name_at, rc = 0;
    while (!rc && next_line(&line, &cap)) {
        if (sscanf(line, "%7s %lld %d %n", dtype, &k.pos, &npieces, &name_at) != 3 || k.pos < 0 || npieces < 1 ||
            (strcmp(dtype, "f32") && strcmp(dtype, "bf16"))) {
            rc = fail("bad request", "standard input", "f32|bf16 BLOB_OFFSET NPIECES BLOB_NAME", line, NULL);
            break;
        }
        char name[256];
        snprintf(name, sizeof name, "%s", line + name_at);
        k.name = name;
        k.bf16 = !strcmp(dtype, "bf16");
        k.written = 0;
        k.crc = 0;
        for (int p = 0; p < npieces && !rc; p++) {
            if (!next_line(&line, &cap) || sscanf(line, "%31s %lld %lld %n", type, &offset, &nbytes, &name_at) != 3) {
                rc = fail("bad request", "standard input", "TYPE OFFSET NBYTES GGUF_NAME", line ? line : "", NULL);
                break;
            }
            const char *tensor = line + name_at;
            rc = check_piece(s, type, offset, nbytes, tensor, &t) ||
                 dequantize_piece(s, t, offset, nbytes, tensor, emit_blob, &k);
        }
        if (!rc && (printf("%u %lld\n", k.crc, k.written) < 0 || fflush(stdout) != 0))
            rc = fail("cannot answer", "standard output", NULL, NULL, strerror(errno));
    }
    free(line);
    if (close(k.fd) != 0 && !rc) rc = fail("cannot write the blob", blob, NULL, NULL, strerror(errno));
    return rc;
}

/* --mlx: MLX's affine dequantization (mx.dequantize on the CPU, mlx_weights.py's dequantize() and its twin):
 * w = (q * scale) + bias, each operation rounded to the compute dtype CT (the scales' dtype, or F32 for MLX's
 * quantized matmul on float32 activations), then to the output dtype OD. As mlx_weights.py does it: the
 * operation exact in a double, rounded to float32, then to CT (BF16 / F16, to nearest even). */
enum { DT_F32, DT_BF16, DT_F16 };

static int dtype_of(const char *s) {
    return !strcmp(s, "F32") ? DT_F32 : !strcmp(s, "BF16") ? DT_BF16 : !strcmp(s, "F16") ? DT_F16 : -1;
}

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint16_t to_bf16(float f) {   /* to nearest even; a NaN stays a NaN (quiet bit set) */
    const uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static uint16_t to_f16(float f) {    /* to nearest even, overflow to infinity, subnormals; NaN as Python packs it */
    const uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);          /* >= 65520: rounds to infinity */
    if (a < 0x38800000u) {                                             /* below 2^-14: a subnormal half */
        if (a < 0x33000000u) return (uint16_t)sign;                    /* at most 2^-25: rounds to 0 */
        const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126 - (a >> 23);   /* value = m * 2^(e-150) */
        uint32_t h = m >> shift;
        const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((a >> 23) - 112) << 10 | (a >> 13 & 0x3ffu);
    const uint32_t rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static float f16_value(uint16_t h) { uint8_t b[2] = {(uint8_t)h, (uint8_t)(h >> 8)}; return fp16(b); }

static float round_to(double x, int dt) {   /* mlx_weights.rnd: to float32, then to dt */
    const float f = (float)x;
    if (dt == DT_BF16) return bits_f32((uint32_t)to_bf16(f) << 16);
    if (dt == DT_F16) return f16_value(to_f16(f));
    return f;
}

static double scale_value(const uint8_t *p, int dt) {
    if (dt == DT_F32) { uint32_t u; memcpy(&u, p, 4); return bits_f32(u); }
    if (dt == DT_F16) return fp16(p);
    return bits_f32(((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16);
}

static int read_stdin(uint8_t *buf, size_t n) { return fread(buf, 1, n, stdin) == n ? 0 : 1; }

static int serve_mlx(void) {   /* "affine BITS GROUP SDTYPE CT OD ROWS PACKED" + words, scales, biases -> values */
    char *line = NULL, mode[16], sd_s[8], ct_s[8], od_s[8];
    size_t cap = 0;
    int bits, group, rc = 0;
    long long rows, packed;
    uint8_t *buf = NULL, *out = NULL;
    size_t buf_cap = 0, out_cap = 0;
    while (!rc && next_line(&line, &cap)) {
        const int n = sscanf(line, "%15s %d %d %7s %7s %7s %lld %lld", mode, &bits, &group, sd_s, ct_s, od_s, &rows,
                             &packed);
        const int sd = dtype_of(sd_s), ct = dtype_of(ct_s), od = dtype_of(od_s);
        if (n != 8 || strcmp(mode, "affine") || bits < 1 || bits > 8 || bits == 7 || group < 1 || sd < 0 || ct < 0 ||
            od < 0 || rows < 0 || packed < 0 || packed * 32 % bits || packed * 32 / bits % group) {
            rc = fail("bad request", "standard input", "affine BITS GROUP SDTYPE CT OD ROWS PACKED (bits 1-6 or 8, "
                      "whole groups per row; dtypes F32, BF16, F16)", line, "mlx_weights.py sends them");
            break;
        }
        const long long cols = packed * 32 / bits, groups = rows * (cols / group);
        const size_t ssz = sd == DT_F32 ? 4 : 2, osz = od == DT_F32 ? 4 : 2, row_bytes = (size_t)packed * 4;
        const size_t in_bytes = (size_t)rows * row_bytes + 2 * (size_t)groups * ssz;
        const size_t out_bytes = (size_t)rows * (size_t)cols * osz;
        if (in_bytes > buf_cap) { free(buf); buf = malloc(buf_cap = in_bytes); }
        if (out_bytes > out_cap) { free(out); out = malloc(out_cap = out_bytes); }
        if ((in_bytes && !buf) || (out_bytes && !out)) { rc = fail("out of memory", line, NULL, NULL, NULL); break; }
        if (read_stdin(buf, in_bytes)) {
            rc = fail("the request's data is cut short", "standard input", line, "fewer bytes", NULL);
            break;
        }
        const uint8_t *words = buf, *scales = buf + (size_t)rows * row_bytes, *biases = scales + (size_t)groups * ssz;
        const unsigned mask = (1u << bits) - 1;
        uint8_t *o = out;
        float table[256];
        for (long long r = 0; r < rows; r++) {
            const uint8_t *row = words + (size_t)r * row_bytes;
            for (long long g = 0; g < cols / group; g++) {
                const size_t i = (size_t)(r * (cols / group) + g);
                const double s = scale_value(scales + i * ssz, sd), b = scale_value(biases + i * ssz, sd);
                for (unsigned c = 0; c <= mask; c++) {   /* multiply(q, scales), then add(., biases), each rounded */
                    float v = round_to(round_to((double)c * s, ct) + b, ct);
                    if (od != ct) v = round_to(v, od);
                    table[c] = v;
                }
                for (long long k = g * group; k < (g + 1) * group; k++, o += osz) {
                    const size_t p = (size_t)k * (size_t)bits, at = p >> 3, sh = p & 7;
                    unsigned q = row[at] >> sh;
                    if (sh + (size_t)bits > 8) q |= (unsigned)row[at + 1] << (8 - sh);
                    const float v = table[q & mask];
                    if (od == DT_F32) {
                        const uint32_t u = f32_bits(v);
                        memcpy(o, &u, 4);
                    } else {
                        const uint16_t h = od == DT_BF16 ? to_bf16(v) : to_f16(v);
                        o[0] = (uint8_t)h;
                        o[1] = (uint8_t)(h >> 8);
                    }
                }
            }
        }
        if (fwrite(out, 1, out_bytes, stdout) != out_bytes || fflush(stdout) != 0)
            rc = fail("cannot write the values", "standard output", NULL, NULL, strerror(errno));
    }
    free(line);
    free(buf);
    free(out);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--mlx")) return serve_mlx();
    if (argc != 2 && !(argc == 4 && !strcmp(argv[2], "--into")))
        return fail("usage: zaya-dequantize MODEL.gguf [--into BLOB] < requests, or zaya-dequantize --mlx < requests",
                    "the command line", NULL, NULL,
                    "dequantize.c's header describes the requests; export_weights.py sends them");
    Source s = {.path = argv[1]};
    s.fd = open(argv[1], O_RDONLY);
    if (s.fd < 0) return fail("cannot open the GGUF", argv[1], NULL, NULL, strerror(errno));
    s.in = malloc(CHUNK);
    s.out = malloc(sizeof(float) * 4 * CHUNK);
    if (!s.in || !s.out) return fail("out of memory", "dequantize.c's buffers", NULL, NULL, NULL);
    crc32_init();
    const int rc = argc == 4 ? serve_blob(&s, argv[3]) : serve_values(&s);
    free(s.in);
    free(s.out);
    close(s.fd);
    return rc;
}
