/* kernels.c - the fast path of zaya.c: matrix products, attention, the thread pool, huge pages.
 *
 * The model (zaya.c) calls matmul(), matmuls(), matmul_grouped(), attention() and a few helpers;
 * how they run is decided here. Every fast kernel has a plain-loop twin (matmul_ref,
 * matmul_grouped_ref, attention_ref) that test/test_kernels.c compares it with. The fast kernels compute each output with the same operations in the same order
 * whatever the thread count, the number of tokens per call or the SIMD width (AVX-512, AVX2, arm64 NEON or
 * portable C), so the model's results never depend on them.
 *
 *   1. memory and weight access (bf16, int8 groups in the blob's order, FP8 and MXFP4 dequantized)
 *   2. activations quantized to int16 for int8 weights
 *   3. dot products: AVX-512 / AVX512-VNNI, AVX2 + FMA and arm64 NEON bodies beside their portable C twins
 *      (test/test_simd.py: the same bits from a -march=native build and a portable one; test/test_arm.py:
 *      arm64 builds under qemu give the x86 builds' bits)
 *   4. the thread pool
 *   5. matmul
 *   6. attention
 *   7. huge pages and the int8 row layout
 */
#define _GNU_SOURCE   /* sched_getaffinity, madvise(MADV_HUGEPAGE) */
#include "kernels.h"
#include "ggml_round.h"
#include "torch_cpu.h"
#include "zmath.h"

#include <math.h>
#include <pthread.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
/* AVX2 + FMA without AVX-512: 256-bit twins of the float and int8 dot products (the same operations in the
 * same order, so the same results) */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define AVX2_ONLY 1
#else
#define AVX2_ONLY 0
#endif
/* arm64 (Apple Silicon, ARM servers): 128-bit NEON twins of the float32, bf16 and int8 dot products,
 * again the same operations in the same order as the portable loops (test/test_arm.py). Every arm64
 * compiler turns NEON on, so -DZAYA_PORTABLE keeps a build on the portable loops (make zaya_debug). */
#if defined(__ARM_NEON) && defined(__aarch64__) && !defined(ZAYA_PORTABLE)
#include <arm_neon.h>
#define NEON 1
#else
#define NEON 0
#endif

/* ---------------------------------------------------------------------------------------------
 * 1. Memory and weight access
 * ------------------------------------------------------------------------------------------- */

/* Zeroed memory aligned to a cache line, so that a 64-byte load of activations never straddles two
 * lines (bench/README.md). Freed with free(). */
void *calloc_lines(size_t n, size_t size) {
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

ZayaMatrix matrix_rows(const ZayaMatrix *m, int row0, int nrows) {
    ZayaMatrix r = *m;
    size_t start = (size_t)row0 * (size_t)m->cols;
    r.rows = nrows;
    if (m->dtype == ZAYA_F32) r.data = (const float *)m->data + start;
    else if (m->dtype == ZAYA_BF16) r.data = (const uint16_t *)m->data + start;
    else if (m->dtype == ZAYA_FP8) {   /* one byte per value, one scale per row */
        r.data = (const uint8_t *)m->data + start;
        r.scales = m->scales + row0;
    } else if (m->dtype == ZAYA_MXFP4) {   /* two values per byte, one exponent per 32 (cols % 32 == 0) */
        r.data = (const uint8_t *)m->data + start / 2;
        r.exponents = m->exponents + start / 32;
    } else {   /* row0 is a multiple of ZAYA_Q8_INTERLEAVE where rows are interleaved (kernels_arrange_rows) */
        r.data = (const int8_t *)m->data + start;
        r.scales = m->scales + start / (size_t)m->group_size;
        const int il = m->interleaved_rows - row0;
        r.interleaved_rows = il < 0 ? 0 : il < nrows ? il : nrows;
    }
    return r;
}

/* Where int8 row `row` starts, and *pitch, the distance between its 64-byte chunks: 64 for a row
 * stored alone, 64 * ZAYA_Q8_INTERLEAVE for an interleaved row (the other rows' chunks between). */
static const int8_t *q8_row(const ZayaMatrix *m, int row, int *pitch) {
    const int8_t *d = m->data;
    const int RI = ZAYA_Q8_INTERLEAVE, first = row / RI * RI;   /* the group's first row */
    *pitch = row < m->interleaved_rows ? 64 * RI : 64;
    return row < m->interleaved_rows ? d + (size_t)first * (size_t)m->cols + (row - first) * 64 : d + (size_t)row * (size_t)m->cols;
}

/* The weight at storage position q of a row whose 64-byte chunks are pitch apart (the test of pitch
 * is loop-invariant: the compiler keeps a plain, vectorized loop for rows alone). */
static inline int8_t q8_at(const int8_t *w, size_t q, int pitch) {
    return pitch == 64 ? w[q] : w[q / 64 * (size_t)pitch + q % 64];
}

/* FP8 E4M3FN and MXFP4 weights (format version 2, the experts; docs/quantized-experts.md) are
 * dequantized where they are used, to exactly the numbers the official code materialises:
 *   FP8:   w = round_to(scale dtype, e4m3(q) * scale), round to nearest even (the product is exact
 *          in float32 for bf16 / f16 scales; for f32 scales the multiply is the one rounding);
 *   MXFP4: w = e2m1(nibble) * 2^(e - 127), exact.
 * The kernels then multiply-add them in the same order as float32 weights, so a matrix gives the same
 * bits as the float32 (or bf16) matrix of its dequantized values. */
static inline float f32_of_bits(uint32_t b) { float f; memcpy(&f, &b, sizeof f); return f; }
static inline uint32_t bits_of_f32(float f) { uint32_t b; memcpy(&b, &f, sizeof b); return b; }

/* E4M3FN: the 7 magnitude bits under float32's exponent field make 2^-120 times the value (a float32
 * subnormal for E4M3 subnormals), so one exact multiply by 2^120 decodes normals and subnormals alike. */
static inline float e4m3_to_f32(uint8_t q) {
    return f32_of_bits((uint32_t)(q & 0x80) << 24 | (uint32_t)(q & 0x7f) << 20) * 0x1p120f;
}

/* float32 to the nearest IEEE half (ties to even, subnormals, overflow to inf), as a float32 */
static inline float round_f16(float f) {
    const uint32_t b = bits_of_f32(f), sign = b & 0x80000000u;
    uint32_t a = b ^ sign;
    if (a >= 0x477ff000u) a = a >= 0x7f800000u ? a : 0x7f800000u;   /* 65520 and above round to inf */
    else if (a < 0x38800000u) a = bits_of_f32(rintf(f32_of_bits(a) * 0x1p24f) * 0x1p-24f);   /* below 2^-14: multiples of 2^-24 */
    else a = (a + 0xfffu + ((a >> 13) & 1)) & ~0x1fffu;   /* 10 mantissa bits */
    return f32_of_bits(a | sign);
}

static inline float fp8_weight(uint8_t q, float scale, int scale_dtype) {
    const float w = e4m3_to_f32(q) * scale;
    return scale_dtype == ZAYA_BF16 ? zaya_round_bf16(w) : scale_dtype == ZAYA_F16 ? round_f16(w) : w;
}

/* E2M1 nibble -> value: bit 3 the sign, bits 0-2 index the magnitudes */
static const float E2M1[16] __attribute__((aligned(64))) = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
/* E8M0 byte e -> the bits of 2^(e - 127) (e = 0: the float32 subnormal 2^-127; 255, inf, is refused by
 * the loader's --verify); a table, so that the SIMD kernel broadcasts it straight from memory */
#define E8M0(e) ((e) ? (uint32_t)(e) << 23 : 0x400000u)
#define E8M0_8(e) E8M0(e), E8M0(e + 1), E8M0(e + 2), E8M0(e + 3), E8M0(e + 4), E8M0(e + 5), E8M0(e + 6), E8M0(e + 7)
#define E8M0_64(e) E8M0_8(e), E8M0_8(e + 8), E8M0_8(e + 16), E8M0_8(e + 24), E8M0_8(e + 32), E8M0_8(e + 40), E8M0_8(e + 48), E8M0_8(e + 56)
static const uint32_t E8M0_BITS[256] = {E8M0_64(0), E8M0_64(64), E8M0_64(128), E8M0_64(192)};
#undef E8M0_64
#undef E8M0_8
#undef E8M0
static inline float e8m0_to_f32(uint8_t e) { return f32_of_bits(E8M0_BITS[e]); }

/* The values of an FP8 / MXFP4 row the dot products need beside the bytes. */
typedef struct {
    const uint8_t *exponents;   /* MXFP4: the row's E8M0 bytes */
    float scale;                /* FP8: the row's scale */
    float scale_2p120;          /* FP8: scale * 2^120 when |scale| <= 2^7 (no overflow), else 0 */
    int scale_dtype;            /* FP8: ZAYA_F32, ZAYA_BF16 or ZAYA_F16 */
} QuantRow;

/* Weight i of a row of dtype `kind` (the dot products' portable form). */
static inline float weight_value(int kind, const void *w, const QuantRow *qr, int i) {
    if (kind == ZAYA_BF16) return bf16_to_f32(((const uint16_t *)w)[i]);
    if (kind == ZAYA_FP8) return fp8_weight(((const uint8_t *)w)[i], qr->scale, qr->scale_dtype);
    if (kind == ZAYA_MXFP4) {
        const uint8_t b = ((const uint8_t *)w)[i / 2];
        return E2M1[i % 2 ? b >> 4 : b & 15] * e8m0_to_f32(qr->exponents[i / 32]);
    }
    return ((const float *)w)[i];
}

/* The plain reference of the two formats, written from their definitions (matrix_at). */
static float e4m3_ref(uint8_t q) {
    const int e = (q >> 3) & 15, mant = q & 7;   /* bias 7; e = 0: subnormal mant * 2^-9 */
    const float v = e ? ldexpf((float)(8 + mant), e - 10) : ldexpf((float)mant, -9);
    return q & 0x80 ? -v : v;
}
static float e2m1_ref(int nibble) {
    static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return nibble & 8 ? -magnitude[nibble & 7] : magnitude[nibble & 7];
}

/* Weight [row][i] widened to float32 (int8: dequantized from its stored position). */
static float matrix_at(const ZayaMatrix *m, int row, int i) {
    size_t start = (size_t)row * (size_t)m->cols;
    if (m->dtype == ZAYA_F32) return ((const float *)m->data)[start + i];
    if (m->dtype == ZAYA_BF16) return bf16_to_f32(((const uint16_t *)m->data)[start + i]);
    if (m->dtype == ZAYA_FP8) {
        const float w = e4m3_ref(((const uint8_t *)m->data)[start + i]) * m->scales[row];
        return m->scale_dtype == ZAYA_BF16 ? zaya_round_bf16(w) : m->scale_dtype == ZAYA_F16 ? round_f16(w) : w;
    }
    if (m->dtype == ZAYA_MXFP4) {
        const uint8_t b = ((const uint8_t *)m->data)[(start + i) / 2];
        return e2m1_ref((start + i) % 2 ? b >> 4 : b & 15) * ldexpf(1.0f, m->exponents[(start + i) / 32] - 127);
    }
    int pitch;
    const int8_t *w = q8_row(m, row, &pitch);
    return q8_at(w, zaya_q8_position(i, m->cols, m->group_size), pitch) * m->scales[(start + i) / (size_t)m->group_size];
}

void matrix_row(const ZayaMatrix *m, int row, float *out) {
    if (m->dtype != ZAYA_Q8 || m->cols % m->group_size) {
        for (int i = 0; i < m->cols; i++) out[i] = matrix_at(m, row, i);
        return;
    }
    /* int8: matrix_at's values with zaya_q8_position's permutation walked block by block (no division) */
    const int G = m->group_size, block = 8 * G, whole = G % 2 ? 0 : m->cols / block * block;
    int pitch;
    const int8_t *w = q8_row(m, row, &pitch);
    const float *scale = m->scales + (size_t)row * (size_t)(m->cols / G);
    for (int b0 = 0; b0 < whole; b0 += block)
        for (int k = 0; k < 8; k++)
            for (int j = 0; j < G; j++)
                out[b0 + k * G + j] = q8_at(w, (size_t)b0 + (size_t)(j / 2) * 16 + 2 * k + j % 2, pitch)
                                      * scale[(b0 + k * G) / G];
    for (int i = whole; i < m->cols; i++) out[i] = q8_at(w, (size_t)i, pitch) * scale[i / G];
}

/* ---------------------------------------------------------------------------------------------
 * 2. Activations for int8 weights
 *
 * Activations meet int8 weights as int16 in the weights' groups: xs[g] = max|x| / 32767 over the
 * group, xq = round(x / xs), stored in the weights' interleaved order (zaya_q8_position). Their
 * rounding error (~1e-5 relative) is far below the weights' int8 error, while the dot product is
 * exact integer work.
 * ------------------------------------------------------------------------------------------- */


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

/* Rounds half away from zero (|v| <= 32767 here). copysignf, not a test of the sign: gcc makes that a
 * branch, which the random signs of activations mispredict. */
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


/* ---------------------------------------------------------------------------------------------
 * 3. Dot products
 * ------------------------------------------------------------------------------------------- */

/* The fast dot products. Each is written in plain C that any compiler builds, and as AVX-512 /
 * AVX512-VNNI intrinsics; the float32, bf16 and int8 ones also as AVX2 + FMA intrinsics (for CPUs
 * without AVX-512: 16 lanes as two 8-lane halves) and as arm64 NEON intrinsics (16 lanes as four
 * quarters; int8 x int16 by widening multiply-adds: the dot-product extension's SDOT multiplies int8
 * by int8, and the activations here are int16, so NEON builds with and without it run the same
 * code). All compute exactly the same operations in the
 * same order (16 float lanes with fused multiply-adds, or exact integer sums), so they give
 * bit-identical results; test/test_simd.py checks that on whole models, test/test_kernels.c how far
 * each is from matmul_ref. */
#define LANES 16

static float sum_lanes(const float *acc) {   /* fixed pairwise order: results never depend on the machine */
    float s8[8], s4[4];
    for (int l = 0; l < 8; l++) s8[l] = acc[l] + acc[l + 8];
    for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#if defined(__AVX512F__) || AVX2_ONLY
/* sum_lanes of lanes 0..7 given as s8 (lanes 8..15 already added), in registers: the same additions
 * in the same order as sum_lanes, without storing the accumulators and reloading them one by one */
static inline float sum_lanes_s8(__m256 s8) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));   /* s4[0] + s4[2], s4[1] + s4[3] */
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif
#ifdef __AVX512F__
static inline float sum_lanes_512(__m512 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return sum_lanes_s8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}
#endif

