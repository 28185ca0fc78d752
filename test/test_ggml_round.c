/* test_ggml_round.c - ggml_round.c's activation quantizers against ggml's own (test/fixtures/ggml_round,
 * recorded by tools/ggml_round_fixtures.c from the port's ggml CPU backend), bit for bit; then the placement
 * through the product kernel: matmul() with a matrix of a ggml type, the placement on, equals matmul_ref() on
 * the input rounded by ggml_round_row(), and with the placement off it is the plain product.
 * Reads $ZAYA_FIXTURES (default test/fixtures). Prints PASS/FAIL lines; exit status 1 on a failure.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_round.h"
#include "kernels.h"

enum { ROWS = 8, COLS = 512 };
static int failures;

static int read_f32(const char *name, float *v) {
    const char *dir = getenv("ZAYA_FIXTURES");
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml_round/%s.f32", dir && *dir ? dir : "test/fixtures", name);
    FILE *f = fopen(path, "rb");
    const size_t got = f ? fread(v, sizeof(float), ROWS * COLS, f) : 0;
    if (f) fclose(f);
    if (got != ROWS * COLS) {
        printf("FAIL fixture %s: %s has %zu of %d float32 values (hint: git checkout -- test/fixtures)\n", name, path,
               got, ROWS * COLS);
        failures++;
        return -1;
    }
    return 0;
}

/* ggml_round_row with weight type `weight` (x86 or reference Q8_0) against the fixture of its vec_dot_type. */
static void check_type(const float *x, const char *fixture, int weight, const char *weight_name, int x86) {
    static float want[ROWS * COLS], got[ROWS * COLS];
    if (read_f32(fixture, want) != 0) return;
    for (int r = 0; r < ROWS; r++) ggml_round_row(got + r * COLS, x + r * COLS, COLS, weight, x86);
    int bad = 0, first = -1;
    for (int i = 0; i < ROWS * COLS; i++)
        if (memcmp(&got[i], &want[i], 4)) { bad++; if (first < 0) first = i; }
    if (bad) {
        printf("FAIL %s weights: the input as %s%s differs from ggml's in %d of %d values; first at row %d col %d: "
               "%.9g (input %.9g) vs ggml %.9g\n", weight_name, fixture, x86 ? "" : " (reference)", bad, ROWS * COLS,
               first / COLS, first % COLS, got[first], x[first], want[first]);
        failures++;
    } else {
        printf("PASS %s weights: the input as ggml's %s holds it, bit for bit (%d values)\n", weight_name, fixture,
               ROWS * COLS);
    }
}

int main(void) {
    static float x[ROWS * COLS];
    if (read_f32("input", x) != 0) return 1;
    check_type(x, "Q8_0", GGML_T_Q8_0, "Q8_0", 1);
    check_type(x, "Q8_0", GGML_T_Q4_0, "Q4_0", 1);
    check_type(x, "Q8_0", GGML_T_IQ4_NL, "IQ4_NL", 1);
    check_type(x, "Q8_0_ref", GGML_T_Q8_0, "Q8_0", 0);
    check_type(x, "Q8_1", GGML_T_Q4_1, "Q4_1", 1);
    check_type(x, "Q8_K", GGML_T_Q4_K, "Q4_K", 1);
    check_type(x, "Q8_K", GGML_T_Q6_K, "Q6_K", 1);
    check_type(x, "Q8_K", GGML_T_IQ4_XS, "IQ4_XS", 1);
    check_type(x, "F16", GGML_T_F16, "F16", 1);
    check_type(x, "BF16", GGML_T_BF16, "BF16", 1);

    /* the placement in the product kernel: W [R, COLS] float32 values tagged as Q4_K, the input of ROWS tokens */
    enum { R = 24 };
    static float w[R * COLS], y_fast[ROWS * R], y_ref[ROWS * R], xr[ROWS * COLS];
    for (int i = 0; i < R * COLS; i++) w[i] = sinf(0.37f * (float)i) * 0.05f;
    ZayaMatrix m = {0};
    m.dtype = ZAYA_F32;
    m.rows = R;
    m.cols = COLS;
    m.data = w;
    m.ggml_type = 1 + GGML_T_Q4_K;
    Kernels *k = kernels_new(2, COLS, ROWS);
    if (!k) { printf("FAIL kernels_new: out of memory\n"); return 1; }
    for (int r = 0; r < ROWS; r++) ggml_round_row(xr + r * COLS, x + r * COLS, COLS, GGML_T_Q4_K, 1);
    kernels_set_ggml(k, KERNELS_GGML_X86);
    matmul(k, y_fast, R, &m, x, COLS, ROWS);
    matmul_ref(y_ref, R, &m, xr, COLS, ROWS);
    double num = 0, den = 0;
    for (int i = 0; i < ROWS * R; i++) {
        num += (y_fast[i] - y_ref[i]) * (double)(y_fast[i] - y_ref[i]);
        den += y_ref[i] * (double)y_ref[i];
    }
    const double rel = sqrt(num / den);
    printf("%s matmul with the ggml placement = matmul_ref on the Q8_K-rounded input (rel L2 %.2e, float32 sums "
           "in another order)\n", rel < 1e-6 ? "PASS" : "FAIL", rel);
    failures += rel >= 1e-6;
    kernels_set_ggml(k, 0);
    matmul(k, y_fast, R, &m, x, COLS, ROWS);
    matmul_ref(y_ref, R, &m, x, COLS, ROWS);
    num = den = 0;
    for (int i = 0; i < ROWS * R; i++) {
        num += (y_fast[i] - y_ref[i]) * (double)(y_fast[i] - y_ref[i]);
        den += y_ref[i] * (double)y_ref[i];
    }
    printf("%s matmul without the placement is the plain product (rel L2 %.2e)\n",
           sqrt(num / den) < 1e-6 ? "PASS" : "FAIL", sqrt(num / den));
    failures += sqrt(num / den) >= 1e-6;
    kernels_free(k);
    return failures ? 1 : 0;
}
