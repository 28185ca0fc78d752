/* dequantize.c - the GGUF dequantizer that export_weights.py drives for a port's GGUF: ggml's to_float at C speed.
 *
 *   zaya-dequantize MODEL.gguf      then, on standard input, one request per line:
 *       TYPE OFFSET NBYTES          a ggml type name (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
 *                                   Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), a byte offset in the file, whole blocks
 * and answers each on standard output with the float32 values (little-endian) that ggml's
 * dequantize_row_* (ggml/src/ggml-quants.c, block layouts of ggml-common.h) gives for those bytes, bit for
 * bit: each value is the same float32 expression in the same order (compiled with -ffp-contract=off; the
 * products are exact in float32 anyway, so a fused multiply-add would not change a value). gguf.py's
 * Python dequantizer is the plain twin and the fallback; test/test_gguf.py compares the two, byte for byte,
 * on every type, and both against ggml's own recorded output (test/fixtures/gguf).
 * Errors (a bad request, a read past the end of the file) go to standard error; the exit status is 1.
 */
#define _POSIX_C_SOURCE 200809L
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

static int die(const char *what, const char *detail) {
    fprintf(stderr, "zaya-dequantize: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) return die("usage: zaya-dequantize MODEL.gguf < requests (TYPE OFFSET NBYTES per line)", NULL);
    const int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return die(argv[1], strerror(errno));
    enum { CHUNK = 1 << 20 };   /* input bytes per read; at most 256/84 values per byte (Q2_K) */
    uint8_t *in = malloc(CHUNK);
    float *out = malloc(sizeof(float) * 4 * CHUNK);
    if (!in || !out) return die("out of memory", NULL);
    char line[256], type[32];
    long long offset, nbytes;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "%31s %lld %lld", type, &offset, &nbytes) != 3) return die("bad request", line);
        size_t t = 0;
        while (t < sizeof TYPES / sizeof TYPES[0] && strcmp(TYPES[t].name, type)) t++;
        if (t == sizeof TYPES / sizeof TYPES[0]) return die("unsupported type", type);
        const long long bs = TYPES[t].bytes;
        if (offset < 0 || nbytes < 0 || nbytes % bs || offset + nbytes > (long long)st.st_size)
            return die("request outside the file or not whole blocks", line);
        const long long per_chunk = CHUNK / bs * bs;
        for (long long done = 0; done < nbytes;) {
            const size_t n = (size_t)(nbytes - done < per_chunk ? nbytes - done : per_chunk);
            for (size_t got = 0; got < n;) {
                const ssize_t r = pread(fd, in + got, n - got, (off_t)(offset + done + (long long)got));
                if (r <= 0) return die("cannot read the GGUF", r < 0 ? strerror(errno) : "unexpected end of file");
                got += (size_t)r;
            }
            const size_t blocks = n / (size_t)bs;
            for (size_t b = 0; b < blocks; b++) TYPES[t].fn(in + b * (size_t)bs, out + b * (size_t)TYPES[t].qk);
            if (fwrite(out, sizeof(float) * (size_t)TYPES[t].qk, blocks, stdout) != blocks)
                return die("cannot write the values", strerror(errno));
            done += (long long)n;
        }
        if (fflush(stdout) != 0) return die("cannot write the values", strerror(errno));
    }
    free(in);
    free(out);
    close(fd);
    return 0;
}