#ifdef __AVX512F__
/* 16 weights i..i+15 of a float32 or bf16 row, as float32 (bf16: the bits shifted up, exact) */
static inline __m512 float_weights_512(int kind, const void *w, size_t i) {
    return kind == ZAYA_BF16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i))), 16))
                             : _mm512_loadu_ps((const float *)w + i);
}

/* 16 FP8 weights from q: fp8_weight lane by lane (the same bit tricks; the hardware's f16 conversion
 * rounds to nearest even like round_f16) */
static inline __m512 fp8_weights_512(const uint8_t *q, const QuantRow *qr) {
    /* each byte sign-extended, shifted by 20: its sign bit lands on bit 31 (and on 27..30, masked off) */
    const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q));
    const __m512 raw = _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(b, 20), _mm512_set1_epi32((int)0x87f00000u)));
    /* raw * 2^120 * scale: one multiply by scale * 2^120 where that is a float (the same real product,
     * rounded once), else the exact multiply by 2^120 first */
    const __m512 w = qr->scale_2p120 != 0.0f ? _mm512_mul_ps(raw, _mm512_set1_ps(qr->scale_2p120))
                                             : _mm512_mul_ps(_mm512_mul_ps(raw, _mm512_set1_ps(0x1p120f)), _mm512_set1_ps(qr->scale));
    if (qr->scale_dtype == ZAYA_BF16) {
        const __m512i u = _mm512_castps_si512(w), one = _mm512_set1_epi32(1);
        const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
        return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u)));
    }
    if (qr->scale_dtype == ZAYA_F16) return _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return w;
}

/* MXFP4 weights i..i+15 (i a multiple of 16) of a row: the lane of weight i + m holds nibble m of the 8
 * bytes in its low 4 bits, which pick its value from `table`, the 16 E2M1 values times the group's
 * power of two (exact). With VBMI one multishift takes each lane's nibble from the 8 bytes broadcast
 * (the shuffle port is what limits this kernel); without, each byte twice, shifted by 0 and 4. */
static inline __m512 mxfp4_16(const uint8_t *q, int i, __m512 table) {
#ifdef __AVX512VBMI__
    uint64_t b8;
    memcpy(&b8, q + i / 2, 8);
    const __m512i at = _mm512_set_epi64(0x3c3c3c3c38383838, 0x3434343430303030, 0x2c2c2c2c28282828, 0x2424242420202020,
                                        0x1c1c1c1c18181818, 0x1414141410101010, 0x0c0c0c0c08080808, 0x0404040400000000);
    const __m512i idx = _mm512_multishift_epi64_epi8(at, _mm512_set1_epi64((long long)b8));   /* lane m: bits 4m.. */
#else
    const __m128i b = _mm_loadl_epi64((const __m128i *)(q + i / 2));
    const __m512i idx = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b)),
                                          _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0));
#endif
    return _mm512_permutexvar_ps(idx, table);   /* the index's low 4 bits: the nibble */
}
static inline __m512 mxfp4_table(const QuantRow *qr, int i) {   /* the group of weight i */
    return _mm512_mul_ps(_mm512_load_ps(E2M1), _mm512_castsi512_ps(_mm512_set1_epi32((int)E8M0_BITS[qr->exponents[i / 32]])));
}
static inline __m512 mxfp4_weights_512(const uint8_t *q, const QuantRow *qr, int i) { return mxfp4_16(q, i, mxfp4_table(qr, i)); }
#endif

/* Weights of dtype `kind` (float32, bf16, or FP8 / MXFP4 dequantized as weight_value does) x float32
 * activations for nt <= DOT_TOKENS tokens at once: per token two chains of 16 lanes of fused
 * multiply-adds (blocks of 16 values alternate between them, so a single token is not held up by the
 * FMA latency), the chains added lane by lane, then sum_lanes. Token t's result is the same operations
 * in the same order whatever nt and kind are; several tokens only share each weight load. */
#define DOT_TOKENS 8
/* One token against bf16 rows: the loop reads 64 weight bytes per two multiply-adds, too few for the
 * hardware to keep enough of the stream in flight; a software prefetch this many bytes ahead (into
 * the next row at a row's end) does (bench/results/zaya1-8b.md). */
#define BF16_PREFETCH 2048
static inline __attribute__((always_inline)) void
dot_float_n(float *out, const int nt, const void *wv, const int kind, const QuantRow *qr, const float *x, size_t x_stride, int n) {
    float acc[DOT_TOKENS][LANES];
    int i = 0;
#ifdef __AVX512F__
    const uint16_t *wb = wv;
    const uint8_t *wq = wv;
#define W512(i) (kind == ZAYA_FP8 ? fp8_weights_512(wq + (i), qr) : kind == ZAYA_MXFP4 ? mxfp4_weights_512(wq, qr, (i)) \
                 : float_weights_512(kind, wv, (i)))
    __m512 a[DOT_TOKENS], b[DOT_TOKENS];
    for (int t = 0; t < nt; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (; i + 2 * LANES <= n; i += 2 * LANES) {
        __m512 w0, w1;
        if (kind == ZAYA_MXFP4) {   /* i is a multiple of 32: one group, one table */
            const __m512 table = mxfp4_table(qr, i);
            w0 = mxfp4_16(wq, i, table), w1 = mxfp4_16(wq, i + LANES, table);
        } else w0 = W512(i), w1 = W512(i + LANES);
        if (kind == ZAYA_BF16 && nt == 1) _mm_prefetch((const char *)(wb + i) + BF16_PREFETCH, _MM_HINT_T0);   /* decode */
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
#if AVX2_ONLY
    if (kind == ZAYA_F32 || kind == ZAYA_BF16) {   /* 16 lanes as two 8-float halves (lo, hi) per chain */
#define W256(i) (kind == ZAYA_BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32( \
                     _mm_loadu_si128((const __m128i *)((const uint16_t *)wv + (i)))), 16)) : _mm256_loadu_ps((const float *)wv + (i)))
        __m256 alo[DOT_TOKENS], ahi[DOT_TOKENS], blo[DOT_TOKENS], bhi[DOT_TOKENS];
        for (int t = 0; t < nt; t++) alo[t] = ahi[t] = blo[t] = bhi[t] = _mm256_setzero_ps();
        for (; i + 2 * LANES <= n; i += 2 * LANES) {
            const __m256 w0 = W256(i), w1 = W256(i + 8), w2 = W256(i + 16), w3 = W256(i + 24);
            for (int t = 0; t < nt; t++) {
                const float *xt = x + t * x_stride + i;
                alo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), alo[t]);
                ahi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), ahi[t]);
                blo[t] = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xt + 16), blo[t]);
                bhi[t] = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xt + 24), bhi[t]);
            }
        }
        if (i + LANES <= n) {             /* an odd last block: the first chain's */
            const __m256 w0 = W256(i), w1 = W256(i + 8);
            for (int t = 0; t < nt; t++) {
                alo[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * x_stride + i), alo[t]);
                ahi[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * x_stride + i + 8), ahi[t]);
            }
            i += LANES;
        }
