/* test_kernels.c - every fast kernel of kernels.c against its plain-loop reference twin.
 *
 *   make build/test_kernels && build/test_kernels
 *
 * matmul (fp32, bf16, int8 groups of 32, 16 and 8; row lengths that are and are not multiples of
 * the SIMD widths) against matmul_ref, within the documented tolerance:
 *   fp32, bf16: relative L2 <= 1e-5 (only the summation order differs);
 *   int8: relative L2 <= 1e-4 (the fast kernel rounds the activations to int16 per group of the
 *         weights: ~1.5e-5 relative per value; the reference multiplies float activations).
 * The fast results must be the same bits for 1, 2 and 3 threads and for one token or several per
 * call, and interleaved int8 rows (what zaya_load does with ZAYA_LOAD_HUGEPAGES) must give the same
 * bits as rows stored alone. matmul_grouped (the grouped conv) against matmul_grouped_ref and
 * against one product per group; matmuls (products of one input) against one matmul each. attention against attention_ref (relative L2 <= 1e-5) on KV caches
 * that are rings (sliding layers) and full, several head layouts, again the same bits for any
 * thread count. FP8 (bf16, f16 and f32 row scales) and MXFP4 weights (the experts of format version
 * 2): the reference decodes known bytes to their values; the fast kernel equals the reference
 * (rel L2 <= 1e-5), gives the same bits for 1-3 threads and 1 or 9 tokens a call, and the same bits
 * as the fast kernel on the float32 matrix of the dequantized values (and on its bf16 form where
 * every value is a bf16 number); a slice of rows (one expert) gives the rows of the whole.
 * matmul_chain (torch's summation order, the vision tower) against matmul_chain_ref: the same bits, with and
 * without a bias, for 1-3 threads, k in one block, two halves and many, fp32, bf16 and int8 rows (plain and
 * interleaved: matrix_row's int8 walk gives matrix_at's values).
 * Prints PASS/FAIL lines.
 */
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;
static uint64_t rng = 0x12345678u;
static float frand(void) {   /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static void check(int ok, const char *what, const char *label) {
    printf("%s %s: %s\n", ok ? "PASS" : "FAIL", label, what);
    failures += !ok;
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { num += (double)(a[i] - ref[i]) * (a[i] - ref[i]); den += (double)ref[i] * ref[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}

enum { TOKENS = 9 };
static Kernels *pools[4];   /* [threads] */

static void matmul_case(int dtype, int rows, int cols, int group) {
    size_t n = (size_t)rows * cols;
    float *wf = malloc(n * sizeof(float)), *x = malloc((size_t)TOKENS * cols * sizeof(float));
    float *y = malloc((size_t)TOKENS * rows * sizeof(float)), *y2 = malloc((size_t)TOKENS * rows * sizeof(float));
    float *yr = malloc((size_t)TOKENS * rows * sizeof(float));
    void *data = NULL;
    float *scales = NULL;
    for (size_t i = 0; i < n; i++) wf[i] = frand() * 0.05f;
    for (int i = 0; i < TOKENS * cols; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    if (dtype == ZAYA_F32) data = wf;
    else if (dtype == ZAYA_BF16) {
        uint16_t *b = malloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) { uint32_t u; memcpy(&u, &wf[i], 4); b[i] = (uint16_t)(u >> 16); }
        data = b;
    } else {
        int8_t *q = malloc(n);
        scales = malloc(n / (size_t)group * sizeof(float));
        for (size_t g = 0; g < n / (size_t)group; g++) {   /* stored in the interleaved order of the blob */
            float amax = 0.0f;
            for (int i = 0; i < group; i++) amax = fmaxf(amax, fabsf(wf[g * group + i]));
            scales[g] = amax / 127.0f;
            size_t row = g * group / (size_t)cols * (size_t)cols;
            for (int i = 0; i < group; i++) {
                int col = (int)(g * group - row) + i;
                q[row + zaya_q8_position(col, cols, group)] = (int8_t)roundf(wf[g * group + i] / scales[g]);
            }
        }
        data = q;
    }
    ZayaMatrix m = {dtype, rows, cols, dtype == ZAYA_Q8 ? group : 0, data, scales, 0, NULL, 0, 0};
    const char *names[] = {"fp32", "bf16", "int8"};
    char label[128], what[160];
    snprintf(label, sizeof label, "matmul %s [%d x %d]%s%.0d", names[dtype], rows, cols, dtype == ZAYA_Q8 ? " group " : "",
             dtype == ZAYA_Q8 ? group : 0);

    matmul_ref(yr, rows, &m, x, cols, 1);
    matmul(pools[1], y, rows, &m, x, cols, 1);
    const double rel = rel_l2(y, yr, (size_t)rows), tol = dtype == ZAYA_Q8 ? 1e-4 : 1e-5;
    snprintf(what, sizeof what, "fast vs reference rel L2 %.2e (<= %.0e)", rel, tol);
    check(rel <= tol, what, label);

    /* each token alone on one thread, then all tokens at once on 1-3 threads: the same bits */
    for (int t = 0; t < TOKENS; t++) matmul(pools[1], y + (size_t)t * rows, rows, &m, x + (size_t)t * cols, cols, 1);
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        matmul(pools[threads], y2, rows, &m, x, cols, TOKENS);
        same = same && !memcmp(y, y2, (size_t)TOKENS * rows * sizeof(float));
    }
    check(same, "the same bits for 1-3 threads and 1 or 9 tokens a call", label);
    float *yc = malloc((size_t)TOKENS * rows * sizeof(float)), *ycr = malloc((size_t)TOKENS * rows * sizeof(float));
    matmul_chain(pools[2], yc, rows, &m, NULL, x, cols, TOKENS);   /* rows from matrix_row (int8: its own walk) */
    matmul_chain_ref(ycr, rows, &m, NULL, x, cols, TOKENS);        /* values from matrix_at */
    check(!memcmp(yc, ycr, (size_t)TOKENS * rows * sizeof(float)), "matmul_chain: matmul_chain_ref's bits", label);

    const int RI = ZAYA_Q8_INTERLEAVE;
    if (dtype == ZAYA_Q8 && cols % 64 == 0 && rows >= RI) {   /* interleaved rows (ZayaMatrix.interleaved_rows) */
        int8_t *p = malloc(n);
        memcpy(p, data, n);
        for (int first = 0; first + RI <= rows; first += RI)   /* the 64-byte chunks of the group's rows alternate */
            for (int c = 0; c < cols; c += 64)
                for (int r = 0; r < RI; r++)
                    memcpy(p + (size_t)first * cols + (size_t)c * RI + 64 * r, (int8_t *)data + (size_t)(first + r) * cols + c, 64);
        ZayaMatrix mp = m;
        mp.data = p;
        mp.interleaved_rows = rows / RI * RI;
        matmul(pools[2], y2, rows, &mp, x, cols, 1);
        same = !memcmp(y, y2, (size_t)rows * sizeof(float));
        matmul_ref(y2, rows, &mp, x, cols, 1);
        same = same && !memcmp(yr, y2, (size_t)rows * sizeof(float));
        check(same, "interleaved rows give the same bits (fast and reference)", label);
        matmul_chain(pools[2], y2, rows, &mp, NULL, x, cols, TOKENS);
        check(!memcmp(yc, y2, (size_t)TOKENS * rows * sizeof(float)), "matmul_chain: interleaved rows, the same bits",
              label);
        free(p);
    }
    if (data != wf) free(data);
    free(wf); free(x); free(y); free(y2); free(yr); free(scales); free(yc); free(ycr);
}

/* attention of the query at `pos` over a cache of cache_len slots (a ring when smaller than pos+1) */
static void attention_case(int nq, int nkv, int d, int cache_len, int first, int pos, int bf16) {
    KvCache kv = {malloc(sizeof(float) * nkv * cache_len * d), malloc(sizeof(float) * nkv * cache_len * d), cache_len, nkv, d};
    for (int i = 0; i < nkv * cache_len * d; i++) kv.keys[i] = frand(), kv.values[i] = frand();
    const int n_keys = pos - first + 1;
    float *q = malloc(sizeof(float) * nq * d), *out = malloc(sizeof(float) * nq * d), *ref = malloc(sizeof(float) * nq * d);
    float *out2 = malloc(sizeof(float) * nq * d), *p = malloc(sizeof(float) * nq * n_keys), *pr = malloc(sizeof(float) * nq * n_keys);
    for (int i = 0; i < nq * d; i++) q[i] = frand() * 3.0f;
    char label[128], what[160];
    snprintf(label, sizeof label, "attention%s %d/%d heads of %d, keys %d..%d, cache %d", bf16 ? " (bf16)" : "", nq, nkv, d,
             first, pos, cache_len);
    const float scale = 1.0f / sqrtf((float)d);
    attention_ref(ref, pr, q, nq, &kv, first, pos, scale, bf16);
    attention(pools[1], out, p, q, nq, &kv, first, pos, scale, bf16);
    const double rel = rel_l2(out, ref, (size_t)nq * d), relp = rel_l2(p, pr, (size_t)nq * n_keys);
    /* bf16: a float32 sum in another order can round to the neighbouring bfloat16 (2^-8 relative) */
    const double bound = bf16 ? 4e-3 : 1e-5;
    int rounded = 1;
    for (int i = 0; bf16 && i < nq * d; i++) rounded = rounded && out[i] == zaya_round_bf16(out[i]);
    for (int i = 0; bf16 && i < nq * n_keys; i++) rounded = rounded && p[i] == zaya_round_bf16(p[i]);
    snprintf(what, sizeof what, "fast vs reference rel L2 %.2e, probabilities %.2e (<= %.0e)%s", rel, relp, bound,
             bf16 ? ", every output a bfloat16" : "");
    check(rel <= bound && relp <= bound && rounded, what, label);
    int same = 1;
    for (int threads = 2; threads <= 3; threads++) {
        attention(pools[threads], out2, pr, q, nq, &kv, first, pos, scale, bf16);
        same = same && !memcmp(out, out2, sizeof(float) * nq * d) && !memcmp(p, pr, sizeof(float) * nq * n_keys);
    }
    check(same, "the same bits for 1-3 threads", label);
    free(kv.keys); free(kv.values); free(q); free(out); free(ref); free(out2); free(p); free(pr);
}

/* ---- FP8 and MXFP4 weights ---------------------------------------------------------------- */

static uint8_t rbyte(void) { rng = rng * 6364136223846793005ull + 1442695040888963407ull; return (uint8_t)(rng >> 56); }

static float bf16_of(float f) {   /* f rounded to bf16 (ties to even), as a float */
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* known bytes decode to their values (matrix_row uses the plain reference) */
static void quant_values_case(void) {
    static const struct { uint8_t q; float scale; int sd; float want; } fp8[] = {
        {0x7e, 1.0f, ZAYA_F32, 448.0f}, {0xfe, 1.0f, ZAYA_F32, -448.0f}, {0x01, 1.0f, ZAYA_F32, 0x1p-9f},
        {0x08, 1.0f, ZAYA_F32, 0x1p-6f}, {0x38, 1.0f, ZAYA_F32, 1.0f}, {0x3c, 0.5f, ZAYA_F32, 0.75f},
        {0x80, 3.0f, ZAYA_BF16, -0.0f}, {0x3f, 0x1.fcp0f, ZAYA_BF16, 0x1.dcp1f},   /* 1.875 x 1.984375 = 3.7207 -> bf16 3.71875 */
        {0x3f, 0x1.ffcp0f, ZAYA_F16, 0x1.dfcp1f},                                    /* 3.74634 -> f16 3.74609 */
        {0x01, 0x1p-16f, ZAYA_F16, 0.0f}, {0x03, 0x1p-16f, ZAYA_F16, 0x1p-23f},       /* f16 subnormals: ties to even */
        {0x0b, 0x1p-19f, ZAYA_F16, 0x1p-24f}, {0x01, 0x1p-5f, ZAYA_F16, 0x1p-14f}};
    int ok = 1;
    char what[200] = "FP8 E4M3FN bytes x scales rounded to the scale dtype";
    for (size_t k = 0; k < sizeof fp8 / sizeof fp8[0]; k++) {
        float scale = fp8[k].scale, got;
        ZayaMatrix m = {ZAYA_FP8, 1, 1, 0, &fp8[k].q, &scale, 0, NULL, fp8[k].sd, 0};
        matrix_row(&m, 0, &got);
        if (memcmp(&got, &fp8[k].want, 4) != 0 && ok) {
            snprintf(what, sizeof what, "byte 0x%02x x %a (scale dtype %d): expected %a, found %a", fp8[k].q, (double)scale,
                     fp8[k].sd, (double)fp8[k].want, (double)got);
            ok = 0;
        }
    }
    check(ok, what, "FP8 values");
    /* MXFP4: row of 64: bytes 0x10 0x32 ... (nibbles 0..15 in order), exponents 127 and 0 */
    uint8_t packed[32], ex[2] = {127, 0};
    for (int i = 0; i < 32; i++) packed[i] = (uint8_t)(((2 * i + 1) % 16) << 4 | (2 * i) % 16);
    const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    ZayaMatrix m = {ZAYA_MXFP4, 1, 64, 32, packed, NULL, 0, ex, 0, 0};
    float got[64];
    matrix_row(&m, 0, got);
    ok = 1;
    snprintf(what, sizeof what, "E2M1 nibbles (low first) x 2^(e - 127), e = 127 and 0");
    for (int i = 0; i < 64 && ok; i++) {
        const float want = e2m1[i % 16] * (i < 32 ? 1.0f : 0x1p-127f);
        if (memcmp(&got[i], &want, 4) != 0) {
            snprintf(what, sizeof what, "value %d: expected %a, found %a", i, (double)want, (double)got[i]);
            ok = 0;
        }
    }
    check(ok, what, "MXFP4 values");
}

/* dtype ZAYA_FP8 (scale dtype sd, scales times `big`) or ZAYA_MXFP4, random bytes; `experts` stacked
 * slices of rows/experts rows */
static void quant_matmul_case(int dtype, int sd, float big, int rows, int cols, int experts) {
    const size_t n = (size_t)rows * cols;
    uint8_t *q = malloc(dtype == ZAYA_FP8 ? n : n / 2), *ex = NULL;
    float *scales = NULL;
    if (dtype == ZAYA_FP8) {
        for (size_t i = 0; i < n; i++) { q[i] = rbyte(); if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1; }   /* no NaN */
        scales = malloc(sizeof(float) * rows);
        for (int r = 0; r < rows; r++) {   /* f16: products down to 2^-19, inside f16's subnormals */
            const float s = (0.75f + 0.25f * frand()) * (sd == ZAYA_F16 ? 0x1p-10f : 0x1p-8f);
            scales[r] = sd == ZAYA_BF16 ? bf16_of(s) : sd == ZAYA_F16 ? ldexpf(rintf(ldexpf(s, 20)), -20) : s * big;
        }
    } else {
        for (size_t i = 0; i < n / 2; i++) q[i] = rbyte();
        ex = malloc(n / 32);
        for (size_t g = 0; g < n / 32; g++) ex[g] = (uint8_t)(118 + rbyte() % 6);   /* 2^-9 .. 2^-4 */
        if (n / 32 > 3) ex[0] = 0, ex[1] = 1, ex[2] = 254 - 128;                   /* subnormal scales too */
    }
    ZayaMatrix m = {dtype, rows, cols, dtype == ZAYA_MXFP4 ? 32 : 0, q, scales, 0, ex, dtype == ZAYA_FP8 ? sd : 0, 0};
    float *x = malloc(sizeof(float) * TOKENS * cols), *deq = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * TOKENS * rows), *y2 = malloc(sizeof(float) * TOKENS * rows), *yr = malloc(sizeof(float) * rows);
    for (int i = 0; i < TOKENS * cols; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int r = 0; r < rows; r++) matrix_row(&m, r, deq + (size_t)r * cols);
    char label[128], what[200];
    const char *sdn = sd == ZAYA_BF16 ? "bf16" : sd == ZAYA_F16 ? "f16" : "f32";
    if (dtype == ZAYA_FP8) snprintf(label, sizeof label, "matmul fp8 (%s scales%s) [%d x %d]", sdn, big > 1 ? " > 2^7" : "", rows, cols);
    else snprintf(label, sizeof label, "matmul mxfp4 [%d x %d]", rows, cols);

    matmul_ref(yr, rows, &m, x, cols, 1);
    matmul(pools[1], y, rows, &m, x, cols, 1);
    const double rel = rel_l2(y, yr, (size_t)rows);
    snprintf(what, sizeof what, "fast vs reference rel L2 %.2e (<= 1e-05)", rel);
    check(rel <= 1e-5, what, label);

    for (int t = 0; t < TOKENS; t++) matmul(pools[1], y + (size_t)t * rows, rows, &m, x + (size_t)t * cols, cols, 1);
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        matmul(pools[threads], y2, rows, &m, x, cols, TOKENS);
        same = same && !memcmp(y, y2, sizeof(float) * TOKENS * rows);
    }
    check(same, "the same bits for 1-3 threads and 1 or 9 tokens a call", label);
    float *yc = malloc((size_t)TOKENS * rows * sizeof(float)), *ycr = malloc((size_t)TOKENS * rows * sizeof(float));
    matmul_chain(pools[2], yc, rows, &m, NULL, x, cols, TOKENS);   /* rows from matrix_row (int8: its own walk) */
    matmul_chain_ref(ycr, rows, &m, NULL, x, cols, TOKENS);        /* values from matrix_at */
    check(!memcmp(yc, ycr, (size_t)TOKENS * rows * sizeof(float)), "matmul_chain: matmul_chain_ref's bits", label);

    /* the dequantized matrix as float32 (and as bf16 where every value is one): the same bits */
    ZayaMatrix mf = {ZAYA_F32, rows, cols, 0, deq, NULL, 0, NULL, 0, 0};
    matmul(pools[2], y2, rows, &mf, x, cols, TOKENS);
    same = !memcmp(y, y2, sizeof(float) * TOKENS * rows);
    int all_bf16 = 1;
    uint16_t *b = malloc(sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &deq[i], 4);
        all_bf16 = all_bf16 && (u & 0xffff) == 0;
        b[i] = (uint16_t)(u >> 16);
    }
    if (all_bf16) {
        ZayaMatrix mb = {ZAYA_BF16, rows, cols, 0, b, NULL, 0, NULL, 0, 0};
        matmul(pools[3], y2, rows, &mb, x, cols, TOKENS);
        same = same && !memcmp(y, y2, sizeof(float) * TOKENS * rows);
    }
    snprintf(what, sizeof what, "the same bits as the dequantized matrix in float32%s", all_bf16 ? " and in bf16" : "");
    check(same, what, label);

    /* one expert of the stacked rows: matrix_rows gives its rows of the whole product */
    same = 1;
    const int per = rows / experts;
    for (int e = 0; e < experts; e++) {
        const ZayaMatrix s = matrix_rows(&m, e * per, per);
        matmul(pools[2], y2, per, &s, x, cols, TOKENS);
        for (int t = 0; t < TOKENS; t++) same = same && !memcmp(y + (size_t)t * rows + e * per, y2 + (size_t)t * per, sizeof(float) * per);
    }
    snprintf(what, sizeof what, "each of %d experts (matrix_rows) gives its rows of the whole", experts);
    check(same, what, label);
    free(q); free(ex); free(scales); free(x); free(deq); free(y); free(y2); free(yr); free(b);
}

