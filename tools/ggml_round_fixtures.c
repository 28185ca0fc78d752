/* ggml_round_fixtures.c - record ggml's CPU activation quantizers as test fixtures (test/fixtures/ggml_round).
 *
 * ggml's CPU backend quantizes a product's float32 input to the weight type's vec_dot_type with
 * ggml_get_type_traits_cpu(vec_dot_type)->from_float (x86: arch/x86/quants.c's quantize_row_q8_0 and
 * quantize_row_q8_1, quantize_row_q8_K = the reference; F16 / BF16 the CPU's conversions). This program runs
 * those on deterministic rows and writes what the quantized blocks stand for (q times the stored scale):
 *   OUTDIR/input.f32          ROWS x COLS float32 inputs (weights-like values, outliers, a zero block, a block
 *                             of one value, ties after scaling, tiny and subnormal values, both signs of a maximum)
 *   OUTDIR/<T>.f32            the same rows through from_float of T = Q8_0, Q8_1, Q8_K, F16, BF16, each
 *                             dequantized (Q8_0 / F16 / BF16: ggml's to_float; Q8_K: d * qs as its
 *                             dequantize_row_q8_K; Q8_1: qs * d as ggml's dot products read it);
 *   OUTDIR/Q8_0_ref.f32       the same through ggml's reference quantize_row_q8_0_ref;
 *   OUTDIR/Q8_1_s.f32         Q8_1's second scale s of each block of 32 (the fp16 widened), ROWS * COLS / 32;
 *   OUTDIR/<T>_w.f32,         T = Q4_1, Q5_1: 16 x COLS weights quantized by T's from_float (no imatrix, as
 *   OUTDIR/<T>_dot.f32        llama-quantize) and dequantized; ggml's vec_dot of each with each input row as
 *                             Q8_1 (ROWS x 16): the second scale's term m * s inside.
 * test/test_ggml_round.c requires ggml_round.c's values equal to these, bit for bit. Only this recorder links ggml.
 *
 * Build against the port's llama.cpp build (LCPP = the checkout built with cmake):
 *   cc -O2 -std=c11 -I$LCPP/ggml/include tools/ggml_round_fixtures.c -L$LCPP/build/bin -lggml-base -lggml-cpu \
 *      -Wl,-rpath,$LCPP/build/bin -lm -o build/ggml_round_fixtures
 *   build/ggml_round_fixtures test/fixtures/ggml_round
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "ggml-cpu.h"

enum { ROWS = 8, COLS = 512 };

static uint32_t state = 48;
static float uniform(void) { state = state * 1664525u + 1013904223u; return (float)(state >> 8) / 16777216.0f; }
static float gauss(void) { return sqrtf(-2.0f * logf(uniform() + 1e-7f)) * cosf(6.2831853f * uniform()); }

static void write_file(const char *dir, const char *name, const float *v, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof(float), n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: ggml_round_fixtures OUTDIR\n"); return 2; }
    ggml_cpu_init();
    static float x[ROWS * COLS], y[ROWS * COLS];
    static uint8_t q[ROWS * COLS * 4];
    for (int i = 0; i < ROWS * COLS; i++) x[i] = 0.02f * gauss();
    for (int i = 0; i < COLS; i += 37) x[COLS + i] = 3.0f * (i % 2 ? 1 : -1) * (1 + uniform());   /* row 1: outliers */
    for (int i = 0; i < 32; i++) x[2 * COLS + i] = 0.0f;                                         /* row 2: zeros */
    for (int i = 32; i < 64; i++) x[2 * COLS + i] = -0.75f;                                          /* one value */
    for (int i = 0; i < COLS; i++) x[3 * COLS + i] = (float)((i % 255) - 127) / 2.0f;               /* row 3: ties */
    for (int i = 0; i < COLS; i++) x[4 * COLS + i] = 1e-6f * gauss();                               /* row 4: tiny */
    for (int i = 0; i < 64; i++) x[4 * COLS + i] = 1e-39f * (float)(i - 32);                         /* subnormal */
    for (int i = 0; i < COLS; i += 32) { x[5 * COLS + i] = 1.5f; x[5 * COLS + i + 5] = -1.5f; }     /* row 5: +-max */
    for (int i = 0; i < COLS; i++) x[6 * COLS + i] = 100.0f * gauss();                              /* row 6: large */
    for (int i = 0; i < COLS; i++) x[7 * COLS + i] = (float)i * 0.01f - 2.0f;                       /* row 7: a ramp */
    write_file(argv[1], "input", x, ROWS * COLS);
    const enum ggml_type types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_Q8_K, GGML_TYPE_F16, GGML_TYPE_BF16};
    const char *names[] = {"Q8_0", "Q8_1", "Q8_K", "F16", "BF16"};
    for (int k = 0; k < 5; k++) {
        const enum ggml_type t = types[k];
        const size_t row = ggml_row_size(t, COLS);
        for (int r = 0; r < ROWS; r++) ggml_get_type_traits_cpu(t)->from_float(x + r * COLS, q + r * row, COLS);
        if (t == GGML_TYPE_Q8_1) {   /* block_q8_1: d, s (fp16), qs[32]; the dot products use qs * d */
            for (size_t b = 0; b < ROWS * COLS / 32; b++) {
                const uint8_t *blk = q + b * 36;
                uint16_t d;
                memcpy(&d, blk, 2);
                for (int j = 0; j < 32; j++) y[b * 32 + j] = (int8_t)blk[4 + j] * ggml_fp16_to_fp32(d);
            }
        } else if (t == GGML_TYPE_Q8_K) {   /* block_q8_K: float d, qs[256], bsums[16]; dequantize_row_q8_K: d * qs */
            for (size_t b = 0; b < ROWS * COLS / 256; b++) {
                const uint8_t *blk = q + b * row / (COLS / 256);
                float d;
                memcpy(&d, blk, 4);
                for (int j = 0; j < 256; j++) y[b * 256 + j] = d * (int8_t)blk[4 + j];
            }
        } else {
            for (int r = 0; r < ROWS; r++) ggml_get_type_traits(t)->to_float(q + r * row, y + r * COLS, COLS);
        }
        write_file(argv[1], names[k], y, ROWS * COLS);
    }
    /* Q8_1's second scale s (fp16, widened), one per block of 32: Q8_1_s.f32 [ROWS * COLS / 32] */
    static float s[ROWS * COLS / 32];
    for (int r = 0; r < ROWS; r++)
        ggml_get_type_traits_cpu(GGML_TYPE_Q8_1)->from_float(x + r * COLS, q + r * ggml_row_size(GGML_TYPE_Q8_1, COLS),
                                                             COLS);
    for (size_t b = 0; b < ROWS * COLS / 32; b++) {
        uint16_t h;
        memcpy(&h, q + b * 36 + 2, 2);
        s[b] = ggml_fp16_to_fp32(h);
    }
    write_file(argv[1], "Q8_1_s", s, ROWS * COLS / 32);
    /* Q4_1 / Q5_1 weights [WROWS, COLS] (from_float, no imatrix, as llama-quantize), dequantized (<T>_w.f32), and
     * ggml's dot product of each with each input row quantized to Q8_1 (<T>_dot.f32 [ROWS, WROWS]) */
    enum { WROWS = 16 };
    static float w[WROWS * COLS], wd[WROWS * COLS], dot[ROWS * WROWS];
    static uint8_t wq[WROWS * COLS * 4], xq[ROWS * COLS * 4];
    for (int i = 0; i < WROWS * COLS; i++) w[i] = 0.05f * gauss() + (i / COLS % 4 == 1 ? 0.03f : 0.0f);
    const enum ggml_type wtypes[] = {GGML_TYPE_Q4_1, GGML_TYPE_Q5_1};
    const char *wnames[][2] = {{"Q4_1_w", "Q4_1_dot"}, {"Q5_1_w", "Q5_1_dot"}};
    for (int k = 0; k < 2; k++) {
        const enum ggml_type t = wtypes[k];
        const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(t);
        const size_t wrow = ggml_row_size(t, COLS), xrow = ggml_row_size(tc->vec_dot_type, COLS);
        for (int r = 0; r < WROWS; r++) tc->from_float(w + r * COLS, wq + r * wrow, COLS);
        for (int r = 0; r < WROWS; r++) ggml_get_type_traits(t)->to_float(wq + r * wrow, wd + r * COLS, COLS);
        for (int r = 0; r < ROWS; r++)
            ggml_get_type_traits_cpu(tc->vec_dot_type)->from_float(x + r * COLS, xq + r * xrow, COLS);
        for (int r = 0; r < ROWS; r++)
            for (int o = 0; o < WROWS; o++)
                tc->vec_dot(COLS, &dot[r * WROWS + o], 0, wq + o * wrow, 0, xq + r * xrow, 0, 1);
        write_file(argv[1], wnames[k][0], wd, WROWS * COLS);
        write_file(argv[1], wnames[k][1], dot, ROWS * WROWS);
    }
    const size_t row = ggml_row_size(GGML_TYPE_Q8_0, COLS);
    for (int r = 0; r < ROWS; r++)
        ggml_get_type_traits(GGML_TYPE_Q8_0)->from_float_ref(x + r * COLS, q + r * row, COLS);
    for (int r = 0; r < ROWS; r++) ggml_get_type_traits(GGML_TYPE_Q8_0)->to_float(q + r * row, y + r * COLS, COLS);
    write_file(argv[1], "Q8_0_ref", y, ROWS * COLS);
    printf("wrote %s: input and Q8_0, Q8_1, Q8_K, F16, BF16, Q8_0_ref of %d x %d values, Q8_1_s, Q4_1 and Q5_1 weights "
           "and dot products\n", argv[1], ROWS, COLS);
    return 0;
}
