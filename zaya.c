/* zaya.c - ZAYA1-8B inference in plain C: blob loader, forward pass, sampler, dumps, CLI.
 *
 * Read it top to bottom:
 *   1. small helpers (errors, bf16, matrices)
 *   2. the math kernels: rmsnorm, matvec, softmax, GELU, SiLU
 *   3. loading and validating the blob (docs/blob-format.md)
 *   4. the decoding state
 *   5. forward(): one token through the model, in the order of docs/architecture.md section 3
 *   6. sampling, dumps and the command line (compiled unless ZAYA_NO_MAIN is defined)
 */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE   /* madvise(MADV_HUGEPAGE) */
#include "zaya.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------
 * 1. Helpers
 * ------------------------------------------------------------------------------------------- */

/* Formats an error message into err and returns -1, so failures read `return fail(err, n, ...)`. */
static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Zeroed memory aligned to a cache line, for the buffers the kernels stream through: a 64-byte load
 * of activations then never straddles two lines (with calloc's 16-byte alignment the int8 kernel
 * computed 41 GB/s from L2 on Zen 4 instead of 54). Freed with free(). */
static void *calloc_lines(size_t n, size_t size) {
    if (size && n > (SIZE_MAX - 63) / size) return NULL;
    const size_t bytes = n * size > 0 ? (n * size + 63) / 64 * 64 : 64;
    void *p = aligned_alloc(64, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static inline float bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;   /* exact: bf16 is the top half of an fp32 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Rows [row0, row0+nrows) of a matrix as a matrix of their own (used for one expert's slice; row0 is
 * a multiple of ZAYA_Q8_INTERLEAVE where rows are interleaved: interleave_q8_rows sees to it). */
static ZayaMatrix matrix_rows(const ZayaMatrix *m, int row0, int nrows) {
    ZayaMatrix r = *m;
    size_t start = (size_t)row0 * (size_t)m->cols;
    r.rows = nrows;
    if (m->dtype == ZAYA_F32) r.data = (const float *)m->data + start;
    else if (m->dtype == ZAYA_BF16) r.data = (const uint16_t *)m->data + start;
    else {
        r.data = (const int8_t *)m->data + start;
        r.scales = m->scales + start / (size_t)m->group_size;
        const int il = m->interleaved_rows - row0;
        r.interleaved_rows = il < 0 ? 0 : il < nrows ? il : nrows;
    }
    return r;
}

/* Where int8 row `row` starts, and *pitch, the distance between its 64-byte chunks: 64 for a row
 * stored alone, 64 * ZAYA_Q8_INTERLEAVE for an interleaved row (ZayaMatrix.interleaved_rows), the
 * chunks of the other rows of its group sitting between. */
static const int8_t *q8_row(const ZayaMatrix *m, int row, int *pitch) {
    const int8_t *d = m->data;
    const int R = ZAYA_Q8_INTERLEAVE, first = row / R * R;   /* the group's first row */
    *pitch = row < m->interleaved_rows ? 64 * R : 64;
    return row < m->interleaved_rows ? d + (size_t)first * (size_t)m->cols + (row - first) * 64 : d + (size_t)row * (size_t)m->cols;
}

/* The weight at storage position q (zaya_q8_position) of a row whose 64-byte chunks are pitch apart
 * (the test of pitch is loop-invariant: the compiler keeps a plain, vectorized loop for rows alone). */
static inline int8_t q8_at(const int8_t *w, size_t q, int pitch) {
    return pitch == 64 ? w[q] : w[q / 64 * (size_t)pitch + q % 64];
}

size_t zaya_q8_position(int i, int cols, int group) {
    const int block = 8 * group;
    if (group % 2 || i >= cols / block * block) return (size_t)i;   /* odd groups and the tail: unpermuted */
    const int b = i / block, k = (i % block) / group, j = i % group;
    return (size_t)b * block + (size_t)(j / 2) * 16 + 2 * k + j % 2;
}

/* Weight [row][i] widened to float32 (int8: dequantized from its interleaved position). */
static float matrix_at(const ZayaMatrix *m, int row, int i) {
    size_t start = (size_t)row * (size_t)m->cols;
    if (m->dtype == ZAYA_F32) return ((const float *)m->data)[start + i];
    if (m->dtype == ZAYA_BF16) return bf16_to_f32(((const uint16_t *)m->data)[start + i]);
    int pitch;
    const int8_t *w = q8_row(m, row, &pitch);
    return q8_at(w, zaya_q8_position(i, m->cols, m->group_size), pitch) * m->scales[(start + i) / (size_t)m->group_size];
}

/* Row `row` of a matrix widened to float32 (the embedding lookup). */
static void matrix_row(const ZayaMatrix *m, int row, float *out) {
    for (int i = 0; i < m->cols; i++) out[i] = matrix_at(m, row, i);
}

/* ---------------------------------------------------------------------------------------------
 * 2. Kernels
 * ------------------------------------------------------------------------------------------- */

/* RMSNorm(x; w) = w * (x / sqrt(mean(x^2) + eps)), HF ZayaRMSNorm.forward (weight not 1+w). */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* Activations meet int8 weights as int16 in groups: xs[g] = max|x| / 32767 over the group,
 * xq = round(x / xs), stored in the weights' interleaved order (zaya_q8_position). Their rounding
 * error (~1e-5 relative) is far below the weights' int8 error, so routing stays as with float32
 * activations, while the dot product is exact integer work. */

/* The scale of one group: *xs = max|x| / 32767 and *inv = 32767 / max|x| (both 0 for a group of
 * zeros). Returns 0 if the group holds NaN or inf (only from a corrupt blob): then *xs = NaN and its
 * values are stored as 0, so the group's sums are NaN. */
static int q16_scale(const float *xg, int group, float *xs, float *inv) {
    uint32_t amax_bits = 0;            /* max |x| as bits: orders like the floats, and NaN > inf > finite */
    for (int i = 0; i < group; i++) {
        uint32_t b;
        memcpy(&b, xg + i, 4);
        b &= 0x7fffffffu;
        amax_bits = b > amax_bits ? b : amax_bits;
    }
    float amax;
    memcpy(&amax, &amax_bits, 4);
    *inv = 0.0f;
    if (amax_bits >= 0x7f800000u) { *xs = NAN; return 0; }
    if (amax < 1e-30f) *xs = 0.0f;     /* counts as zero (and 32767 / amax could overflow) */
    else { *xs = amax / 32767.0f; *inv = 32767.0f / amax; }
    return 1;
}

/* Rounds half away from zero (|v| <= 32767 here). copysignf, not a test of the sign: gcc made that a
 * branch, which the random signs of activations mispredict (2.2 -> 0.5-1 us per 512 values). */
static int16_t q16_round(float v) { return (int16_t)(v + copysignf(0.5f, v)); }

/* Group g of the n values x[0..n). In a block of 8 groups, values 2j and 2j+1 of group k are stored
 * together at 16 * j + 2 * k (zaya_q8_position): one 32-bit store per pair. */
static void quantize_q16(int16_t *xq, float *xs, const float *x, int n, int group, int g) {
    const int block = 8 * group, nb = group % 2 ? 0 : n / block;   /* as in zaya_q8_position */
    const float *xg = x + (size_t)g * group;
    float inv;
    const int finite = q16_scale(xg, group, &xs[g], &inv);
    if (g < nb * 8) {
        int16_t *dst = xq + (size_t)(g / 8) * block + 2 * (g % 8);
        for (int j = 0; j < group / 2; j++) {
            const float v0 = xg[2 * j] * inv, v1 = xg[2 * j + 1] * inv;
            const uint32_t pair = (uint16_t)q16_round(finite ? v0 : 0.0f) | (uint32_t)(uint16_t)q16_round(finite ? v1 : 0.0f) << 16;
            memcpy(dst + 16 * j, &pair, sizeof pair);   /* little-endian, like the blob: v0 first */
        }
    } else {                                         /* past the last whole block: unpermuted */
        for (int i = 0; i < group; i++) xq[(size_t)g * group + i] = q16_round(finite ? xg[i] * inv : 0.0f);
    }
}

/* The reference kernel: y[o] = sum_i W[o][i] * x[i], plain loops, float32 weights and activations.
 * (int8 weights are dequantized, the activations are not quantized.) */
void zaya_matvec_ref(float *y, const ZayaMatrix *w, const float *x) {
    for (int o = 0; o < w->rows; o++) {
        float sum = 0.0f;
        for (int i = 0; i < w->cols; i++) sum += matrix_at(w, o, i) * x[i];
        y[o] = sum;
    }
}

/* The fast dot products. Each is written twice: plain C that any compiler builds, and AVX-512 /
 * AVX512-VNNI intrinsics. The two compute exactly the same operations in the same order (16
 * float lanes with fused multiply-adds, or exact integer sums), so they give bit-identical
 * results; test/test_kernels.c checks that, and how far both are from zaya_matvec_ref. */
#define LANES 16

static float sum_lanes(const float *acc) {   /* fixed pairwise order: results never depend on the machine */
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#ifdef __AVX512F__
/* sum_lanes of lanes 0..7 given as s8 (lanes 8..15 already added), in registers: the same additions
 * in the same order as sum_lanes, without storing the accumulators and reloading them one by one */
static inline float sum_lanes_s8(__m256 s8) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));   /* s4[0] + s4[2], s4[1] + s4[3] */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
static inline float sum_lanes_512(__m512 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return sum_lanes_s8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}
#endif

/* float32 or bf16 weights x float32 activations for nt <= DOT_TOKENS tokens at once: per token two
 * chains of 16 lanes of fused multiply-adds (blocks of 16 values alternate between them, so a single
 * token is not held up by the FMA latency), the chains added lane by lane, then sum_lanes. Token t's
 * result is the same operations in the same order whatever nt is; several tokens only share each
 * weight load. */
#define DOT_TOKENS 8
static inline __attribute__((always_inline)) void
dot_float_n(float *out, const int nt, const void *wv, const int bf16, const float *x, size_t x_stride, int n) {
    const float *wf = wv;
    const uint16_t *wb = wv;
    float acc[DOT_TOKENS][LANES];
    int i = 0;
#ifdef __AVX512F__
#define W512(i) (bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(wb + (i)))), 16)) \
                      : _mm512_loadu_ps(wf + (i)))
    __m512 a[DOT_TOKENS], b[DOT_TOKENS];
    for (int t = 0; t < nt; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (; i + 2 * LANES <= n; i += 2 * LANES) {
        const __m512 w0 = W512(i), w1 = W512(i + LANES);
        for (int t = 0; t < nt; t++) {
            a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * x_stride + i), a[t]);
            b[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * x_stride + i + LANES), b[t]);
        }
    }
    if (i + LANES <= n) {             /* an odd last block: the first chain's */
        const __m512 w0 = W512(i);
        for (int t = 0; t < nt; t++) a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * x_stride + i), a[t]);
        i += LANES;
    }
#undef W512
    for (int t = 0; t < nt; t++) a[t] = _mm512_add_ps(a[t], b[t]);
    if (i == n) {                    /* no tail: the lane sums in registers */
        for (int t = 0; t < nt; t++) out[t] = sum_lanes_512(a[t]);
        return;
    }
    for (int t = 0; t < nt; t++) _mm512_storeu_ps(acc[t], a[t]);
#else
    float acc2[DOT_TOKENS][LANES];
    for (int t = 0; t < nt; t++) memset(acc[t], 0, sizeof acc[t]), memset(acc2[t], 0, sizeof acc2[t]);
    for (int k = 0; i + LANES <= n; i += LANES, k++) {
        float (*chain)[LANES] = k % 2 ? acc2 : acc;   /* block k's chain */
        for (int t = 0; t < nt; t++)
            for (int l = 0; l < LANES; l++)
                chain[t][l] = fmaf(bf16 ? bf16_to_f32(wb[i + l]) : wf[i + l], x[t * x_stride + i + l], chain[t][l]);
    }
    for (int t = 0; t < nt; t++)
        for (int l = 0; l < LANES; l++) acc[t][l] += acc2[t][l];
#endif
    for (int t = 0; t < nt; t++) {
        for (int j = i, l = 0; j < n; j++, l++) acc[t][l] = fmaf(bf16 ? bf16_to_f32(wb[j]) : wf[j], x[t * x_stride + j], acc[t][l]);
        out[t] = sum_lanes(acc[t]);
    }
}

static float dot_f32(const float *w, const float *x, int n) {
    float r;
    dot_float_n(&r, 1, w, 0, x, 0, n);
    return r;
}

/* The int8 kernels' SIMD form: AVX-512 with VNNI (vpdpwssd) and VL. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define Q8_VNNI 1
#else
#define Q8_VNNI 0
#endif

/* Whether rows of n int8 values in groups of `group` are whole blocks of 8 groups with a group size
 * the SIMD steps of 64 values divide: then every 64-byte chunk of a row is whole. */
static int q8_whole_blocks(int n, int group) { return group % 8 == 0 && n > 0 && n % (8 * group) == 0; }

#if Q8_VNNI
/* acc += the 8 group sums of one block times weight scale times activation scale: int32 lanes k and
 * k+8 of s0 + s1 belong to group k. */
static inline __m256 q8_block_acc(__m256 acc, __m512i s0, __m512i s1, __m256 wscale, const float *xs) {
    const __m512i s2 = _mm512_add_epi32(s0, s1);
    const __m256i s8 = _mm256_add_epi32(_mm512_castsi512_si256(s2), _mm512_extracti64x4_epi64(s2, 1));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(wscale, _mm256_loadu_ps(xs)), acc);
}
#endif

/* PREFETCH_AHEAD (bytes, off unless defined at build time): a software prefetch of the weight stream
 * into L1 that far ahead. The hardware prefetchers alone gave the fastest decode on the Zen 4 VM
 * (2026-11-24, 1 thread, same rounds: 15.1-16.2 tok/s; 4096 ahead 10.4-10.9; 8192 into L2 13.8-15.0; with the unroll
 * below, 4096 ahead: 0.66 of a paired read against 0.85), although 4096 had been 20-25% faster than
 * 1024 there two days before: measure with bench/decode_vs_read.c before turning it on. */
/* int8 weights x int16 activations for nt <= DOT_TOKENS tokens at once (prefill shares each weight load).
 * Both are in the interleaved order: in a block of 8 groups, position p belongs to group p/2 % 8,
 * so 16-bit lanes pair up into 8 int32 lanes, one per group, and no horizontal sums are needed.
 * Per group an exact integer sum, then acc[g % 8] += isum * (weight scale * activation scale). */
static inline __attribute__((always_inline)) void
dot_q8_n(float *out, const int nt, const int8_t *w, int pitch, const float *ws, const int16_t *xq, size_t xq_stride,
         const float *xs, size_t xs_stride, int n, int group) {
    float acc[DOT_TOKENS][LANES];
    for (int t = 0; t < nt; t++) memset(acc[t], 0, sizeof acc[t]);
    const int block = 8 * group, nb = group % 2 ? 0 : n / block;
    int b = 0;
#if Q8_VNNI
    __m256 a[DOT_TOKENS];
    for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
    if (group % 8 == 0)   /* 64 values per iteration: two 512-bit steps, two chains per token */
        for (; b < nb; b++) {
            __m512i isum0[DOT_TOKENS], isum1[DOT_TOKENS];
            for (int t = 0; t < nt; t++) isum0[t] = isum1[t] = _mm512_setzero_si512();
            const int8_t *wb = w + (size_t)b * block / 64 * pitch;   /* the row's chunks are pitch bytes apart */
#pragma GCC unroll 8   /* a block of the default group size 64 in one pass: decode ~12% faster on Zen 4
                          (ratio to a paired read 0.86-0.87 vs 0.75-0.78, 1 thread; 0.75 vs 0.65 at 2) */
            for (int s = 0; s < block; s += 64) {
#ifdef PREFETCH_AHEAD
                _mm_prefetch((const char *)(wb + s + PREFETCH_AHEAD), _MM_HINT_T0);
#endif
                __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wb + s / 64 * pitch)));
                __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(wb + s / 64 * pitch + 32)));
                for (int t = 0; t < nt; t++) {
                    const int16_t *xb = xq + t * xq_stride + (size_t)b * block + s;
                    isum0[t] = _mm512_dpwssd_epi32(isum0[t], w0, _mm512_loadu_si512(xb));
                    isum1[t] = _mm512_dpwssd_epi32(isum1[t], w1, _mm512_loadu_si512(xb + 32));
                }
            }
            __m256 wscale = _mm256_loadu_ps(ws + (size_t)b * 8);
            for (int t = 0; t < nt; t++) a[t] = q8_block_acc(a[t], isum0[t], isum1[t], wscale, xs + t * xs_stride + (size_t)b * 8);
        }
    if (b == nb && nb * 8 == n / group) {   /* no tail: the lane sums in registers (lanes 8..15 are 0) */
        for (int t = 0; t < nt; t++) out[t] = sum_lanes_s8(_mm256_add_ps(a[t], _mm256_setzero_ps()));
        return;
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(acc[t], a[t]);
#endif
    for (int t = 0; t < nt; t++) {
        const int16_t *x = xq + t * xq_stride;
        const float *xst = xs + t * xs_stride;
        for (int bb = b; bb < nb; bb++) {                       /* interleaved blocks of 8 groups */
            int32_t isum[8] = {0};
            for (int p = 0; p < block; p++) isum[(p >> 1) & 7] += (int32_t)q8_at(w, (size_t)bb * block + p, pitch) * x[(size_t)bb * block + p];
            for (int k = 0; k < 8; k++) acc[t][k] = fmaf((float)isum[k], ws[bb * 8 + k] * xst[bb * 8 + k], acc[t][k]);
        }
        for (int g = nb * 8; g < n / group; g++) {              /* the remaining groups, unpermuted */
            int32_t isum = 0;
            for (int i = 0; i < group; i++) isum += (int32_t)q8_at(w, (size_t)g * group + i, pitch) * x[(size_t)g * group + i];
            acc[t][g % 8] = fmaf((float)isum, ws[g] * xst[g], acc[t][g % 8]);
        }
        out[t] = sum_lanes(acc[t]);
    }
}

/* The ZAYA_Q8_INTERLEAVE rows of an interleaved group (ZayaMatrix.interleaved_rows; row r's chunks at
 * w + 64 r, 64 R apart) against one token: decode reads the group as one weight stream, and each
 * activation load serves all its rows (the kernel is bound by its loads: two 64-byte loads of
 * activations for two 32-byte loads of weights). ws: the first row's scales, the next rows' follow
 * n / group apart. Per row the same operations in the same order as dot_q8_n with nt = 1, so the
 * same results. */
_Static_assert(ZAYA_Q8_INTERLEAVE <= DOT_TOKENS, "matmul_rows takes a group's results in r[DOT_TOKENS]");
static void dot_q8_interleaved(float *out, const int8_t *w, const float *ws, const int16_t *xq, const float *xs,
                               int n, int group) {
    enum { R = ZAYA_Q8_INTERLEAVE };
#if Q8_VNNI
    if (q8_whole_blocks(n, group)) {   /* what interleave_q8_rows requires; else the general path below */
        const int block = 8 * group, nb = n / block;
        __m256 a[R];
        for (int r = 0; r < R; r++) a[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m512i s0[R], s1[R];   /* per row, two chains */
            for (int r = 0; r < R; r++) s0[r] = s1[r] = _mm512_setzero_si512();
            const int8_t *wb = w + (size_t)b * block * R;
            const int16_t *xb = xq + (size_t)b * block;
#pragma GCC unroll 8
            for (int s = 0; s < block; s += 64) {
                const __m512i x0 = _mm512_loadu_si512(xb + s), x1 = _mm512_loadu_si512(xb + s + 32);
                for (int r = 0; r < R; r++) {
                    const int8_t *c = wb + (size_t)s * R + 64 * r;   /* row r's chunk */
                    s0[r] = _mm512_dpwssd_epi32(s0[r], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)c)), x0);
                    s1[r] = _mm512_dpwssd_epi32(s1[r], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + 32))), x1);
                }
            }
            for (int r = 0; r < R; r++)
                a[r] = q8_block_acc(a[r], s0[r], s1[r], _mm256_loadu_ps(ws + (size_t)r * (n / group) + (size_t)b * 8), xs + (size_t)b * 8);
        }
        for (int r = 0; r < R; r++) out[r] = sum_lanes_s8(_mm256_add_ps(a[r], _mm256_setzero_ps()));
        return;
    }
