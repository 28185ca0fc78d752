/* test_zmath.c - the accuracy of zmath.c's functions: the ulp error over sweeps, against libm in double.
 *
 *     make build/test_zmath && build/test_zmath [stride]
 *
 * Each function's float result against the true value, taken from the double libm function (error
 * < 1e-16 relative, 1e-9 of a float ulp), over every stride-th float of its domain (stride 1021 by
 * default: about 4 million values a function over the whole float range) and the ranges the model
 * uses densely (GELU's and SiLU's arguments, RoPE's angles and frequencies). The contract (zmath.h):
 * within 1 ulp; the sweep reports the maximum and how many results are not correctly rounded. Also a
 * checksum of all the results, the same on every machine (test/test_arm.py compares it across builds).
 * Prints `PASS name` / `FAIL name: detail`.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zmath.h"

static int failures;

static uint32_t bits_of(float f) { uint32_t b; memcpy(&b, &f, sizeof b); return b; }
static float float_of(uint32_t b) { float f; memcpy(&f, &b, sizeof f); return f; }

typedef struct {
    const char *name;
    double max_ulp;
    float worst_x, worst_y;   /* the arguments of the worst result */
    long count, misrounded;
    uint64_t hash;            /* FNV-1a over the results' bits */
} Sweep;

/* the error of float f against the true value y in units of the float ulp at y */
static double ulp_error(float f, double y) {
    int e;
    frexp(y, &e);                          /* y = m 2^e, 0.5 <= |m| < 1 */
    const double ulp = ldexp(1.0, e - 24 < -149 ? -149 : e - 24);
    return fabs((double)f - y) / ulp;
}

static void take(Sweep *s, float x, float y, float f, double truth) {
    const uint32_t b = bits_of(f);
    for (int i = 0; i < 4; i++) s->hash = (s->hash ^ ((b >> (8 * i)) & 0xff)) * 0x100000001b3u;
    s->count++;
    if (isnan(truth) || isnan(f)) {
        if (isnan(truth) != isnan(f)) s->max_ulp = INFINITY, s->worst_x = x, s->worst_y = y;
        return;
    }
    if (fabs(truth) > 0x1.ffffffp127) {    /* the true value rounds to inf */
        if (!isinf(f) || (f > 0) != (truth > 0)) s->max_ulp = INFINITY, s->worst_x = x, s->worst_y = y;
        return;
    }
    const double err = ulp_error(f, truth);
    s->misrounded += f != (float)truth;
    if (err > s->max_ulp) s->max_ulp = err, s->worst_x = x, s->worst_y = y;
}

/* within `bound` ulp, and correctly rounded but for at most one value in a million */
static void report(const Sweep *s, double bound) {
    const int ok = s->max_ulp <= bound && s->misrounded * 1000000 <= s->count;
    failures += !ok;
    char at[80];
    if (s->worst_y != 0.0f) snprintf(at, sizeof at, "x = %a, y = %a", (double)s->worst_x, (double)s->worst_y);
    else snprintf(at, sizeof at, "x = %a", (double)s->worst_x);
    printf("%s %s: max %.6f ulp over %ld values (bound %.1f), %ld not correctly rounded (bound 1e-6 of them); "
           "worst at %s%s\n",
           ok ? "PASS" : "FAIL", s->name, s->max_ulp, s->count, bound, s->misrounded, at,
           ok ? "" : " (hint: zmath.c's evaluation or argument reduction lost accuracy there)");
}

static void check(int ok, const char *what) {
    failures += !ok;
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
}

static uint64_t lcg(uint64_t *state) { return *state = *state * 6364136223846793005u + 1442695040888963407u; }

