/* matmul_rate.c - one matrix product's speed on one thread, against a plain read of its weight bytes.
 *
 * Build: make build/matmul_rate (make test does this)
 * Run:   build/matmul_rate f32|bf16|int8 ROWS COLS TOKENS [--rounds N]
 *
 * A ROWS x COLS matrix of random weights (int8: groups of 64 with their scales) in 2 MB-aligned
 * memory marked MADV_HUGEPAGE, as the engine's weights are, times TOKENS random activation rows:
 * kernels.c's matmul() on one thread. Each of N rounds (default 9) runs the product once, then reads
 * the weight bytes once with bandwidth.c's read loop (read_sum.h), so the two see the same seconds of
 * a host whose memory speed drifts. A matrix larger than the last-level cache measures the product
 * from memory (decode: TOKENS 1); a small one, from the caches (the multiply-adds: prefill).
 *
 * stdout, one line: medians over the rounds (the range of the product's rate in parentheses)
 *   matmul_rate dtype=bf16 rows=32768 cols=2048 tokens=1 rounds=9 GMAC/s=15.4 (14.6-15.5)
 *       product_GB/s=30.8 read_GB/s=32.9 ratio=0.94
 * product_GB/s = weight bytes / product time; ratio = median over rounds of read time / product time.
 * Errors: a message on stderr, exit 1; usage: 2.
 */
#define _GNU_SOURCE   /* madvise(MADV_HUGEPAGE) */
#include "kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "read_sum.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int usage(const char *what, const char *found) {
    if (what) fprintf(stderr, "matmul_rate: %s\n  found: %s\n", what, found);
    fprintf(stderr, "usage: matmul_rate f32|bf16|int8 ROWS COLS TOKENS [--rounds N]\n"
                    "  ROWS, COLS, TOKENS, N: whole numbers >= 1 (int8: COLS a multiple of its group size, 64)\n");
    return 2;
}

static long positive(const char *s) {   /* a whole number in 1..2^30, else -1 */
    char *end;
    const long v = strtol(s, &end, 10);
    return *s && !*end && v >= 1 && v <= (1L << 30) ? v : -1;
}

static uint32_t rng = 12345;
static float random_unit(void) {   /* uniform in [-0.5, 0.5) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 16777216.0f - 0.5f;
}

int main(int argc, char **argv) {
    if (argc != 5 && argc != 7) return usage(NULL, NULL);
    const int dtype = !strcmp(argv[1], "f32") ? ZAYA_F32 : !strcmp(argv[1], "bf16") ? ZAYA_BF16 : !strcmp(argv[1], "int8") ? ZAYA_Q8 : -1;
    if (dtype < 0) return usage("the dtype must be f32, bf16 or int8", argv[1]);
    const char *names[3] = {"ROWS", "COLS", "TOKENS"};
    long dim[3], rounds = 9;
    for (int i = 0; i < 3; i++)
        if ((dim[i] = positive(argv[2 + i])) < 0) {
            char what[64];
            snprintf(what, sizeof what, "%s must be a whole number from 1 to 2^30", names[i]);
            return usage(what, argv[2 + i]);
        }
    if (argc == 7 && strcmp(argv[5], "--rounds")) return usage("unknown option", argv[5]);
    if (argc == 7 && (rounds = positive(argv[6])) < 0) return usage("--rounds must be a whole number >= 1", argv[6]);
    const long rows = dim[0], cols = dim[1], tokens = dim[2];
    if (dtype == ZAYA_Q8 && cols % 64) return usage("int8 COLS must be a multiple of 64 (the group size)", argv[3]);

    const size_t n = (size_t)rows * (size_t)cols, elem = dtype == ZAYA_F32 ? 4 : dtype == ZAYA_BF16 ? 2 : 1;
    const size_t bytes = n * elem, huge = (size_t)1 << 21, alloc = (bytes + huge - 1) / huge * huge;
    const double acts = (double)tokens * (double)(rows + cols) * sizeof(float);   /* x and y */
    if (bytes > ((size_t)16 << 30) || acts > 16e9) {
        fprintf(stderr, "matmul_rate: a %ld x %ld %s matrix and %ld tokens need %.1f GB of weights and %.1f GB of activations\n"
                        "  expected: at most 16 GB of each\n  hint: a matrix of 64 MB or more already measures the product from memory\n",
                rows, cols, argv[1], tokens, bytes / 1e9, acts / 1e9);
        return 1;
    }
    unsigned char *w = aligned_alloc(huge, alloc);
    float *scales = dtype == ZAYA_Q8 ? malloc(n / 64 * sizeof(float)) : NULL;
    float *x = calloc_lines((size_t)tokens * (size_t)cols, sizeof(float)), *y = calloc_lines((size_t)tokens * (size_t)rows, sizeof(float));
    double *rate = malloc((size_t)rounds * sizeof(double)), *product = malloc((size_t)rounds * sizeof(double)),
           *read = malloc((size_t)rounds * sizeof(double)), *ratio = malloc((size_t)rounds * sizeof(double));
    Kernels *k = kernels_new(1, (int)cols, (int)tokens);
    if (!w || (dtype == ZAYA_Q8 && !scales) || !x || !y || !rate || !product || !read || !ratio || !k) {
        fprintf(stderr, "matmul_rate: out of memory for a %ld x %ld %s matrix and %ld tokens (%.2f GB of weights)\n",
                rows, cols, argv[1], tokens, bytes / 1e9);
        return 1;
    }
    madvise(w, alloc, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; i++) {
        const float v = random_unit();
        if (dtype == ZAYA_F32) memcpy(w + 4 * i, &v, 4);
        else if (dtype == ZAYA_BF16) { uint32_t b; memcpy(&b, &v, 4); const uint16_t h = (uint16_t)(b >> 16); memcpy(w + 2 * i, &h, 2); }
        else w[i] = (unsigned char)(int8_t)(v * 254.0f);
    }
    for (size_t g = 0; scales && g < n / 64; g++) scales[g] = 1.0f / 127.0f;
    for (size_t i = 0; i < (size_t)tokens * (size_t)cols; i++) x[i] = random_unit();
    const ZayaMatrix m = {dtype, (int)rows, (int)cols, dtype == ZAYA_Q8 ? 64 : 0, w, scales, 0, NULL, 0, 0};

    matmul(k, y, (int)rows, &m, x, (int)cols, (int)tokens);   /* pages in, caches warm */
    volatile uint64_t sink = read_sum(w, bytes);
    for (long r = 0; r < rounds; r++) {
        double t = now_s();
        matmul(k, y, (int)rows, &m, x, (int)cols, (int)tokens);
        product[r] = now_s() - t;
        t = now_s();
        sink += read_sum(w, bytes);
        read[r] = now_s() - t;
        rate[r] = (double)n * (double)tokens / product[r] / 1e9;
        ratio[r] = read[r] / product[r];
    }
    (void)sink;
    const double p = median(product, (int)rounds), rd = median(read, (int)rounds), q = median(ratio, (int)rounds);
    const double gmac = median(rate, (int)rounds);   /* median() sorts: rate[0] is the least */
    printf("matmul_rate dtype=%s rows=%ld cols=%ld tokens=%ld rounds=%ld GMAC/s=%.2f (%.2f-%.2f) product_GB/s=%.2f read_GB/s=%.2f ratio=%.3f\n",
           argv[1], rows, cols, tokens, rounds, gmac, rate[0], rate[rounds - 1], bytes / p / 1e9, bytes / rd / 1e9, q);
    kernels_free(k);
    free(w), free(scales), free(x), free(y), free(rate), free(product), free(read), free(ratio);
    return 0;
}
