/* test_vision.c - runs vision.c's tower on weights and pixels given as raw float32 files, writing every
 * tap as NAME.f32 (row-major float32) into OUT_DIR. Driven by test/test_vision.py, which writes the inputs
 * from test/fixtures/vl and compares the taps with the official code's.
 *
 *   build/test_vision IN_DIR OUT_DIR
 * IN_DIR/config.txt: depth D heads I C P T M window out n_fullatt fullatt... grid_h grid_w
 * IN_DIR/weights.f32: patch_embed [D, C*T*P*P]; per block norm1, norm2 [D], qkv [3D, D], qkv bias, proj
 * [D, D], proj bias, gate_proj [I, D], bias, up_proj [I, D], bias, down_proj [D, I], bias; merger ln_q
 * [D], mlp.0 [4D, 4D], bias, mlp.2 [out, 4D], bias.   IN_DIR/pixels.f32: [grid_h * grid_w, C*T*P*P]
 */
#include "../vision.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *all, *at;
static size_t have;

static const float *take(size_t n) {
    if ((size_t)(at - all) + n > have) {
        fprintf(stderr, "FAIL test_vision: weights.f32 is too short (%zu floats, more needed)\n", have);
        exit(1);
    }
    const float *p = at;
    at += n;
    return p;
}

static ZayaMatrix matrix(int rows, int cols) {
    ZayaMatrix m;
    memset(&m, 0, sizeof m);
    m.dtype = ZAYA_F32, m.rows = rows, m.cols = cols, m.data = take((size_t)rows * cols);
    return m;
}

static float *read_file(const char *dir, const char *name, size_t *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "FAIL test_vision: cannot open %s\n", path); exit(1); }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    float *p = malloc((size_t)size + 4);
    if (!p || fread(p, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "FAIL test_vision: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *n = (size_t)size / 4;
    return p;
}

static void write_tap(void *ctx, const char *name, const float *x, int rows, int cols) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", (const char *)ctx, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof(float), (size_t)rows * cols, f) != (size_t)rows * cols) {
        fprintf(stderr, "FAIL test_vision: cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: test_vision IN_DIR OUT_DIR\n"); return 2; }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.txt", argv[1]);
    FILE *f = fopen(path, "r");
    ZayaVision v;
    memset(&v, 0, sizeof v);
    ZayaVisionConfig *c = &v.config;
    int grid_h = 0, grid_w = 0, ok = f != NULL;
    ok = ok && fscanf(f, "%d %d %d %d %d %d %d %d %d %d %d", &c->depth, &c->hidden_size, &c->num_heads,
                      &c->intermediate_size, &c->in_channels, &c->patch_size, &c->temporal_patch_size,
                      &c->spatial_merge_size, &c->window_size, &c->out_hidden_size, &c->n_fullatt) == 11;
    for (int k = 0; ok && k < c->n_fullatt && k < ZAYA_MAX_VISION_DEPTH; k++) ok = fscanf(f, "%d", &c->fullatt[k]) == 1;
    ok = ok && fscanf(f, "%d %d", &grid_h, &grid_w) == 2;
    if (f) fclose(f);
    if (!ok || c->depth < 1 || c->depth > ZAYA_MAX_VISION_DEPTH) {
        fprintf(stderr, "FAIL test_vision: bad %s\n", path);
        return 1;
    }
    all = at = read_file(argv[1], "weights.f32", &have);
    const int D = c->hidden_size, I = c->intermediate_size, U = c->spatial_merge_size * c->spatial_merge_size;
    const int pin = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    v.patch_embed = matrix(D, pin);
    v.blocks = calloc((size_t)c->depth, sizeof(ZayaVisionBlock));
    for (int i = 0; i < c->depth; i++) {
        ZayaVisionBlock *B = &v.blocks[i];
        B->norm1 = take((size_t)D), B->norm2 = take((size_t)D);
        B->qkv = matrix(3 * D, D), B->qkv_bias = take((size_t)3 * D);
        B->proj = matrix(D, D), B->proj_bias = take((size_t)D);
        B->gate_proj = matrix(I, D), B->gate_proj_bias = take((size_t)I);
        B->up_proj = matrix(I, D), B->up_proj_bias = take((size_t)I);
        B->down_proj = matrix(D, I), B->down_proj_bias = take((size_t)D);
    }
    v.merger_ln_q = take((size_t)D);
    v.merger_fc1 = matrix(U * D, U * D), v.merger_fc1_bias = take((size_t)U * D);
    v.merger_fc2 = matrix(c->out_hidden_size, U * D), v.merger_fc2_bias = take((size_t)c->out_hidden_size);
    size_t npix;
    float *pixels = read_file(argv[1], "pixels.f32", &npix);
    if (npix != (size_t)grid_h * grid_w * pin) {
        fprintf(stderr, "FAIL test_vision: pixels.f32 has %zu floats, expected %d x %d x %d\n", npix, grid_h, grid_w,
                pin);
        return 1;
    }
    float *features = malloc(sizeof(float) * (size_t)zaya_vision_tokens(c, grid_h, grid_w) * c->out_hidden_size);
    char err[1024];
    if (zaya_vision_encode(&v, 1, pixels, grid_h, grid_w, features, write_tap, argv[2], err, sizeof err) != 0) {
        fprintf(stderr, "FAIL test_vision: %s\n", err);
        return 1;
    }
    free(features), free(pixels), free(all), free(v.blocks);
    return 0;
}