/* matmul_grouped: each group's rows meet their own columns of x. The same bits as one matmul per
 * group (fast and reference), for 1-3 threads and 1 or 9 tokens a call; fast vs reference within
 * the tolerance of matmul. dtype F32 (the grouped conv of CCA) or int8 with groups of 8. */
static void grouped_case(int dtype, int groups, int group_rows, int cols) {
    const int rows = groups * group_rows, in = groups * cols, G = 8;
    const size_t n = (size_t)rows * cols;
    float *wf = malloc(n * sizeof(float)), *x = malloc((size_t)TOKENS * in * sizeof(float)), *scales = NULL;
    float *y = malloc((size_t)TOKENS * rows * sizeof(float)), *y2 = malloc((size_t)TOKENS * rows * sizeof(float));
    float *yr = malloc((size_t)TOKENS * rows * sizeof(float)), *yr2 = malloc((size_t)TOKENS * rows * sizeof(float));
    void *data = wf;
    for (size_t i = 0; i < n; i++) wf[i] = frand() * 0.05f;
    for (int i = 0; i < TOKENS * in; i++) x[i] = frand();
    if (dtype == ZAYA_Q8) {   /* groups of 8 in the blob's order */
        int8_t *q = malloc(n);
        scales = malloc(n / G * sizeof(float));
        for (size_t g = 0; g < n / G; g++) {
            scales[g] = 1.0f / 127.0f;
            size_t row = g * G / (size_t)cols * (size_t)cols;
            for (int i = 0; i < G; i++) q[row + zaya_q8_position((int)(g * G - row) + i, cols, G)] = (int8_t)(frand() * 127.0f);
        }
        data = q;
    }
    ZayaMatrix m = {dtype, rows, cols, dtype == ZAYA_Q8 ? G : 0, data, scales, 0, NULL, 0, 0};
    char label[128], what[160];
    snprintf(label, sizeof label, "matmul_grouped %s [%d groups of %d x %d]", dtype == ZAYA_Q8 ? "int8" : "fp32", groups, group_rows, cols);
    matmul_grouped_ref(yr, rows, &m, groups, x, in, TOKENS);
    matmul_grouped(pools[1], y, rows, &m, groups, x, in, TOKENS);
    const double rel = rel_l2(y, yr, (size_t)TOKENS * rows), tol = dtype == ZAYA_Q8 ? 1e-4 : 1e-5;
    snprintf(what, sizeof what, "fast vs reference rel L2 %.2e (<= %.0e)", rel, tol);
    check(rel <= tol, what, label);
    int same = 1;
    for (int j = 0; j < groups; j++) {   /* group j alone: rows [j * group_rows, ...) of W, columns j * cols of x */
        ZayaMatrix part = matrix_rows(&m, j * group_rows, group_rows);
        for (int t = 0; t < TOKENS; t++) matmul(pools[1], y2 + (size_t)t * rows + (size_t)j * group_rows, rows, &part,
                                                x + (size_t)t * in + (size_t)j * cols, in, 1);
        matmul_ref(yr2 + (size_t)j * group_rows, rows, &part, x + (size_t)j * cols, in, TOKENS);
    }
    same = !memcmp(y, y2, (size_t)TOKENS * rows * sizeof(float)) && !memcmp(yr, yr2, (size_t)TOKENS * rows * sizeof(float));
    for (int threads = 2; threads <= 3; threads++) {
        matmul_grouped(pools[threads], y2, rows, &m, groups, x, in, TOKENS);
        same = same && !memcmp(y, y2, (size_t)TOKENS * rows * sizeof(float));
    }
    check(same, "the same bits as a product per group, for 1-3 threads and 1 or 9 tokens a call", label);
    if (data != wf) free(data);
    free(wf); free(x); free(y); free(y2); free(yr); free(yr2); free(scales);
}