#endif
    for (int r = 0; r < R; r++) dot_q8_n(out + r, 1, w + 64 * r, 64 * R, ws + (size_t)r * (n / group), xq, 0, xs, 0, n, group);
}

/* dot_q8_n and dot_float_n with the token count fixed at compile time, so the accumulators live in
 * registers */
static void dot_q8(float *out, int nt, const int8_t *w, int pitch, const float *ws, const int16_t *xq, size_t xq_stride,
                   const float *xs, size_t xs_stride, int n, int group) {
#define CASE(k) case k: dot_q8_n(out, k, w, pitch, ws, xq, xq_stride, xs, xs_stride, n, group); break;
    switch (nt) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) default: CASE(8) }
#undef CASE
}

static void dot_float(float *out, int nt, const void *w, int bf16, const float *x, size_t x_stride, int n) {
#define CASE(k) case k: dot_float_n(out, k, w, bf16, x, x_stride, n); break;
    switch (nt) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) default: CASE(8) }
#undef CASE
}

/* Output rows [o0, o1) for n tokens: tokens DOT_TOKENS at a time against every row of the range, so
 * one group of tokens' activations stays in the L1 cache while it meets the rows. */
static void matmul_rows(float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n,
                        const int16_t *xq, const float *xqs, int o0, int o1) {
    const int cols = w->cols, G = w->group_size;
    for (int t = 0; t < n; t += DOT_TOKENS) {
        const int nt = n - t < DOT_TOKENS ? n - t : DOT_TOKENS;
        float r[DOT_TOKENS];
        for (int o = o0; o < o1; o++) {
            const size_t row = (size_t)o * (size_t)cols;
            if (w->dtype == ZAYA_Q8) {
                int pitch;
                const int8_t *wr = q8_row(w, o, &pitch);
                const int R = ZAYA_Q8_INTERLEAVE;
                if (nt == 1 && o % R == 0 && o + R <= o1 && o + R <= w->interleaved_rows) {   /* decode: a group at once */
                    dot_q8_interleaved(r, wr, w->scales + row / (size_t)G, xq + (size_t)t * cols, xqs + (size_t)t * (cols / G), cols, G);
                    for (int k = 0; k < R; k++) y[(size_t)t * ys + o + k] = r[k];
                    o += R - 1;
                    continue;
                }
                dot_q8(r, nt, wr, pitch, w->scales + row / (size_t)G, xq + (size_t)t * cols, (size_t)cols,
                       xqs + (size_t)t * (cols / G), (size_t)(cols / G), cols, G);
            } else if (w->dtype == ZAYA_BF16) dot_float(r, nt, (const uint16_t *)w->data + row, 1, x + (size_t)t * xs, (size_t)xs, cols);
            else dot_float(r, nt, (const float *)w->data + row, 0, x + (size_t)t * xs, (size_t)xs, cols);
            for (int k = 0; k < nt; k++) y[(size_t)(t + k) * ys + o] = r[k];
        }
    }
}

/* One product of a matmul: Y[t][o] = W[o] . X[t], Y's rows `ys` apart. */
typedef struct { const ZayaMatrix *w; float *y; int ys; } MatmulOut;

/* Multiply-adds below which a step runs on one thread: starting the threads would cost more. */
#define PARALLEL_MIN_WORK 65536

/* Rows [a, b) of one product, in tiles of ROW_TILE rows whose weights stay in L2 while all n
 * tokens meet them: a batch reads the weights from memory once. */
#define ROW_TILE 64
static void matmul_tiles(const MatmulOut *out, const float *x, int xs, int n, const int16_t *xq, const float *xqs, int a, int b) {
    for (int o = a; o < b; o += ROW_TILE)
        matmul_rows(out->y, out->ys, out->w, x, xs, n, xq, xqs, o, o + ROW_TILE < b ? o + ROW_TILE : b);
}

/* This thread's number and the team's size (0 and 1 outside a parallel region or without OpenMP). */
static void this_thread(int *me, int *nth) {
    *me = 0, *nth = 1;
#ifdef _OPENMP
    *me = omp_get_thread_num(), *nth = omp_get_num_threads();
#endif
}

/* Thread me's equal share [*a, *b) of [0, total), cut at multiples of `unit` (the last thread
 * takes the rest). */
static void thread_share(int total, int unit, int me, int nth, int *a, int *b) {
    *a = (int)((long long)total * me / nth) / unit * unit;
    *b = me + 1 == nth ? total : (int)((long long)total * (me + 1) / nth) / unit * unit;
}

/* For int8 weights w: quantizes share me of nth of the groups of X (n tokens, rows xs apart) into
 * xq/xqs and returns 1. Nothing for float weights: returns 0. */
static int quantize_groups(const ZayaMatrix *w, const float *x, int xs, int n, int16_t *xq, float *xqs, int me, int nth) {
    if (w->dtype != ZAYA_Q8) return 0;
    const int cols = w->cols, G = w->group_size, ng = cols / G;
    const long groups = (long)n * ng;
    for (long i = groups * me / nth; i < groups * (me + 1) / nth; i++) {
        const long t = i / ng;
        quantize_q16(xq + t * cols, xqs + t * ng, x + t * xs, cols, G, (int)(i % ng));
    }
    return 1;
}

/* Thread me's equal share of X's groups, then a wait for the other threads, since every thread's
 * rows read all of X. Call it inside the parallel region. */
static void quantize_share(const ZayaMatrix *w, const float *x, int xs, int n, int16_t *xq, float *xqs, int me, int nth) {
    if (quantize_groups(w, x, xs, n, xq, xqs, me, nth)) {
#pragma omp barrier
    }
}

/* All of one token's x by the calling thread alone (decode_token: each thread keeps its own copy). */
static void quantize_all(const ZayaMatrix *w, const float *x, int16_t *xq, float *xqs) {
    quantize_groups(w, x, w->cols, 1, xq, xqs, 0, 1);
}

/* Thread me's equal share of the output rows of `count` products with the same input (already
 * quantized for int8 weights), all matrices' rows taken together (so small matrices such as k_proj
 * do not each cost the threads a meeting). Shares start at a multiple of ZAYA_Q8_INTERLEAVE: a group
 * of interleaved rows goes to one thread. Call it inside a parallel region. */
static void products_share(const MatmulOut *out, int count, const float *x, int xs, int n, const int16_t *xq,
                           const float *xqs, int me, int nth) {
    int rows = 0, r0, r1;
    for (int i = 0; i < count; i++) rows += out[i].w->rows;
    thread_share(rows, ZAYA_Q8_INTERLEAVE, me, nth, &r0, &r1);
    for (int i = 0, base = 0; i < count; base += out[i++].w->rows) {   /* this thread's rows of out[i] */
        const int a = r0 - base > 0 ? r0 - base : 0, b = r1 - base < out[i].w->rows ? r1 - base : out[i].w->rows;
        matmul_tiles(&out[i], x, xs, n, xq, xqs, a, b);
    }
}

/* Whether the matrices of products share a format (one quantized input serves them all). */
static int same_format(const MatmulOut *out, int count) {
    for (int i = 1; i < count; i++)
        if (out[i].w->dtype != out[0].w->dtype || out[i].w->group_size != out[0].w->group_size) return 0;
    return 1;
}

/* The products of `count` matrices with the same input X (n tokens, rows xs apart; xq and xqs hold
 * its int16 form). One parallel region: the threads quantize equal shares of X for int8 weights,
 * then take equal shares of all the matrices' output rows together. Each token's result is the same
 * dot product whatever n, the tiling or the thread count, so results are identical for any thread
 * count and for prefill in batches or token by token. */
static void matmul(const MatmulOut *out, int count, const float *x, int xs, int n, int16_t *xq, float *xqs) {
    if (!same_format(out, count)) {   /* a blob that mixes formats */
        for (int j = 0; j < count; j++) matmul(&out[j], 1, x, xs, n, xq, xqs);
        return;
    }
    size_t rows = 0;
    for (int i = 0; i < count; i++) rows += (size_t)out[i].w->rows;
#pragma omp parallel if (rows * out[0].w->cols * n >= PARALLEL_MIN_WORK)
    {
        int me, nth;
        this_thread(&me, &nth);
        quantize_share(out[0].w, x, xs, n, xq, xqs, me, nth);
        products_share(out, count, x, xs, n, xq, xqs, me, nth);
    }
}

void zaya_matvec(float *y, const ZayaMatrix *w, const float *x) {
    int16_t *xq = NULL;
    float *xqs = NULL;
    if (w->dtype == ZAYA_Q8) {
        xq = calloc_lines((size_t)w->cols, sizeof(int16_t));
        xqs = calloc_lines((size_t)(w->cols / w->group_size), sizeof(float));
        if (!xq || !xqs) { free(xq); free(xqs); return; }
    }
    const MatmulOut out = {w, y, w->rows};
    matmul(&out, 1, x, w->cols, 1, xq, xqs);
    free(xq);
    free(xqs);
}

static void add_bias(float *y, const float *x, const float *b, int n) {   /* y = x + b (y may be x) */
    for (int i = 0; i < n; i++) y[i] = x[i] + b[i];
}

/* softmax in float32 with the maximum subtracted (torch.softmax). */
static void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) { x[i] = expf(x[i] - max); sum += x[i]; }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* Exact GELU (torch.nn.functional.gelu, approximate="none"): x * 0.5 * (1 + erf(x / sqrt(2))). */
static float gelu(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752440f)); }

/* SiLU(x) = x * sigmoid(x) (torch.nn.functional.silu). */
static float silu(float x) { return x / (1.0f + expf(-x)); }

/* (branch + hb) * hs + (residual + rb) * rs, into residual (HF ZayaResidualScaling.forward). */
static void residual_scale(float *residual, const float *branch, const ZayaResidualScale *p, int n) {
    for (int i = 0; i < n; i++)
        residual[i] = (branch[i] + p->hidden_states_bias[i]) * p->hidden_states_scale[i] +
                      (residual[i] + p->residual_bias[i]) * p->residual_scale[i];
}

/* ---------------------------------------------------------------------------------------------
 * 3. Loading the blob (docs/blob-format.md; written by export_weights.py)
 * ------------------------------------------------------------------------------------------- */

#define HEADER_SIZE 1024
#define DIR_ENTRY_SIZE 192
#define NAME_SIZE 128
#define HINT_REEXPORT "hint: re-export the checkpoint with export_weights.py"

static uint32_t rd_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static float rd_f32(const unsigned char *p) { float v; memcpy(&v, p, 4); return v; }

/* CRC-32 (IEEE, as Python's zlib.crc32), bitwise table built on first use per call site. */
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

typedef struct {
    char name[NAME_SIZE];
    uint32_t dtype, ndim;
    uint64_t shape[4], offset, nbytes;
    uint32_t crc, group;      /* group: int8 group size (0 for other dtypes) */
    int used;
} DirEntry;

/* Bytes a tensor of `numel` values takes in the blob (docs/blob-format.md). */
static uint64_t tensor_bytes(int dtype, uint64_t numel, int group) {
    if (dtype == ZAYA_F32) return numel * 4;
    if (dtype == ZAYA_BF16) return numel * 2;
    return (numel + 63) / 64 * 64 + 4 * (numel / (uint64_t)group);
}

typedef struct {
    const char *path;
    const unsigned char *base;
    DirEntry *dir;
    int n;
    char *err;
    size_t errlen;
} Loader;

/* Finds tensor `name` with the expected shape (up to 3 dims; 0 = unused); `matrix` = may be any
 * dtype, otherwise must be float32. Returns the entry or NULL with a message. */
static const DirEntry *find_tensor(Loader *ld, const char *name, int matrix, uint64_t d0, uint64_t d1, uint64_t d2) {
    uint64_t want[3] = {d0, d1, d2};
    int ndim = d2 ? 3 : d1 ? 2 : 1;
    for (int i = 0; i < ld->n; i++) {
        DirEntry *e = &ld->dir[i];
        if (strcmp(e->name, name) != 0) continue;
        if (e->used) { fail(ld->err, ld->errlen, "%s: tensor %s appears twice in the directory\n  %s", ld->path, name, HINT_REEXPORT); return NULL; }
        e->used = 1;
        int shape_ok = (int)e->ndim == ndim;
        for (int k = 0; k < ndim && shape_ok; k++) shape_ok = e->shape[k] == want[k];
        if (!shape_ok) {
            fail(ld->err, ld->errlen, "%s: tensor %s has the wrong shape\n  expected: [%llu, %llu, %llu] (%d dims)\n  found:    [%llu, %llu, %llu] (%u dims)\n  %s",
                 ld->path, name, (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)d2, ndim,
                 (unsigned long long)e->shape[0], (unsigned long long)e->shape[1], (unsigned long long)e->shape[2], e->ndim, HINT_REEXPORT);
            return NULL;
        }
        if (!matrix && e->dtype != ZAYA_F32) {
            fail(ld->err, ld->errlen, "%s: tensor %s has dtype %u\n  expected: 0 (float32; only the big matrices are bf16/int8)\n  %s", ld->path, name, e->dtype, HINT_REEXPORT);
            return NULL;
        }
        return e;
    }
    fail(ld->err, ld->errlen, "%s: tensor %s is missing from the blob\n  expected: a tensor [%llu, %llu, %llu] of that name (the header's config asks for it)\n  found:    none in the %d directory entries\n  %s",
         ld->path, name, (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)d2, ld->n, HINT_REEXPORT);
    return NULL;
}

static int load_vector(Loader *ld, const float **out, const char *name, uint64_t d0, uint64_t d1, uint64_t d2) {
    const DirEntry *e = find_tensor(ld, name, 0, d0, d1, d2);
    if (!e) return -1;
    *out = (const float *)(ld->base + e->offset);
    return 0;
}

/* A 2-D matrix [rows, cols], or a 3-D stack [n, rows, cols] seen as [n*rows, cols]. */
static int load_matrix(Loader *ld, ZayaMatrix *m, const char *name, uint64_t n, uint64_t rows, uint64_t cols) {
    const DirEntry *e = n ? find_tensor(ld, name, 1, n, rows, cols) : find_tensor(ld, name, 1, rows, cols, 0);
    if (!e) return -1;
    uint64_t total_rows = n ? n * rows : rows;
    if (total_rows > INT32_MAX || cols > INT32_MAX)   /* the kernels index rows and columns with int */
        return fail(ld->err, ld->errlen, "%s: tensor %s is too large for this zaya.c\n  expected: at most 2^31-1 rows and columns\n  found:    %llu rows, %llu columns\n  %s",
                    ld->path, name, (unsigned long long)total_rows, (unsigned long long)cols, HINT_REEXPORT);
    if (e->dtype == ZAYA_Q8 && cols % e->group != 0)
        return fail(ld->err, ld->errlen, "%s: tensor %s is int8 with %llu columns, not a multiple of its group size %u\n  %s",
                    ld->path, name, (unsigned long long)cols, e->group, HINT_REEXPORT);
    m->dtype = (int)e->dtype;
    m->rows = (int)total_rows;
    m->cols = (int)cols;
    m->group_size = (int)e->group;
    m->data = ld->base + e->offset;
    m->scales = e->dtype == ZAYA_Q8 ? (const float *)(ld->base + e->offset + (total_rows * cols + 63) / 64 * 64) : NULL;
    return 0;
}

static int load_residual_scale(Loader *ld, ZayaResidualScale *p, const char *prefix, int H) {
    char name[2 * NAME_SIZE];
    const char *parts[4] = {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"};
    const float **dst[4] = {&p->hidden_states_scale, &p->hidden_states_bias, &p->residual_scale, &p->residual_bias};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "%s.%s", prefix, parts[k]);
        if (load_vector(ld, dst[k], name, (uint64_t)H, 0, 0)) return -1;
    }
    return 0;
}