#undef W256
        for (int t = 0; t < nt; t++) {
            _mm256_storeu_ps(acc[t], _mm256_add_ps(alo[t], blo[t]));
            _mm256_storeu_ps(acc[t] + 8, _mm256_add_ps(ahi[t], bhi[t]));
        }
    } else
#elif NEON
    if (kind == ZAYA_F32 || kind == ZAYA_BF16) {   /* 16 lanes as four 4-float quarters per chain */
#define WN(i) (kind == ZAYA_BF16 ? vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)wv + (i)), 16)) \
                                 : vld1q_f32((const float *)wv + (i)))
        float32x4_t a[DOT_TOKENS][4], b[DOT_TOKENS][4];
        for (int t = 0; t < nt; t++)
            for (int q = 0; q < 4; q++) a[t][q] = b[t][q] = vdupq_n_f32(0.0f);
        for (; i + 2 * LANES <= n; i += 2 * LANES) {
            float32x4_t w8[8];
            for (int q = 0; q < 8; q++) w8[q] = WN(i + 4 * q);
            for (int t = 0; t < nt; t++) {
                const float *xt = x + t * x_stride + i;
                for (int q = 0; q < 4; q++) {   /* vfmaq_f32(acc, w, x) = fmaf(w, x, acc) lane by lane */
                    a[t][q] = vfmaq_f32(a[t][q], w8[q], vld1q_f32(xt + 4 * q));
                    b[t][q] = vfmaq_f32(b[t][q], w8[4 + q], vld1q_f32(xt + LANES + 4 * q));
                }
            }
        }
        if (i + LANES <= n) {             /* an odd last block: the first chain's */
            float32x4_t w4[4];
            for (int q = 0; q < 4; q++) w4[q] = WN(i + 4 * q);
            for (int t = 0; t < nt; t++)
                for (int q = 0; q < 4; q++)
                    a[t][q] = vfmaq_f32(a[t][q], w4[q], vld1q_f32(x + t * x_stride + i + 4 * q));
            i += LANES;
        }
#undef WN
        for (int t = 0; t < nt; t++)
            for (int q = 0; q < 4; q++) vst1q_f32(acc[t] + 4 * q, vaddq_f32(a[t][q], b[t][q]));
    } else
#endif
    {
        float acc2[DOT_TOKENS][LANES];
        for (int t = 0; t < nt; t++) memset(acc[t], 0, sizeof acc[t]), memset(acc2[t], 0, sizeof acc2[t]);
        for (int k = 0; i + LANES <= n; i += LANES, k++) {
            float (*chain)[LANES] = k % 2 ? acc2 : acc;   /* block k's chain */
            for (int t = 0; t < nt; t++)
                for (int l = 0; l < LANES; l++)
                    chain[t][l] = fmaf(weight_value(kind, wv, qr, i + l), x[t * x_stride + i + l], chain[t][l]);
        }
        for (int t = 0; t < nt; t++)
            for (int l = 0; l < LANES; l++) acc[t][l] += acc2[t][l];
    }
#endif
    for (int t = 0; t < nt; t++) {
        for (int j = i, l = 0; j < n; j++, l++) acc[t][l] = fmaf(weight_value(kind, wv, qr, j), x[t * x_stride + j], acc[t][l]);
        out[t] = sum_lanes(acc[t]);
    }
}

#ifdef __AVX512F__
/* Two rows of a float32 or bf16 matrix (rows_apart values apart) x nt <= PAIR_TOKENS tokens, for rows
 * whose width is a multiple of 32: for each (row, token) the same two chains, the same operations in
 * the same order as dot_float_n, so the same results. Each weight load serves nt tokens and each
 * activation load both rows: one row at a time, prefill waited on its activation loads; two rows at a
 * time it runs near the core's multiply-add peak (bench/results/zaya1-8b.md). */
#define PAIR_TOKENS 6
static inline __attribute__((always_inline)) void
dot_float_pair_n(float *out0, float *out1, const int nt, const void *wv, size_t rows_apart, const int kind, const float *x,
                 size_t x_stride, int n) {
    __m512 a0[PAIR_TOKENS], b0[PAIR_TOKENS], a1[PAIR_TOKENS], b1[PAIR_TOKENS];
    for (int t = 0; t < nt; t++) a0[t] = b0[t] = a1[t] = b1[t] = _mm512_setzero_ps();
#define W512(r, i) float_weights_512(kind, wv, (r) * rows_apart + (i))
    for (int i = 0; i < n; i += 2 * LANES) {
        const __m512 w00 = W512(0, i), w01 = W512(0, i + LANES), w10 = W512(1, i), w11 = W512(1, i + LANES);
        for (int t = 0; t < nt; t++) {
            const __m512 x0 = _mm512_loadu_ps(x + t * x_stride + i), x1 = _mm512_loadu_ps(x + t * x_stride + i + LANES);
            a0[t] = _mm512_fmadd_ps(w00, x0, a0[t]);
            b0[t] = _mm512_fmadd_ps(w01, x1, b0[t]);
            a1[t] = _mm512_fmadd_ps(w10, x0, a1[t]);
            b1[t] = _mm512_fmadd_ps(w11, x1, b1[t]);
        }
    }
#undef W512
    for (int t = 0; t < nt; t++) {
        out0[t] = sum_lanes_512(_mm512_add_ps(a0[t], b0[t]));
        out1[t] = sum_lanes_512(_mm512_add_ps(a1[t], b1[t]));
    }
}
static void dot_float_pair(float *out0, float *out1, int nt, const void *w, size_t rows_apart, int kind, const float *x,
                           size_t x_stride, int n) {
#define CASE(k, K) case k: dot_float_pair_n(out0, out1, k, w, rows_apart, K, x, x_stride, n); break;
#define TOKENS(K) switch (nt) { CASE(1, K) CASE(2, K) CASE(3, K) CASE(4, K) CASE(5, K) default: CASE(6, K) }
    if (kind == ZAYA_BF16) TOKENS(ZAYA_BF16) else TOKENS(ZAYA_F32)
#undef TOKENS
#undef CASE
}
#endif

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
#pragma GCC unroll 8   /* a block of the default group size 64 in one pass */
            for (int s = 0; s < block; s += 64) {
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
#elif AVX2_ONLY
    __m256 a[DOT_TOKENS];
    for (int t = 0; t < nt; t++) a[t] = _mm256_setzero_ps();
    if (group % 8 == 0)   /* 64 values per iteration: four 16-value steps; _mm256_madd_epi16 adds the pair of
                           * each group (lane k of every step is group k), exact integer sums as the loop below */
        for (; b < nb; b++) {
            __m256i isum[DOT_TOKENS];
            for (int t = 0; t < nt; t++) isum[t] = _mm256_setzero_si256();
            const int8_t *wb = w + (size_t)b * block / 64 * pitch;
            for (int s = 0; s < block; s += 64) {
                const int8_t *c = wb + s / 64 * pitch;
                const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)c));
                const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 16)));
                const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 32)));
                const __m256i w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 48)));
                for (int t = 0; t < nt; t++) {
                    const __m256i *xb = (const __m256i *)(xq + t * xq_stride + (size_t)b * block + s);
                    const __m256i p01 = _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(xb)),
                                                         _mm256_madd_epi16(w1, _mm256_loadu_si256(xb + 1)));
                    const __m256i p23 = _mm256_add_epi32(_mm256_madd_epi16(w2, _mm256_loadu_si256(xb + 2)),
                                                         _mm256_madd_epi16(w3, _mm256_loadu_si256(xb + 3)));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(p01, p23));
                }
            }
            const __m256 wscale = _mm256_loadu_ps(ws + (size_t)b * 8);
            for (int t = 0; t < nt; t++)
                a[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(wscale, _mm256_loadu_ps(xs + t * xs_stride + (size_t)b * 8)), a[t]);
        }
    if (b == nb && nb * 8 == n / group) {   /* no tail: the lane sums in registers (lanes 8..15 are 0) */
        for (int t = 0; t < nt; t++) out[t] = sum_lanes_s8(_mm256_add_ps(a[t], _mm256_setzero_ps()));
        return;
    }
    for (int t = 0; t < nt; t++) _mm256_storeu_ps(acc[t], a[t]);
#elif NEON
    /* 16 values per step: int8 weights widened to int16, multiply-long-added (vmlal_s16) into four int32
     * accumulators whose lanes hold groups (0,0,1,1), (2,2,3,3), (4,4,5,5), (6,6,7,7) of the block; vpaddq
     * then adds each group's pair: the exact integer sums of the loop below. */
    if (group % 8 == 0) {
        float32x4_t alo[DOT_TOKENS], ahi[DOT_TOKENS];   /* acc[0..3], acc[4..7] */
        for (int t = 0; t < nt; t++) alo[t] = ahi[t] = vdupq_n_f32(0.0f);
        for (; b < nb; b++) {
            int32x4_t s[DOT_TOKENS][4];
            for (int t = 0; t < nt; t++) s[t][0] = s[t][1] = s[t][2] = s[t][3] = vdupq_n_s32(0);
            const int8_t *wb = w + (size_t)b * block / 64 * pitch;
            for (int p = 0; p < block; p += 16) {
                const int8x16_t w16 = vld1q_s8(wb + p / 64 * pitch + p % 64);
                const int16x8_t w0 = vmovl_s8(vget_low_s8(w16)), w1 = vmovl_high_s8(w16);
                for (int t = 0; t < nt; t++) {
                    const int16_t *xb = xq + t * xq_stride + (size_t)b * block + p;
                    const int16x8_t x0 = vld1q_s16(xb), x1 = vld1q_s16(xb + 8);
                    s[t][0] = vmlal_s16(s[t][0], vget_low_s16(w0), vget_low_s16(x0));
                    s[t][1] = vmlal_high_s16(s[t][1], w0, x0);
                    s[t][2] = vmlal_s16(s[t][2], vget_low_s16(w1), vget_low_s16(x1));
                    s[t][3] = vmlal_high_s16(s[t][3], w1, x1);
                }
            }
            const float32x4_t wlo = vld1q_f32(ws + (size_t)b * 8), whi = vld1q_f32(ws + (size_t)b * 8 + 4);
            for (int t = 0; t < nt; t++) {   /* acc[k] = fmaf((float)isum[k], ws[k] * xs[k], acc[k]) */
                const float *xst = xs + t * xs_stride + (size_t)b * 8;
                const int32x4_t glo = vpaddq_s32(s[t][0], s[t][1]), ghi = vpaddq_s32(s[t][2], s[t][3]);   /* isum[k] */
                alo[t] = vfmaq_f32(alo[t], vcvtq_f32_s32(glo), vmulq_f32(wlo, vld1q_f32(xst)));
                ahi[t] = vfmaq_f32(ahi[t], vcvtq_f32_s32(ghi), vmulq_f32(whi, vld1q_f32(xst + 4)));
            }
        }
        for (int t = 0; t < nt; t++) vst1q_f32(acc[t], alo[t]), vst1q_f32(acc[t] + 4, ahi[t]);
    }
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
 * w + 64 r, 64 RI apart) against one token: decode reads the group as one weight stream, and each
 * activation load serves all its rows (the kernel is bound by its loads: two 64-byte loads of
 * activations for two 32-byte loads of weights). ws: the first row's scales, the next rows' follow
 * n / group apart. Per row the same operations in the same order as dot_q8_n with nt = 1, so the
 * same results. */
