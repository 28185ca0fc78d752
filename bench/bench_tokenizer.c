/* bench_tokenizer.c - speed of tokenizer.c: section load, encode of a text as ONE string
 * (add_special_tokens = 1, like HF `tokenizer.encode(text)`), decode of the ids; median of N runs.
 *
 *   mkdir -p build && python3 test/make_tokenizer_section.py build/tokenizer_section.bin ../shared/fixtures/tokenizer/model
 *   cc -O2 -std=c11 -Wall -Wextra -Werror -I. bench/bench_tokenizer.c tokenizer.c -o build/bench_tokenizer
 *   build/bench_tokenizer build/tokenizer_section.bin ../shared/fixtures/tokenizer/english_1mb.txt 5
 *
 * Prints one line per measurement and a JSON line with the same keys as shared/tools/hf_tokenizer_bench.mjs
 * (load_s, encode_s, tokens, tokens_per_s, mb_per_s, decode_s; MB = 10^6 bytes).
 * The section is read into memory first (as the blob's mmap would be after the first use); load = zaya_tok_load.
 */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static unsigned char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)sz + 1);
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) { fclose(f); free(buf); return NULL; }
    fclose(f);
    *n = (size_t)sz;
    return buf;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SECTION TEXT [RUNS=5]\n", argv[0]);
        return 2;
    }
    int runs = argc > 3 ? atoi(argv[3]) : 5;
    if (runs < 1 || runs > 1000) runs = 5;
    size_t size, n;
    unsigned char *sec = read_file(argv[1], &size), *text = read_file(argv[2], &n);
    if (!sec || !text) {
        fprintf(stderr, "cannot read %s or %s\n", argv[1], argv[2]);
        return 1;
    }
    double *t_load = malloc(runs * sizeof(double)), *t_enc = malloc(runs * sizeof(double)),
           *t_dec = malloc(runs * sizeof(double));
    ZayaTokenizer t;
    char err[512];
    for (int r = 0; r < runs; r++) {
        double t0 = now();
        if (zaya_tok_load(&t, sec, size, err, sizeof err)) {
            fprintf(stderr, "load failed: %s\n", err);
            return 1;
        }
        t_load[r] = now() - t0;
    }
    int *ids = NULL;
    size_t n_ids = 0, warm_n;
    int *warm;
    zaya_tok_encode(&t, "Hello world", 11, 1, &warm, &warm_n);      /* warm-up, as the HF script does */
    free(warm);
    for (int r = 0; r < runs; r++) {
        free(ids);
        double t0 = now();
        if (zaya_tok_encode(&t, (const char *)text, n, 1, &ids, &n_ids)) {
            fprintf(stderr, "encode failed\n");
            return 1;
        }
        t_enc[r] = now() - t0;
    }
    size_t dlen = 0;
    for (int r = 0; r < runs; r++) {
        double t0 = now();
        char *d = zaya_tok_decode(&t, ids + t.n_prefix, n_ids - (size_t)t.n_prefix - (size_t)t.n_suffix, 0, &dlen);
        t_dec[r] = now() - t0;
        if (!d) return 1;
        if (r == 0 && (dlen != n || memcmp(d, text, n))) fprintf(stderr, "warning: decode(encode(text)) != text\n");
        free(d);
    }
    double lo = median(t_load, runs), en = median(t_enc, runs), de = median(t_dec, runs);
    printf("section: %.1f MB, %d tokens\n", size / 1e6, t.n_tokens);
    printf("load:    %.2f ms (median of %d)\n", lo * 1e3, runs);
    printf("encode:  %.3f s for %zu bytes -> %zu tokens: %.0f tokens/s, %.2f MB/s (median of %d; runs", en, n, n_ids,
           n_ids / en, n / en / 1e6, runs);
    for (int r = 0; r < runs; r++) printf(" %.3f", t_enc[r]);
    printf(")\n");
    printf("decode:  %.4f s for %zu ids: %.2f M tokens/s (median of %d)\n", de, n_ids - 2, (n_ids - 2) / de / 1e6, runs);
    printf("{\"load_s\": %.5f, \"encode_s\": %.4f, \"tokens\": %zu, \"tokens_per_s\": %.0f, \"mb_per_s\": %.3f, "
           "\"decode_s\": %.5f}\n", lo, en, n_ids, n_ids / en, n / en / 1e6, de);
    free(ids);
    free(sec);
    free(text);
    free(t_load);
    free(t_enc);
    free(t_dec);
    return 0;
}