/* Reads and range-checks the config block (offset 128 of the header). */
static int read_config(ZayaConfig *c, const unsigned char *h, const char *path, char *err, size_t errlen) {
    const unsigned char *p = h + 128;
    int *ints[] = {&c->vocab_size, &c->hidden_size, &c->num_layers, &c->num_heads, &c->num_kv_heads, &c->head_dim,
                   &c->num_experts, &c->experts_per_tok, &c->moe_intermediate, &c->router_hidden, &c->cca_time0,
                   &c->cca_time1, &c->sliding_window, &c->max_position};
    const char *names[] = {"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                           "num_experts", "experts_per_tok", "moe_intermediate", "router_hidden", "cca_time0",
                           "cca_time1", "sliding_window", "max_position"};
    const uint32_t lo[] = {1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 1};
    const uint32_t hi[] = {1u << 24, 1u << 16, ZAYA_MAX_LAYERS, 1024, 1024, 4096, 4096, 1, 1u << 18, 1u << 14, 16, 16,
                           1u << 24, 1u << 30};
    for (int k = 0; k < 14; k++) {
        uint32_t v = rd_u32(p + 4 * k);
        if (v < lo[k] || v > hi[k])
            return fail(err, errlen, "%s: config value %s is out of range\n  expected: %u..%u\n  found:    %u\n  %s",
                        path, names[k], lo[k], hi[k], v, HINT_REEXPORT);
        *ints[k] = (int)v;
    }
    c->bos_id = (int32_t)rd_u32(p + 56);
    c->pad_id = (int32_t)rd_u32(p + 60);
    c->n_eos = (int)rd_u32(p + 64);
    if (c->n_eos < 0 || c->n_eos > ZAYA_MAX_EOS)
        return fail(err, errlen, "%s: config n_eos is out of range\n  expected: 0..%d\n  found:    %d\n  %s", path, ZAYA_MAX_EOS, c->n_eos, HINT_REEXPORT);
    for (int k = 0; k < ZAYA_MAX_EOS; k++) c->eos_ids[k] = (int32_t)rd_u32(p + 68 + 4 * k);
    c->rope_dim[0] = (int)rd_u32(p + 84);
    c->rope_dim[1] = (int)rd_u32(p + 88);
    c->rms_norm_eps = rd_f32(p + 92);
    const uint32_t flags = rd_u32(p + 116);   /* bit 0 attention_bias, bit 1 lm_head_bias */
    c->attention_bias = (int)(flags & 1);
    c->lm_head_bias = (int)(flags >> 1 & 1);
    c->router_norm_eps = rd_f32(p + 120);      /* 0: the same as rms_norm_eps */
    if (flags > 3)
        return fail(err, errlen, "%s: config flags are unknown\n  expected: bits 0 (attention_bias) and 1 (lm_head_bias) only\n  found:    0x%x\n  %s", path, flags, HINT_REEXPORT);
    if (c->router_norm_eps == 0.0f) c->router_norm_eps = rd_f32(p + 92);
    c->rope_theta[0] = rd_f32(p + 96);
    c->rope_theta[1] = rd_f32(p + 100);
    c->partial_rotary_factor[0] = rd_f32(p + 104);
    c->partial_rotary_factor[1] = rd_f32(p + 108);
    memcpy(c->layer_types, h + 256, ZAYA_MAX_LAYERS);

    if (c->num_heads % c->num_kv_heads != 0 || (c->num_kv_heads * c->head_dim) % 2 != 0)
        return fail(err, errlen, "%s: config has %d query heads and %d KV heads of %d\n  expected: KV heads that divide the query heads, KV heads x head_dim even (half current, half delayed value channels)\n  %s",
                    path, c->num_heads, c->num_kv_heads, c->head_dim, HINT_REEXPORT);
    for (int k = 0; k < 2; k++)
        if (c->rope_dim[k] < 2 || c->rope_dim[k] > c->head_dim || c->rope_dim[k] % 2 ||
            !(c->rope_theta[k] > 0.0f) || !isfinite(c->rope_theta[k]))
            return fail(err, errlen, "%s: config RoPE for layer type %d is out of range\n  expected: rotary dims even in 2..%d, theta > 0\n  found:    dims %d, theta %g\n  %s",
                        path, k, c->head_dim, c->rope_dim[k], (double)c->rope_theta[k], HINT_REEXPORT);
    for (int k = 0; k < 2; k++) {   /* rope_dim = int(head_dim * factor) is what is used; the factor must agree */
        double r = c->head_dim * (double)c->partial_rotary_factor[k];   /* (the factor is a float32 here) */
        if (!(c->partial_rotary_factor[k] > 0.0f && c->partial_rotary_factor[k] <= 1.0f) || !(r > c->rope_dim[k] - 0.01 && r < c->rope_dim[k] + 1.0))
            return fail(err, errlen, "%s: config partial_rotary_factor of layer type %d is out of range\n  expected: 0 < factor <= 1 with int(head_dim %d x factor) = rotary dims %d\n  found:    %g\n  %s",
                        path, k, c->head_dim, c->rope_dim[k], (double)c->partial_rotary_factor[k], HINT_REEXPORT);
    }
    if (rd_u32(p + 112) != 1)
        return fail(err, errlen, "%s: config tie_word_embeddings is not supported\n  expected: 1 (the LM head is the embedding)\n  found:    %u\n  %s", path, rd_u32(p + 112), HINT_REEXPORT);
    if (memchr(h + 512, 0, 512) == NULL)
        return fail(err, errlen, "%s: header provenance is not NUL-terminated\n  expected: a NUL within its 512 bytes\n  found:    none\n  %s", path, HINT_REEXPORT);
    if (!(c->rms_norm_eps > 0.0f) || !(c->rms_norm_eps < 1.0f) || !(c->router_norm_eps > 0.0f) || !(c->router_norm_eps < 1.0f))
        return fail(err, errlen, "%s: config rms_norm_eps or router_norm_eps is out of range\n  expected: 0 < eps < 1\n  found:    %g, %g\n  %s", path, (double)c->rms_norm_eps, (double)c->router_norm_eps, HINT_REEXPORT);
    int ids[2 + ZAYA_MAX_EOS] = {c->bos_id, c->pad_id};
    for (int k = 0; k < c->n_eos; k++) ids[2 + k] = c->eos_ids[k];
    for (int k = 0; k < 2 + c->n_eos; k++)
        if (ids[k] < 0 || ids[k] >= c->vocab_size)
            return fail(err, errlen, "%s: config special token id %d (%s) is outside the vocabulary\n  expected: 0..%d\n  found:    %d\n  %s",
                        path, ids[k], k == 0 ? "bos" : k == 1 ? "pad" : "eos", c->vocab_size - 1, ids[k], HINT_REEXPORT);
    for (int l = 0; l < ZAYA_MAX_LAYERS; l++) {
        int t = c->layer_types[l];
        if (l < c->num_layers && t != ZAYA_HYBRID && t != ZAYA_HYBRID_SLIDING)
            return fail(err, errlen, "%s: layer %d has an unknown type %d\n  expected: 0 (hybrid) or 1 (hybrid_sliding)\n  %s", path, l, t, HINT_REEXPORT);
        if (l < c->num_layers && t == ZAYA_HYBRID_SLIDING && c->sliding_window < 1)
            return fail(err, errlen, "%s: layer %d is hybrid_sliding but sliding_window is 0\n  %s", path, l, HINT_REEXPORT);
    }
    return 0;
}

/* The tensors of arch §2.2, bound to the model struct. */
static int bind_tensors(ZayaModel *m, Loader *ld) {
    const ZayaConfig *c = &m->config;
    const uint64_t H = (uint64_t)c->hidden_size, d = (uint64_t)c->head_dim, nq = (uint64_t)c->num_heads,
                   nkv = (uint64_t)c->num_kv_heads, E = (uint64_t)c->num_experts, I = (uint64_t)c->moe_intermediate,
                   R = (uint64_t)c->router_hidden, C = (nq + nkv) * d;
    if (load_matrix(ld, &m->embed_tokens, "model.embed_tokens.weight", 0, (uint64_t)c->vocab_size, H) ||
        load_vector(ld, &m->input_hidden_states_scale, "model.input_hidden_states_scale", H, 0, 0) ||
        load_vector(ld, &m->input_hidden_states_bias, "model.input_hidden_states_bias", H, 0, 0) ||
        load_vector(ld, &m->norm, "model.norm.weight", H, 0, 0) ||
        (c->lm_head_bias && load_vector(ld, &m->lm_head_bias, "lm_head.bias", (uint64_t)c->vocab_size, 0, 0)))
        return -1;
    m->layers = calloc((size_t)c->num_layers, sizeof(ZayaLayer));
    if (!m->layers) return fail(ld->err, ld->errlen, "out of memory");
    char n[NAME_SIZE], p[64];
#define NAME(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
    for (int i = 0; i < c->num_layers; i++) {
        ZayaLayer *L = &m->layers[i];
        snprintf(p, sizeof p, "model.layers.%d", i);
        if (load_vector(ld, &L->input_layernorm, NAME("input_layernorm.weight"), H, 0, 0) ||
            load_matrix(ld, &L->q_proj, NAME("self_attn.qkv_proj.q_proj.weight"), 0, nq * d, H) ||
            load_matrix(ld, &L->k_proj, NAME("self_attn.qkv_proj.k_proj.weight"), 0, nkv * d, H) ||
            load_matrix(ld, &L->v_proj_current, NAME("self_attn.qkv_proj.v_proj_current.weight"), 0, nkv * d / 2, H) ||
            load_matrix(ld, &L->v_proj_delayed, NAME("self_attn.qkv_proj.v_proj_delayed.weight"), 0, nkv * d / 2, H) ||
            (c->attention_bias && (load_vector(ld, &L->q_proj_bias, NAME("self_attn.qkv_proj.q_proj.bias"), nq * d, 0, 0) ||
                                   load_vector(ld, &L->k_proj_bias, NAME("self_attn.qkv_proj.k_proj.bias"), nkv * d, 0, 0) ||
                                   load_vector(ld, &L->v_proj_current_bias, NAME("self_attn.qkv_proj.v_proj_current.bias"), nkv * d / 2, 0, 0) ||
                                   load_vector(ld, &L->v_proj_delayed_bias, NAME("self_attn.qkv_proj.v_proj_delayed.bias"), nkv * d / 2, 0, 0) ||
                                   load_vector(ld, &L->o_proj_bias, NAME("self_attn.o_proj.bias"), H, 0, 0))) ||
            load_vector(ld, &L->conv_qk_depthwise_weight, NAME("self_attn.qkv_proj.conv_qk_depthwise.weight"), C, 1, (uint64_t)c->cca_time0) ||
            load_vector(ld, &L->conv_qk_depthwise_bias, NAME("self_attn.qkv_proj.conv_qk_depthwise.bias"), C, 0, 0) ||
            load_vector(ld, &L->conv_qk_grouped_weight, NAME("self_attn.qkv_proj.conv_qk_grouped.weight"), C, d, (uint64_t)c->cca_time1) ||
            load_vector(ld, &L->conv_qk_grouped_bias, NAME("self_attn.qkv_proj.conv_qk_grouped.bias"), C, 0, 0) ||
            load_vector(ld, &L->qk_norm_temp, NAME("self_attn.qk_norm.temp"), nkv, 0, 0) ||
            load_matrix(ld, &L->o_proj, NAME("self_attn.o_proj.weight"), 0, H, nq * d) ||
            load_residual_scale(ld, &L->post_attention_residual_scale, NAME("post_attention_residual_scale"), (int)H) ||
            load_vector(ld, &L->post_attention_layernorm, NAME("post_attention_layernorm.weight"), H, 0, 0) ||
            load_matrix(ld, &L->router_down_proj, NAME("mlp.gate.down_proj.weight"), 0, R, H) ||
            load_vector(ld, &L->router_down_proj_bias, NAME("mlp.gate.down_proj.bias"), R, 0, 0) ||
            (i > 0 && load_vector(ld, &L->router_states_scale, NAME("mlp.gate.router_states_scale"), R, 0, 0)) ||
            load_vector(ld, &L->router_norm, NAME("mlp.gate.router_mlp.norm.weight"), R, 0, 0) ||
            load_matrix(ld, &L->router_fc1, NAME("mlp.gate.router_mlp.fc1.weight"), 0, R, R) ||
            load_vector(ld, &L->router_fc1_bias, NAME("mlp.gate.router_mlp.fc1.bias"), R, 0, 0) ||
            load_matrix(ld, &L->router_fc2, NAME("mlp.gate.router_mlp.fc2.weight"), 0, R, R) ||
            load_vector(ld, &L->router_fc2_bias, NAME("mlp.gate.router_mlp.fc2.bias"), R, 0, 0) ||
            load_matrix(ld, &L->router_out_proj, NAME("mlp.gate.router_mlp.out_proj.weight"), 0, E + 1, R) ||
            load_vector(ld, &L->balancing_biases, NAME("mlp.gate.balancing_biases"), E + 1, 0, 0) ||
            load_matrix(ld, &L->experts_gate_up, NAME("mlp.experts.gate_up_proj"), E, 2 * I, H) ||
            load_matrix(ld, &L->experts_down, NAME("mlp.experts.down_proj"), E, H, I) ||
            load_residual_scale(ld, &L->post_mlp_residual_scale, NAME("post_mlp_residual_scale"), (int)H))
            return -1;
    }
#undef NAME
    for (int i = 0; i < ld->n; i++) {
        if (ld->dir[i].used) continue;
        for (int j = 0; j < ld->n; j++)   /* an unused entry with the name of a used one is a duplicate */
            if (ld->dir[j].used && strcmp(ld->dir[j].name, ld->dir[i].name) == 0)
                return fail(ld->err, ld->errlen, "%s: tensor %s appears twice in the directory (entries %d and %d)\n  expected: every tensor once\n  %s",
                            ld->path, ld->dir[i].name, j, i, HINT_REEXPORT);
        return fail(ld->err, ld->errlen, "%s: unexpected tensor %s in the blob\n  expected: only the tensors of docs/architecture.md 2.2 for this config\n  %s",
                    ld->path, ld->dir[i].name, HINT_REEXPORT);
    }
    return 0;
}

/* Reads and checks the tensor directory: names, dtypes, sizes, offsets inside the data section,
 * alignment and no overlap. Touches no tensor data. */
