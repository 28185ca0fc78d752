/* test_torch_cpu.c - torch_cpu.c's functions and matmul_chain on raw float32 inputs (test/test_torch_cpu.py).
 *
 *   build/test_torch_cpu KIND DIR M K N    KIND: linear (in0 [M,K], in1 [N,K], in2 [N]), matmul (in0 [M,K],
 *                                          in1 [K,N]), sumsq (in0 [M,K]: mean of squares per row), softmax
 *                                          (in0 [M,K]), silu (in0 [M*K]); writes DIR/out.f32
 *
 * linear runs matmul_chain on 1 and 2 threads and matmul_chain_ref and exits 2 when their bits differ.
 */
#include "kernels.h"
#include "torch_cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load(const char *dir, const char *name, size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    FILE *f = fopen(path, "rb");
    float *x = malloc(n * sizeof(float) + 1);
    if (!f || !x || fread(x, sizeof(float), n, f) != n) {
        fprintf(stderr, "test_torch_cpu: cannot read %zu floats from %s\n", n, path);
        exit(1);
    }
    fclose(f);
    return x;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: test_torch_cpu linear|matmul|sumsq|softmax|silu DIR M K N\n");
        return 1;
    }
    const char *kind = argv[1], *dir = argv[2];
    const int m = atoi(argv[3]), k = atoi(argv[4]), n = atoi(argv[5]);
    size_t outs = (size_t)m * (size_t)n;
    float *out = NULL;
    if (!strcmp(kind, "linear")) {
        float *x = load(dir, "in0", (size_t)m * k), *w = load(dir, "in1", (size_t)n * k), *b = load(dir, "in2", n);
        const ZayaMatrix mat = {.dtype = ZAYA_F32, .rows = n, .cols = k, .data = w};
        float *ref = malloc(outs * sizeof(float));
        out = malloc(outs * sizeof(float));
        matmul_chain_ref(ref, n, &mat, b, x, k, m);
        for (int threads = 1; threads <= 2; threads++) {
            Kernels *kern = kernels_new(threads, k, m);
            if (!kern) return 1;
            matmul_chain(kern, out, n, &mat, b, x, k, m);
            kernels_free(kern);
            if (memcmp(out, ref, outs * sizeof(float))) {
                fprintf(stderr, "test_torch_cpu: matmul_chain on %d threads differs from matmul_chain_ref\n", threads);
                return 2;
            }
        }
    } else if (!strcmp(kind, "matmul")) {
        float *a = load(dir, "in0", (size_t)m * k), *b = load(dir, "in1", (size_t)k * n), *part = malloc(n * 4 + 4);
        out = malloc(outs * sizeof(float));
        for (int i = 0; i < m; i++) torch_matmul_row(out + (size_t)i * n, a + (size_t)i * k, 1, b, n, n, k, m, part);
    } else if (!strcmp(kind, "sumsq") || !strcmp(kind, "softmax")) {
        float *x = load(dir, "in0", (size_t)m * k);
        out = malloc((size_t)m * k * sizeof(float));
        outs = !strcmp(kind, "softmax") ? (size_t)m * k : (size_t)m;
        for (int i = 0; i < m; i++) {
            float *row = x + (size_t)i * k;
            if (!strcmp(kind, "softmax")) {
                torch_softmax(row, k);
                memcpy(out + (size_t)i * k, row, sizeof(float) * (size_t)k);
            } else {
                for (int j = 0; j < k; j++) row[j] = row[j] * row[j];
                out[i] = torch_sum(row, k) / (float)k;
            }
        }
    } else if (!strcmp(kind, "silu")) {
        float *x = load(dir, "in0", (size_t)m * k);
        outs = (size_t)m * k;
        out = malloc(outs * sizeof(float));
        for (size_t i = 0; i < outs; i++) out[i] = x[i] / (1.0f + torch_expf(-x[i]));
    } else {
        fprintf(stderr, "test_torch_cpu: unknown kind %s\n", kind);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/out.f32", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, sizeof(float), outs, f) != outs || fclose(f)) return 1;
    return 0;
}
