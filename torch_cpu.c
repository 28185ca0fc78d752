/* torch_cpu.c - torch's CPU float32 sum orders, exp and softmax (torch_cpu.h). */
#include "torch_cpu.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

enum { SUM_LANES = 8, SUM_ILP = 4, SUM_LEVELS = 4, SOFTMAX_LANES = 16 };

int torch_k_block(int k) {
    return k <= 192 ? k : k <= 384 ? (k + 1) / 2 : 192;
}

void torch_matmul_row(float *y, const float *a, int as, const float *b, int bs, int cols, int k, int m, float *part) {
    const int fused = (long long)m * k * cols >= 400, block = fused ? torch_k_block(k) : k;
    for (int k0 = 0; k0 < k; k0 += block) {
        for (int c = 0; c < cols; c++) part[c] = 0.0f;
        for (int i = k0; i < k && i < k0 + block; i++)
            for (int c = 0; c < cols; c++)
                part[c] = fused ? fmaf(a[(size_t)i * as], b[(size_t)i * bs + c], part[c])
                                : part[c] + a[(size_t)i * as] * b[(size_t)i * bs + c];
        for (int c = 0; c < cols; c++) y[c] = k0 == 0 ? part[c] : y[c] + part[c];
    }
}

float torch_sum(const float *x, int n) {
    /* row_sum over the n / 8 vectors: SUM_ILP accumulators, each a cascade of SUM_LEVELS levels whose
     * lowest takes 2^level_power vectors at a time (multi_row_sum) */
    const int vectors = n / SUM_LANES, rows = vectors / SUM_ILP;
    int log2 = 0;
    while ((1 << log2) < rows) log2++;
    const int power = log2 / SUM_LEVELS > 4 ? log2 / SUM_LEVELS : 4, step = 1 << power;
    float acc[SUM_LEVELS][SUM_ILP][SUM_LANES] = {{{0}}};
    int i = 0;
    while (i + step <= rows) {
        for (int j = 0; j < step; j++, i++)
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < SUM_LANES; l++) acc[0][k][l] += x[(i * SUM_ILP + k) * SUM_LANES + l];
        for (int level = 1; level < SUM_LEVELS; level++) {
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < SUM_LANES; l++) {
                    acc[level][k][l] += acc[level - 1][k][l];
                    acc[level - 1][k][l] = 0.0f;
                }
            if (i & ((step - 1) << (level * power))) break;
        }
    }
    for (; i < rows; i++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < SUM_LANES; l++) acc[0][k][l] += x[(i * SUM_ILP + k) * SUM_LANES + l];
    for (int level = 1; level < SUM_LEVELS; level++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < SUM_LANES; l++) acc[0][k][l] += acc[level][k][l];
    for (int v = rows * SUM_ILP; v < vectors; v++)   /* vectors past the last whole group of SUM_ILP */
        for (int l = 0; l < SUM_LANES; l++) acc[0][0][l] += x[v * SUM_LANES + l];
    for (int k = 1; k < SUM_ILP; k++)
        for (int l = 0; l < SUM_LANES; l++) acc[0][0][l] += acc[0][k][l];
    float sum = 0.0f;
    for (int k = vectors * SUM_LANES; k < n; k++) sum += x[k];   /* the scalar tail first, then the lanes */
    for (int l = 0; l < SUM_LANES; l++) sum += acc[0][0][l];
    return sum;
}

static float pow2(int e) {   /* 2^e for -126 <= e <= 127 */
    union { uint32_t u; float f; } b = {(uint32_t)(e + 127) << 23};
    return b.f;
}

float torch_expf(float x) {
    if (x != x) return x;
    if (x < -104.0f) return 0.0f;
    if (x > 100.0f) return INFINITY;
    /* x = q ln2 + s, |s| <= ln2 / 2 (ln2 in two parts); e^s by a degree-7 polynomial; times 2^q */
    const float q = rintf(x * 1.442695040888963407359924681001892137426645954152985934135449406931f);
    float s = fmaf(q, -0.693145751953125f, x);
    s = fmaf(q, -1.428606765330187045e-06f, s);
    float u = 0.000198527617612853646278381f;
    u = fmaf(u, s, 0.00139304355252534151077271f);
    u = fmaf(u, s, 0.00833336077630519866943359f);
    u = fmaf(u, s, 0.0416664853692054748535156f);
    u = fmaf(u, s, 0.166666671633720397949219f);
    u = fmaf(u, s, 0.5f);
    u = 1.0f + fmaf(s * s, u, s);
    const int e = (int)q, half = e >> 1;   /* times 2^(e/2) then 2^(e - e/2), as SLEEF scales (two roundings) */
    return u * pow2(half) * pow2(e - half);
}

void torch_softmax(float *x, int n) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    float lane[SOFTMAX_LANES] = {0};
    for (int j = 0; j < n; j++) {
        x[j] = torch_expf(x[j] - m);
        lane[j % SOFTMAX_LANES] = j < SOFTMAX_LANES ? x[j] : lane[j % SOFTMAX_LANES] + x[j];
    }
    if (n < SOFTMAX_LANES)   /* a row shorter than a vector: its values added in order */
        for (int j = 1; j < n; j++) lane[0] += lane[j];
    else
        for (int half = SOFTMAX_LANES / 2; half >= 1; half /= 2)
            for (int l = 0; l < half; l++) lane[l] += lane[l + half];
    const float inv = 1.0f / lane[0];
    for (int j = 0; j < n; j++) x[j] *= inv;
}