static int read_directory(Loader *ld, const unsigned char *h, uint64_t data_off, uint64_t data_end) {
    for (int i = 0; i < ld->n; i++) {
        const unsigned char *p = h + HEADER_SIZE + (size_t)i * DIR_ENTRY_SIZE;
        DirEntry *e = &ld->dir[i];
        memcpy(e->name, p, NAME_SIZE);
        if (memchr(e->name, 0, NAME_SIZE) == NULL || e->name[0] == 0)
            return fail(ld->err, ld->errlen, "%s: tensor directory entry %d has no valid name\n  %s", ld->path, i, HINT_REEXPORT);
        e->dtype = rd_u32(p + NAME_SIZE);
        e->ndim = rd_u32(p + NAME_SIZE + 4);
        uint64_t numel = 1;
        for (int k = 0; k < 4; k++) {
            e->shape[k] = rd_u64(p + NAME_SIZE + 8 + 8 * k);
            if (e->shape[k] == 0 || e->shape[k] > (1ull << 32))
                return fail(ld->err, ld->errlen, "%s: tensor %s has dimension %d = %llu\n  expected: 1..2^32\n  %s", ld->path, e->name, k, (unsigned long long)e->shape[k], HINT_REEXPORT);
            if (numel > (1ull << 40) / e->shape[k])   /* checked before multiplying: no wrap-around */
                return fail(ld->err, ld->errlen, "%s: tensor %s is impossibly large\n  expected: at most 2^40 values\n  found:    shape [%llu, %llu, %llu, %llu]\n  %s",
                            ld->path, e->name, (unsigned long long)rd_u64(p + NAME_SIZE + 8), (unsigned long long)rd_u64(p + NAME_SIZE + 16),
                            (unsigned long long)rd_u64(p + NAME_SIZE + 24), (unsigned long long)rd_u64(p + NAME_SIZE + 32), HINT_REEXPORT);
            numel *= e->shape[k];
        }
        e->offset = rd_u64(p + NAME_SIZE + 40);
        e->nbytes = rd_u64(p + NAME_SIZE + 48);
        e->crc = rd_u32(p + NAME_SIZE + 56);
        e->group = rd_u32(p + NAME_SIZE + 60);
        e->used = 0;
        if (e->dtype > ZAYA_Q8 || e->ndim < 1 || e->ndim > 4)
            return fail(ld->err, ld->errlen, "%s: tensor %s has dtype %u and %u dims\n  expected: dtype 0..2, 1..4 dims\n  %s", ld->path, e->name, e->dtype, e->ndim, HINT_REEXPORT);
        if (e->dtype == ZAYA_Q8 ? (e->group < 1 || e->group > 4096 || e->shape[e->ndim - 1] % e->group) : e->group != 0)
            return fail(ld->err, ld->errlen, "%s: tensor %s has group size %u\n  expected: for int8 a divisor (1..4096) of its row length %llu, otherwise 0\n  %s",
                        ld->path, e->name, e->group, (unsigned long long)e->shape[e->ndim - 1], HINT_REEXPORT);
        uint64_t want = tensor_bytes((int)e->dtype, numel, (int)e->group);
        if (e->nbytes != want)
            return fail(ld->err, ld->errlen, "%s: tensor %s has a byte size that does not match its shape\n  expected: %llu bytes\n  found:    %llu bytes\n  %s",
                        ld->path, e->name, (unsigned long long)want, (unsigned long long)e->nbytes, HINT_REEXPORT);
        if (e->offset % 64 || e->offset < data_off || e->offset > data_end || e->nbytes > data_end - e->offset)
            return fail(ld->err, ld->errlen, "%s: tensor %s lies outside the data section or is misaligned\n  expected: a 64-byte aligned range within [%llu, %llu)\n  found:    [%llu, %llu)\n  hint: the file is truncated or corrupt; re-export it with export_weights.py",
                        ld->path, e->name, (unsigned long long)data_off, (unsigned long long)data_end,
                        (unsigned long long)e->offset, (unsigned long long)(e->offset + e->nbytes));
    }
    /* no overlap: check every pair in offset order (insertion sort on an index; n is ~1300) */
    int *order = malloc(sizeof(int) * (size_t)ld->n);
    if (!order) return fail(ld->err, ld->errlen, "out of memory");
    for (int i = 0; i < ld->n; i++) {
        int j = i;
        while (j > 0 && ld->dir[order[j - 1]].offset > ld->dir[i].offset) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    for (int i = 1; i < ld->n; i++) {
        const DirEntry *a = &ld->dir[order[i - 1]], *b = &ld->dir[order[i]];
        if (a->offset + a->nbytes > b->offset) {
            free(order);
            return fail(ld->err, ld->errlen, "%s: tensors %s and %s overlap\n  %s", ld->path, a->name, b->name, HINT_REEXPORT);
        }
    }
    free(order);
    return 0;
}

/* The RAM a copy of the blob can get: MemAvailable of /proc/meminfo (free memory plus the page
 * cache that can be dropped), else all physical memory; 0 if neither is known. */
static uint64_t available_ram(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* --hugepages: the file's bytes copied into anonymous memory that the kernel may back with 2 MB
 * transparent huge pages. Streaming 9.5 GB of weights through 4 KB pages costs a TLB miss every 4 KB;
 * with huge pages decode of the 8B int8 blob ran 14-24% faster on AMD EPYC, 7-16% on Intel
 * (bench/README.md), at the price of a copy at load and RAM for the whole blob. */
static void *copy_to_huge_pages(void *map, size_t size, size_t *alloc_size) {
    const size_t huge = (size_t)1 << 21;
    size_t sz = (size + huge - 1) / huge * huge;
    void *anon = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(anon, sz, MADV_HUGEPAGE);     /* a hint: without THP the copy still works, with 4 KB pages */
#endif
    for (size_t off = 0; off < size; off += huge) {   /* in 2 MB pieces, each dropped from this process */
        size_t n = size - off < huge ? size - off : huge;   /* once copied: RSS stays near one blob */
        memcpy((char *)anon + off, (const char *)map + off, n);
        madvise((char *)map + off, n, MADV_DONTNEED);  /* (the page cache keeps the file for the next run) */
    }
    *alloc_size = sz;
    return anon;
}

/* --hugepages, in the private copy: an int8 matrix's rows interleaved in groups of
 * R = ZAYA_Q8_INTERLEAVE, the 64-byte chunks of rows Rp .. Rp+R-1 alternating (q8_row). Decode then
 * reads R rows as one stream and loads each activation once for all of them (dot_q8_interleaved):
 * on the Zen 4 VM, 2 threads, the paired ratio went from 0.81-0.82 to 0.83-0.85 with reads of
 * 56-59 GB/s (pairs, bench/README.md). Only in builds with that kernel
 * (AVX-512 VNNI), where it takes whole blocks of 8 groups (the chunks are then whole), and for a
 * stacked matrix only if each expert's row count `slice` is a multiple of R (its slices then start
 * on a group). The rows after the last whole group stay as they are. Returns -1 if out of memory. */
static int interleave_q8_rows(ZayaMatrix *w, int slice) {
    const int cols = w->cols, G = w->group_size, R = ZAYA_Q8_INTERLEAVE;
    /* the portable kernels read an interleaved row chunk by chunk (slower), so there rows stay */
    if (!Q8_VNNI || w->dtype != ZAYA_Q8 || !q8_whole_blocks(cols, G) || slice % R || w->rows < R) return 0;
    int8_t *tmp = malloc((size_t)R * cols);
    if (!tmp) return -1;
    for (int first = 0; first + R <= w->rows; first += R) {
        int8_t *g = (int8_t *)w->data + (size_t)first * cols;   /* writable: the copy in huge pages */
        memcpy(tmp, g, (size_t)R * cols);
        for (int c = 0; c < cols; c += 64)
            for (int r = 0; r < R; r++) memcpy(g + (size_t)c * R + 64 * r, tmp + (size_t)r * cols + c, 64);
    }
    free(tmp);
    w->interleaved_rows = w->rows / R * R;
    return 0;
}

static int interleave_model_rows(ZayaModel *m) {
    const ZayaConfig *c = &m->config;
    int rc = interleave_q8_rows(&m->embed_tokens, ZAYA_Q8_INTERLEAVE);
    for (int l = 0; l < c->num_layers && rc == 0; l++) {
        ZayaLayer *L = &m->layers[l];
        ZayaMatrix *plain[] = {&L->q_proj, &L->k_proj, &L->v_proj_current, &L->v_proj_delayed, &L->o_proj};
        for (int i = 0; i < 5 && rc == 0; i++) rc = interleave_q8_rows(plain[i], ZAYA_Q8_INTERLEAVE);
        if (rc == 0) rc = interleave_q8_rows(&L->experts_gate_up, 2 * c->moe_intermediate);
        if (rc == 0) rc = interleave_q8_rows(&L->experts_down, c->hidden_size);
    }
    return rc;
}

int zaya_load(ZayaModel *m, const char *path, int flags, char *err, size_t errlen) {
    const int verify_crc = flags & ZAYA_LOAD_VERIFY;
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return fail(err, errlen, "cannot open model file %s: %s\n  hint: export one with: python3 export_weights.py CKPT_DIR %s", path, strerror(errno), path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, errlen, "%s is not a regular file\n  hint: give the .bin written by export_weights.py", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < HEADER_SIZE) {
        close(fd);
        return fail(err, errlen, "%s is too small to be a zaya.c model\n  expected: at least %d bytes\n  found:    %llu bytes\n  hint: the file is empty or truncated; re-export it with export_weights.py",
                    path, HEADER_SIZE, (unsigned long long)size);
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(err, errlen, "cannot mmap %s: %s", path, strerror(errno));
    m->map = map;
    m->map_size = (size_t)size;
    if (flags & ZAYA_LOAD_HUGEPAGES) {
        const uint64_t avail = available_ram();
        if (avail && size > avail) {
            zaya_free(m);
            return fail(err, errlen, "%s is too big for --hugepages\n  expected: a blob that fits in the available RAM (%.2f GB, MemAvailable)\n  found:    %.2f GB\n  hint: run without --hugepages: the weights then stay memory-mapped and are read layer by layer",
                        path, avail / 1e9, size / 1e9);
        }
        size_t alloc = 0;
        void *anon = copy_to_huge_pages(map, (size_t)size, &alloc);
        if (!anon) { zaya_free(m); return fail(err, errlen, "cannot allocate %llu bytes for --hugepages\n  hint: run without --hugepages (the blob is then used in place)", (unsigned long long)size); }
        munmap(map, (size_t)size);
        m->map = map = anon;
        m->map_size = alloc;
    }
    const unsigned char *h = map;

    if (memcmp(h, "ZAYABLOB", 8) != 0) {
        char found[8 * 4 + 1], *q = found;   /* the first 8 bytes, non-printable ones as \xHH */
        for (int k = 0; k < 8; k++) q += sprintf(q, h[k] >= 0x20 && h[k] < 0x7f && h[k] != '"' && h[k] != '\\' ? "%c" : "\\x%02x", h[k]);
        fail(err, errlen, "%s is not a zaya.c model\n  expected: magic \"ZAYABLOB\"\n  found:    \"%s\"%s\n  hint: a Hugging Face checkpoint folder must first be exported: python3 export_weights.py CKPT_DIR OUT.bin",
             path, found, h[8] == '{' ? " (a safetensors file?)" : "");
        zaya_free(m);   /* after the message: h points into the mapping */
        return -1;
    }
    uint32_t version = rd_u32(h + 8);
    if (version != ZAYA_FORMAT_VERSION) {
        zaya_free(m);
        return fail(err, errlen, "%s has blob format version %u\n  expected: %d (this zaya.c)\n  %s", path, version, ZAYA_FORMAT_VERSION, HINT_REEXPORT);
    }
    uint64_t file_size = rd_u64(h + 16), dir_off = rd_u64(h + 24), data_off = rd_u64(h + 48),
             tok_off = rd_u64(h + 56), tok_size = rd_u64(h + 64);
    uint32_t n_tensors = rd_u32(h + 32), wformat = rd_u32(h + 36), group = rd_u32(h + 40), layout = rd_u32(h + 44);
    int rc = -1;
    if (file_size != size) {
        fail(err, errlen, "%s is %s\n  expected: %llu bytes (from its header)\n  found:    %llu bytes\n  hint: the file is truncated or was changed; re-export it with export_weights.py",
             path, size < file_size ? "truncated" : "longer than its header says", (unsigned long long)file_size, (unsigned long long)size);
    } else if (dir_off != HEADER_SIZE || n_tensors == 0 || n_tensors > 100000 ||
               data_off < HEADER_SIZE + (uint64_t)n_tensors * DIR_ENTRY_SIZE || data_off > size || data_off % 4096 ||
               tok_off < data_off || tok_off > size || tok_size > size - tok_off) {
        fail(err, errlen, "%s: header offsets are inconsistent (directory %llu, %u tensors, data %llu, tokenizer %llu+%llu, file %llu)\n  %s",
             path, (unsigned long long)dir_off, n_tensors, (unsigned long long)data_off, (unsigned long long)tok_off,
             (unsigned long long)tok_size, (unsigned long long)size, HINT_REEXPORT);
    } else if (wformat > ZAYA_Q8 || layout > 1 || (wformat == ZAYA_Q8 ? (group < 1 || group > 4096) : group != 0)) {
        fail(err, errlen, "%s: header weight format %u, group size %u, layout %u are out of range\n  expected: format 0..2, group size 1..4096 for int8 else 0, layout 0..1\n  %s",
             path, wformat, group, layout, HINT_REEXPORT);
    } else {
        /* header CRC covers the header (with its CRC field zeroed) and the directory */
        uint32_t want = rd_u32(h + 12), zero = 0;
        uint32_t crc = crc32_update(0, h, 12);
        crc = crc32_update(crc, (const unsigned char *)&zero, 4);
        crc = crc32_update(crc, h + 16, HEADER_SIZE - 16 + (size_t)n_tensors * DIR_ENTRY_SIZE);
        if (crc != want)
            fail(err, errlen, "%s: header checksum mismatch\n  expected: %08x\n  found:    %08x\n  hint: the file is corrupt; re-export it with export_weights.py", path, want, crc);
        else
            rc = read_config(&m->config, h, path, err, errlen);
    }
    if (rc != 0) { zaya_free(m); return -1; }
    m->weight_format = (int)wformat;
    m->group_size = (int)group;
    m->source_layout = (int)layout;
    memcpy(m->provenance, h + 512, sizeof m->provenance - 1);

    Loader ld = {path, h, calloc(n_tensors, sizeof(DirEntry)), (int)n_tensors, err, errlen};
    if (!ld.dir) { zaya_free(m); return fail(err, errlen, "out of memory"); }
    rc = read_directory(&ld, h, data_off, tok_off);
    if (rc == 0) rc = bind_tensors(m, &ld);
    if (rc == 0 && verify_crc) {
        for (int i = 0; i < ld.n && rc == 0; i++)
            if (crc32_update(0, h + ld.dir[i].offset, ld.dir[i].nbytes) != ld.dir[i].crc)
                rc = fail(err, errlen, "%s: tensor %s fails its CRC-32 check\n  hint: the file is corrupt; re-export it with export_weights.py", path, ld.dir[i].name);
    }
    free(ld.dir);
    if (rc == 0 && tok_size > 0) {
        m->tokenizer = calloc(1, sizeof(ZayaTokenizer));
        char terr[512];
        if (!m->tokenizer) rc = fail(err, errlen, "out of memory");
        else if (zaya_tok_load(m->tokenizer, h + tok_off, (size_t)tok_size, terr, sizeof terr) != 0) {
            free(m->tokenizer);
            m->tokenizer = NULL;
            rc = fail(err, errlen, "%s: tokenizer section: %s", path, terr);
        }
    }
    if (rc == 0 && (flags & ZAYA_LOAD_HUGEPAGES) && interleave_model_rows(m) != 0)
        rc = fail(err, errlen, "out of memory while interleaving the int8 rows\n  hint: run without --hugepages");
    if (rc != 0) { zaya_free(m); return -1; }
    return 0;
}

void zaya_free(ZayaModel *m) {
    if (m->tokenizer) { zaya_tok_free(m->tokenizer); free(m->tokenizer); }
    free(m->layers);
    if (m->map) munmap(m->map, m->map_size);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------------------------------------
 * 4. Decoding state (arch §4)
 * ------------------------------------------------------------------------------------------- */

static int conv_state_len(const ZayaConfig *c) { return (c->cca_time0 - 1) + (c->cca_time1 - 1); }

/* The slot of position pos in a layer's KV cache: a sliding layer's cache is a ring of cache_len
 * slots; a full layer's holds every position (no division there: attention asks for each key twice). */
static int kv_slot(const ZayaLayerState *ls, int pos) { return pos < ls->cache_len ? pos : pos % ls->cache_len; }

/* Offset of position pos of KV head kvh in a layer's key_cache / value_cache ([nkv, cache_len, d]). */
static size_t kv_row(const ZayaLayerState *ls, int kvh, int pos, int d) {
    return ((size_t)kvh * (size_t)ls->cache_len + (size_t)kv_slot(ls, pos)) * (size_t)d;
}

/* The float vectors of a thread's state, for zaya_state_init and _free, and (size not NULL) their
 * lengths for config c, `in` being the widest product input of decode_token. */
#define THREAD_VECTORS 16
static void thread_vectors(ZayaThreadState *th, float **v[THREAD_VECTORS], size_t size[THREAD_VECTORS],
                           const ZayaConfig *c, size_t in) {
    float **all[THREAD_VECTORS] = {&th->x, &th->h, &th->y, &th->q, &th->k, &th->v, &th->q_res, &th->k_res,
                                   &th->router_state, &th->router_a, &th->router_b, &th->router_probs,
                                   &th->router_scores, &th->rope_cos, &th->rope_sin, &th->xq_scales};
    memcpy(v, all, sizeof all);
    if (!size) return;
    const size_t H = (size_t)c->hidden_size, d = (size_t)c->head_dim, nq = (size_t)c->num_heads,
                 nkv = (size_t)c->num_kv_heads, R = (size_t)c->router_hidden, E = (size_t)c->num_experts;
    const size_t n[THREAD_VECTORS] = {H, H, H, nq * d, nkv * d, nkv * d, nq * d, nkv * d, R, R, R, E + 1, E + 1,
                                      d, d, in};   /* rope tables: [2 layer types][d/2] */
    memcpy(size, n, sizeof n);
}

int zaya_state_init(ZayaState *s, const ZayaModel *m, int ctx, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    memset(s, 0, sizeof *s);
    if (ctx < 1 || ctx > c->max_position)
        return fail(err, errlen, "context length %d is out of range\n  expected: 1..%d (max_position_embeddings)", ctx, c->max_position);
    const size_t H = (size_t)c->hidden_size, d = (size_t)c->head_dim, nq = (size_t)c->num_heads,
                 nkv = (size_t)c->num_kv_heads, C = (nq + nkv) * d, E = (size_t)c->num_experts,
                 I = (size_t)c->moe_intermediate, R = (size_t)c->router_hidden, K = (size_t)conv_state_len(c),
                 B = ZAYA_BATCH;
    size_t max_in = H > nq * d ? H : nq * d;
    max_in = max_in > I ? max_in : I;
    s->ctx = ctx;
    s->batch = ZAYA_BATCH;
    s->num_layers = c->num_layers;
    s->layers = calloc((size_t)c->num_layers, sizeof(ZayaLayerState));
    int ok = s->layers != NULL;
    for (int i = 0; ok && i < c->num_layers; i++) {
        ZayaLayerState *ls = &s->layers[i];
        ls->cache_len = c->layer_types[i] == ZAYA_HYBRID_SLIDING && c->sliding_window < ctx ? c->sliding_window : ctx;
        ls->key_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->value_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->conv_state = calloc(K * C + 1, sizeof(float));
        ls->delayed_value = calloc(nkv * d / 2, sizeof(float));
        ok = ls->key_cache && ls->value_cache && ls->conv_state && ls->delayed_value;
    }
    float **bufs[] = {&s->x, &s->h, &s->u, &s->q, &s->k, &s->v, &s->vd, &s->attn_out, &s->branch,
                      &s->router_state, &s->router_a, &s->router_b, &s->router_logits, &s->router_probs,
                      &s->expert_weight, &s->expert_in, &s->expert_hidden, &s->expert_out, &s->xq_scales, &s->xq_hidden_scales,
                      &s->conv_a, &s->q_res, &s->k_res, &s->att, &s->router_scores, &s->rope_cos,
                      &s->rope_sin, &s->logits};
    size_t sizes[] = {B * H, B * H, B * C, B * nq * d, B * nkv * d, B * nkv * d, B * nkv * d / 2, B * nq * d,
                      B * H, B * R, B * R, B * R, B * (E + 1), B * (E + 1), B, B * H, B * 2 * I, B * H,
                      B * max_in, B * I, (size_t)(c->cca_time1 + 2) * C, nq * d, nkv * d, nq * (size_t)ctx, E + 1, d, d,
                      (size_t)c->vocab_size};
    for (size_t k = 0; ok && k < sizeof sizes / sizeof sizes[0]; k++) ok = (*bufs[k] = calloc_lines(sizes[k], sizeof(float))) != NULL;
    if (ok) ok = (s->expert = calloc(B, sizeof(int))) && (s->xq = calloc_lines(B * max_in, sizeof(int16_t)))
              && (s->xq_hidden = calloc_lines(B * I, sizeof(int16_t)));
    s->num_threads = 1;
#ifdef _OPENMP
    s->num_threads = omp_get_max_threads();
#endif
    if (ok) ok = (s->threads = calloc((size_t)s->num_threads, sizeof(ZayaThreadState))) != NULL;
    const size_t th_in = max_in > R ? max_in : R;   /* the widest product input of decode_token */
    for (int t = 0; ok && t < s->num_threads; t++) {   /* each on its own cache lines */
        float **tv[THREAD_VECTORS];
        size_t th_sizes[THREAD_VECTORS];
        thread_vectors(&s->threads[t], tv, th_sizes, c, th_in);
        for (int k = 0; ok && k < THREAD_VECTORS; k++) ok = (*tv[k] = calloc_lines(th_sizes[k], sizeof(float))) != NULL;
        if (ok) ok = (s->threads[t].xq = calloc_lines(th_in, sizeof(int16_t))) != NULL;
    }
    if (!ok) {
        zaya_state_free(s);
        return fail(err, errlen, "out of memory allocating the state for %d positions\n  hint: use a smaller --ctx", ctx);
    }
    zaya_state_reset(s, m);
    return 0;
}

void zaya_state_reset(ZayaState *s, const ZayaModel *m) {
    const ZayaConfig *c = &m->config;
    size_t d = (size_t)c->head_dim, nkv = (size_t)c->num_kv_heads, C = (size_t)(c->num_heads + c->num_kv_heads) * d;
    for (int i = 0; i < c->num_layers; i++) {
        ZayaLayerState *ls = &s->layers[i];
        memset(ls->key_cache, 0, (size_t)ls->cache_len * nkv * d * sizeof(float));
        memset(ls->value_cache, 0, (size_t)ls->cache_len * nkv * d * sizeof(float));
        memset(ls->conv_state, 0, (size_t)conv_state_len(c) * C * sizeof(float));
        /* the delayed value of position -1 is v_proj_delayed(0): its bias, or 0 without one */
        if (m->layers[i].v_proj_delayed_bias) memcpy(ls->delayed_value, m->layers[i].v_proj_delayed_bias, nkv * d / 2 * sizeof(float));
        else memset(ls->delayed_value, 0, nkv * d / 2 * sizeof(float));
    }
    s->pos = 0;
}

void zaya_state_free(ZayaState *s) {
    for (int i = 0; s->layers && i < s->num_layers; i++) {
        free(s->layers[i].key_cache);
        free(s->layers[i].value_cache);
        free(s->layers[i].conv_state);
        free(s->layers[i].delayed_value);
    }
    free(s->layers);
    float *bufs[] = {s->x, s->h, s->u, s->q, s->k, s->v, s->vd, s->attn_out, s->branch, s->router_state,
                     s->router_a, s->router_b, s->router_logits, s->router_probs, s->expert_weight,
                     s->expert_in, s->expert_hidden, s->expert_out, s->xq_scales, s->xq_hidden_scales, s->conv_a, s->q_res,
                     s->k_res, s->att, s->router_scores, s->rope_cos, s->rope_sin, s->logits};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
    free(s->expert);
    free(s->xq);
    free(s->xq_hidden);
    for (int t = 0; s->threads && t < s->num_threads; t++) {
        float **tv[THREAD_VECTORS];
        thread_vectors(&s->threads[t], tv, NULL, NULL, 0);
        for (int k = 0; k < THREAD_VECTORS; k++) free(*tv[k]);
        free(s->threads[t].xq);
    }
    free(s->threads);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------------------------------------
 * 5. Forward (arch §3; HF ZayaDecoderLayer.forward per layer)
 *
 * A batch of n tokens at positions s->pos .. s->pos+n-1 goes through the model layer by layer.
 * Row t of every [B, dim] scratch buffer belongs to token t. The projections are matmuls over the
 * n rows; the steps that carry state from token to token (the CCA convolutions, the delayed value,
 * the KV cache and attention) run token after token, in order. This path serves prompts and every
 * run with a tap (--dump, --trace); a decoded token without one takes decode_token (5b), the same
 * steps arranged for the threads, with identical results.
 * ------------------------------------------------------------------------------------------- */

/* Reports an intermediate tensor to the tap callback, if any (--dump, --trace). */
static void tap2(ZayaState *s, int layer, int pos, const char *name, const float *data, int d0, int d1) {
    if (!s->tap) return;
    ZayaTap t = {name, layer, pos, 0, d1 ? 2 : 1, {d0, d1}, data, 0};
    s->tap(s->tap_ctx, &t);
}
#define TAP(layer, pos, name, data, n) tap2(s, layer, pos, name, data, n, 0)

/* matmul with the state's scratch for quantized activations */
#define MATMUL(y, ys, w, x, xs, n) matmul(&(const MatmulOut){w, y, ys}, 1, x, xs, n, s->xq, s->xq_scales)

/* 3.4 the two causal convolutions of heads [h0, h1) for one token, over [u_{t-K} .. u_t] (the conv
 * state, then u_t = [q_tilde ; k_tilde], the q_proj and k_proj outputs); a head's channels are one
 * group of the grouped conv, so heads are independent.
 * depthwise conv (conv_qk_depthwise, kernel t0): a_s for s = t-t1+1 .. t, stored interleaved as
 * conv_a[ch * t1 + kk] with kk = s - (t-t1+1), so that the grouped conv reads the head's inputs in
 * the order of its weights [o, j, k].
 * a_s[c] = b0[c] + sum_m w0[c,0,m] * u_{s-t0+1+m}[c]; zero-padded u gives a_{<0} = b0, not 0.
 * grouped conv (conv_qk_grouped, kernel t1, one group of d channels per head):
 * z_t[o] = b1[o] + sum_j sum_k w1[o,j,k] * a_{t-t1+1+k}[head*d + j], one dot product of length d*t1
 * per output channel o of the head. */
static void cca_conv_heads(const ZayaConfig *c, const ZayaLayer *L, const ZayaLayerState *ls, const float *u_t,
                           float *conv_a, float *z, int h0, int h1) {
    const int d = c->head_dim, C = (c->num_heads + c->num_kv_heads) * d;
    const int t0 = c->cca_time0, t1 = c->cca_time1, K = conv_state_len(c);
    /* window[j] = u_{t-K+j}: the K raw columns from the conv state, then u_t */
#define WINDOW(j) ((j) < K ? ls->conv_state + (size_t)(j) * C : u_t)
    for (int head = h0; head < h1; head++) {
        for (int ch = head * d; ch < (head + 1) * d; ch++)
            for (int kk = 0; kk < t1; kk++) {
                float sum = L->conv_qk_depthwise_bias[ch];
                for (int m = 0; m < t0; m++) sum += L->conv_qk_depthwise_weight[ch * t0 + m] * WINDOW(kk + m)[ch];
                conv_a[(size_t)ch * t1 + kk] = sum;
            }
        for (int o = head * d; o < (head + 1) * d; o++)
            z[o] = L->conv_qk_grouped_bias[o] + dot_f32(L->conv_qk_grouped_weight + (size_t)o * d * t1,
                                                        conv_a + (size_t)head * d * t1, d * t1);
    }
#undef WINDOW
}

/* Shifts channels [c0, c1) of the conv state: drops u_{t-K}, appends u_t (raw, pre-conv). */
static void conv_state_push(const ZayaConfig *c, ZayaLayerState *ls, const float *u_t, int c0, int c1) {
    const int C = (c->num_heads + c->num_kv_heads) * c->head_dim, K = conv_state_len(c);
    for (int j = 0; j < K; j++)
        memcpy(ls->conv_state + (size_t)j * C + c0, j + 1 < K ? ls->conv_state + (size_t)(j + 1) * C + c0 : u_t + c0,
               sizeof(float) * (size_t)(c1 - c0));
}

/* 3.5 residual mix of u_t: q_res[n] = (q_tilde[n] + k_tilde[n/g]) * 0.5; k_res[j] = mean of q_res
 * over its g heads. (q = conv output + q_res, k = conv output + k_res.) */
static void cca_mix(const ZayaConfig *c, const float *u_t, float *q_res, float *k_res) {
    const int d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, g = nq / nkv;
    const float *q_tilde = u_t, *k_tilde = u_t + (size_t)nq * d;
    for (int n = 0; n < nq; n++)
        for (int i = 0; i < d; i++) q_res[n * d + i] = (q_tilde[n * d + i] + k_tilde[(n / g) * d + i]) * 0.5f;
    for (int j = 0; j < nkv; j++)
        for (int i = 0; i < d; i++) {
            float sum = 0.0f;
            for (int r = 0; r < g; r++) sum += q_res[(j * g + r) * d + i];
            k_res[j * d + i] = sum / (float)g;
        }
}

/* 3.4-3.5 for one token: the convolutions (heads in parallel), the conv state, the residual mix.
 * u_t = [q_tilde ; k_tilde]; writes q and k. */
static void cca_qk(const ZayaConfig *c, const ZayaLayer *L, ZayaLayerState *ls, ZayaState *s, int layer, int pos,
                   const float *u_t, float *q, float *k) {
    const int d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, C = (nq + nkv) * d, t1 = c->cca_time1;
    float *z = s->conv_a + (size_t)C * t1;   /* z_t: C floats after conv_a (then C more for the tap of a_t) */
#pragma omp parallel for schedule(static)
    for (int head = 0; head < nq + nkv; head++) cca_conv_heads(c, L, ls, u_t, s->conv_a, z, head, head + 1);
    if (s->tap) {
        float *a_t = z + C;
        for (int ch = 0; ch < C; ch++) a_t[ch] = s->conv_a[(size_t)ch * t1 + t1 - 1];
        TAP(layer, pos, "self_attn.qkv_proj.conv_qk_depthwise", a_t, C);
    }
    TAP(layer, pos, "self_attn.qkv_proj.conv_qk_grouped", z, C);
    conv_state_push(c, ls, u_t, 0, C);

    cca_mix(c, u_t, s->q_res, s->k_res);
    tap2(s, layer, pos, "self_attn.qkv_proj:query_residual", s->q_res, nq, d);
    tap2(s, layer, pos, "self_attn.qkv_proj:key_residual", s->k_res, nkv, d);
    for (int i = 0; i < nq * d; i++) q[i] = z[i] + s->q_res[i];
    for (int i = 0; i < nkv * d; i++) k[i] = z[nq * d + i] + s->k_res[i];
    tap2(s, layer, pos, "self_attn.qkv_proj:query", q, nq, d);
    tap2(s, layer, pos, "self_attn.qkv_proj:key", k, nkv, d);
}

/* 3.7: L2-normalize each head to norm sqrt(d) (clamped at FLT_EPSILON); keys also times temp[j]
 * (HF ZayaQKNorm.forward). */
static void qk_norm(float *x, int heads, int d, const float *temp) {
    const float sqrt_d = sqrtf((float)d);
    for (int n = 0; n < heads; n++) {
        float *v = x + (size_t)n * d, ss = 0.0f;
        for (int i = 0; i < d; i++) ss += v[i] * v[i];
        float scale = sqrt_d / fmaxf(sqrtf(ss), FLT_EPSILON);
        for (int i = 0; i < d; i++) v[i] = v[i] * scale * (temp ? temp[n] : 1.0f);
    }
}

/* 3.8: partial NeoX RoPE on dims [0, rot) of every head, pairs (j, j + rot/2)
 * (HF ZayaRotaryEmbedding + apply_rotary_pos_emb; inv_freq and angles in float32). */
static void rope_tables(float *cos_t, float *sin_t, int pos, int rot, float theta) {
    for (int j = 0; j < rot / 2; j++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)rot);
        float angle = (float)pos * inv_freq;
        cos_t[j] = cosf(angle);
        sin_t[j] = sinf(angle);
    }
}

static void rope(float *x, int heads, int d, int rot, const float *cos_t, const float *sin_t) {
    const int half = rot / 2;
    for (int n = 0; n < heads; n++) {
        float *v = x + (size_t)n * d;
        for (int j = 0; j < half; j++) {
            float a = v[j], b = v[j + half];
            v[j] = a * cos_t[j] - b * sin_t[j];
            v[j + half] = b * cos_t[j] + a * sin_t[j];
        }
    }
}

/* The rows of a KV head are short streams, and the hardware prefetchers stop at every 4 KB page:
 * attention asks for the row KV_AHEAD positions ahead (decode at positions 128-160 on Zen 4, 2
 * threads: attention 27-29 -> 23.5-26.5 us per layer). A prefetch is only a hint and never faults. */
#define KV_AHEAD 8
static void prefetch_kv_row(const ZayaLayerState *ls, const float *cache, int kvh, int pos, int d) {
    const float *row = cache + kv_row(ls, kvh, pos, d);
    for (int i = 0; i < d; i += 16) __builtin_prefetch(row + i);   /* one 64-byte line each */
}

/* 3.9: causal attention of one token at position pos over the KV cache; query head n uses KV head
 * n / g. Sliding layers see the last `sliding_window` positions including the current one: keys
 * first .. pos. The g query heads of a KV head go together, so each cached key and value is read
 * once for all of them (the cache holds a KV head's positions one after another: a stream). */
static int attention_first(const ZayaConfig *c, int layer, int pos) {
    return c->layer_types[layer] == ZAYA_HYBRID_SLIDING && pos - c->sliding_window + 1 > 0 ? pos - c->sliding_window + 1 : 0;
}

/* Scores q_n . k_t * scale of query heads [n0, n1) (all of one KV head's: kvh = n0 / g) for keys t in
 * [t_from, t_to), into p[n * n_keys + t - first]; the key is loaded once for up to DOT_TOKENS heads. */
static void attention_scores(const ZayaConfig *c, const ZayaLayerState *ls, const float *q_all, float *p, int n0,
                             int n1, int first, int pos, int t_from, int t_to) {
    const int d = c->head_dim, kvh = n0 / (c->num_heads / c->num_kv_heads), n_keys = pos - first + 1;
    const float scale = 1.0f / sqrtf((float)d);    /* HF: scaling = head_dim ** -0.5 */
    for (int t = t_from; t < t_to; t++) {
        const float *key = ls->key_cache + kv_row(ls, kvh, t, d);
        if (t + KV_AHEAD <= pos) prefetch_kv_row(ls, ls->key_cache, kvh, t + KV_AHEAD, d);
        for (int n = n0; n < n1; n += DOT_TOKENS) {
            const int nr = n1 - n < DOT_TOKENS ? n1 - n : DOT_TOKENS;
            float dots[DOT_TOKENS];
            dot_float(dots, nr, key, 0, q_all + (size_t)n * d, (size_t)d, d);
            for (int j = 0; j < nr; j++) p[(size_t)(n + j) * n_keys + (t - first)] = dots[j] * scale;
        }
    }
}

/* o_n = sum_t p_n[t] v_t for query heads [n0, n1) of one KV head, added in position order. */
static void attention_values(const ZayaConfig *c, const ZayaLayerState *ls, const float *p, float *out, int n0,
                             int n1, int first, int pos) {
    const int d = c->head_dim, kvh = n0 / (c->num_heads / c->num_kv_heads), n_keys = pos - first + 1;
    memset(out + (size_t)n0 * d, 0, (size_t)(n1 - n0) * d * sizeof(float));
    for (int t = first, nt; t <= pos; t += nt) {   /* four positions per pass over o where they are adjacent */
        const int slot = kv_slot(ls, t);
        nt = pos - t + 1 >= 4 && ls->cache_len - slot >= 4 ? 4 : 1;
        const float *v = ls->value_cache + kv_row(ls, kvh, t, d);
        for (int j = t + KV_AHEAD; j < t + KV_AHEAD + nt && j <= pos; j++) prefetch_kv_row(ls, ls->value_cache, kvh, j, d);
        for (int n = n0; n < n1; n++) {
            float *o = out + (size_t)n * d;
            const float *pt = p + (size_t)n * n_keys + (t - first);
            if (nt == 4)
                for (int i = 0; i < d; i++)
                    o[i] = o[i] + pt[0] * v[i] + pt[1] * v[d + i] + pt[2] * v[2 * d + i] + pt[3] * v[3 * d + i];
            else
                for (int i = 0; i < d; i++) o[i] += pt[0] * v[i];
        }
    }
}

/* Query heads [n0, n1) of one KV head, on one thread: scores, softmax, values. */
static void attention_heads(const ZayaConfig *c, const ZayaLayerState *ls, int layer, int pos, const float *q_all,
                            float *p, float *out, int n0, int n1) {
    const int first = attention_first(c, layer, pos), n_keys = pos - first + 1;
    attention_scores(c, ls, q_all, p, n0, n1, first, pos, first, pos + 1);
    for (int n = n0; n < n1; n++) softmax(p + (size_t)n * n_keys, n_keys);
    attention_values(c, ls, p, out, n0, n1, first, pos);
}

/* The attention of one token with all threads: the scores split over (KV head, key) pairs, the
 * softmax over heads, the values over KV heads. p = s->att [nq, n_keys]. */
static void attention(const ZayaConfig *c, const ZayaLayerState *ls, ZayaState *s, int layer, int pos,
                      const float *q_all, float *out) {
    const int nq = c->num_heads, nkv = c->num_kv_heads, g = nq / nkv;
    const int first = attention_first(c, layer, pos), n_keys = pos - first + 1;
    float *p = s->att;                             /* p[n * n_keys + j]: head n, key position first + j */
#pragma omp parallel if ((size_t)nq * n_keys * c->head_dim >= PARALLEL_MIN_WORK)
    {
#pragma omp for collapse(2) schedule(static)
        for (int kvh = 0; kvh < nkv; kvh++)
            for (int t = first; t <= pos; t++) attention_scores(c, ls, q_all, p, kvh * g, (kvh + 1) * g, first, pos, t, t + 1);
#pragma omp for schedule(static)
        for (int n = 0; n < nq; n++) softmax(p + (size_t)n * n_keys, n_keys);
#pragma omp for schedule(static)
        for (int kvh = 0; kvh < nkv; kvh++) attention_values(c, ls, p, out, kvh * g, (kvh + 1) * g, first, pos);
    }
    if (s->tap) {   /* [nq, n_keys]: column j = key position first + j (HF's attn_weights row without the masked zeros) */
        ZayaTap t = {"self_attn:attn_weights", layer, pos, 0, 2, {nq, n_keys}, s->att, 1};
        s->tap(s->tap_ctx, &t);
    }
}

/* 3.2-3.11: the attention half of layer `layer` for n tokens; updates the residual stream s->x. */
static void attention_block(const ZayaModel *m, ZayaState *s, int layer, int n) {
    const ZayaConfig *c = &m->config;
    const ZayaLayer *L = &m->layers[layer];
    ZayaLayerState *ls = &s->layers[layer];
    const int H = c->hidden_size, d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads;
    const int C = (nq + nkv) * d, vhalf = nkv * d / 2;
    const int type = c->layer_types[layer], rot = c->rope_dim[type];

    for (int t = 0; t < n; t++) {                                               /* input_layernorm */
        rmsnorm(s->h + (size_t)t * H, s->x + (size_t)t * H, L->input_layernorm, H, c->rms_norm_eps);
        TAP(layer, s->pos + t, "input_layernorm", s->h + (size_t)t * H, H);
    }
    const MatmulOut qkv[] = {{&L->q_proj, s->u, C},                              /* qkv_proj.q_proj -> u[:nq*d] */
                             {&L->k_proj, s->u + (size_t)nq * d, C},             /* qkv_proj.k_proj -> u[nq*d:] */
                             {&L->v_proj_current, s->v, nkv * d},                /* v_proj_current -> v[:vhalf] */
                             {&L->v_proj_delayed, s->vd, vhalf}};                /* v_proj_delayed */
    matmul(qkv, 4, s->h, H, n, s->xq, s->xq_scales);                            /* all four read h: one pass */
    if (L->q_proj_bias)                                                         /* attention_bias */
        for (int t = 0; t < n; t++) {
            float *u = s->u + (size_t)t * C, *v = s->v + (size_t)t * nkv * d, *vd = s->vd + (size_t)t * vhalf;
            add_bias(u, u, L->q_proj_bias, nq * d);
            add_bias(u + (size_t)nq * d, u + (size_t)nq * d, L->k_proj_bias, nkv * d);
            add_bias(v, v, L->v_proj_current_bias, vhalf);
            add_bias(vd, vd, L->v_proj_delayed_bias, vhalf);
        }

    for (int t = 0; t < n; t++) {       /* token after token: conv state, delayed value, KV cache */
        const int pos = s->pos + t;
        const float *u = s->u + (size_t)t * C;
        float *q = s->q + (size_t)t * nq * d, *k = s->k + (size_t)t * nkv * d, *v = s->v + (size_t)t * nkv * d;
        TAP(layer, pos, "self_attn.qkv_proj.q_proj", u, nq * d);
        TAP(layer, pos, "self_attn.qkv_proj.k_proj", u + (size_t)nq * d, nkv * d);
        cca_qk(c, L, ls, s, layer, pos, u, q, k);                                /* CCA convs + residual mix */

        /* 3.6 values: channels [0, vhalf) = v_proj_current(h_t), then v_proj_delayed(h_{t-1}), viewed as nkv heads */
        TAP(layer, pos, "self_attn.qkv_proj.v_proj_current", v, vhalf);
        TAP(layer, pos, "self_attn.qkv_proj.v_proj_delayed", s->vd + (size_t)t * vhalf, vhalf);
        memcpy(v + vhalf, ls->delayed_value, (size_t)vhalf * sizeof(float));
        memcpy(ls->delayed_value, s->vd + (size_t)t * vhalf, (size_t)vhalf * sizeof(float));
        tap2(s, layer, pos, "self_attn.qkv_proj:value", v, nkv, d);

        qk_norm(q, nq, d, NULL);                                                 /* qk_norm */
        qk_norm(k, nkv, d, L->qk_norm_temp);
        tap2(s, layer, pos, "self_attn.qk_norm:query", q, nq, d);
        tap2(s, layer, pos, "self_attn.qk_norm:key", k, nkv, d);

        rope_tables(s->rope_cos, s->rope_sin, pos, rot, c->rope_theta[type]);   /* rotary_emb */
        rope(q, nq, d, rot, s->rope_cos, s->rope_sin);
        rope(k, nkv, d, rot, s->rope_cos, s->rope_sin);
        tap2(s, layer, pos, "self_attn:query_after_rope", q, nq, d);
        tap2(s, layer, pos, "self_attn:key_after_rope", k, nkv, d);

        for (int j = 0; j < nkv; j++) {                                         /* append to the KV cache */
            const size_t row = kv_row(ls, j, pos, d);
            memcpy(ls->key_cache + row, k + (size_t)j * d, (size_t)d * sizeof(float));
            memcpy(ls->value_cache + row, v + (size_t)j * d, (size_t)d * sizeof(float));
        }
        attention(c, ls, s, layer, pos, q, s->attn_out + (size_t)t * nq * d);
        TAP(layer, pos, "self_attn:attn_output", s->attn_out + (size_t)t * nq * d, nq * d);
    }

    MATMUL(s->branch, H, &L->o_proj, s->attn_out, nq * d, n);                   /* o_proj */
    for (int t = 0; t < n; t++) {                                               /* post_attention_residual_scale */
        if (L->o_proj_bias) add_bias(s->branch + (size_t)t * H, s->branch + (size_t)t * H, L->o_proj_bias, H);
        TAP(layer, s->pos + t, "self_attn.o_proj", s->branch + (size_t)t * H, H);
        residual_scale(s->x + (size_t)t * H, s->branch + (size_t)t * H, &L->post_attention_residual_scale, H);
        TAP(layer, s->pos + t, "post_attention_residual_scale", s->x + (size_t)t * H, H);
    }
}

/* EDA from layer 1 on: rho = down_proj + rho_prev * router_states_scale (handed to layer+1);
 * layer 0 (no router_states_scale) starts it: rho = down_proj. */
static void router_eda(const ZayaLayer *L, const float *down, float *rho, int R) {
    for (int i = 0; i < R; i++) rho[i] = L->router_states_scale ? down[i] + rho[i] * L->router_states_scale[i] : down[i];
}

static void gelu_all(float *x, int n) {
    for (int i = 0; i < n; i++) x[i] = gelu(x[i]);
}

/* The router's choice: top-1 of the biased scores probs + balancing_biases over E+1 classes (ties:
 * lowest index), scores kept in scores[E+1]; its weight is the unbiased probability probs[best]. */
static int router_top1(const float *probs, const float *balancing_biases, int E, float *scores) {
    int best = 0;
    for (int e = 0; e <= E; e++) {
        scores[e] = probs[e] + balancing_biases[e];
        if (scores[e] > scores[best]) best = e;
    }
    return best;
}

/* 3.13 router for n tokens: down_proj, EDA (the state flows from the previous layer), router MLP,
 * softmax over E+1 classes, top-1 of the biased scores. Fills s->expert and s->expert_weight. */
static void router(const ZayaModel *m, ZayaState *s, int layer, int n) {
    const ZayaConfig *c = &m->config;
    const ZayaLayer *L = &m->layers[layer];
    const int H = c->hidden_size, R = c->router_hidden, E = c->num_experts;
    float *a = s->router_a, *b = s->router_b;

    MATMUL(a, R, &L->router_down_proj, s->h, H, n);                             /* mlp.gate.down_proj */
    for (int t = 0; t < n; t++) {
        float *at = a + (size_t)t * R, *rho = s->router_state + (size_t)t * R;
        add_bias(at, at, L->router_down_proj_bias, R);
        TAP(layer, s->pos + t, "mlp.gate.down_proj", at, R);
        router_eda(L, at, rho, R);
        TAP(layer, s->pos + t, "mlp.gate:router_state", rho, R);
        rmsnorm(b + (size_t)t * R, rho, L->router_norm, R, c->router_norm_eps);  /* router_mlp.norm */
        TAP(layer, s->pos + t, "mlp.gate.router_mlp.norm", b + (size_t)t * R, R);
    }
    MATMUL(a, R, &L->router_fc1, b, R, n);                                      /* router_mlp.fc1 + GELU */
    for (int t = 0; t < n; t++) {
        float *at = a + (size_t)t * R;
        add_bias(at, at, L->router_fc1_bias, R);
        TAP(layer, s->pos + t, "mlp.gate.router_mlp.fc1", at, R);
        gelu_all(at, R);
    }
    MATMUL(b, R, &L->router_fc2, a, R, n);                                      /* router_mlp.fc2 + GELU */
    for (int t = 0; t < n; t++) {
        float *bt = b + (size_t)t * R;
        add_bias(bt, bt, L->router_fc2_bias, R);
        TAP(layer, s->pos + t, "mlp.gate.router_mlp.fc2", bt, R);
        gelu_all(bt, R);
    }
    MATMUL(s->router_logits, E + 1, &L->router_out_proj, b, R, n);              /* router_mlp.out_proj */
    for (int t = 0; t < n; t++) {
        const int pos = s->pos + t;
        float *logits = s->router_logits + (size_t)t * (E + 1), *probs = s->router_probs + (size_t)t * (E + 1);
        TAP(layer, pos, "mlp.gate.router_mlp", logits, E + 1);
        memcpy(probs, logits, (size_t)(E + 1) * sizeof(float));
        softmax(probs, E + 1);                                                   /* over all E+1 classes */
        TAP(layer, pos, "mlp.gate:router_probs", probs, E + 1);
        int best = router_top1(probs, L->balancing_biases, E, s->router_scores);
        TAP(layer, pos, "mlp.gate:router_scores", s->router_scores, E + 1);
        if (s->tap) {
            ZayaTap tp = {"mlp.gate.router_indices", layer, pos, 1, 0, {0, 0}, &best, 0};
            s->tap(s->tap_ctx, &tp);
        }
        s->expert[t] = best;
        s->expert_weight[t] = probs[best];
    }
}

/* 3.14 thread me's part of one expert for cnt tokens x (rows H apart, quantized for int8 weights
 * into xq/xqs): expert_out = down_proj(SiLU(gate) * up), where gate and up are rows 0..I-1 and
 * I..2I-1 of gate_up_proj(x). Each thread computes the same channels of gate and up, so it applies
 * SiLU(gate)*up to its own channels and quantizes them for down_proj without reading what another
 * thread wrote (where the two cores sit on different CCDs, each such hand-off costs microseconds).
 * The threads wait for each other once, when all of down_proj's input is ready; the caller waits
 * for expert_out. Results are those of matmul(gate_up), SiLU, matmul(down), for any thread count.
 * Call it inside a parallel region. */
static void expert_share(ZayaState *s, const ZayaMatrix *gate_up, const ZayaMatrix *down, const float *x, int cnt,
                         const int16_t *xq, const float *xqs, int me, int nth) {
    const int H = gate_up->cols, I = down->cols, R = ZAYA_Q8_INTERLEAVE, G = down->group_size;
    const ZayaMatrix gate = matrix_rows(gate_up, 0, I), up = matrix_rows(gate_up, I, I);
    const MatmulOut gate_out = {&gate, s->expert_hidden, 2 * I}, up_out = {&up, s->expert_hidden + I, 2 * I},
                    down_out = {down, s->expert_out, H};
    /* a thread's channels start at a block of down_proj's quantized input (quantize_q16's layout) */
    const int unit = down->dtype != ZAYA_Q8 ? R : G % 2 ? R * G : 8 * G;
    int a, b;
    thread_share(I, unit, me, nth, &a, &b);                                      /* this thread's channels */
    matmul_tiles(&gate_out, x, H, cnt, xq, xqs, a, b);
    matmul_tiles(&up_out, x, H, cnt, xq, xqs, a, b);
    for (int t = 0; t < cnt; t++) {
        float *g = s->expert_hidden + (size_t)t * 2 * I, *u = g + I;
        for (int i = a; i < b; i++) g[i] = silu(g[i]) * u[i];
        if (down->dtype == ZAYA_Q8)
            for (int k = a / G; k < b / G; k++)
                quantize_q16(s->xq_hidden + (size_t)t * I, s->xq_hidden_scales + (size_t)t * (I / G), g, I, G, k);
    }
#pragma omp barrier
    thread_share(H, R, me, nth, &a, &b);                                         /* this thread's rows of down_proj */
    matmul_tiles(&down_out, s->expert_hidden, 2 * I, cnt, s->xq_hidden, s->xq_hidden_scales, a, b);
}

/* One expert for its cnt tokens (expert_in -> expert_out) in one parallel region: the threads
 * quantize equal shares of expert_in, then expert_share. */
static void expert_swiglu(ZayaState *s, const ZayaMatrix *gate_up, const ZayaMatrix *down, int cnt) {
    const int H = gate_up->cols;
#pragma omp parallel if ((size_t)3 * down->cols * H * cnt >= PARALLEL_MIN_WORK)
    {
        int me, nth;
        this_thread(&me, &nth);
        quantize_share(gate_up, s->expert_in, H, cnt, s->xq, s->xq_scales, me, nth);
        expert_share(s, gate_up, down, s->expert_in, cnt, s->xq, s->xq_scales, me, nth);
    }
}

/* 3.12-3.15: the MoE half for n tokens: router, then each chosen expert once for all its tokens
 * (SwiGLU), or the skip class; then the residual merge. */
static void moe_block(const ZayaModel *m, ZayaState *s, int layer, int n) {
    const ZayaConfig *c = &m->config;
    const ZayaLayer *L = &m->layers[layer];
    const int H = c->hidden_size, E = c->num_experts, I = c->moe_intermediate;

    for (int t = 0; t < n; t++) {                                               /* post_attention_layernorm */
        rmsnorm(s->h + (size_t)t * H, s->x + (size_t)t * H, L->post_attention_layernorm, H, c->rms_norm_eps);
        TAP(layer, s->pos + t, "post_attention_layernorm", s->h + (size_t)t * H, H);
    }
    router(m, s, layer, n);

    for (int e = 0; e < E; e++) {                                                /* experts (SwiGLU) */
        int idx[ZAYA_BATCH], cnt = 0;   /* the tokens routed to expert e, gathered into expert_in */
        for (int t = 0; t < n; t++)
            if (s->expert[t] == e) {
                memcpy(s->expert_in + (size_t)cnt * H, s->h + (size_t)t * H, sizeof(float) * (size_t)H);
                idx[cnt++] = t;
            }
        if (!cnt) continue;             /* only the chosen experts' weights are read */
        const ZayaMatrix gate_up = matrix_rows(&L->experts_gate_up, e * 2 * I, 2 * I);
        const ZayaMatrix down = matrix_rows(&L->experts_down, e * H, H);
        expert_swiglu(s, &gate_up, &down, cnt);                                  /* expert_in -> expert_out */
        for (int j = 0; j < cnt; j++)                                            /* y = weight * down(...) */
            for (int i = 0; i < H; i++)
                s->branch[(size_t)idx[j] * H + i] = s->expert_weight[idx[j]] * s->expert_out[(size_t)j * H + i];
    }
    for (int t = 0; t < n; t++) {
        float *y = s->branch + (size_t)t * H;
        if (s->expert[t] == E) {            /* the skip class (arch §6a) */
            if (s->skip_expert == ZAYA_SKIP_PASSTHROUGH)                         /* Zyphra fork: P[skip] * h2 */
                for (int i = 0; i < H; i++) y[i] = s->expert_weight[t] * s->h[(size_t)t * H + i];
            else {                                                               /* upstream: zero output */
                s->expert_weight[t] = 0.0f;
                memset(y, 0, (size_t)H * sizeof(float));
            }
        }
        if (s->tap) {
            ZayaTap tw = {"mlp.gate:router_weight", layer, s->pos + t, 0, 0, {0, 0}, &s->expert_weight[t], 0};
            s->tap(s->tap_ctx, &tw);
        }
        TAP(layer, s->pos + t, "mlp.experts", y, H);
        residual_scale(s->x + (size_t)t * H, y, &L->post_mlp_residual_scale, H);  /* post_mlp_residual_scale */
        TAP(layer, s->pos + t, "post_mlp_residual_scale", s->x + (size_t)t * H, H);
    }
}

/* n <= ZAYA_BATCH tokens through the whole model (ids already checked). */
static void forward_batch(const ZayaModel *m, ZayaState *s, const int *tokens, int n) {
    const ZayaConfig *c = &m->config;
    const int H = c->hidden_size;
    for (int t = 0; t < n; t++) {
        /* 3.1 embedding and input scaling: r = (e + bias) * scale (no sqrt(H) factor) */
        float *e = s->h + (size_t)t * H, *x = s->x + (size_t)t * H;
        matrix_row(&m->embed_tokens, tokens[t], e);
        TAP(-1, s->pos + t, "model.embed_tokens", e, H);
        for (int i = 0; i < H; i++) x[i] = (e[i] + m->input_hidden_states_bias[i]) * m->input_hidden_states_scale[i];
        TAP(-1, s->pos + t, "model:input_scaled", x, H);
    }
    for (int layer = 0; layer < c->num_layers; layer++) {
        attention_block(m, s, layer, n);
        moe_block(m, s, layer, n);
    }
    /* 3.16 final norm and the tied LM head over all vocab_size rows: for the last token only,
     * unless a tap wants every position's logits */
    for (int t = 0; t < n; t++) {
        float *f = s->h + (size_t)t * H;
        rmsnorm(f, s->x + (size_t)t * H, m->norm, H, c->rms_norm_eps);
        TAP(-1, s->pos + t, "model.norm", f, H);
        if (t == n - 1 || s->tap) {
            MATMUL(s->logits, c->vocab_size, &m->embed_tokens, f, H, 1);
            if (m->lm_head_bias) add_bias(s->logits, s->logits, m->lm_head_bias, c->vocab_size);
            TAP(-1, s->pos + t, "logits", s->logits, c->vocab_size);
        }
    }
    s->pos += n;
}

/* ---------------------------------------------------------------------------------------------
 * 5b. Decode: one token in one parallel region (zaya_forward without a tap)
 *
 * The computation of forward_batch for one token, step for step, arranged for the threads. They
 * split the rows of every matrix product (outputs in the shared scratch of ZayaState) and wait for
 * each other before anyone reads a product's output. Every other step (norms, residuals, the CCA
 * mix, qk_norm, RoPE, the router's activations and choice) each thread computes itself into its own
 * ZayaThreadState, instead of one thread computing it and handing it to the others: where the cores
 * sit on different CCDs each hand-off costs microseconds, and a token has hundreds (bench/README.md).
 * The convolutions go by head (a thread keeps the conv state of its heads), attention by query head.
 * Results are identical to forward_batch's for any thread count.
 * ------------------------------------------------------------------------------------------- */

/* The products of decode_token: this thread quantizes all of x for itself (int8 weights), computes
 * its share of the rows, then waits for the other threads (every thread reads the whole output next). */
static void project(const MatmulOut *out, int count, const float *x, ZayaThreadState *th, int me, int nth) {
    const int together = same_format(out, count);   /* else a blob that mixes formats: one at a time */
    for (int i = 0; i < count; i += together ? count : 1) {
        quantize_all(out[i].w, x, th->xq, th->xq_scales);
        products_share(out + i, together ? count : 1, x, out[i].w->cols, 1, th->xq, th->xq_scales, me, nth);
    }
#pragma omp barrier
}

static void decode_token(const ZayaModel *m, ZayaState *s, int token) {
    const ZayaConfig *c = &m->config;
    const int H = c->hidden_size, d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, g = nq / nkv;
    const int C = (nq + nkv) * d, vhalf = nkv * d / 2, R = c->router_hidden, E = c->num_experts, I = c->moe_intermediate;
    const int pos = s->pos;
    const float eps = c->rms_norm_eps;
#ifdef _OPENMP
    const int threads = omp_get_max_threads() < s->num_threads ? omp_get_max_threads() : s->num_threads;
#endif
#pragma omp parallel num_threads(threads)
    {
        int me, nth, a, b;
        this_thread(&me, &nth);
        ZayaThreadState *th = &s->threads[me];
        matrix_row(&m->embed_tokens, token, th->h);                              /* 3.1 embedding, input scaling */
        for (int i = 0; i < H; i++) th->x[i] = (th->h[i] + m->input_hidden_states_bias[i]) * m->input_hidden_states_scale[i];
        for (int type = 0; type < 2; type++)                                     /* RoPE tables of both layer types */
            rope_tables(th->rope_cos + type * (d / 2), th->rope_sin + type * (d / 2), pos, c->rope_dim[type], c->rope_theta[type]);
        for (int layer = 0; layer < c->num_layers; layer++) {
            const ZayaLayer *L = &m->layers[layer];
            ZayaLayerState *ls = &s->layers[layer];
            const int type = c->layer_types[layer], rot = c->rope_dim[type];

            rmsnorm(th->h, th->x, L->input_layernorm, H, eps);                   /* input_layernorm */
            const MatmulOut qkv[] = {{&L->q_proj, s->u, C}, {&L->k_proj, s->u + (size_t)nq * d, C},
                                     {&L->v_proj_current, s->v, nkv * d}, {&L->v_proj_delayed, s->vd, vhalf}};
            project(qkv, 4, th->h, th, me, nth);                                 /* q/k/v projections */
            if (L->q_proj_bias) {                                                /* attention_bias: a share each */
                thread_share(C, 1, me, nth, &a, &b);
                for (int i = a; i < b; i++) s->u[i] += i < nq * d ? L->q_proj_bias[i] : L->k_proj_bias[i - nq * d];
                thread_share(vhalf, 1, me, nth, &a, &b);
                for (int i = a; i < b; i++) { s->v[i] += L->v_proj_current_bias[i]; s->vd[i] += L->v_proj_delayed_bias[i]; }
#pragma omp barrier
            }

            float *z = s->conv_a + (size_t)C * c->cca_time1;                     /* CCA convs of this thread's heads */
            thread_share(nq + nkv, 1, me, nth, &a, &b);
            cca_conv_heads(c, L, ls, s->u, s->conv_a, z, a, b);
            conv_state_push(c, ls, s->u, a * d, b * d);
#pragma omp barrier
            cca_mix(c, s->u, th->q_res, th->k_res);                              /* residual mix */
            for (int i = 0; i < nq * d; i++) th->q[i] = z[i] + th->q_res[i];
            for (int i = 0; i < nkv * d; i++) th->k[i] = z[nq * d + i] + th->k_res[i];
            memcpy(th->v, s->v, sizeof(float) * (size_t)vhalf);                 /* values: current, delayed */
            memcpy(th->v + vhalf, ls->delayed_value, sizeof(float) * (size_t)vhalf);
            qk_norm(th->q, nq, d, NULL);                                         /* qk_norm */
            qk_norm(th->k, nkv, d, L->qk_norm_temp);
            const float *cos_t = th->rope_cos + type * (d / 2), *sin_t = th->rope_sin + type * (d / 2);   /* RoPE */
            rope(th->q, nq, d, rot, cos_t, sin_t);
            rope(th->k, nkv, d, rot, cos_t, sin_t);
            /* attention over this thread's query heads: whole KV groups while there are no more threads
             * than KV heads, so that a thread appends the keys and values it reads itself; else any heads,
             * once each KV head's row is in the cache (appended by the thread of its first query head) */
            const int whole = nth <= nkv;
            thread_share(nq, whole ? g : 1, me, nth, &a, &b);
            for (int j = (a + g - 1) / g; j * g < b; j++) {                      /* KV cache append */
                memcpy(ls->key_cache + kv_row(ls, j, pos, d), th->k + (size_t)j * d, sizeof(float) * (size_t)d);
                memcpy(ls->value_cache + kv_row(ls, j, pos, d), th->v + (size_t)j * d, sizeof(float) * (size_t)d);
            }
            if (!whole) {
#pragma omp barrier
            }
            for (int n0 = a, n1; n0 < b; n0 = n1) {                              /* attention, KV group by group */
                n1 = (n0 / g + 1) * g < b ? (n0 / g + 1) * g : b;
                attention_heads(c, ls, layer, pos, th->q, s->att, s->attn_out, n0, n1);
            }
#pragma omp barrier
            if (me == 0) memcpy(ls->delayed_value, s->vd, sizeof(float) * (size_t)vhalf);   /* all have read the old one */
            const MatmulOut o = {&L->o_proj, s->branch, H};
            project(&o, 1, s->attn_out, th, me, nth);                            /* o_proj */
            const float *o_out = s->branch;
            if (L->o_proj_bias) { add_bias(th->y, s->branch, L->o_proj_bias, H); o_out = th->y; }
            residual_scale(th->x, o_out, &L->post_attention_residual_scale, H);
            rmsnorm(th->h, th->x, L->post_attention_layernorm, H, eps);          /* post_attention_layernorm */

            const MatmulOut down = {&L->router_down_proj, s->router_a, R};       /* router */
            project(&down, 1, th->h, th, me, nth);
            add_bias(th->router_a, s->router_a, L->router_down_proj_bias, R);
            router_eda(L, th->router_a, th->router_state, R);
            rmsnorm(th->router_b, th->router_state, L->router_norm, R, c->router_norm_eps);
            const MatmulOut fc1 = {&L->router_fc1, s->router_b, R}, fc2 = {&L->router_fc2, s->router_a, R};
            project(&fc1, 1, th->router_b, th, me, nth);
            add_bias(th->router_a, s->router_b, L->router_fc1_bias, R);
            gelu_all(th->router_a, R);
            project(&fc2, 1, th->router_a, th, me, nth);
            add_bias(th->router_b, s->router_a, L->router_fc2_bias, R);
            gelu_all(th->router_b, R);
            const MatmulOut out_proj = {&L->router_out_proj, th->router_probs, E + 1};   /* small: every thread */
            quantize_all(out_proj.w, th->router_b, th->xq, th->xq_scales);
            matmul_tiles(&out_proj, th->router_b, R, 1, th->xq, th->xq_scales, 0, E + 1);
            softmax(th->router_probs, E + 1);
            const int best = router_top1(th->router_probs, L->balancing_biases, E, th->router_scores);
            const float weight = th->router_probs[best];

            if (best < E) {                                                      /* the expert (SwiGLU) */
                const ZayaMatrix gate_up = matrix_rows(&L->experts_gate_up, best * 2 * I, 2 * I);
                const ZayaMatrix expert_down = matrix_rows(&L->experts_down, best * H, H);
                quantize_all(&gate_up, th->h, th->xq, th->xq_scales);
                expert_share(s, &gate_up, &expert_down, th->h, 1, th->xq, th->xq_scales, me, nth);
#pragma omp barrier
                for (int i = 0; i < H; i++) th->y[i] = weight * s->expert_out[i];
            } else if (s->skip_expert == ZAYA_SKIP_PASSTHROUGH) {               /* the skip class (arch §6a) */
                for (int i = 0; i < H; i++) th->y[i] = weight * th->h[i];
            } else {
                memset(th->y, 0, sizeof(float) * (size_t)H);
            }
            residual_scale(th->x, th->y, &L->post_mlp_residual_scale, H);        /* post_mlp_residual_scale */
        }
        rmsnorm(th->h, th->x, m->norm, H, eps);                                  /* final norm, LM head */
        const MatmulOut head = {&m->embed_tokens, s->logits, c->vocab_size};
        project(&head, 1, th->h, th, me, nth);
    }
    if (m->lm_head_bias) add_bias(s->logits, s->logits, m->lm_head_bias, c->vocab_size);   /* lm_head_bias */
    s->pos += 1;
}

int zaya_prefill(const ZayaModel *m, ZayaState *s, const int *tokens, int n, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return fail(err, errlen, "token id %d (position %d) is outside the vocabulary\n  expected: 0..%d",
                        tokens[t], s->pos + t, c->vocab_size - 1);
    if (n > s->ctx - s->pos)
        return fail(err, errlen, "context is full: %d positions used of %d, %d more needed\n  hint: start a new conversation or raise --ctx (max %d)",
                    s->pos, s->ctx, n, c->max_position);
    const int batch = s->batch >= 1 && s->batch <= ZAYA_BATCH ? s->batch : ZAYA_BATCH;
    for (int done = 0; done < n; done += batch)
        forward_batch(m, s, tokens + done, n - done < batch ? n - done : batch);
    return 0;
}

int zaya_forward(const ZayaModel *m, ZayaState *s, int token, char *err, size_t errlen) {
    if (s->tap || token < 0 || token >= m->config.vocab_size || s->pos >= s->ctx)   /* taps and errors: */
        return zaya_prefill(m, s, &token, 1, err, errlen);                           /* the batch path */
    decode_token(m, s, token);
    return 0;
}

void zaya_state_taps(const ZayaModel *m, const ZayaState *s, ZayaTapFn fn, void *ctx) {
    const ZayaConfig *c = &m->config;
    const int d = c->head_dim, nkv = c->num_kv_heads, C = (c->num_heads + nkv) * d, K = conv_state_len(c);
    for (int i = 0; i < c->num_layers; i++) {
        const ZayaLayerState *ls = &s->layers[i];
        ZayaTap conv = {"self_attn.qkv_proj:conv_state", i, -1, 0, 2, {K, C}, ls->conv_state, 0};
        ZayaTap dv = {"self_attn.qkv_proj:delayed_value_state", i, -1, 0, 1, {nkv * d / 2, 0}, ls->delayed_value, 0};
        if (K > 0) fn(ctx, &conv);
        fn(ctx, &dv);
        /* the KV cache in position order (a sliding layer's ring buffer is unrolled) */
        int n = s->pos < ls->cache_len ? s->pos : ls->cache_len;
        float *kc = malloc(sizeof(float) * ((size_t)n * nkv * d + 1)), *vc = malloc(sizeof(float) * ((size_t)n * nkv * d + 1));
        if (kc && vc) {
            for (int r = 0; r < n; r++)
                for (int j = 0; j < nkv; j++) {   /* cache [nkv, cache_len, d] -> tap [n, nkv * d] */
                    const size_t from = kv_row(ls, j, s->pos - n + r, d);
                    memcpy(kc + ((size_t)r * nkv + j) * d, ls->key_cache + from, sizeof(float) * (size_t)d);
                    memcpy(vc + ((size_t)r * nkv + j) * d, ls->value_cache + from, sizeof(float) * (size_t)d);
                }
            ZayaTap kt = {"self_attn:key_cache", i, -1, 0, 2, {n, nkv * d}, kc, 0};
            ZayaTap vt = {"self_attn:value_cache", i, -1, 0, 2, {n, nkv * d}, vc, 0};
            fn(ctx, &kt);
            fn(ctx, &vt);
        }
        free(kc);
        free(vc);
    }
}

/* ---------------------------------------------------------------------------------------------
 * 6. Command line: sampling, dumps, generation (not compiled into the test/fuzz libraries)
 * ------------------------------------------------------------------------------------------- */
#ifndef ZAYA_NO_MAIN
#include <regex.h>
#include "trace.h"
#include <time.h>

#ifndef ZAYA_VERSION
#define ZAYA_VERSION "1.0"
#endif
#ifndef ZAYA_COMMIT
#define ZAYA_COMMIT "unknown"
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prints "zaya: error: ..." and exits with status 1: only main() and its helpers end the program. */
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("zaya: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---- sampling (llama2.c style: xorshift RNG, temperature, top-p) ---- */

static uint32_t random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; }

typedef struct { float p; int id; } ProbIndex;
/* Sorts a[0..m) by probability, largest first, equal probabilities by lower id first (a[] arrives
 * in id order). An LSD radix sort, 8 bits a pass, on the float's bit pattern, which orders positive
 * floats like their values; each pass is stable, so ties keep their id order. O(m) where qsort was
 * O(m log m): a flat distribution keeps nearly all 262,144 tokens above the top-p cutoff. Uses tmp
 * (m entries); the result ends in a (four passes). */
static void sort_prob_desc(ProbIndex *a, ProbIndex *tmp, int m) {
    for (int shift = 0; shift < 32; shift += 8) {
        size_t start[257] = {0};   /* digit 255 - byte, so larger bytes come first */
        uint32_t bits;
        for (int i = 0; i < m; i++) { memcpy(&bits, &a[i].p, 4); start[1 + 255 - ((bits >> shift) & 255)]++; }
        for (int k = 0; k < 256; k++) start[k + 1] += start[k];
        for (int i = 0; i < m; i++) { memcpy(&bits, &a[i].p, 4); tmp[start[255 - ((bits >> shift) & 255)]++] = a[i]; }
        ProbIndex *t = a; a = tmp; tmp = t;
    }
}

/* Picks the next token from logits[0..n): n is the tokenizer's size, so ids the tokenizer cannot
 * print (embedding padding rows) are never chosen. temperature 0 = greedy (ties: lowest id).
 * scratch: 2n entries (candidates, and the sort's second buffer). */
static int sample(float *logits, int n, float temperature, float topp, uint64_t *rng, ProbIndex *scratch) {
    if (temperature == 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++) logits[i] /= temperature;
    softmax(logits, n);
    float r = random_f32(rng);
    if (topp <= 0.0f || topp >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) { cdf += logits[i]; if (r < cdf) return i; }
        return n - 1;
    }
    /* top-p: the smallest set of most likely tokens whose probability reaches topp */
    int m = 0;
    const float cutoff = (1.0f - topp) / (float)(n - 1);   /* tokens below this can never be in the set */
    for (int i = 0; i < n; i++) if (logits[i] >= cutoff) scratch[m++] = (ProbIndex){logits[i], i};
    sort_prob_desc(scratch, scratch + n, m);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) { cum += scratch[i].p; if (cum > topp) { last = i; break; } }
    r *= cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) { cdf += scratch[i].p; if (r < cdf) return scratch[i].id; }
    return scratch[last].id;
}