_Static_assert(ZAYA_Q8_INTERLEAVE <= DOT_TOKENS, "matmul_rows takes a group's results in r[DOT_TOKENS]");
static void dot_q8_interleaved(float *out, const int8_t *w, const float *ws, const int16_t *xq, const float *xs,
                               int n, int group) {
    enum { RI = ZAYA_Q8_INTERLEAVE };
#if Q8_VNNI
    if (q8_whole_blocks(n, group)) {   /* what kernels_arrange_rows requires; else the general path below */
        const int block = 8 * group, nb = n / block;
        __m256 a[RI];
        for (int r = 0; r < RI; r++) a[r] = _mm256_setzero_ps();
        for (int b = 0; b < nb; b++) {
            __m512i s0[RI], s1[RI];   /* per row, two chains */
            for (int r = 0; r < RI; r++) s0[r] = s1[r] = _mm512_setzero_si512();
            const int8_t *wb = w + (size_t)b * block * RI;
            const int16_t *xb = xq + (size_t)b * block;
#pragma GCC unroll 8
            for (int s = 0; s < block; s += 64) {
                const __m512i x0 = _mm512_loadu_si512(xb + s), x1 = _mm512_loadu_si512(xb + s + 32);
                for (int r = 0; r < RI; r++) {
                    const int8_t *c = wb + (size_t)s * RI + 64 * r;   /* row r's chunk */
                    s0[r] = _mm512_dpwssd_epi32(s0[r], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)c)), x0);
                    s1[r] = _mm512_dpwssd_epi32(s1[r], _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(c + 32))), x1);
                }
            }
            for (int r = 0; r < RI; r++)
                a[r] = q8_block_acc(a[r], s0[r], s1[r], _mm256_loadu_ps(ws + (size_t)r * (n / group) + (size_t)b * 8), xs + (size_t)b * 8);
        }
        for (int r = 0; r < RI; r++) out[r] = sum_lanes_s8(_mm256_add_ps(a[r], _mm256_setzero_ps()));
        return;
    }
#endif
    for (int r = 0; r < RI; r++) dot_q8_n(out + r, 1, w + 64 * r, 64 * RI, ws + (size_t)r * (n / group), xq, 0, xs, 0, n, group);
}

/* dot_q8_n and dot_float_n with the token count fixed at compile time, so the accumulators live in
 * registers */
static void dot_q8(float *out, int nt, const int8_t *w, int pitch, const float *ws, const int16_t *xq, size_t xq_stride,
                   const float *xs, size_t xs_stride, int n, int group) {
#define CASE(k) case k: dot_q8_n(out, k, w, pitch, ws, xq, xq_stride, xs, xs_stride, n, group); break;
    switch (nt) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) default: CASE(8) }
#undef CASE
}

/* (and the weights' dtype: one specialised loop per dtype) */
static void dot_float(float *out, int nt, const void *w, int kind, const QuantRow *qr, const float *x, size_t x_stride, int n) {
#define CASE(k, K) case k: dot_float_n(out, k, w, K, qr, x, x_stride, n); break;
#define TOKENS(K) switch (nt) { CASE(1, K) CASE(2, K) CASE(3, K) CASE(4, K) CASE(5, K) CASE(6, K) CASE(7, K) default: CASE(8, K) }
    switch (kind) {
    case ZAYA_BF16: TOKENS(ZAYA_BF16) break;
    case ZAYA_FP8: TOKENS(ZAYA_FP8) break;
    case ZAYA_MXFP4: TOKENS(ZAYA_MXFP4) break;
    default: TOKENS(ZAYA_F32) break;
    }
#undef TOKENS
#undef CASE
}

/* Output rows [o0, o1) for n tokens: tokens DOT_TOKENS at a time against every row of the range, so
 * one group of tokens' activations stays in the L1 cache while it meets the rows (float32 and bf16
 * weights: PAIR_TOKENS at a time against pairs of rows). The tokens'
 * int16 form (int8 weights): rows xq_cols values apart. */
static void matmul_rows(float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n,
                        const int16_t *xq, const float *xqs, int xq_cols, int o0, int o1) {
    const int cols = w->cols, G = w->group_size;
#ifdef __AVX512F__
    if ((w->dtype == ZAYA_BF16 || w->dtype == ZAYA_F32) && n > 1 && cols % (2 * LANES) == 0) {   /* prefill: pairs of rows */
        const size_t size = w->dtype == ZAYA_BF16 ? 2 : 4;
        for (int t = 0; t < n; t += PAIR_TOKENS) {
            const int nt = n - t < PAIR_TOKENS ? n - t : PAIR_TOKENS;
            float r0[PAIR_TOKENS], r1[PAIR_TOKENS];
            int o = o0;
            for (; o + 2 <= o1; o += 2) {
                dot_float_pair(r0, r1, nt, (const char *)w->data + (size_t)o * cols * size, (size_t)cols, w->dtype, x + (size_t)t * xs, (size_t)xs, cols);
                for (int k = 0; k < nt; k++) y[(size_t)(t + k) * ys + o] = r0[k], y[(size_t)(t + k) * ys + o + 1] = r1[k];
            }
            if (o < o1) {
                dot_float(r0, nt, (const char *)w->data + (size_t)o * cols * size, w->dtype, NULL, x + (size_t)t * xs, (size_t)xs, cols);
                for (int k = 0; k < nt; k++) y[(size_t)(t + k) * ys + o] = r0[k];
            }
        }
        return;
    }
#endif
    for (int t = 0; t < n; t += DOT_TOKENS) {
        const int nt = n - t < DOT_TOKENS ? n - t : DOT_TOKENS;
        float r[DOT_TOKENS];
        for (int o = o0; o < o1; o++) {
            const size_t row = (size_t)o * (size_t)cols;
            if (w->dtype == ZAYA_Q8) {
                int pitch;
                const int8_t *wr = q8_row(w, o, &pitch);
                const int RI = ZAYA_Q8_INTERLEAVE;
                if (nt == 1 && o % RI == 0 && o + RI <= o1 && o + RI <= w->interleaved_rows) {   /* decode: a group at once */
                    dot_q8_interleaved(r, wr, w->scales + row / (size_t)G, xq + (size_t)t * xq_cols, xqs + (size_t)t * (xq_cols / G), cols, G);
                    for (int k = 0; k < RI; k++) y[(size_t)t * ys + o + k] = r[k];
                    o += RI - 1;
                    continue;
                }
                dot_q8(r, nt, wr, pitch, w->scales + row / (size_t)G, xq + (size_t)t * xq_cols, (size_t)xq_cols,
                       xqs + (size_t)t * (xq_cols / G), (size_t)(xq_cols / G), cols, G);
            } else if (w->dtype == ZAYA_BF16) dot_float(r, nt, (const uint16_t *)w->data + row, ZAYA_BF16, NULL, x + (size_t)t * xs, (size_t)xs, cols);
            else if (w->dtype == ZAYA_FP8) {
                const float sc = w->scales[o];
                const QuantRow qr = {NULL, sc, fabsf(sc) <= 0x1p7f ? sc * 0x1p120f : 0.0f, w->scale_dtype};
                dot_float(r, nt, (const uint8_t *)w->data + row, ZAYA_FP8, &qr, x + (size_t)t * xs, (size_t)xs, cols);
            } else if (w->dtype == ZAYA_MXFP4) {
                const QuantRow qr = {w->exponents + row / 32, 0.0f, 0.0f, 0};
                dot_float(r, nt, (const uint8_t *)w->data + row / 2, ZAYA_MXFP4, &qr, x + (size_t)t * xs, (size_t)xs, cols);
            } else dot_float(r, nt, (const float *)w->data + row, ZAYA_F32, NULL, x + (size_t)t * xs, (size_t)xs, cols);
            for (int k = 0; k < nt; k++) y[(size_t)(t + k) * ys + o] = r[k];
        }
    }
}


/* ---------------------------------------------------------------------------------------------
 * 4. The thread pool
 *
 * A job is a number of independent pieces of work. The calling thread publishes it, then takes pieces
 * itself, one at a time, like every worker that is running; it waits only for pieces that another
 * thread has already taken. A worker the OS has descheduled (another program wants the core) takes
 * nothing and holds nobody up. A piece taken just before its thread was descheduled does hold the
 * caller up, for as long as the OS keeps that thread off its core (a stall). Whether other programs
 * want the cores, or the host (a hypervisor) took a core for a moment, the machine's count of
 * runnable threads tells: more than its cores, and the caller runs the next jobs alone, looking
 * again every SOLO_CHECK jobs for free cores for its threads; a host's hiccup costs one wait and
 * nothing after. Workers spin for a while between jobs (the next one usually comes within
 * microseconds), then sleep. Which thread runs a piece never changes its result.
 * ------------------------------------------------------------------------------------------- */

typedef void (*PieceFn)(void *ctx, int piece);

#define MAX_PIECES 0xffff
#define WORKER_SPIN_NS 1000000   /* a worker polls this long for the next job before it sleeps */
#define CALLER_SPINS 2000    /* polls of the caller between sched_yield() calls while it waits */
/* A wait for another thread's piece this long, and twice as long as the caller's fastest piece
 * of the job, is a stall: that thread was descheduled. Where the count of runnable threads cannot
 * be read (no /proc), two stalls within STALL_WINDOW jobs with threads send the caller alone for
 * SOLO_JOBS jobs (a few tokens). */
#define STALL_NS 1000000
#define SOLO_CHECK 256
#define STALL_WINDOW 512
#define SOLO_JOBS 1024

