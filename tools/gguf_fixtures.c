/* gguf_fixtures.c - record ggml's own quantization and dequantization as test fixtures.
 *
 * For each ggml type that export_weights.py reads from a GGUF, this program quantizes a few deterministic
 * rows with ggml_quantize_chunk() (ggml's own quantizer), dequantizes them with the type's to_float
 * (ggml_get_type_traits(type)->to_float, ggml's reference dequantization, dequantize_row_* in
 * ggml-quants.c), and writes
 *   OUTDIR/<TYPE>.gguf   one tensor "t" of ROWS x COLS in that type, written by ggml's own GGUF writer
 *                        (gguf_write_to_file), with a few metadata keys of every GGUF value type;
 *   OUTDIR/<TYPE>.f32    ggml's dequantized values of that tensor, little-endian float32, row-major.
 * test/test_gguf.py reads each .gguf with gguf.py and requires its values bit for bit equal to the .f32.
 * Nothing of llama.cpp is needed to run the tests; only this recorder links ggml.
 *
 * Build against a llama.cpp / ggml build (one line; LCPP is the llama.cpp checkout, built with cmake):
 *   cc -O2 -std=c11 -I$LCPP/ggml/include tools/gguf_fixtures.c -L$LCPP/build/bin -lggml-base \
 *      -Wl,-rpath,$LCPP/build/bin -lm -o build/gguf_fixtures
 * Run:
 *   build/gguf_fixtures test/fixtures/gguf
 *   build/gguf_fixtures --quantize IN.gguf OUT.gguf TYPE     (TYPE: q4_K, iq4_xs, ... as ggml names them)
 * The second form is a small stand-in for llama-quantize (whose build here needs AVX-512): every F32 tensor of
 * 2+ dimensions whose rows are whole blocks of TYPE is quantized with ggml_quantize_chunk (no importance
 * matrix), except the ones llama-quantize also keeps (ssm_conv1d, ffn_gate_inp, 1-D tensors); the rest is copied.
 * It links only ggml-base (no CPU-specific code), so it runs on any x86-64.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml.h"
#include "gguf.h"

#define COLS 256                 /* one K-quant super-block per row; 8 blocks of 32 */
#define ROWS 6

static const enum ggml_type TYPES[] = {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
    GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS,
};