/* matmul_chain (torch's summation order) against matmul_chain_ref: the same bits, for 1-3 threads, any
 * number of tokens (whole tiles of 8 and a tail), blocks of k one, two halves and many (torch_k_block) */
static void chain_case(int dtype, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    float *wf = malloc(n * sizeof(float)), *x = malloc((size_t)TOKENS * cols * sizeof(float));
    float *y = malloc((size_t)TOKENS * rows * sizeof(float)), *yr = malloc((size_t)TOKENS * rows * sizeof(float));
    uint16_t *wb = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) wf[i] = frand() * 0.05f;
    for (int i = 0; i < TOKENS * cols; i++) x[i] = frand();
    for (size_t i = 0; i < n; i++) { uint32_t u; memcpy(&u, &wf[i], 4); wb[i] = (uint16_t)(u >> 16); }
    const ZayaMatrix m = {.dtype = dtype, .rows = rows, .cols = cols, .data = dtype == ZAYA_BF16 ? (void *)wb : wf};
    float *bias = malloc((size_t)rows * sizeof(float));
    for (int o = 0; o < rows; o++) bias[o] = frand();
    matmul_chain_ref(yr, rows, &m, bias, x, cols, TOKENS);
    int same = 1;
    for (int t = 1; t <= 3; t++) {
        matmul_chain(pools[t], y, rows, &m, bias, x, cols, TOKENS);
        same = same && !memcmp(y, yr, (size_t)TOKENS * rows * sizeof(float));
    }
    matmul_chain(pools[2], y, rows, &m, bias, x, cols, 3);   /* fewer tokens than a tile */
    same = same && !memcmp(y, yr, (size_t)3 * rows * sizeof(float));
    matmul_chain_ref(yr, rows, &m, NULL, x, cols, TOKENS);   /* no bias */
    matmul_chain(pools[3], y, rows, &m, NULL, x, cols, TOKENS);
    same = same && !memcmp(y, yr, (size_t)TOKENS * rows * sizeof(float));
    printf("%s matmul_chain %s [%d x %d], %d tokens: the same bits as matmul_chain_ref for 1-3 threads\n",
           same ? "PASS" : "FAIL", dtype == ZAYA_BF16 ? "bf16" : "fp32", rows, cols, TOKENS);
    failures += !same;
    free(wf), free(x), free(y), free(yr), free(wb), free(bias);
}