/* ---- --dump DIR: every tap, token-major, one .npy each, plus index.json (docs/compare.md) ---- */

typedef struct {
    char name[160];
    int is_int, ndim, shape[2];
    size_t row;          /* values per position */
    size_t rows, cap;    /* positions stored, capacity */
    unsigned char *data;
    int state;           /* 1 = a state tensor written once after the run (full shape in `shape`) */
} DumpTensor;

typedef struct {
    DumpTensor *t;
    int n, cap, cursor;
    regex_t filter;
    int has_filter;
    int list_only;       /* --list-taps: collect names and shapes of one position */
} Dump;

static void full_name(char *out, size_t n, const ZayaTap *tap) {
    if (tap->layer < 0) snprintf(out, n, "%s", tap->name);
    else snprintf(out, n, "model.layers.%d.%s", tap->layer, tap->name);
}

static void dump_tap(void *ctx, const ZayaTap *tap) {
    Dump *d = ctx;
    if (tap->ragged) return;   /* not a [T, ...] array: --trace shows it */
    char name[160];
    full_name(name, sizeof name, tap);
    /* taps arrive in the same order at every position: try the next expected entry first */
    int idx = -1;
    if (d->n && strcmp(d->t[d->cursor % d->n].name, name) == 0) idx = d->cursor % d->n;
    for (int i = 0; idx < 0 && i < d->n; i++) if (strcmp(d->t[i].name, name) == 0) idx = i;
    if (idx < 0) {
        if (d->has_filter && regexec(&d->filter, name, 0, NULL, 0) != 0) return;
        if (d->n == d->cap) {
            d->cap = d->cap ? 2 * d->cap : 256;
            d->t = realloc(d->t, sizeof(DumpTensor) * (size_t)d->cap);
            if (!d->t) die("out of memory in --dump");
        }
        DumpTensor *t = &d->t[d->n];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%s", name);
        t->is_int = tap->is_int;
        t->ndim = tap->ndim;
        t->shape[0] = tap->shape[0];
        t->shape[1] = tap->shape[1];
        t->row = tap->ndim == 0 ? 1 : tap->ndim == 1 ? (size_t)tap->shape[0] : (size_t)tap->shape[0] * tap->shape[1];
        idx = d->n++;
    }
    d->cursor = idx + 1;
    DumpTensor *t = &d->t[idx];
    if (d->list_only) return;
    if (t->rows == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 16;
        t->data = realloc(t->data, t->cap * t->row * 4);
        if (!t->data) die("out of memory in --dump (tensor %s)", t->name);
    }
    memcpy(t->data + t->rows * t->row * 4, tap->data, t->row * 4);
    t->rows++;
}

