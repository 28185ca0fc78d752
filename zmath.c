/* zmath.c - expf, erff, powf, sinf, cosf computed the same on every machine (zmath.h).
 *
 * Each function takes its float argument to double (exact), evaluates there with +, -, *, / only
 * (relative error below 1e-14), and rounds once to float. No libm call but fabs, no fused multiply-add: the
 * Makefile builds every file with -ffp-contract=off, and the pragma below says the same to clang
 * when a file is built without it. The constants are exact binary values or decimal literals that
 * every compiler rounds the same way (IEEE round to nearest).
 */
#include "zmath.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif
#if FLT_EVAL_METHOD != 0
#error "zmath.c needs double arithmetic evaluated in double (FLT_EVAL_METHOD 0: x86-64 SSE, arm64)"
#endif

static double double_of_bits(uint64_t b) { double d; memcpy(&d, &b, sizeof d); return d; }
static uint64_t bits_of_double(double d) { uint64_t b; memcpy(&b, &d, sizeof b); return b; }
static uint32_t bits_of_float(float f) { uint32_t b; memcpy(&b, &f, sizeof b); return b; }

/* the largest double that rounds to a finite float: (2 - 2^-24) * 2^127 rounds to inf (ties to even) */
#define FLOAT_OVERFLOW 0x1.ffffffp127

/* 2^(j/32) for j < 32, each the nearest double (computed with Python's decimal module at 60 digits) */
static const double EXP2_32[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};

/* e^x in double for -110 < x < 95 (the float range and a margin): x = k ln2/32 + r, |r| <= ln2/64, with
 * ln2/32 in two parts (the first with 32 bits, so k * LN2_32_HI is exact), e^r by its Taylor series to
 * r^6 (remainder < 4e-18), times 2^(k/32) = 2^m * EXP2_32[j] (2^m built from its bits). Relative error
 * < 5e-16. */
static double exp_d(double x) {
    const double LN2_32_HI = 0x1.62e42fee00000p-6, LN2_32_LO = 0x1.a39ef35793c76p-38, INV = 0x1.71547652b82fep+5;
    const double kd = x * INV;
    const int k = (int)(kd < 0 ? kd - 0.5 : kd + 0.5);   /* nearest integer */
    const double r = (x - k * LN2_32_HI) - k * LN2_32_LO;
    double p = 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    const int j = (k % 32 + 32) % 32, m = (k - j) / 32;
    return p * EXP2_32[j] * double_of_bits((uint64_t)(m + 1023) << 52);   /* the last product exact: -160 < m < 138 */
}

/* the natural logarithm in double of a positive normal double: x = 2^e m, sqrt(1/2) <= m < sqrt(2),
 * ln m = 2 atanh(s) = 2 (s + s^3/3 + ... + s^23/23), s = (m - 1)/(m + 1), |s| < 0.172 (remainder
 * < 1e-18 relative). Error < 2e-16 * (|ln x| + 1). */
static double log_d(double x) {
    const uint64_t b = bits_of_double(x);
    int e = (int)(b >> 52) - 1023;
    double m = double_of_bits((b & 0x000fffffffffffffu) | 0x3ff0000000000000u);   /* [1, 2) */
    if (m > 0x1.6a09e667f3bcdp+0) m *= 0.5, e++;                                      /* sqrt(2) */
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    double p = 1.0 / 23;
    for (int n = 21; n >= 1; n -= 2) p = p * s2 + 1.0 / n;
    const double LN2_HI = 0x1.62e42fee00000p-1, LN2_LO = 0x1.a39ef35793c76p-33;
    return e * LN2_HI + (e * LN2_LO + 2.0 * s * p);
}

float zaya_expf(float x) {
    if (x != x) return x + x;
    if (x > 89.0f) return INFINITY;
    if (x < -104.0f) return 0.0f;   /* e^-104 < 2^-150: rounds to 0 */
    const double y = exp_d(x);
    return y >= FLOAT_OVERFLOW ? INFINITY : (float)y;
}