int main(int argc, char **argv) {
    const uint32_t stride = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 1021;
    if (stride == 0) { printf("FAIL arguments: stride must be > 0 (usage: test_zmath [stride])\n"); return 1; }
    Sweep ex = {"expf over every float", 0, 0, 0, 0, 0, 0xcbf29ce484222325u}, er = ex, si = ex, co = ex, pw = ex;
    Sweep exd = ex, erd = ex, sid = ex, cod = ex;
    er.name = "erff over every float", si.name = "sinf over every float", co.name = "cosf over every float";
    pw.name = "powf over random x > 0, y in [-4, 4] and RoPE's theta^(2j/rot)";
    exd.name = "expf over [-20, 20] (SiLU, softmax)", erd.name = "erff over [-5, 5] (GELU)";
    sid.name = "sinf over [0, 2^17] (RoPE angles)", cod.name = "cosf over [0, 2^17] (RoPE angles)";
    for (uint64_t b = 0; b <= 0xffffffffu; b += stride) {
        const float x = float_of((uint32_t)b);
        take(&ex, x, 0, zaya_expf(x), exp(x));
        take(&er, x, 0, zaya_erff(x), erf(x));
        take(&si, x, 0, zaya_sinf(x), sin(x));
        take(&co, x, 0, zaya_cosf(x), cos(x));
    }
    /* denser: every (stride / 8 + 1)-th float of the model's ranges */
    const uint32_t dense = stride / 8 + 1;
    for (uint32_t b = 0; b <= bits_of(20.0f); b += dense)
        for (int s = 0; s < 2; s++) {
            const float x = s ? -float_of(b) : float_of(b);
            take(&exd, x, 0, zaya_expf(x), exp(x));
        }
    for (uint32_t b = 0; b <= bits_of(5.0f); b += dense)
        for (int s = 0; s < 2; s++) {
            const float x = s ? -float_of(b) : float_of(b);
            take(&erd, x, 0, zaya_erff(x), erf(x));
        }
    for (uint32_t b = 0; b <= bits_of(0x1p17f); b += dense) {
        const float x = float_of(b);
        take(&sid, x, 0, zaya_sinf(x), sin(x));
        take(&cod, x, 0, zaya_cosf(x), cos(x));
    }
    uint64_t st = 42;
    for (long i = 0; i < 4000000000L / stride; i++) {
        const float x = float_of((uint32_t)(lcg(&st) >> 33) % 0x7f800000u);   /* any positive finite float */
        const float y = (float)((double)(lcg(&st) >> 11) * 0x1p-53 * 8.0 - 4.0);
        take(&pw, x, y, zaya_powf(x, y), pow(x, y));
    }
    const float thetas[] = {10000.0f, 500000.0f, 1000000.0f, 5000000.0f, 160000.0f};
    for (int t = 0; t < 5; t++)
        for (int rot = 2; rot <= 512; rot += 2)
            for (int j = 0; j < rot / 2; j++) {
                const float y = (float)(2 * j) / (float)rot;
                take(&pw, thetas[t], y, zaya_powf(thetas[t], y), pow(thetas[t], y));
            }
    /* correctly rounded except vanishingly rarely; the contract is 1 ulp */
    report(&ex, 1.0), report(&er, 1.0), report(&si, 1.0), report(&co, 1.0), report(&pw, 1.0);
    report(&exd, 1.0), report(&erd, 1.0), report(&sid, 1.0), report(&cod, 1.0);

    /* the values the C99 functions give exactly */
    check(zaya_expf(0.0f) == 1.0f && zaya_expf(-INFINITY) == 0.0f && isinf(zaya_expf(INFINITY))
          && isinf(zaya_expf(89.0f)) && zaya_expf(-104.0f) == 0.0f && isnan(zaya_expf(NAN)),
          "expf: exp(0) = 1, exp(-inf) = 0, overflow to inf, NaN");
    check(zaya_erff(0.0f) == 0.0f && signbit(zaya_erff(-0.0f)) && zaya_erff(INFINITY) == 1.0f
          && zaya_erff(-INFINITY) == -1.0f && zaya_erff(4.0f) == 1.0f && isnan(zaya_erff(NAN)),
          "erff: erf(+-0) = +-0, erf(+-inf) = +-1, NaN");
    check(zaya_sinf(0.0f) == 0.0f && signbit(zaya_sinf(-0.0f)) && zaya_cosf(0.0f) == 1.0f
          && isnan(zaya_sinf(INFINITY)) && isnan(zaya_cosf(-INFINITY)) && isnan(zaya_sinf(NAN)),
          "sinf, cosf: sin(+-0) = +-0, cos(0) = 1, NaN at inf");
    check(zaya_powf(10000.0f, 0.0f) == 1.0f && zaya_powf(2.0f, 10.0f) == 1024.0f && zaya_powf(10000.0f, 0.5f) == 100.0f
          && isnan(zaya_powf(-2.0f, 0.5f)) && isnan(zaya_powf(0.0f, 1.0f)) && isinf(zaya_powf(10.0f, 40.0f)),
          "powf: x^0 = 1, exact powers, NaN for x <= 0, overflow to inf");
    const uint64_t all = ex.hash ^ er.hash ^ si.hash ^ co.hash ^ pw.hash ^ exd.hash ^ erd.hash ^ sid.hash ^ cod.hash;
    printf("checksum of all results: %016llx\n", (unsigned long long)all);
    return failures ? 1 : 0;
}
