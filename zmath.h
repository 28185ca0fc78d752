/* zmath.h - the transcendental functions the model calls, the same bits on every machine.
 *
 * libm's expf, erff, powf, sinf and cosf differ by platform, by library version and by CPU feature
 * (glibc picks an FMA variant at run time), so a dump made with them differs between an x86 PC and
 * an arm64 Mac. These are the project's own: each evaluated in double with only +, -, *, / (and
 * integer work) and rounded once to float, so within 1 ulp of the true value (correctly rounded
 * except where the true value lies within about 1e-14 relative of a halfway point between floats)
 * and bit-identical on every IEEE machine (zmath.c is written for FLT_EVAL_METHOD 0 and built without
 * FMA contraction). test/test_zmath.c measures their ulp error over sweeps. sqrtf is not here: IEEE
 * rounds it exactly everywhere.
 */
#ifndef ZAYA_ZMATH_H
#define ZAYA_ZMATH_H

/* e^x (C99 expf): inf above 88.72, 0 below -103.98, NaN for NaN. */
float zaya_expf(float x);
/* The error function (C99 erff): 2/sqrt(pi) * integral_0^x e^(-t^2) dt; +-1 at +-inf, NaN for NaN. */
float zaya_erff(float x);
/* x^y for x > 0 (C99 powf on that domain; RoPE's theta^(2j/rot)); 1 when y == 0, NaN for x <= 0 or NaN. */
float zaya_powf(float x, float y);
/* sine and cosine of x radians (C99 sinf, cosf), any finite x (exact argument reduction); NaN for inf, NaN. */
float zaya_sinf(float x);
float zaya_cosf(float x);

#endif /* ZAYA_ZMATH_H */