static uint64_t rng = 0x5eed5eed12345ULL;
static double uniform(void) {                  /* xorshift64*, deterministic on every machine */
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (double)((rng * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}
static double normal(void) {                   /* Box-Muller */
    double u = uniform(), v = uniform();
    return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* rows with different characters: weights-like, outliers, tiny (subnormal fp16 scales), a ramp with a zero
   block, one sign only, and large values */
static void make_rows(float *x) {
    for (int c = 0; c < COLS; c++) {
        x[0 * COLS + c] = (float)(0.02 * normal());
        x[1 * COLS + c] = (float)(0.02 * normal() + (c % 37 == 5 ? 1.5 * (c % 2 ? 1 : -1) : 0));
        x[2 * COLS + c] = (float)(3e-6 * normal());
        x[3 * COLS + c] = (c >= 64 && c < 96) ? 0.0f : (float)(-1.0 + 2.0 * c / (COLS - 1));
        x[4 * COLS + c] = (float)fabs(0.1 * normal()) + 0.01f;
        x[5 * COLS + c] = (float)(40.0 * normal());
    }
}

static int quantize_file(const char *in, const char *out, const char *type_name) {
    enum ggml_type type = GGML_TYPE_COUNT;
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const struct ggml_type_traits *tr = ggml_get_type_traits((enum ggml_type)t);
        if (tr->type_name && strcmp(tr->type_name, type_name) == 0 && (tr->from_float_ref || t <= 1 || t == GGML_TYPE_BF16))
            type = (enum ggml_type)t;
    }
    if (type == GGML_TYPE_COUNT) {
        fprintf(stderr, "unknown type %s\n", type_name);
        return 2;
    }
    struct ggml_context *meta = NULL;
    struct gguf_init_params ip = { false, &meta };
    struct gguf_context *g = gguf_init_from_file(in, ip);
    if (!g) {
        fprintf(stderr, "cannot read %s\n", in);
        return 1;
    }
    struct gguf_context *o = gguf_init_empty();
    gguf_set_kv(o, g);
    int64_t n = gguf_get_n_tensors(g);
    size_t need = 0;
    for (int64_t i = 0; i < n; i++)
        need += ggml_nbytes(ggml_get_tensor(meta, gguf_get_tensor_name(g, i))) + ggml_tensor_overhead() + 64;
    struct ggml_init_params cp = { need + 1024, NULL, false };
    struct ggml_context *ctx = ggml_init(cp);
    int64_t nq = 0;
    for (int64_t i = 0; i < n; i++) {
        const char *name = gguf_get_tensor_name(g, i);
        struct ggml_tensor *t = ggml_get_tensor(meta, name);
        int keep = t->type != GGML_TYPE_F32 || ggml_n_dims(t) < 2 || t->ne[0] % ggml_blck_size(type) != 0 ||
                   strstr(name, "ssm_conv1d") || strstr(name, "ffn_gate_inp");
        struct ggml_tensor *q = ggml_new_tensor(ctx, keep ? t->type : type, GGML_MAX_DIMS, t->ne);
        ggml_set_name(q, name);
        if (keep) {
            memcpy(q->data, t->data, ggml_nbytes(t));
        } else {
            ggml_quantize_chunk(type, (const float *)t->data, q->data, 0, ggml_nrows(t), t->ne[0], NULL);
            nq++;
        }
        gguf_add_tensor(o, q);
    }
    gguf_set_val_u32(o, "general.file_type", 0);
    if (!gguf_write_to_file(o, out, false)) {
        fprintf(stderr, "cannot write %s\n", out);
        return 1;
    }
    printf("%s: %lld of %lld tensors quantized to %s\n", out, (long long)nq, (long long)n, type_name);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "--quantize") == 0)
        return quantize_file(argv[2], argv[3], argv[4]);
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR | --quantize IN.gguf OUT.gguf TYPE\n", argv[0]);
        return 2;
    }
    float x[ROWS * COLS], y[ROWS * COLS];
    make_rows(x);
    for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++) {
        enum ggml_type type = TYPES[k];
        const struct ggml_type_traits *tr = ggml_get_type_traits(type);
        size_t row_size = ggml_row_size(type, COLS);
        struct ggml_init_params ip = { ROWS * row_size + 4 * ggml_tensor_overhead() + 1024, NULL, false };
        struct ggml_context *ctx = ggml_init(ip);
        struct ggml_tensor *t = ggml_new_tensor_2d(ctx, type, COLS, ROWS);
        ggml_set_name(t, "t");
        size_t n = ggml_quantize_chunk(type, x, t->data, 0, ROWS, COLS, NULL);
        if (n != ROWS * row_size) {
            fprintf(stderr, "%s: quantize wrote %zu bytes, expected %zu\n", tr->type_name, n, ROWS * row_size);
            return 1;
        }
        if (type == GGML_TYPE_F32)
            memcpy(y, t->data, sizeof y);
        else
            for (int r = 0; r < ROWS; r++)
                tr->to_float((const char *)t->data + r * row_size, y + r * COLS, COLS);

        struct gguf_context *g = gguf_init_empty();
        gguf_set_val_str(g, "general.architecture", "fixture");
        gguf_set_val_str(g, "fixture.recorder", "tools/gguf_fixtures.c");
        gguf_set_val_str(g, "fixture.type", tr->type_name);
        gguf_set_val_u8(g, "fixture.u8", 200);
        gguf_set_val_i8(g, "fixture.i8", -100);
        gguf_set_val_u16(g, "fixture.u16", 60000);
        gguf_set_val_i16(g, "fixture.i16", -30000);
        gguf_set_val_u32(g, "fixture.u32", 4000000000u);
        gguf_set_val_i32(g, "fixture.i32", -2000000000);
        gguf_set_val_f32(g, "fixture.f32", 0.1f);
        gguf_set_val_u64(g, "fixture.u64", 18000000000000000000ull);
        gguf_set_val_i64(g, "fixture.i64", -9000000000000000000ll);
        gguf_set_val_f64(g, "fixture.f64", 0.1);
        gguf_set_val_bool(g, "fixture.bool", true);
        int32_t ints[3] = { 1, -2, 3 };
        gguf_set_arr_data(g, "fixture.arr_i32", GGUF_TYPE_INT32, ints, 3);
        const char *strs[3] = { "a", "", "\xc3\xa9t\xc3\xa9" };
        gguf_set_arr_str(g, "fixture.arr_str", strs, 3);
        gguf_add_tensor(g, t);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.gguf", argv[1], tr->type_name);
        for (char *p = path + strlen(argv[1]); *p; p++)
            if (*p >= 'a' && *p <= 'z' && p < path + strlen(path) - 5) *p -= 32;   /* q4_K -> Q4_K */
        if (!gguf_write_to_file(g, path, false)) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        size_t len = strlen(path);
        strcpy(path + len - 5, ".f32");
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(y, sizeof y, 1, f) != 1 || fclose(f)) {
            fprintf(stderr, "cannot write %s\n", path);
            return 1;
        }
        printf("%-8s %4zu bytes/row -> %s\n", tr->type_name, row_size, path);
        gguf_free(g);
        ggml_free(ctx);
    }
    ggml_quantize_free();
    return 0;
}