/* matmuls: four products of one input (q_proj, k_proj, the two value projections of ZAYA1-8B,
 * scaled down) give the same bits as one matmul() each, for 1-3 threads and 1 or 9 tokens a call
 * (so matmul_ref on each is their reference). int8 (one quantized input for all) and fp32; a mixed
 * set (int8 and fp32) falls back to one product each. */
static void matmuls_case(int dtype, int cols, int mixed) {
    const int rows[4] = {256, 32, 32, 16}, G = 8;
    ZayaMatrix m[4];
    float *y[4], *y2[4], *x = malloc((size_t)TOKENS * cols * sizeof(float));
    MatmulOut out2[4];
    for (int i = 0; i < TOKENS * cols; i++) x[i] = frand();
    for (int i = 0; i < 4; i++) {
        const int dt = mixed && i == 3 ? ZAYA_F32 : dtype;
        const size_t n = (size_t)rows[i] * cols;
        float *scales = NULL;
        void *data;
        if (dt == ZAYA_Q8) {
            int8_t *q = malloc(n);
            scales = malloc(n / G * sizeof(float));
            for (size_t j = 0; j < n; j++) q[j] = (int8_t)(frand() * 127.0f);
            for (size_t g = 0; g < n / G; g++) scales[g] = 1.0f / 127.0f;
            data = q;
        } else {
            float *f = malloc(n * sizeof(float));
            for (size_t j = 0; j < n; j++) f[j] = frand() * 0.05f;
            data = f;
        }
        m[i] = (ZayaMatrix){dt, rows[i], cols, dt == ZAYA_Q8 ? G : 0, data, scales, 0, NULL, 0, 0};
        y[i] = malloc((size_t)TOKENS * rows[i] * sizeof(float));
        y2[i] = malloc((size_t)TOKENS * rows[i] * sizeof(float));
        out2[i] = (MatmulOut){&m[i], y2[i], rows[i]};
    }
    char label[96];
    snprintf(label, sizeof label, "matmuls %s%s [4 products of %d columns]", dtype == ZAYA_Q8 ? "int8" : "fp32", mixed ? " + fp32" : "", cols);
    int same = 1;
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < TOKENS; t++) matmul(pools[1], y[i] + (size_t)t * rows[i], rows[i], &m[i], x + (size_t)t * cols, cols, 1);
    for (int threads = 1; threads <= 3; threads++) {
        matmuls(pools[threads], out2, 4, x, cols, TOKENS);
        for (int i = 0; i < 4; i++) same = same && !memcmp(y[i], y2[i], (size_t)TOKENS * rows[i] * sizeof(float));
    }
    check(same, "the same bits as one matmul each, for 1-3 threads and 1 or 9 tokens a call", label);
    for (int i = 0; i < 4; i++) { free((void *)m[i].data); free((void *)m[i].scales); free(y[i]); free(y2[i]); }
    free(x);
}