typedef struct {   /* the fields the threads write each on its own cache line */
    _Alignas(64) _Atomic uint64_t claim;   /* job << 32 | next piece << 16 | pieces */
    _Alignas(64) _Atomic uint32_t done;    /* pieces finished of the current job */
    _Alignas(64) PieceFn fn;               /* the current job (written before claim publishes it) */
    void *ctx;
    int threads;                   /* including the caller */
    pthread_t *workers;            /* threads - 1 */
    int cpus;                      /* the machine's online cores */
    uint32_t job;                  /* the caller's job counter */
    uint32_t solo_left;            /* while other programs want the cores: jobs the caller runs alone
                                    * before it looks again */
    uint32_t calm;                 /* jobs with threads since the last stall (STALL_WINDOW at the start) */
    uint64_t stalls, busy_stalls, solo_jobs, stall_ns;   /* counts and the time waited (kernels_pool_report) */
    _Alignas(64) _Atomic int sleepers, stop;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
} Pool;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Takes and runs pieces of job `job` until none is left (or a newer job has replaced it). With
 * shortest not NULL (the caller), *shortest = the fastest of its pieces in ns (UINT64_MAX if none). */
static void run_pieces(Pool *p, uint32_t job, uint64_t *shortest) {
    uint64_t c = atomic_load(&p->claim);
    uint32_t ran = 0;
    if (shortest) *shortest = UINT64_MAX;
    while ((uint32_t)(c >> 32) == job && ((c >> 16) & 0xffff) < (c & 0xffff)) {
        if (!atomic_compare_exchange_weak(&p->claim, &c, c + (1u << 16))) continue;   /* c reloaded */
        const uint64_t t0 = shortest ? now_ns() : 0;
        p->fn(p->ctx, (int)((c >> 16) & 0xffff));   /* safe: the job cannot end before this piece is done */
        if (shortest) {
            const uint64_t took = now_ns() - t0;
            *shortest = took < *shortest ? took : *shortest;
        }
        ran++;
        c = atomic_load(&p->claim);
    }
    if (ran) atomic_fetch_add(&p->done, ran);   /* once: the caller waits for all pieces, not for each */
}

static uint32_t current_job(Pool *p) { return (uint32_t)(atomic_load(&p->claim) >> 32); }

static void *worker_main(void *arg) {
    Pool *p = arg;
    uint32_t seen = 0;
    for (;;) {
        const uint64_t t0 = now_ns();
        for (int spins = 0; current_job(p) == seen && !atomic_load(&p->stop);) {
            if (++spins % 256 || now_ns() - t0 < WORKER_SPIN_NS) { cpu_relax(); continue; }
            pthread_mutex_lock(&p->mutex);   /* sleep until the caller publishes a job */
            atomic_fetch_add(&p->sleepers, 1);
            while (current_job(p) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->mutex);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mutex);
            spins = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = current_job(p);
        run_pieces(p, seen, NULL);
    }
}

/* The machine's runnable threads (running or waiting for a core) now: /proc/loadavg's fourth field
 * "runnable/total"; -1 where it cannot be read. */
static int runnable_threads(void) {
    char buf[128];
    const int fd = open("/proc/loadavg", O_RDONLY);
    if (fd < 0) return -1;
    const ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = 0;
    const char *q = buf;
    for (int field = 0; field < 3 && q; field++) q = strchr(q + 1, ' ');   /* past the three averages */
    return q ? atoi(q + 1) : -1;
}

/* Runs fn(ctx, piece) for piece = 0 .. pieces-1 on the pool's threads; returns when all are done. */
static void pool_run(Pool *p, PieceFn fn, void *ctx, int pieces) {
    if (p->solo_left && pieces > 1 && --p->solo_left == 0) {   /* alone for a while: free cores now? */
        const int r = runnable_threads();   /* our sleeping workers are not counted, the caller is */
        p->solo_left = r >= 0 && r - 1 + p->threads > p->cpus ? SOLO_CHECK : 0;
    }
    if (p->threads == 1 || pieces == 1 || p->solo_left) {
        p->solo_jobs += p->solo_left > 0 && pieces > 1;
        for (int i = 0; i < pieces; i++) fn(ctx, i);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->done, 0);
    const uint32_t job = ++p->job;
    atomic_store(&p->claim, (uint64_t)job << 32 | (uint32_t)pieces);
    if (atomic_load(&p->sleepers)) {   /* a worker that checked before the store sleeps until woken */
        pthread_mutex_lock(&p->mutex);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mutex);
    }
    uint64_t piece_ns;
    run_pieces(p, job, &piece_ns);
    p->calm += p->calm < UINT32_MAX;
    if (atomic_load(&p->done) == (uint32_t)pieces) return;
    const uint64_t t1 = now_ns();
    for (int spins = 0; atomic_load(&p->done) < (uint32_t)pieces;)
        if (++spins % CALLER_SPINS) cpu_relax();
        else sched_yield();            /* a piece's thread was descheduled: let it run */
    const uint64_t waited = now_ns() - t1;
    if (waited >= STALL_NS && (piece_ns == UINT64_MAX || waited >= 2 * piece_ns)) {   /* a stall */
        const int r = runnable_threads();
        p->stalls++;
        p->stall_ns += waited;
        if (r >= 0 ? r > p->cpus : p->calm < STALL_WINDOW) {   /* other programs want the cores */
            p->busy_stalls++;
            p->solo_left = r >= 0 ? SOLO_CHECK : SOLO_JOBS;   /* alone for a while (same results) */
        }
        p->calm = 0;
    }
}

static void pool_stop(Pool *p) {
    pthread_mutex_lock(&p->mutex);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mutex);
    for (int i = 0; i < p->threads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_mutex_destroy(&p->mutex);
    pthread_cond_destroy(&p->wake);
}

static int pool_start(Pool *p, int threads) {
    memset(p, 0, sizeof *p);
    p->threads = 1;
    p->calm = STALL_WINDOW;
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    p->cpus = cpus > 0 ? (int)cpus : 1;
    if (pthread_mutex_init(&p->mutex, NULL) || pthread_cond_init(&p->wake, NULL)) return -1;
    if (threads > 1 && !(p->workers = calloc((size_t)threads - 1, sizeof(pthread_t)))) return -1;
    for (int i = 0; i < threads - 1; i++, p->threads++)
        if (pthread_create(&p->workers[i], NULL, worker_main, p) != 0) { pool_stop(p); return -1; }
    return 0;
}