/* 1/(2n+1) for n < 128, each rounded once (the compiler divides) */
#define INV_ODD4(n) 1.0 / (2 * (n) + 1), 1.0 / (2 * (n) + 3), 1.0 / (2 * (n) + 5), 1.0 / (2 * (n) + 7)
#define INV_ODD16(n) INV_ODD4(n), INV_ODD4(n + 4), INV_ODD4(n + 8), INV_ODD4(n + 12)
static const double INV_ODD[128] = {INV_ODD16(0), INV_ODD16(16), INV_ODD16(32), INV_ODD16(48),
                                    INV_ODD16(64), INV_ODD16(80), INV_ODD16(96), INV_ODD16(112)};
#undef INV_ODD16
#undef INV_ODD4

/* erf(a) = 2/sqrt(pi) e^(-a^2) sum_n (2a^2)^n a / (1 * 3 * ... * (2n + 1)): all terms positive, so no
 * cancellation; the sum stops when a term adds less than 2^-56 of it (about 12 terms at a = 0.5, 30 at
 * a = 2, 110 at a = 4.5). erf(a) rounds to 1 in float from a = 3.92 on. */
float zaya_erff(float x) {
    if (x != x) return x + x;
    const double a = fabs((double)x);
    if (a >= 4.5) return x < 0 ? -1.0f : 1.0f;
    const double a2 = a * a, twice = 2.0 * a2;   /* exact: a has 24 bits */
    double term = a, sum = a;
    for (int n = 1; n < 128 && term > sum * 0x1p-56; n++) {
        term *= twice * INV_ODD[n];
        sum += term;
    }
    const double r = 0x1.20dd750429b6dp+0 * exp_d(-a2) * sum;   /* 2/sqrt(pi) */
    return (float)(bits_of_float(x) >> 31 ? -r : r);   /* erf(-0) = -0 */
}

float zaya_powf(float x, float y) {
    if (y == 0.0f) return 1.0f;
    if (!(x > 0.0f) || y != y) return NAN;
    if (x == INFINITY) return y > 0 ? INFINITY : 0.0f;
    if (y == INFINITY || y == -INFINITY) return x == 1.0f ? 1.0f : (x > 1.0f) == (y > 0) ? INFINITY : 0.0f;
    const double t = (double)y * log_d(x);
    if (t > 89.0) return INFINITY;
    if (t < -104.0) return 0.0f;
    const double r = exp_d(t);
    return r >= FLOAT_OVERFLOW ? INFINITY : (float)r;
}

/* 2/pi in binary: its bits 1..288 (bit i of value 2^-i), 32 a word, the most significant first;
 * enough for any float (reduce_pio2 reads up to bit 232). */
static const uint32_t TWO_OVER_PI[9] = {0xa2f9836e, 0x4e441529, 0xfc2757d1, 0xf534ddc0, 0xdb629599,
                                        0x3c439041, 0xfe5163ab, 0xdebbc561, 0xb7246e3a};

/* The 32 bits i .. i + 31 of 2/pi as an integer (bits before the binary point, i < 1, are 0). */
static uint32_t two_over_pi_bits(int i) {
    const int at = i + 63;   /* with 64 zero bits in front: bit i is bit `at` of the padded string */
    uint64_t w = 0;
    for (int j = at / 32; j <= at / 32 + 1; j++) w = w << 32 | (j >= 2 && j - 2 < 9 ? TWO_OVER_PI[j - 2] : 0);
    return (uint32_t)(w >> (32 - at % 32));
}

/* |x| = (q + r / (pi/2)) * pi/2 with q mod 4 returned and r in double (|r| <= pi/4), for finite x:
 * Payne-Hanek with integers. |x| = m 2^e (m < 2^24 an integer), so |x| * 2/pi mod 4 needs the bits of
 * 2/pi from 2^-(e - 1) on (earlier bits give multiples of 4): bits e - 1 and e add 2m and m to the
 * quadrant, bits e + 1 .. e + 128 times m give the rest of it and 128 bits of fraction (error
 * < 2^-104 of a quarter turn), exact however close x lies to a multiple of pi/2. */