int main(void) {
    for (int t = 1; t <= 3; t++)
        if (!(pools[t] = kernels_new(t, 4096, TOKENS))) { printf("FAIL kernels_new(%d threads): cannot start\n", t); return 1; }
    /* row lengths: whole int8 blocks of 8 groups, blocks plus a tail, only a tail, tiny */
    const int shapes[][2] = {{300, 2048}, {33, 320}, {17, 96}, {64, 80}, {9, 384}, {5, 8}, {7, 512}, {10, 192}, {1000, 64}};
    for (int s = 0; s < 9; s++) {
        matmul_case(ZAYA_F32, shapes[s][0], shapes[s][1], 0);
        matmul_case(ZAYA_BF16, shapes[s][0], shapes[s][1], 0);
        for (int g = 32; g >= 8; g /= 2)
            if (shapes[s][1] % g == 0) { matmul_case(ZAYA_Q8, shapes[s][0], shapes[s][1], g); break; }
        if (shapes[s][1] % 16 == 0) matmul_case(ZAYA_Q8, shapes[s][0], shapes[s][1], 16);
    }
    grouped_case(ZAYA_F32, 18, 128, 256);   /* ZAYA1-8B's grouped conv: 18 heads of d = 128, kernel 2 */
    grouped_case(ZAYA_F32, 5, 8, 16);       /* the fixtures' d = 8: groups smaller than a row tile */
    grouped_case(ZAYA_F32, 3, 100, 24);     /* groups that end inside a row tile */
    grouped_case(ZAYA_Q8, 4, 72, 512);      /* int8: interleaved-size groups, whole blocks */
    grouped_case(ZAYA_Q8, 3, 5, 64);
    const int chains[][2] = {{120, 40}, {17, 160}, {33, 200}, {16, 256}, {40, 1280}, {5, 385}, {24, 3420}};
    for (int c = 0; c < 7; c++) {
        chain_case(ZAYA_F32, chains[c][0], chains[c][1]);
        chain_case(ZAYA_BF16, chains[c][0], chains[c][1]);
    }
    matmuls_case(ZAYA_Q8, 512, 0);
    matmuls_case(ZAYA_Q8, 96, 0);
    matmuls_case(ZAYA_F32, 80, 0);
    matmuls_case(ZAYA_Q8, 64, 1);
    quant_values_case();
    /* row lengths: ZAYA1-8B's 2048, blocks of 32 with an odd 16-block (FP8 only: any length) */
    const int sds[3] = {ZAYA_BF16, ZAYA_F16, ZAYA_F32};
    for (int k = 0; k < 3; k++) {
        quant_matmul_case(ZAYA_FP8, sds[k], 1, 256, 2048, 4);
        quant_matmul_case(ZAYA_FP8, sds[k], 1, 48, 80, 3);
        quant_matmul_case(ZAYA_FP8, sds[k], 1, 10, 37, 2);
    }
    quant_matmul_case(ZAYA_FP8, ZAYA_F32, 0x1p16f, 48, 80, 3);   /* scale * 2^120 overflows: two multiplies */
    quant_matmul_case(ZAYA_MXFP4, 0, 1, 256, 2048, 4);
    quant_matmul_case(ZAYA_MXFP4, 0, 1, 48, 96, 3);
    quant_matmul_case(ZAYA_MXFP4, 0, 1, 6, 32, 2);
    attention_case(8, 2, 128, 300, 0, 200, 0);    /* ZAYA1-8B's heads, a full cache */
    attention_case(8, 2, 128, 64, 137, 200, 0);   /* a sliding window of 64: a ring that wraps */
    attention_case(6, 3, 16, 5, 8, 12, 0);        /* odd KV heads, window 5 */
    attention_case(8, 2, 128, 300, 0, 200, 1);    /* --precision bf16 */
    attention_case(6, 3, 16, 5, 8, 12, 1);
    attention_case(4, 1, 8, 40, 0, 0, 0);      /* one key */
    attention_case(16, 2, 128, 1000, 0, 999, 0);   /* 74B's heads */
    for (int t = 1; t <= 3; t++) kernels_free(pools[t]);
    return failures ? 1 : 0;
}