int zaya_default_threads(void) {
#ifdef __linux__   /* (macOS has no affinity masks: its online cores) */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

struct Kernels {
    Pool pool;
    int max_cols, max_tokens;
    int16_t *xq;       /* activations quantized for int8 weights [max_tokens, max_cols] */
    float *xq_scales;  /* their scales, one per group */
    int ggml;          /* the ggml placement: KERNELS_GGML_* flags (kernels_set_ggml), 0 off */
    float *ggml_x;     /* the activations as ggml's vec_dot_type holds them [max_tokens, max_cols] */
    float *ggml_s;     /* Q8_1: each block's second scale minus the sum of its values [max_tokens, max_cols / 32] */
};

Kernels *kernels_new(int threads, int max_cols, int max_tokens) {
    Kernels *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    k->max_cols = max_cols;
    k->max_tokens = max_tokens;
    k->xq = calloc_lines((size_t)max_cols * max_tokens, sizeof(int16_t));
    k->xq_scales = calloc_lines((size_t)max_cols * max_tokens, sizeof(float));
    if (!k->xq || !k->xq_scales || pool_start(&k->pool, threads > 0 ? threads : zaya_default_threads()) != 0) {
        free(k->xq);
        free(k->xq_scales);
        free(k);
        return NULL;
    }
    return k;
}

void kernels_set_ggml(Kernels *k, int mode) {
    if (mode && !k->ggml_x) k->ggml_x = calloc_lines((size_t)k->max_cols * k->max_tokens, sizeof(float));
    if (mode && !k->ggml_s) k->ggml_s = calloc_lines((size_t)(k->max_cols / 32 + 1) * k->max_tokens, sizeof(float));
    k->ggml = k->ggml_x && k->ggml_s ? mode : 0;
}

void kernels_free(Kernels *k) {
    if (!k) return;
    pool_stop(&k->pool);
    free(k->ggml_x);
    free(k->ggml_s);
    free(k->xq);
    free(k->xq_scales);
    free(k);
}

int kernels_threads(const Kernels *k) { return k->pool.threads; }

void kernels_pool_report(const Kernels *k, char *line, size_t len) {
    const Pool *p = &k->pool;
    snprintf(line, len, "pool: %llu stalls (%llu with other programs busy; %.1f ms waited), %llu of %llu parallel jobs run alone",
             (unsigned long long)p->stalls, (unsigned long long)p->busy_stalls, p->stall_ns / 1e6,
             (unsigned long long)p->solo_jobs, (unsigned long long)(p->job + p->solo_jobs));
}

/* ---------------------------------------------------------------------------------------------
 * 5. matmul
 * ------------------------------------------------------------------------------------------- */

/* Multiply-adds below which a product runs on the calling thread alone: a job would cost more. */
#define PARALLEL_MIN_WORK 100000
/* Rows per tile: the tile's weights stay in L2 while all tokens of the call meet them, so a prompt
 * reads the weights from memory once. A piece of a job is a run of whole tiles. */
#define ROW_TILE 64
/* Pieces per thread and job: a few, so that a thread that runs late finds some left to take; but
 * no piece under PIECE_MIN_WORK multiply-adds (each piece costs the threads a meeting on its claim). */
#define PIECES_PER_THREAD 4
#define PIECE_MIN_WORK (1 << 20)

typedef struct {
    const MatmulOut *out;
    int count, groups;         /* products; groups of each one's rows (matmul_grouped) */
    const float *x;
    int xs, n;
    const int16_t *xq;
    const float *xqs;
    int in_cols;               /* the input's width: groups * cols */
    int tiles_per_piece;       /* a piece: a run of the products' row tiles, taken one product after another */
} MatmulJob;

/* Row tiles [tile0, tile1) of the products' tiles taken one after another. */
static void matmul_piece(void *ctx, int piece) {
    const MatmulJob *j = ctx;
    const int tile0 = piece * j->tiles_per_piece, tile1 = tile0 + j->tiles_per_piece;
    for (int i = 0, first = 0; i < j->count && first < tile1; first += (j->out[i++].w->rows + ROW_TILE - 1) / ROW_TILE) {
        const MatmulOut *m = &j->out[i];
        const ZayaMatrix *w = m->w;
        const int cols = w->cols, scales = w->dtype == ZAYA_Q8 ? cols / w->group_size : 0, group_rows = w->rows / j->groups;
        const int o0 = (tile0 > first ? tile0 - first : 0) * ROW_TILE, o1 = (tile1 - first) * ROW_TILE < w->rows ? (tile1 - first) * ROW_TILE : w->rows;
        for (int o = o0, end; o < o1; o = end) {   /* tiles, cut where a group of rows ends */
            const int group = o / group_rows, group_end = (group + 1) * group_rows;
            end = o + ROW_TILE < o1 ? o + ROW_TILE : o1;
            end = end < group_end ? end : group_end;
            matmul_rows(m->y, m->ys, w, j->x + (size_t)group * cols, j->xs, j->n, j->xq + (size_t)group * cols,
                        j->xqs + (size_t)group * scales, j->in_cols, o, end);
        }
    }
}

typedef struct { const ZayaMatrix *w; const float *x; int xs, n, in_cols, per; int16_t *xq; float *xqs; } QuantizeJob;

static void quantize_piece(void *ctx, int piece) {   /* the groups of tokens [piece*per, piece*per + per) */
    const QuantizeJob *j = ctx;
    const int cols = j->in_cols, G = j->w->group_size;
    for (int t = piece * j->per; t < j->n && t < (piece + 1) * j->per; t++)
        for (int g = 0; g < cols / G; g++)
            quantize_q16(j->xq + (size_t)t * cols, j->xqs + (size_t)t * (cols / G), j->x + (size_t)t * j->xs, cols, G, g);
}

/* The ZAYA port's grouped conv (KERNELS_GGML_CONV): W (float32) and X rounded to F16, float32 sums in
 * plain loops (a small product: C rows of d * t1). */
static void conv_f16_product(float *y, int ys, const ZayaMatrix *w, int groups, const float *x, int xs, int n) {
    const int group_rows = w->rows / groups;
    const float *wf = w->data;
    for (int t = 0; t < n; t++)
        for (int o = 0; o < w->rows; o++) {
            const float *xg = x + (size_t)t * xs + (size_t)(o / group_rows) * w->cols, *wo = wf + (size_t)o * w->cols;
            float sum = 0.0f;
            for (int i = 0; i < w->cols; i++) sum += ggml_round_f16(wo[i]) * ggml_round_f16(xg[i]);
            y[(size_t)t * ys + o] = sum;
        }
}

/* ggml's Q4_1 / Q5_1 dot product with Q8_1 activations: d d_x sum(q q_x) + m s, where the product of the
 * dequantized weights (d q + m) with the values the activations stand for gives m d_x sum(q_x) for the second
 * term. Adds m (s - d_x sum q_x) per block of 32 (s_excess, ggml_round_row_s), m the block's minimum: q = 0
 * stands for m, and llama-quantize's Q4_1 / Q5_1 (quantize_row_q4_1_ref, no imatrix) gives every block a q = 0. */
static void q8_1_second_scale(const MatmulOut *out, int count, const float *s_excess, int n) {
    for (int i = 0; i < count; i++) {
        const ZayaMatrix *w = out[i].w;
        const int blocks = w->cols / 32;
        for (int o = 0; o < w->rows; o++)
            for (int b = 0; b < blocks; b++) {
                float m = INFINITY;
                for (int j = 32 * b; j < 32 * b + 32; j++) {
                    const size_t at = (size_t)o * w->cols + j;
                    const float v = w->dtype == ZAYA_BF16 ? bf16_to_f32(((const uint16_t *)w->data)[at])
                                                          : ((const float *)w->data)[at];
                    m = v < m ? v : m;
                }
                for (int t = 0; t < n; t++) out[i].y[(size_t)t * out[i].ys + o] += m * s_excess[(size_t)t * blocks + b];
            }
    }
}

/* count products of one input (the same format and width) as one job; groups > 1: count = 1. */
static void matmul_job(Kernels *k, const MatmulOut *out, int count, int groups, const float *x, int xs, int n) {
    const ZayaMatrix *w = out[0].w;
    if (groups > 1 && k->ggml & KERNELS_GGML_CONV && w->dtype == ZAYA_F32) {   /* the port's F16 conv */
        conv_f16_product(out[0].y, out[0].ys, w, groups, x, xs, n);
        return;
    }
    const int ggml_input = groups == 1 && k->ggml & (KERNELS_GGML_X86 | KERNELS_GGML_REF) && w->ggml_type > 0;
    const int q8_1 = ggml_input && ggml_vec_dot_type(w->ggml_type - 1) == GGML_T_Q8_1 && w->cols % 32 == 0
                     && (w->dtype == ZAYA_F32 || w->dtype == ZAYA_BF16);
    if (ggml_input) {
        for (int t = 0; t < n; t++)   /* the input as ggml's vec_dot_type for this weight type holds it */
            ggml_round_row_s(k->ggml_x + (size_t)t * w->cols, q8_1 ? k->ggml_s + (size_t)t * (w->cols / 32) : NULL,
                             x + (size_t)t * xs, w->cols, w->ggml_type - 1, k->ggml & KERNELS_GGML_X86);
        x = k->ggml_x;
        xs = w->cols;
    }
    size_t work = 0;
    int tiles = 0;
    for (int i = 0; i < count; i++) {
        work += (size_t)out[i].w->rows * (size_t)w->cols * (size_t)n;
        tiles += (out[i].w->rows + ROW_TILE - 1) / ROW_TILE;
    }
    const int threads = work >= PARALLEL_MIN_WORK ? k->pool.threads : 1, in_cols = groups * w->cols;
    if (w->dtype == ZAYA_Q8) {   /* the tokens' int16 form (once for all the products), several tokens at once in parallel */
        const int pieces = (size_t)n * in_cols >= PARALLEL_MIN_WORK / 8 && threads > 1 && n > 1
                           ? (n < threads * PIECES_PER_THREAD ? n : threads * PIECES_PER_THREAD) : 1;
        QuantizeJob q = {w, x, xs, n, in_cols, (n + pieces - 1) / pieces, k->xq, k->xq_scales};
        pool_run(&k->pool, quantize_piece, &q, pieces);
    }
    /* pieces start at a multiple of ROW_TILE (and so of ZAYA_Q8_INTERLEAVE) */
    const size_t by_work = work / PIECE_MIN_WORK;
    int pieces = threads == 1 ? 1 : by_work < (size_t)threads ? threads
                               : by_work < (size_t)threads * PIECES_PER_THREAD ? (int)by_work : threads * PIECES_PER_THREAD;
    pieces = pieces < tiles ? pieces : tiles;
    int per = (tiles + pieces - 1) / pieces;
    if ((tiles + per - 1) / per > MAX_PIECES) per = (tiles + MAX_PIECES - 1) / MAX_PIECES;
    MatmulJob j = {out, count, groups, x, xs, n, k->xq, k->xq_scales, in_cols, per};
    pool_run(&k->pool, matmul_piece, &j, (tiles + per - 1) / per);
    if (q8_1) q8_1_second_scale(out, count, k->ggml_s, n);
}

void matmul(Kernels *k, float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n) {
    const MatmulOut out = {w, y, ys};
    matmul_job(k, &out, 1, 1, x, xs, n);
}

void matmul_grouped(Kernels *k, float *y, int ys, const ZayaMatrix *w, int groups, const float *x, int xs, int n) {
    const MatmulOut out = {w, y, ys};
    matmul_job(k, &out, 1, groups, x, xs, n);
}

void matmuls(Kernels *k, const MatmulOut *out, int count, const float *x, int xs, int n) {
    int same = 1;   /* one quantized input serves products of one format */
    for (int i = 1; i < count; i++)
        same = same && out[i].w->dtype == out[0].w->dtype && out[i].w->group_size == out[0].w->group_size
               && (!k->ggml || out[i].w->ggml_type == out[0].w->ggml_type);   /* ggml: one vec_dot_type */
    if (same) matmul_job(k, out, count, 1, x, xs, n);
    else for (int i = 0; i < count; i++) matmul_job(k, &out[i], 1, 1, x, xs, n);
}

/* The reference: y[o] = sum_i W[o][i] * x[i] in plain loops, float32 activations (int8 weights
 * dequantized, the activations not quantized); row o of a grouped product reads the input's
 * columns of its group. */
void matmul_grouped_ref(float *y, int ys, const ZayaMatrix *w, int groups, const float *x, int xs, int n) {
    const int group_rows = w->rows / groups;
    for (int t = 0; t < n; t++)
        for (int o = 0; o < w->rows; o++) {
            const float *xg = x + (size_t)t * xs + (size_t)(o / group_rows) * w->cols;
            float sum = 0.0f;
            for (int i = 0; i < w->cols; i++) sum += matrix_at(w, o, i) * xg[i];
            y[(size_t)t * ys + o] = sum;
        }
}

void matmul_ref(float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n) {
    matmul_grouped_ref(y, ys, w, 1, x, xs, n);
}

/* matmul_chain: Y[t][o] as torch's CPU nn.Linear sums it (kernels.h): blocks of k (torch_k_block), each a
 * float32 fused multiply-add chain from 0, added in order to the bias. The fast form takes CHAIN_OUTS outputs
 * at once, their rows widened and transposed ([k][CHAIN_OUTS]), and CHAIN_ROWS tokens of them: each lane is
 * still its own chain in k order, so the bits are matmul_chain_ref's. Pieces are panels of outputs. */
#define CHAIN_OUTS 16
#define CHAIN_ROWS 8
typedef struct {
    float *y, *buf;   /* buf: 2 * CHAIN_OUTS * cols floats per piece */
    int ys, n, xs, per;
    const ZayaMatrix *w;
    const float *bias, *x;
} ChainJob;

/* acc[r][o] = fma chain over k0 <= k < k1 of x[r * xs + k] * wt[k * CHAIN_OUTS + o], for r < tn, from 0: each
 * lane its own chain in k order, so the SIMD forms give the plain loop's bits */
static void chain_tile(float acc[CHAIN_ROWS][CHAIN_OUTS], const float *x, size_t xs, int tn, const float *wt, int k0,
                       int k1) {
    int r0 = 0;
#if defined(__AVX512F__)
    if (tn == CHAIN_ROWS) {
        __m512 a[CHAIN_ROWS];
        for (int r = 0; r < CHAIN_ROWS; r++) a[r] = _mm512_setzero_ps();
        for (int k = k0; k < k1; k++) {
            const __m512 w = _mm512_loadu_ps(wt + (size_t)k * CHAIN_OUTS);
            for (int r = 0; r < CHAIN_ROWS; r++) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * xs + k]), w, a[r]);
        }
        for (int r = 0; r < CHAIN_ROWS; r++) _mm512_storeu_ps(acc[r], a[r]);
        r0 = CHAIN_ROWS;
    }
