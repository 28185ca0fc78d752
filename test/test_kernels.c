/* test_kernels.c - the fast matvec kernels against the reference kernel (plain loops).
 *
 *   make build/test_kernels && build/test_kernels
 *
 * For every dtype (fp32, bf16, int8 groups of 32 and 16) and a few shapes (row lengths that are and
 * are not multiples of the SIMD widths): zaya_matvec (AVX-512/VNNI when compiled with them, else
 * portable C) must agree with zaya_matvec_ref within the documented tolerance:
 *   fp32, bf16: relative L2 <= 1e-5 (only the summation order differs);
 *   int8: relative L2 <= 1e-4 (the fast kernel rounds the activations to int16 per group of the
 *         weights: ~1.5e-5 relative per value; the reference multiplies float activations).
 * It also checks that two calls give the same bits, and that interleaved int8 rows (what zaya_load
 * does with ZAYA_LOAD_HUGEPAGES) give the same bits as rows stored alone, row counts that leave rows
 * outside the last group and row tails included. Prints PASS/FAIL lines.
 */
#include "zaya.h"

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

static void run_case(int dtype, int rows, int cols, int group) {
    size_t n = (size_t)rows * cols;
    float *wf = malloc(n * sizeof(float)), *x = malloc((size_t)cols * sizeof(float));
    float *y = malloc((size_t)rows * sizeof(float)), *y2 = malloc((size_t)rows * sizeof(float));
    float *yr = malloc((size_t)rows * sizeof(float));
    void *data = NULL;
    float *scales = NULL;
    for (size_t i = 0; i < n; i++) wf[i] = frand() * 0.05f;
    for (int i = 0; i < cols; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
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
    ZayaMatrix m = {dtype, rows, cols, dtype == ZAYA_Q8 ? group : 0, data, scales, 0};
    zaya_matvec_ref(yr, &m, x);
    zaya_matvec(y, &m, x);
    zaya_matvec(y2, &m, x);
    double num = 0, den = 0;
    for (int o = 0; o < rows; o++) { num += (double)(y[o] - yr[o]) * (y[o] - yr[o]); den += (double)yr[o] * yr[o]; }
    double rel = sqrt(num / den), tol = dtype == ZAYA_Q8 ? 1e-4 : 1e-5;
    const char *names[] = {"fp32", "bf16", "int8"};
    char label[128];
    snprintf(label, sizeof label, "%s [%d x %d]%s%.0d", names[dtype], rows, cols, dtype == ZAYA_Q8 ? " group " : "",
             dtype == ZAYA_Q8 ? group : 0);
    if (rel <= tol) printf("PASS matvec %s: fast vs reference rel L2 %.2e <= %.0e\n", label, rel, tol);
    else { printf("FAIL matvec %s: fast vs reference rel L2 %.2e > %.0e\n", label, rel, tol); failures++; }
    if (memcmp(y, y2, (size_t)rows * sizeof(float)) == 0) printf("PASS matvec %s: deterministic\n", label);
    else { printf("FAIL matvec %s: two calls differ\n", label); failures++; }
    const int R = ZAYA_Q8_INTERLEAVE;
    if (dtype == ZAYA_Q8 && cols % 64 == 0 && rows >= R) {   /* interleaved rows (ZayaMatrix.interleaved_rows) */
        int8_t *p = malloc(n);
        memcpy(p, data, n);
        for (int first = 0; first + R <= rows; first += R)   /* the 64-byte chunks of the group's rows alternate */
            for (int c = 0; c < cols; c += 64)
                for (int r = 0; r < R; r++)
                    memcpy(p + (size_t)first * cols + (size_t)c * R + 64 * r, (int8_t *)data + (size_t)(first + r) * cols + c, 64);
        ZayaMatrix mp = m;
        mp.data = p;
        mp.interleaved_rows = rows / R * R;
        zaya_matvec(y2, &mp, x);
        int same = memcmp(y, y2, (size_t)rows * sizeof(float)) == 0;
        zaya_matvec_ref(y2, &mp, x);
        same = same && memcmp(yr, y2, (size_t)rows * sizeof(float)) == 0;
        printf("%s matvec %s: interleaved rows give the same bits (fast and reference)\n", same ? "PASS" : "FAIL", label);
        failures += !same;
        free(p);
    }
    if (data != wf) free(data);
    free(wf); free(x); free(y); free(y2); free(yr); free(scales);
}

int main(void) {
    /* row lengths: whole int8 blocks of 8 groups, blocks plus a tail, only a tail, tiny */
    const int shapes[][2] = {{300, 2048}, {33, 320}, {17, 96}, {64, 80}, {9, 384}, {5, 8}, {7, 512}, {10, 192}};
    for (int s = 0; s < 8; s++) {
        run_case(ZAYA_F32, shapes[s][0], shapes[s][1], 0);
        run_case(ZAYA_BF16, shapes[s][0], shapes[s][1], 0);
        for (int g = 32; g >= 8; g /= 2)
            if (shapes[s][1] % g == 0) { run_case(ZAYA_Q8, shapes[s][0], shapes[s][1], g); break; }
        if (shapes[s][1] % 16 == 0) run_case(ZAYA_Q8, shapes[s][0], shapes[s][1], 16);
    }
    return failures ? 1 : 0;
}