static void dump_state_tap(void *ctx, const ZayaTap *tap) {
    Dump *d = ctx;
    int before = d->n;
    dump_tap(ctx, tap);
    if (d->n > before) d->t[d->n - 1].state = 1;
}

/* NumPy format 1.0: magic, version, header length, a dict padded with spaces to 64 bytes. */
static int write_npy(const char *path, const DumpTensor *t) {
    char shape[96];
    if (t->state) {
        if (t->ndim == 2) snprintf(shape, sizeof shape, "(%d, %d)", t->shape[0], t->shape[1]);
        else snprintf(shape, sizeof shape, "(%d,)", t->shape[0]);
    } else if (t->ndim == 0) snprintf(shape, sizeof shape, "(%zu,)", t->rows);
    else if (t->ndim == 1) snprintf(shape, sizeof shape, "(%zu, %d)", t->rows, t->shape[0]);
    else snprintf(shape, sizeof shape, "(%zu, %d, %d)", t->rows, t->shape[0], t->shape[1]);
    char header[256];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       t->is_int ? "<i4" : "<f4", shape);
    int total = (10 + len + 1 + 63) / 64 * 64;
    while (10 + len + 1 < total) header[len++] = ' ';
    header[len++] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xFF), (unsigned char)(len >> 8)};
    size_t nbytes = (t->state ? 1 : t->rows) * t->row * 4;
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)len, f) == (size_t)len &&
             (nbytes == 0 || fwrite(t->data, 1, nbytes, f) == nbytes);
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static void json_number(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

static void write_dump(const char *dir, Dump *d, const ZayaModel *m, const char *model_path, int skip_mode,
                       const int *tokens, int n_tokens) {
    char path[4096];
    snprintf(path, sizeof path, "%s/index.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s: %s\n  hint: check that the folder is writable", path, strerror(errno));
    const char *formats[] = {"fp32", "bf16", "int8"};
    fprintf(f, "{\n  \"format_version\": 1,\n  \"producer\": {\"program\": \"zaya.c\", \"version\": \"%s\", \"commit\": \"%s\"},\n",
            ZAYA_VERSION, ZAYA_COMMIT);
    fprintf(f, "  \"model\": {\"path\": \"");
    for (const char *p = model_path; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        if ((unsigned char)*p >= 0x20) fputc(*p, f);
    }
    fprintf(f, "\", \"source_layout\": \"%s\", \"provenance\": %s},\n", m->source_layout ? "legacy" : "native",
            m->provenance[0] == '{' ? m->provenance : "null");
    fprintf(f, "  \"weight_format\": {\"dtype\": \"%s\", \"group_size\": %d},\n", formats[m->weight_format], m->group_size);
    fprintf(f, "  \"skip_expert\": \"%s\",\n  \"tokens\": [", skip_mode == ZAYA_SKIP_PASSTHROUGH ? "passthrough" : "zero");
    for (int i = 0; i < n_tokens; i++) fprintf(f, "%s%d", i ? ", " : "", tokens[i]);
    fprintf(f, "],\n  \"tensors\": [\n");
    for (int i = 0; i < d->n; i++) {
        DumpTensor *t = &d->t[i];
        char file[200];
        snprintf(file, sizeof file, "%s.npy", t->name);
        for (char *p = file; *p; p++) if (*p == ':') *p = '~';
        snprintf(path, sizeof path, "%s/%s", dir, file);
        if (write_npy(path, t) != 0) die("cannot write %s: %s\n  hint: check the disk space and that the folder is writable", path, strerror(errno));
        size_t n = (t->state ? 1 : t->rows) * t->row, nan = 0, inf = 0, fin = 0;
        double mn = INFINITY, mx = -INFINITY, sum = 0, ss = 0;
        for (size_t k = 0; k < n; k++) {
            double v;
            if (t->is_int) { int32_t iv; memcpy(&iv, t->data + 4 * k, 4); v = iv; }
            else { float fv; memcpy(&fv, t->data + 4 * k, 4); v = fv; }
            if (isnan(v)) { nan++; continue; }
            if (isinf(v)) { inf++; continue; }
            fin++;
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            sum += v;
            ss += v * v;
        }
        fprintf(f, "    {\"name\": \"%s\", \"file\": \"%s\", \"shape\": [", t->name, file);
        if (t->state) fprintf(f, t->ndim == 2 ? "%d, %d" : "%d", t->shape[0], t->shape[1]);
        else if (t->ndim == 0) fprintf(f, "%zu", t->rows);
        else if (t->ndim == 1) fprintf(f, "%zu, %d", t->rows, t->shape[0]);
        else fprintf(f, "%zu, %d, %d", t->rows, t->shape[0], t->shape[1]);
        fprintf(f, "], \"dtype\": \"%s\", \"order\": %d, \"stats\": {\"min\": ", t->is_int ? "int32" : "float32", i);
        json_number(f, fin ? mn : NAN);
        fputs(", \"max\": ", f);
        json_number(f, fin ? mx : NAN);
        fputs(", \"mean\": ", f);
        json_number(f, fin ? sum / (double)fin : NAN);
        fputs(", \"rms\": ", f);
        json_number(f, fin ? sqrt(ss / (double)fin) : NAN);
        fprintf(f, ", \"nan\": %zu, \"inf\": %zu}}%s\n", nan, inf, i + 1 < d->n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    if (fclose(f) != 0) die("cannot write %s/index.json: %s", dir, strerror(errno));
}

/* ---- arguments ---- */

static void usage(FILE *f) {
    fputs("usage: zaya MODEL.bin [options]\n"
          "\n"
          "Generate (default):\n"
          "  -i TEXT            prompt text (encoded as <bos> + text, like the HF fixture prompts)\n"
          "  --ids 2,818,...    prompt as token ids instead of text\n"
          "  -n N               tokens to generate (default 256; 0 with --dump)\n"
          "  -t T               temperature, 0 = greedy (default 1.0)\n"
          "  -p P               top-p (default 0.9)\n"
          "  -s SEED            random seed (default: time)\n"
          "  --print-ids        print generated ids comma-separated instead of text\n"
          "  -m generate|chat   mode (default generate)\n"
          "  -y TEXT            system prompt for chat\n"
          "  --no-think         chat: ask for an answer without a thinking block\n"
          "Model options:\n"
          "  --skip-expert zero|passthrough   skip-expert output: upstream zero (default) or Zyphra fork\n"
          "  --ctx N            context length (default min(4096, max_position_embeddings))\n"
          "  --threads N        OpenMP threads (results are identical for any number)\n"
          "  --batch N          prompt tokens per batch, 1..256 (default 256; results are identical)\n"
          "  --verify           check every tensor's CRC-32 at load\n"
          "  --hugepages        copy the weights into huge-page memory at load: slower start, faster decode\n"
          "Inspection:\n"
          "  --dump DIR         write every intermediate tensor (HF module paths) as .npy + index.json\n"
          "  --dump-filter RE   only tensors whose name matches the POSIX extended regex RE\n"
          "  --list-taps        print the names and shapes of all tensors --dump writes\n"
          "  --trace POS        print every step of forward() at prompt position POS (needs --ids or -i;\n"
          "                     -n 0 unless given; not with --dump; see trace.h)\n"
          "  --trace-layer N    limit --trace to layer N (the model-level steps are still printed)\n"
          "Tokenizer:\n"
          "  --encode           read UTF-8 text from stdin, print HF tokenizer(text) ids\n"
          "  --decode IDS       print HF decode(ids, skip_special_tokens=False)\n"
          "  -h, --help         this help\n", f);
}

/* Parses "2,818,3823" into a new array; every id must be a decimal number below `limit`. */
static int *parse_ids(const char *flag, const char *s, int limit, int *n_out) {
    int cap = 16, n = 0;
    int *ids = malloc(sizeof(int) * (size_t)cap);
    if (!ids) die("out of memory");
    const char *p = s;
    while (1) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') {
            free(ids);
            die("malformed %s at character %d: \"%s\"\n  expected: comma-separated decimal token ids, e.g. %s 2,818,3823\n  found:    %s%.20s%s",
                flag, (int)(p - s) + 1, s, flag, *p ? "\"" : "", *p ? p : "the end of the list", *p ? "\"" : "");
        }
        long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > 2000000000L) break;
        }
        while (*p >= '0' && *p <= '9') p++;   /* the rest of a huge number, for the message */
        if (v >= limit) {
            free(ids);
            die("token id %.*s in %s is outside the vocabulary\n  expected: 0..%d\n  found:    %.*s", (int)(p - start), start, flag, limit - 1,
                (int)(p - start), start);
        }
        if (n == cap) { cap *= 2; ids = realloc(ids, sizeof(int) * (size_t)cap); if (!ids) die("out of memory"); }
        ids[n++] = (int)v;
        while (*p == ' ') p++;
        if (*p == 0) break;
        if (*p != ',') {
            free(ids);
            die("malformed %s at character %d: \"%s\"\n  expected: ',' between ids\n  found:    '%c'", flag, (int)(p - s) + 1, s, *p);
        }
        p++;
    }
    *n_out = n;
    return ids;
}