#elif AVX2_ONLY
    for (; r0 + 4 <= tn; r0 += 4) {   /* 4 rows of two 8-lane halves: 8 accumulators */
        __m256 a[4][2];
        for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
        for (int k = k0; k < k1; k++) {
            const __m256 w0 = _mm256_loadu_ps(wt + (size_t)k * CHAIN_OUTS);
            const __m256 w1 = _mm256_loadu_ps(wt + (size_t)k * CHAIN_OUTS + 8);
            for (int r = 0; r < 4; r++) {
                const __m256 xv = _mm256_set1_ps(x[(r0 + r) * xs + k]);
                a[r][0] = _mm256_fmadd_ps(xv, w0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(xv, w1, a[r][1]);
            }
        }
        for (int r = 0; r < 4; r++) _mm256_storeu_ps(acc[r0 + r], a[r][0]), _mm256_storeu_ps(acc[r0 + r] + 8, a[r][1]);
    }
#elif NEON
    for (; r0 + 4 <= tn; r0 += 4) {   /* 4 rows of four 4-lane quarters: 16 accumulators */
        float32x4_t a[4][4];
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 4; q++) a[r][q] = vdupq_n_f32(0.0f);
        for (int k = k0; k < k1; k++) {
            float32x4_t w[4];
            for (int q = 0; q < 4; q++) w[q] = vld1q_f32(wt + (size_t)k * CHAIN_OUTS + 4 * q);
            for (int r = 0; r < 4; r++) {
                const float32x4_t xv = vdupq_n_f32(x[(r0 + r) * xs + k]);
                for (int q = 0; q < 4; q++) a[r][q] = vfmaq_f32(a[r][q], xv, w[q]);
            }
        }
        for (int r = 0; r < 4; r++)
            for (int q = 0; q < 4; q++) vst1q_f32(acc[r0 + r] + 4 * q, a[r][q]);
    }
#endif
    for (int r = r0; r < tn; r++) {   /* the plain loop: the rows left (all of them without SIMD) */
        for (int o = 0; o < CHAIN_OUTS; o++) acc[r][o] = 0.0f;
        for (int k = k0; k < k1; k++)
            for (int o = 0; o < CHAIN_OUTS; o++)
                acc[r][o] = fmaf(x[r * xs + k], wt[(size_t)k * CHAIN_OUTS + o], acc[r][o]);
    }
}

static void chain_piece(void *ctx, int piece) {
    const ChainJob *j = ctx;
    const int K = j->w->cols, block = torch_k_block(K);
    float bias[CHAIN_OUTS] = {0};
    float *rows = j->buf + (size_t)piece * K * CHAIN_OUTS * 2, *wt = rows + (size_t)K * CHAIN_OUTS;
    for (int o0 = piece * j->per * CHAIN_OUTS; o0 < j->w->rows && o0 < (piece + 1) * j->per * CHAIN_OUTS;
         o0 += CHAIN_OUTS) {
        const int outs = j->w->rows - o0 < CHAIN_OUTS ? j->w->rows - o0 : CHAIN_OUTS;
        memset(wt, 0, sizeof(float) * (size_t)K * CHAIN_OUTS);
        for (int o = 0; o < outs; o++) bias[o] = j->bias ? j->bias[o0 + o] : 0.0f;
        for (int o = 0; o < outs; o++) matrix_row(j->w, o0 + o, rows + (size_t)o * K);
        for (int o = 0; o < outs; o++)
            for (int k = 0; k < K; k++) wt[(size_t)k * CHAIN_OUTS + o] = rows[(size_t)o * K + k];
        for (int t0 = 0; t0 < j->n; t0 += CHAIN_ROWS) {
            const int tn = j->n - t0 < CHAIN_ROWS ? j->n - t0 : CHAIN_ROWS;
            float sum[CHAIN_ROWS][CHAIN_OUTS];
            const float *x = j->x + (size_t)t0 * j->xs;
            for (int k0 = 0; k0 < K; k0 += block) {
                const int k1 = k0 + block < K ? k0 + block : K;
                float acc[CHAIN_ROWS][CHAIN_OUTS];
                chain_tile(acc, x, (size_t)j->xs, tn, wt, k0, k1);
                for (int r = 0; r < tn; r++)
                    for (int o = 0; o < CHAIN_OUTS; o++)
                        sum[r][o] = k0 > 0 ? sum[r][o] + acc[r][o] : j->bias ? bias[o] + acc[r][o] : acc[r][o];
            }
            for (int r = 0; r < tn; r++)
                memcpy(j->y + (size_t)(t0 + r) * j->ys + o0, sum[r], sizeof(float) * (size_t)outs);
        }
    }
}

void matmul_chain(Kernels *k, float *y, int ys, const ZayaMatrix *w, const float *bias, const float *x, int xs, int n) {
    const int panels = (w->rows + CHAIN_OUTS - 1) / CHAIN_OUTS;
    const size_t work = (size_t)w->rows * (size_t)w->cols * (size_t)n;
    const int threads = work >= PARALLEL_MIN_WORK ? k->pool.threads : 1;
    int pieces = threads * PIECES_PER_THREAD < panels ? threads * PIECES_PER_THREAD : panels;
    const int per = (panels + pieces - 1) / pieces;
    pieces = (panels + per - 1) / per;
    float *buf = malloc(sizeof(float) * (size_t)w->cols * CHAIN_OUTS * 2 * (size_t)pieces);
    if (!buf) {   /* out of memory for the widened rows: the plain loops give the same bits */
        matmul_chain_ref(y, ys, w, bias, x, xs, n);
        return;
    }
    ChainJob j = {y, buf, ys, n, xs, per, w, bias, x};
    pool_run(&k->pool, chain_piece, &j, pieces);
    free(buf);
}

void matmul_chain_ref(float *y, int ys, const ZayaMatrix *w, const float *bias, const float *x, int xs, int n) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < w->rows; o++) {
            float sum = 0.0f;
            for (int k0 = 0; k0 < w->cols; k0 += torch_k_block(w->cols)) {
                float acc = 0.0f;
                for (int i = k0; i < w->cols && i < k0 + torch_k_block(w->cols); i++)
                    acc = fmaf(x[(size_t)t * xs + i], matrix_at(w, o, i), acc);
                sum = k0 > 0 ? sum + acc : bias ? bias[o] + acc : acc;
            }
            y[(size_t)t * ys + o] = sum;
        }
}

/* ---------------------------------------------------------------------------------------------
 * 6. Attention
 * ------------------------------------------------------------------------------------------- */

/* The rows of a KV head are short streams and the hardware prefetchers stop at every 4 KB page:
 * attention asks for the row KV_AHEAD positions ahead. Only a hint; never faults. */
#define KV_AHEAD 8
static void prefetch_row(const KvCache *kv, const float *cache, int h, int pos) {
    const float *row = cache + kv_row(kv, h, pos);
    for (int i = 0; i < kv->d; i += 16) __builtin_prefetch(row + i);   /* one 64-byte line each */
}

/* Scores q_n . k_t * scale of query heads [n0, n1) (all of KV head h) for keys first..pos, into
 * p[n * n_keys + t - first]: each key is loaded once for up to DOT_TOKENS heads. bf16: the product
 * and the scaled score rounded to bfloat16. */
static void attention_scores(const KvCache *kv, int h, const float *q, float *p, int n0, int n1, int first, int pos,
                             float scale, int bf16, int f16) {
    const int d = kv->d, n_keys = pos - first + 1;
    for (int t = first; t <= pos; t++) {
        const float *key = kv->keys + kv_row(kv, h, t);
        if (f16) {   /* ggml: an F16 cache's keys times the query converted to F16 (its vec_dot_type), float sums */
            for (int n = n0; n < n1; n++) {
                float dot = 0.0f;
                for (int i = 0; i < d; i++) dot += ggml_round_f16(key[i]) * ggml_round_f16(q[(size_t)n * d + i]);
                p[(size_t)n * n_keys + (t - first)] = dot * scale;
            }
            continue;
        }
        if (t + KV_AHEAD <= pos) prefetch_row(kv, kv->keys, h, t + KV_AHEAD);
        for (int n = n0; n < n1; n += DOT_TOKENS) {
            const int nr = n1 - n < DOT_TOKENS ? n1 - n : DOT_TOKENS;
            float dots[DOT_TOKENS];
            dot_float(dots, nr, key, ZAYA_F32, NULL, q + (size_t)n * d, (size_t)d, d);
            for (int j = 0; j < nr; j++)
                p[(size_t)(n + j) * n_keys + (t - first)] = bf16 ? zaya_round_bf16(zaya_round_bf16(dots[j]) * scale) : dots[j] * scale;
        }
    }
}

/* o_n = sum_t p_n[t] v_t for query heads [n0, n1) of KV head h, added in position order, four
 * positions per pass over o where their slots are adjacent; bf16: the sum rounded to bfloat16. */
