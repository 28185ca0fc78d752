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

static int read_n(const char *name, float *v, int n) {
    const char *dir = getenv("ZAYA_FIXTURES");
    char path[1024];
    snprintf(path, sizeof path, "%s/ggml_round/%s.f32", dir && *dir ? dir : "test/fixtures", name);
    FILE *f = fopen(path, "rb");
    const size_t got = f ? fread(v, sizeof(float), (size_t)n, f) : 0;
    if (f) fclose(f);
    if (got != (size_t)n) {
        printf("FAIL fixture %s: %s has %zu of %d float32 values (hint: git checkout -- test/fixtures)\n", name, path,
               got, n);
        failures++;
        return -1;
    }
    return 0;
}

static int read_f32(const char *name, float *v) { return read_n(name, v, ROWS * COLS); }

/* Q8_1's second scale s = fp16(d * sum q) of every block of 32, bit for bit against ggml's (Q8_1_s.f32). */
static void check_q8_1_s(const float *x) {
    static float want[ROWS * COLS / 32];
    if (read_n("Q8_1_s", want, ROWS * COLS / 32) != 0) return;
    int bad = 0, first = -1;
    for (int b = 0; b < ROWS * COLS / 32; b++) {
        const float got = ggml_q8_1_s(x + 32 * b, 1);
        if (memcmp(&got, &want[b], 4)) { bad++; if (first < 0) first = b; }
    }
    if (bad)
        printf("FAIL Q8_1's second scale s differs from ggml's in %d of %d blocks; first block %d (row %d): %.9g vs "
               "ggml %.9g (hint: s = fp16(d * sum q), d = amax / 127 unrounded, x86's sum before saturation)\n", bad,
               ROWS * COLS / 32, first, first * 32 / COLS, ggml_q8_1_s(x + 32 * first, 1), want[first]);
    else
        printf("PASS Q8_1's second scale s equals ggml's, bit for bit (%d blocks)\n", ROWS * COLS / 32);
    failures += bad != 0;
}

/* float32 weights [rows, COLS] tagged as a GGUF tensor of ggml type `ggml_type` (what export_weights.py records) */
static ZayaMatrix tagged(const float *w, int rows, int ggml_type) {
    return (ZayaMatrix){.dtype = ZAYA_F32, .rows = rows, .cols = COLS, .data = w, .ggml_type = 1 + ggml_type};
}

/* The product with Q4_1 / Q5_1 weights (ggml's dequantized values, tagged with the type) with the placement on,
 * against ggml's own vec_dot with Q8_1 activations (<T>_dot.f32): within float32 summation, element by element
 * relative to sum |w| |x|; the placement's m (s - sum) term is what makes it so. */
static void check_q8_1_product(Kernels *k, const float *x, const char *type, int ggml_type) {
    enum { WROWS = 16 };
    static float w[WROWS * COLS], want[ROWS * WROWS], got[ROWS * WROWS];
    char wn[32], dn[32];
    snprintf(wn, sizeof wn, "%s_w", type);
    snprintf(dn, sizeof dn, "%s_dot", type);
    if (read_n(wn, w, WROWS * COLS) != 0 || read_n(dn, want, ROWS * WROWS) != 0) return;
    const ZayaMatrix m = tagged(w, WROWS, ggml_type);
    kernels_set_ggml(k, KERNELS_GGML_X86);
    matmul(k, got, WROWS, &m, x, COLS, ROWS);
    kernels_set_ggml(k, 0);
    double worst = 0;
    int at = 0;
    for (int r = 0; r < ROWS; r++)
        for (int o = 0; o < WROWS; o++) {
            double mag = 0;
            for (int i = 0; i < COLS; i++) mag += fabs((double)w[o * COLS + i] * x[r * COLS + i]);
            const double e = fabs((double)got[r * WROWS + o] - want[r * WROWS + o]) / (mag > 0 ? mag : 1e-30);
            if (e > worst) { worst = e; at = r * WROWS + o; }
        }
    const int ok = worst <= 1e-6;
    printf("%s %s weights: matmul with the ggml placement = ggml's vec_dot_%s_q8_1 (Q8_1's second scale inside) to "
           "float32 summation: largest |difference| / sum|w||x| %.2e (limit 1e-6; input row %d, weight row %d: %.9g vs "
           "ggml %.9g)\n", ok ? "PASS" : "FAIL", type, ggml_type == GGML_T_Q4_1 ? "q4_1" : "q5_1", worst, at / WROWS,
           at % WROWS, got[at], want[at]);
    failures += !ok;
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
    check_q8_1_s(x);

    /* the placement in the product kernel: W [R, COLS] float32 values tagged as Q4_K, the input of ROWS tokens */
    enum { R = 24 };
    static float w[R * COLS], y_fast[ROWS * R], y_ref[ROWS * R], xr[ROWS * COLS];
    for (int i = 0; i < R * COLS; i++) w[i] = sinf(0.37f * (float)i) * 0.05f;
    const ZayaMatrix m = tagged(w, R, GGML_T_Q4_K);
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
    check_q8_1_product(k, x, "Q4_1", GGML_T_Q4_1);
    check_q8_1_product(k, x, "Q5_1", GGML_T_Q5_1);
    kernels_free(k);
    return failures ? 1 : 0;
}