static long parse_int(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        die("bad value for %s: \"%s\"\n  expected: an integer in %ld..%ld", flag, v, lo, hi);
    return x;
}

static float parse_float(const char *flag, const char *v, float lo, float hi) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        die("bad value for %s: \"%s\"\n  expected: a number in %g..%g", flag, v, (double)lo, (double)hi);
    return x;
}

typedef struct {
    const char *model_path, *prompt, *ids, *dump_dir, *dump_filter, *system_prompt, *decode_ids, *mode;
    int steps, steps_given, print_ids, skip_expert, ctx, threads, batch, verify, hugepages, list_taps, encode, no_think;
    int trace_pos, trace_layer;
    float temperature, topp;
    uint64_t seed;
} Options;

static Options parse_args(int argc, char **argv) {
    Options o = {0};
    o.steps = 256;
    o.temperature = 1.0f;
    o.topp = 0.9f;
    o.seed = (uint64_t)time(NULL);
    o.trace_pos = -1;
    o.trace_layer = -1;
    o.mode = "generate";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        int flag_only = !strcmp(a, "--print-ids") || !strcmp(a, "--verify") || !strcmp(a, "--hugepages") || !strcmp(a, "--list-taps") ||
                        !strcmp(a, "--encode") || !strcmp(a, "--no-think");
        if (a[0] != '-' || !a[1]) {
            if (o.model_path) die("unexpected argument \"%s\"\n  hint: options start with '-'; see zaya -h", a);
            o.model_path = a;
            continue;
        }
        if (flag_only) {
            if (!strcmp(a, "--print-ids")) o.print_ids = 1;
            else if (!strcmp(a, "--verify")) o.verify = 1;
            else if (!strcmp(a, "--hugepages")) o.hugepages = 1;
            else if (!strcmp(a, "--list-taps")) o.list_taps = 1;
            else if (!strcmp(a, "--encode")) o.encode = 1;
            else o.no_think = 1;
            continue;
        }
        static const char *with_value[] = {"-i", "--ids", "-n", "-t", "-p", "-s", "-m", "-y", "--skip-expert", "--ctx",
                                           "--threads", "--batch", "--dump", "--dump-filter", "--trace", "--trace-layer",
                                           "--decode", NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= !strcmp(a, with_value[k]);
        if (!known) die("unknown option \"%s\"\n  hint: see zaya -h for the list of options", a);
        if (i + 1 >= argc) die("option %s needs a value\n  hint: see zaya -h", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-i")) o.prompt = v;
        else if (!strcmp(a, "--ids")) o.ids = v;
        else if (!strcmp(a, "-n")) { o.steps = (int)parse_int(a, v, 0, 1 << 30); o.steps_given = 1; }
        else if (!strcmp(a, "-t")) o.temperature = parse_float(a, v, 0.0f, 100.0f);
        else if (!strcmp(a, "-p")) o.topp = parse_float(a, v, 0.0f, 1.0f);
        else if (!strcmp(a, "-s")) o.seed = (uint64_t)parse_int(a, v, 0, 0x7fffffffffffffffL);
        else if (!strcmp(a, "-m")) {
            if (strcmp(v, "generate") && strcmp(v, "chat")) die("bad value for -m: \"%s\"\n  expected: generate or chat", v);
            o.mode = v;
        } else if (!strcmp(a, "-y")) o.system_prompt = v;
        else if (!strcmp(a, "--skip-expert")) {
            if (!strcmp(v, "zero")) o.skip_expert = ZAYA_SKIP_ZERO;
            else if (!strcmp(v, "passthrough")) o.skip_expert = ZAYA_SKIP_PASSTHROUGH;
            else die("bad value for --skip-expert: \"%s\"\n  expected: zero (upstream transformers/vLLM) or passthrough (Zyphra's fork)", v);
        } else if (!strcmp(a, "--ctx")) o.ctx = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--threads")) o.threads = (int)parse_int(a, v, 1, 1024);
        else if (!strcmp(a, "--batch")) o.batch = (int)parse_int(a, v, 1, ZAYA_BATCH);
        else if (!strcmp(a, "--dump")) o.dump_dir = v;
        else if (!strcmp(a, "--dump-filter")) o.dump_filter = v;
        else if (!strcmp(a, "--trace")) o.trace_pos = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--trace-layer")) o.trace_layer = (int)parse_int(a, v, 0, ZAYA_MAX_LAYERS - 1);
        else if (!strcmp(a, "--decode")) o.decode_ids = v;
    }
    if (!o.model_path) { usage(stderr); die("no model file given\n  hint: zaya MODEL.bin -i \"prompt\" (export MODEL.bin with export_weights.py)"); }
    if (o.prompt && o.ids) die("give the prompt either as -i TEXT or as --ids, not both");
    if ((o.dump_dir || o.trace_pos >= 0) && !o.steps_given) o.steps = 0;
    if (o.trace_pos >= 0 && o.dump_dir) die("--trace and --dump cannot be combined\n  hint: run twice; the values are identical");
    if (o.trace_layer >= 0 && o.trace_pos < 0) die("--trace-layer needs --trace POS");
    return o;
}

/* ---- running ---- */

/* Runs `n` prompt tokens, then generates up to `steps` more (stops at an eos id). Generated ids
 * are printed as ids or streamed as text. Returns the number of generated tokens. */
typedef struct {
    const ZayaModel *m;
    ZayaState *s;
    const Options *o;
    uint64_t rng;
    ProbIndex *scratch;
    int sample_limit;          /* ids >= this are never sampled (not in the tokenizer) */
    double prefill_s, decode_s;
    int prefill_n, decode_n;
} Runner;

static void run_prompt(Runner *r, const int *ids, int n) {
    char err[512];
    double t0 = now_s();
    if (zaya_prefill(r->m, r->s, ids, n, err, sizeof err) != 0) die("%s", err);
    r->prefill_s += now_s() - t0;
    r->prefill_n += n;
}

/* Generation stops at the config's eos ids and at the chat format's stop ids (<|im_end|>, <eos>). */
static int is_eos(const ZayaModel *m, int id) {
    for (int k = 0; k < m->config.n_eos; k++) if (m->config.eos_ids[k] == id) return 1;
    return m->tokenizer && zaya_tok_is_stop(m->tokenizer, id);
}

/* Generates up to `steps` tokens after the prompt; `emit` prints each. Returns the count. */
static int generate(Runner *r, int steps, void (*emit)(Runner *, int, int), int *last) {
    char err[512];
    int n = 0;
    double t0 = now_s();
    while (n < steps) {
        int next = sample(r->s->logits, r->sample_limit, r->o->temperature, r->o->topp, &r->rng, r->scratch);
        emit(r, next, n);
        n++;
        *last = next;
        if (is_eos(r->m, next)) break;
        if (n == steps) break;
        if (r->s->pos >= r->s->ctx) {
            fprintf(stderr, "\nzaya: context is full (%d positions); stopping\n  hint: raise --ctx (max %d)\n",
                    r->s->ctx, r->m->config.max_position);
            break;
        }
        if (zaya_forward(r->m, r->s, next, err, sizeof err) != 0) die("%s", err);
    }
    r->decode_s += now_s() - t0;
    r->decode_n += n;
    return n;
}

static void emit_id(Runner *r, int id, int i) {
    (void)r;
    printf(i ? ",%d" : "%d", id);
    fflush(stdout);
}

/* Streams generated text: only whole UTF-8 characters are printed (zaya_tok_stream_push). Stop
 * tokens end the text and are not printed. */
static ZayaTokStream text_stream;
static void emit_text(Runner *r, int id, int i) {
    (void)i;
    if (is_eos(r->m, id)) return;
    size_t len;
    const char *text = zaya_tok_stream_push(&text_stream, id, &len);
    if (!text) die("out of memory while decoding");
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void flush_text(void) {
    size_t len;
    const char *text = zaya_tok_stream_flush(&text_stream, &len);
    if (text) fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* Generates up to `steps` tokens and prints them: ids with --print-ids (or without a tokenizer),
 * else streamed text. */
static void generate_and_print(Runner *r, int steps, int *last) {
    if (r->o->print_ids || !r->m->tokenizer) {
        generate(r, steps, emit_id, last);
        return;
    }
    zaya_tok_stream_init(&text_stream, r->m->tokenizer, 0);
    generate(r, steps, emit_text, last);
    flush_text();
    zaya_tok_stream_free(&text_stream);
}

static const ZayaTokenizer *need_tokenizer(const ZayaModel *m, const char *what) {
    if (!m->tokenizer)
        die("%s needs the tokenizer, but this blob has none\n  hint: re-export it with export_weights.py from a folder with tokenizer.json", what);
    return m->tokenizer;
}

/* Encodes text like HF tokenizer(text) but without the trailing <|im_end|> that ZAYA1's
 * post-processor appends: a prompt to continue is <bos> + the text's tokens (as in the fixtures). */
static int *encode_prompt(const ZayaTokenizer *tok, const char *text, int *n_out) {
    int *body = NULL, *ids;
    size_t n = 0;
    if (zaya_tok_encode(tok, text, strlen(text), 0, &body, &n) != 0) die("out of memory while encoding the prompt");
    ids = malloc(sizeof(int) * (n + (size_t)tok->n_prefix + 1));
    if (!ids) die("out of memory");
    for (int k = 0; k < tok->n_prefix; k++) ids[k] = tok->prefix[k];
    memcpy(ids + tok->n_prefix, body, sizeof(int) * n);
    *n_out = (int)n + tok->n_prefix;
    free(body);
    return ids;
}

/* --encode: standard input, every byte, to HF tokenizer(text).ids on one line. */
static void run_encode(const ZayaTokenizer *tok) {
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) text = realloc(text, cap *= 2);
    }
    if (!text) die("out of memory reading standard input");
    int *ids = NULL;
    size_t n = 0;
    if (zaya_tok_encode(tok, text, len, 1, &ids, &n) != 0) die("cannot encode %zu bytes (out of memory, or over 256 MB)", len);
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
}

/* Feeds rendered chat text to the model (encoded without special tokens: it carries its own <bos>). */
static void feed_text(Runner *r, const char *text) {
    int *ids = NULL;
    size_t n = 0;
    if (zaya_tok_encode(r->m->tokenizer, text, strlen(text), 0, &ids, &n) != 0) die("out of memory while encoding");
    if (r->s->pos + (int)n > r->s->ctx)
        die("the conversation no longer fits the context (%d + %zu tokens > %d)\n  hint: raise --ctx (max %d) or start over",
            r->s->pos, n, r->s->ctx, r->m->config.max_position);
    if (r->o->print_ids) {    /* --print-ids: show what the model is fed, as ids, on stderr */
        fprintf(stderr, "[fed");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "]\n");
    }
    run_prompt(r, ids, (int)n);
    free(ids);
}