static void attention_values(const KvCache *kv, int h, const float *p, float *out, int n0, int n1, int first, int pos,
                             int bf16, int f16) {
    const int d = kv->d, n_keys = pos - first + 1;
    memset(out + (size_t)n0 * d, 0, (size_t)(n1 - n0) * d * sizeof(float));
    for (int t = first; f16 && t <= pos; t++) {   /* ggml: F16 values times the probabilities converted to F16 */
        const float *v = kv->values + kv_row(kv, h, t);
        for (int n = n0; n < n1; n++) {
            const float pt = ggml_round_f16(p[(size_t)n * n_keys + (t - first)]);
            for (int i = 0; i < d; i++) out[(size_t)n * d + i] += pt * ggml_round_f16(v[i]);
        }
    }
    for (int t = f16 ? pos + 1 : first, nt; t <= pos; t += nt) {
        const int slot = t < kv->cache_len ? t : t % kv->cache_len;
        nt = pos - t + 1 >= 4 && kv->cache_len - slot >= 4 ? 4 : 1;
        const float *v = kv->values + kv_row(kv, h, t);
        for (int j = t + KV_AHEAD; j < t + KV_AHEAD + nt && j <= pos; j++) prefetch_row(kv, kv->values, h, j);
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
    for (size_t i = (size_t)n0 * d; bf16 && i < (size_t)n1 * d; i++) out[i] = zaya_round_bf16(out[i]);
}

typedef struct {
    float *out, *probs;
    const float *q;
    const KvCache *kv;
    int g, per, first, pos;   /* query heads per KV head, heads per piece */
    float scale;
    int bf16, f16;            /* f16: ggml's F16 KV cache (KERNELS_GGML_KV) */
    int fa;                   /* ggml's flash attention (KERNELS_GGML_FA) */
} AttentionJob;

/* ggml-cpu's flash attention, ggml_compute_forward_flash_attn_ext_f16_one_chunk (ops.cpp), for query heads [n0, n1)
 * of KV head h over keys first..pos in position order: the query converted to the cache's type (F16: its
 * vec_dot_type), s = q . k (float32 sums) * scale; online softmax in float32 (M the largest score so far, S the sum):
 * a new maximum scales the accumulator by expf(M_old - M), else the value's weight is expf(s - M); F16 cache: the
 * accumulator is F16, each scale and each fused multiply-add rounded to F16 (ggml_vec_scale_f16, ggml_vec_mad_f16);
 * at the end the accumulator times 1 / S. llama.cpp casts an F32 cache's keys and values to F16 for it (llama-graph.cpp
 * build_attn_mha): the port's flash attention always runs on F16 keys, values and query, so this does too. */
static void attention_flash(const KvCache *kv, int h, const float *q, float *out, int n0, int n1, int first, int pos,
                            float scale) {
    const int d = kv->d;
    for (int n = n0; n < n1; n++) {
        const float *qn = q + (size_t)n * d;
        float *acc = out + (size_t)n * d, S = 0.0f, M = -INFINITY;
        for (int i = 0; i < d; i++) acc[i] = 0.0f;
        for (int t = first; t <= pos; t++) {
            const float *key = kv->keys + kv_row(kv, h, t), *v = kv->values + kv_row(kv, h, t);
            float s = 0.0f;
            for (int i = 0; i < d; i++) s += ggml_round_f16(key[i]) * ggml_round_f16(qn[i]);
            s = s * scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > M) {
                const float m_old = M;
                M = s;
                ms = expf(m_old - M);
                for (int i = 0; i < d; i++) acc[i] = ggml_round_f16(acc[i] * ms);
            } else {
                vs = expf(s - M);
            }
            for (int i = 0; i < d; i++) acc[i] = ggml_round_f16(fmaf(ggml_round_f16(v[i]), vs, acc[i]));
            S = S * ms + vs;
        }
        const float s_inv = S == 0.0f ? 0.0f : 1.0f / S;
        for (int i = 0; i < d; i++) acc[i] *= s_inv;
    }
}

/* A piece: `per` query heads of one KV head (a KV head's g heads read its keys and values once). */
static void attention_piece(void *ctx, int piece) {
    const AttentionJob *j = ctx;
    const int splits = (j->g + j->per - 1) / j->per, h = piece / splits;
    const int n0 = h * j->g + piece % splits * j->per, n1 = n0 + j->per < (h + 1) * j->g ? n0 + j->per : (h + 1) * j->g;
    const int n_keys = j->pos - j->first + 1;
    attention_scores(j->kv, h, j->q, j->probs, n0, n1, j->first, j->pos, j->scale, j->bf16, j->f16);
    for (int n = n0; n < n1; n++) softmax(j->probs + (size_t)n * n_keys, n_keys);
    for (size_t i = (size_t)n0 * n_keys; j->bf16 && i < (size_t)n1 * n_keys; i++) j->probs[i] = zaya_round_bf16(j->probs[i]);
    if (j->fa) attention_flash(j->kv, h, j->q, j->out, n0, n1, j->first, j->pos, j->scale);   /* F16 K, V, query (above) */
    else attention_values(j->kv, h, j->probs, j->out, n0, n1, j->first, j->pos, j->bf16, j->f16);
}

void attention(Kernels *k, float *out, float *probs, const float *q, int nq, const KvCache *kv, int first, int pos,
               float scale, int bf16) {
    const int g = nq / kv->nkv, threads = (size_t)nq * (pos - first + 1) * kv->d >= PARALLEL_MIN_WORK / 4 ? k->pool.threads : 1;
    /* whole KV groups while there are enough of them for the threads; else groups split */
    const int splits = threads <= kv->nkv ? 1 : (threads + kv->nkv - 1) / kv->nkv < g ? (threads + kv->nkv - 1) / kv->nkv : g;
    AttentionJob j = {out, probs, q, kv, g, (g + splits - 1) / splits, first, pos, scale, bf16,
                      (k->ggml & KERNELS_GGML_KV) != 0, (k->ggml & KERNELS_GGML_FA) != 0};
    pool_run(&k->pool, attention_piece, &j, kv->nkv * ((g + j.per - 1) / j.per));
}

void attention_ref(float *out, float *probs, const float *q, int nq, const KvCache *kv, int first, int pos, float scale,
                   int bf16) {
    const int d = kv->d, g = nq / kv->nkv, n_keys = pos - first + 1;
    for (int n = 0; n < nq; n++) {
        float *p = probs + (size_t)n * n_keys, *o = out + (size_t)n * d;
        for (int t = first; t <= pos; t++) {
            const float *key = kv->keys + kv_row(kv, n / g, t);
            float s = 0.0f;
            for (int i = 0; i < d; i++) s += q[(size_t)n * d + i] * key[i];
            p[t - first] = bf16 ? zaya_round_bf16(zaya_round_bf16(s) * scale) : s * scale;
        }
        softmax(p, n_keys);
        for (int t = 0; bf16 && t < n_keys; t++) p[t] = zaya_round_bf16(p[t]);
        for (int i = 0; i < d; i++) o[i] = 0.0f;
        for (int t = first; t <= pos; t++)
            for (int i = 0; i < d; i++) o[i] += p[t - first] * kv->values[kv_row(kv, n / g, t) + i];
        for (int i = 0; bf16 && i < d; i++) o[i] = zaya_round_bf16(o[i]);
    }
}

void softmax(float *x, int n) {
    float max = x[0];
    for (int i = 1; i < n; i++) if (x[i] > max) max = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) { x[i] = zaya_expf(x[i] - max); sum += x[i]; }
    for (int i = 0; i < n; i++) x[i] /= sum;
}

/* ---------------------------------------------------------------------------------------------
 * 7. Huge pages and the int8 row layout
 * ------------------------------------------------------------------------------------------- */

/* Streaming the weights through 4 KB pages costs a TLB miss every 4 KB; 2 MB pages make decode
 * faster (docs/loading.md), at the price of a copy at load and RAM for the whole blob. */
void *copy_to_huge_pages(void *map, size_t size, size_t *alloc_size) {
    const size_t huge = (size_t)1 << 21;
    size_t sz = (size + huge - 1) / huge * huge;
    void *anon = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    madvise(anon, sz, MADV_HUGEPAGE);     /* a hint: without THP the copy still works, with 4 KB pages */
#endif
    for (size_t off = 0; off < size; off += huge) {   /* in 2 MB pieces, each dropped from the mapping */
        size_t n = size - off < huge ? size - off : huge;   /* once copied: RSS stays near one blob */
        memcpy((char *)anon + off, (const char *)map + off, n);
        madvise((char *)map + off, n, MADV_DONTNEED);  /* (the page cache keeps the file for the next run) */
    }
    *alloc_size = sz;
    return anon;
}

/* The file mapped read-only at a 2 MB boundary and marked MADV_HUGEPAGE: where the kernel keeps a
 * file's page cache in 2 MB pieces (large folios: ext4 and xfs on Linux 6.x), each piece then maps
 * whole, one TLB entry, and pages read through this mapping come in as 2 MB pieces. MAP_FAILED if
 * the file cannot be mapped. */
void *map_file_huge(int fd, size_t size) {
    const size_t huge = (size_t)1 << 21;
    char *area = mmap(NULL, size + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);   /* room to align */
    if (area == MAP_FAILED) return mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    char *at = (char *)(((uintptr_t)area + huge - 1) & ~(uintptr_t)(huge - 1));
    void *map = mmap(at, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (map == MAP_FAILED) { munmap(area, size + huge); return map; }
    if (at > area) munmap(area, (size_t)(at - area));   /* the room left before and after */
    const size_t end = ((size_t)(at - area) + size + 4095) / 4096 * 4096;
    if (end < size + huge) munmap(area + end, size + huge - end);
#ifdef MADV_HUGEPAGE
    madvise(map, size, MADV_HUGEPAGE);
#endif
    return map;
}

/* Reads [p, p + size) of a mapping into memory now (MADV_POPULATE_READ, Linux 5.14): 0, or -1 where
 * the kernel cannot (nothing is read then). */
int populate_mapping(void *p, size_t size) {
#ifdef MADV_POPULATE_READ
    return madvise(p, size, MADV_POPULATE_READ);
#else
    (void)p, (void)size;
    return -1;
#endif
}

/* Of the mapping that holds p (/proc/self/smaps): resident bytes, bytes in 2 MB pages (AnonHugePages +
 * FilePmdMapped), and whether it maps a file. 0, or -1 where this cannot be read. */
int mapping_pages(const void *p, uint64_t *resident, uint64_t *huge, int *file) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = 0;
    *resident = *huge = 0;
    *file = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi, kb, inode;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s %*s %*s %llu", &lo, &hi, perms, &inode) == 4) {   /* a mapping's first line */
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            if (in) found = 1, *file = inode != 0;
        } else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) *resident = kb * 1024;
        else if (in && (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 || sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1))
            *huge += kb * 1024;
    }
    fclose(f);
    return found ? 0 : -1;
}

/* In builds with the AVX-512 VNNI kernel, an int8 matrix's rows go in groups of RI =
 * ZAYA_Q8_INTERLEAVE, the 64-byte chunks of rows RI*p .. RI*p+RI-1 alternating (q8_row): decode then
 * reads RI rows as one stream and loads each activation once for all of them (dot_q8_interleaved).
 * Only rows of whole blocks of 8 groups (whole chunks), and for a stacked matrix only if each
 * expert's row count `slice` is a multiple of RI. The portable kernels read such rows slower, so
 * other builds leave the rows alone. */
int kernels_arrange_rows(ZayaMatrix *w, int slice) {
    const int cols = w->cols, G = w->group_size, RI = ZAYA_Q8_INTERLEAVE;
    if (!Q8_VNNI || w->dtype != ZAYA_Q8 || !q8_whole_blocks(cols, G) || slice % RI || w->rows < RI) return 0;
    int8_t *tmp = malloc((size_t)RI * cols);
    if (!tmp) return -1;
    for (int first = 0; first + RI <= w->rows; first += RI) {
        int8_t *g = (int8_t *)w->data + (size_t)first * cols;   /* writable: the copy in huge pages */
        memcpy(tmp, g, (size_t)RI * cols);
        for (int c = 0; c < cols; c += 64)
            for (int r = 0; r < RI; r++) memcpy(g + (size_t)c * RI + 64 * r, tmp + (size_t)r * cols + c, 64);
    }
    free(tmp);
    w->interleaved_rows = w->rows / RI * RI;
    return 0;
}