static int reduce_pio2(float x, double *r) {
    const uint32_t b = bits_of_float(x) & 0x7fffffffu;
    const int biased = (int)(b >> 23);
    const uint64_t m = biased ? (b & 0x7fffffu) | 0x800000u : b & 0x7fffffu;
    const int e = (biased ? biased : 1) - 150;   /* |x| = m 2^e */
    /* W = bits e+1 .. e+128 of 2/pi as four 32-bit limbs (w[0] the top): m W / 2^128 = the rest */
    uint32_t w[4], p[5];
    for (int j = 0; j < 4; j++) w[j] = two_over_pi_bits(e + 1 + 32 * j);
    uint64_t carry = 0;
    for (int j = 3; j >= 0; j--) {
        const uint64_t t = m * w[j] + carry;
        p[j + 1] = (uint32_t)t;
        carry = t >> 32;
    }
    p[0] = (uint32_t)carry;
    int q = (int)((p[0] + m * (two_over_pi_bits(e - 1) >> 30)) & 3);
    uint64_t hi = (uint64_t)p[1] << 32 | p[2], lo = (uint64_t)p[3] << 32 | p[4];   /* the fraction */
    double sign = 1.0;
    if (hi >> 63) {   /* fraction >= 1/2: the next quadrant, fraction - 1 (its two's complement) */
        q = (q + 1) & 3;
        hi = ~hi, lo = ~lo + 1;
        if (lo == 0) hi++;
        sign = -1.0;
    }
    /* each part converts with relative error <= 2^-53, so their sum carries ~2^-52 of the fraction */
    const double f = (double)hi * 0x1p-64 + (double)lo * 0x1p-128;
    *r = sign * (f * 0x1.921fb54442d18p+0);   /* pi/2 */
    return q;
}

/* sin and cos of |r| <= pi/4 + a little: Taylor series to r^19 and r^18 (remainder < 1e-17) */
static double sin_d(double r) {
    const double r2 = r * r;
    double p = -1.0 / 121645100408832000.0;   /* -1/19! */
    p = p * r2 + 1.0 / 355687428096000.0;
    p = p * r2 - 1.0 / 1307674368000.0;
    p = p * r2 + 1.0 / 6227020800.0;
    p = p * r2 - 1.0 / 39916800.0;
    p = p * r2 + 1.0 / 362880.0;
    p = p * r2 - 1.0 / 5040.0;
    p = p * r2 + 1.0 / 120.0;
    p = p * r2 - 1.0 / 6.0;
    return r + r * (r2 * p);
}
static double cos_d(double r) {
    const double r2 = r * r;
    double p = 1.0 / 6402373705728000.0;       /* 1/18! */
    p = p * r2 - 1.0 / 20922789888000.0;
    p = p * r2 + 1.0 / 87178291200.0;
    p = p * r2 - 1.0 / 479001600.0;
    p = p * r2 + 1.0 / 3628800.0;
    p = p * r2 - 1.0 / 40320.0;
    p = p * r2 + 1.0 / 720.0;
    p = p * r2 - 1.0 / 24.0;
    p = p * r2 + 0.5;
    return 1.0 - r2 * p;
}

float zaya_sinf(float x) {
    if (x != x || x == INFINITY || x == -INFINITY) return x - x;
    if (x == 0.0f) return x;   /* sin(-0) = -0 */
    if (fabsf(x) < 0.78f) return (float)sin_d(x);
    double r;
    const int q = reduce_pio2(x, &r);
    const double s = q == 0 ? sin_d(r) : q == 1 ? cos_d(r) : q == 2 ? -sin_d(r) : -cos_d(r);
    return (float)(x < 0 ? -s : s);
}

float zaya_cosf(float x) {
    if (x != x || x == INFINITY || x == -INFINITY) return x - x;
    if (fabsf(x) < 0.78f) return (float)cos_d(x);
    double r;
    const int q = reduce_pio2(x, &r);
    return (float)(q == 0 ? cos_d(r) : q == 1 ? -sin_d(r) : q == 2 ? -cos_d(r) : sin_d(r));
}