/* Drops the line ending ("\n" or "\r\n") that getline() keeps. */
static void chomp(char *line, ssize_t *len) {
    while (*len > 0 && (line[*len - 1] == '\n' || line[*len - 1] == '\r')) line[--*len] = 0;
}

/* Closes an assistant turn as the template does (turn_end, e.g. "<|im_end|>\n"). */
static void close_assistant_turn(Runner *r) {
    ZayaTokStr end = r->m->tokenizer->chat.turn_end;
    char *text = malloc(end.len + 1);
    if (!text) die("out of memory");
    memcpy(text, end.s, end.len);
    text[end.len] = 0;
    feed_text(r, text);
    free(text);
}

/* -m chat: one user message per line of standard input. Turns are rendered with the checkpoint's chat
 * format (the template family recorded by the exporter); the KV/conv/delayed-value state is kept
 * across turns, so history is never prefilled again. A line "/assistant TEXT" right after a user
 * line gives the assistant's reply instead of generating one (to replay a transcript). */
static void run_chat(Runner *r) {
    const ZayaTokenizer *tok = need_tokenizer(r->m, "-m chat");
    if (tok->chat.family == ZAYA_CHAT_NONE)
        die("this blob has no chat format\n  hint: re-export with export_weights.py --chat-format chatml|gemma");
    const char *replay = "/assistant ";
    int think = !r->o->no_think, turn = 0, interactive = isatty(STDIN_FILENO), have_line = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = 0;
    while (1) {
        if (!have_line) {
            if (interactive) fputs("user> ", stderr);
            if ((len = getline(&line, &cap, stdin)) < 0) break;
        }
        have_line = 0;
        chomp(line, &len);
        char *text;
        if (turn == 0) {   /* <bos>, the system prompt, the first user turn, the generation prompt */
            ZayaChatMessage msgs[2] = {{"system", r->o->system_prompt}, {"user", line}};
            text = r->o->system_prompt ? zaya_tok_chat_render(tok, msgs, 2, 1, think, NULL)
                                       : zaya_tok_chat_render(tok, msgs + 1, 1, 1, think, NULL);
        } else {           /* the user turn and the generation prompt */
            char *user = zaya_tok_chat_turn(tok, "user", line, NULL), *gen = zaya_tok_chat_generation_prompt(tok, think, NULL);
            text = user && gen ? malloc(strlen(user) + strlen(gen) + 1) : NULL;
            if (text) { strcpy(text, user); strcat(text, gen); }
            free(user);
            free(gen);
        }
        if (!text) die("out of memory rendering the chat turn");
        feed_text(r, text);
        free(text);
        turn++;

        if (!interactive && (len = getline(&line, &cap, stdin)) >= 0) {
            if (!strncmp(line, replay, strlen(replay))) {   /* a given reply: feed it, do not generate */
                chomp(line, &len);
                feed_text(r, line + strlen(replay));
                close_assistant_turn(r);
                continue;
            }
            have_line = 1;
        }
        if (interactive) fputs("assistant> ", stderr);
        int last = -1;
        generate_and_print(r, r->o->steps, &last);
        printf("\n");
        fflush(stdout);
        /* the last sampled token was not fed; a stop token is replaced by the template's turn end */
        if (last >= 0 && !is_eos(r->m, last)) {
            if (r->s->pos >= r->s->ctx) die("the conversation no longer fits the context (%d tokens)\n  hint: raise --ctx (max %d)", r->s->ctx, r->m->config.max_position);
            run_prompt(r, &last, 1);
        }
        close_assistant_turn(r);
    }
    free(line);
}

static void report_speed(const Runner *r, double load_s) {
    fprintf(stderr, "load: %.3f s\n", load_s);
    if (r->prefill_n)
        fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s)\n", r->prefill_n, r->prefill_s,
                r->prefill_n / (r->prefill_s > 0 ? r->prefill_s : 1e-9));
    if (r->decode_n)
        fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s)\n", r->decode_n, r->decode_s,
                r->decode_n / (r->decode_s > 0 ? r->decode_s : 1e-9));
}

static void list_taps(const ZayaModel *m, ZayaState *s) {
    Dump d = {0};
    d.list_only = 1;
    s->tap = dump_tap;
    s->tap_ctx = &d;
    char err[512];
    if (zaya_forward(m, s, m->config.bos_id, err, sizeof err) != 0) die("%s", err);
    for (int i = 0; i < d.n; i++) {
        const DumpTensor *t = &d.t[i];
        if (t->ndim == 0) printf("%-64s [T] %s\n", t->name, t->is_int ? "int32" : "float32");
        else if (t->ndim == 1) printf("%-64s [T, %d] float32\n", t->name, t->shape[0]);
        else printf("%-64s [T, %d, %d] float32\n", t->name, t->shape[0], t->shape[1]);
    }
    printf("(after the last position: model.layers.{i}.self_attn.qkv_proj:conv_state, "
           ":delayed_value_state, self_attn:key_cache, self_attn:value_cache)\n");
    free(d.t);
}

static void make_dump_dir(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) die("--dump %s exists and is not a folder\n  hint: give a new or existing folder", dir);
    } else if (mkdir(dir, 0777) != 0) {
        die("cannot create the dump folder %s: %s\n  hint: check the parent folder exists and is writable", dir, strerror(errno));
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/.zaya_write_test", dir);
    FILE *f = fopen(probe, "w");
    if (!f) die("the dump folder %s is not writable: %s", dir, strerror(errno));
    fclose(f);
    remove(probe);
}

int main(int argc, char **argv) {
    Options o = parse_args(argc, argv);
    char err[1024];
#ifdef _OPENMP
    if (o.threads) omp_set_num_threads(o.threads);
#endif
    double t0 = now_s();
    ZayaModel m;
    if (zaya_load(&m, o.model_path, (o.verify ? ZAYA_LOAD_VERIFY : 0) | (o.hugepages ? ZAYA_LOAD_HUGEPAGES : 0), err, sizeof err) != 0) die("%s", err);
    double load_s = now_s() - t0;
    const ZayaConfig *c = &m.config;

    if (o.encode) {
        run_encode(need_tokenizer(&m, "--encode"));
        zaya_free(&m);
        return 0;
    }
    if (o.decode_ids) {
        int n = 0;
        int *ids = parse_ids("--decode", o.decode_ids, c->vocab_size, &n);
        size_t len;
        char *text = zaya_tok_decode(need_tokenizer(&m, "--decode"), ids, (size_t)n, 0, &len);
        if (!text) die("out of memory while decoding");
        fwrite(text, 1, len, stdout);
        free(text);
        free(ids);
        zaya_free(&m);
        return 0;
    }
    int n_prompt = 0;
    int *prompt = NULL;
    if (o.ids) prompt = parse_ids("--ids", o.ids, c->vocab_size, &n_prompt);
    else if (o.prompt) prompt = encode_prompt(need_tokenizer(&m, "-i"), o.prompt, &n_prompt);
    if (o.dump_dir) {
        if (!prompt) die("--dump needs a prompt: --ids 2,818,... or -i TEXT");
        make_dump_dir(o.dump_dir);
    }
    int ctx = o.ctx ? o.ctx : (c->max_position < 4096 ? c->max_position : 4096);
    if (ctx > c->max_position) die("--ctx %d is larger than the model's max_position_embeddings %d", ctx, c->max_position);
    if (n_prompt + o.steps > ctx && (o.dump_dir || o.print_ids) && n_prompt > ctx)
        die("the prompt has %d tokens but the context holds %d\n  hint: raise --ctx (max %d)", n_prompt, ctx, c->max_position);
    ZayaState s;
    if (zaya_state_init(&s, &m, ctx, err, sizeof err) != 0) die("%s", err);
    s.skip_expert = o.skip_expert;
    if (o.batch) s.batch = o.batch;
    if (o.list_taps) { list_taps(&m, &s); zaya_state_free(&s); zaya_free(&m); return 0; }
    int chat = !strcmp(o.mode, "chat");
    if (!prompt && !chat) die("no prompt\n  hint: give -i \"text\" or --ids 2,818,..., or use -m chat");
    if (chat && (prompt || o.dump_dir || o.trace_pos >= 0)) die("-m chat reads the user's messages from standard input: give no -i, --ids, --dump or --trace");
    if (n_prompt > ctx) die("the prompt has %d tokens but the context holds %d\n  hint: raise --ctx (max %d)", n_prompt, ctx, c->max_position);

    ZayaTrace trace = {0};    /* --trace: a second tap consumer (trace.c) */
    if (o.trace_pos >= 0) {
        if (zaya_trace_init(&trace, &m, o.trace_pos, o.trace_layer, prompt, n_prompt, o.skip_expert, stdout, err, sizeof err) != 0)
            die("%s", err);
        s.tap = zaya_trace_tap;
        s.tap_ctx = &trace;
    }
    Dump dump = {0};
    if (o.dump_dir) {
        if (o.dump_filter) {
            if (regcomp(&dump.filter, o.dump_filter, REG_EXTENDED | REG_NOSUB) != 0)
                die("--dump-filter \"%s\" is not a valid POSIX extended regular expression", o.dump_filter);
            dump.has_filter = 1;
        }
        s.tap = dump_tap;
        s.tap_ctx = &dump;
    }
    /* never sample an id the tokenizer cannot print (the embedding has padding rows beyond it) */
    int limit = m.tokenizer && m.tokenizer->n_tokens < c->vocab_size ? m.tokenizer->n_tokens : c->vocab_size;
    Runner r = {&m, &s, &o, o.seed ? o.seed : 0x9E3779B97F4A7C15ull, NULL, limit, 0, 0, 0, 0};
    r.scratch = malloc(sizeof(ProbIndex) * 2 * (size_t)c->vocab_size);
    if (!r.scratch) die("out of memory");
    if (chat) run_chat(&r);
    else {
        run_prompt(&r, prompt, n_prompt);
        int last = -1;
        if (o.steps > 0) {
            s.tap = NULL;   /* dumps cover the prompt positions only */
            generate_and_print(&r, o.steps, &last);
            printf("\n");
            fflush(stdout);   /* before the speed report on stderr */
        }
    }
    if (o.dump_dir) {
        zaya_state_taps(&m, &s, dump_state_tap, &dump);
        write_dump(o.dump_dir, &dump, &m, o.model_path, o.skip_expert, prompt, n_prompt);
        for (int i = 0; i < dump.n; i++) free(dump.t[i].data);
        free(dump.t);
        if (dump.has_filter) regfree(&dump.filter);
    }
    zaya_trace_free(&trace);
    report_speed(&r, load_s);
    free(r.scratch);
    free(prompt);
    zaya_state_free(&s);
    zaya_free(&m);
    return 0;
}
#endif /* ZAYA_NO_MAIN */
