/* bandwidth.c - memory READ bandwidth of this machine, the ceiling of a weight-streaming decoder.
 *
 * Build:  cc -O3 -march=native -pthread -o build/bandwidth bench/bandwidth.c
 * Run:    build/bandwidth                    # 1 and 2 threads, 2048 MB buffer, best of 7
 *         build/bandwidth -t 1,2,4 -m 4096 -r 7
 *
 * A buffer much larger than the caches is filled once (every page touched, by the thread that will
 * read it), then each of T threads reads its own contiguous 1/T of it, summing 64-bit words. One run
 * = all threads start together, wall time until the last one finishes; bytes / time = GB/s (1e9).
 * Runs alternate between the thread counts; the best of the runs is reported, one machine-readable line per thread count on stdout:
 *
 *   bandwidth threads=1 GB/s=24.13 MB=2048 runs=7 kernel=avx512 spread=2.1%
 *
 * spread = (best - worst) / best over the runs. The read loop uses AVX-512 loads when compiled with
 * -mavx512f (e.g. -march=native on Zen 4), else a portable 8-accumulator loop that the compiler
 * vectorizes. Only libc and pthreads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "read_sum.h"   /* the read loop, shared with decode_vs_read.c */

#define MAX_THREADS 256

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    uint64_t *p;
    size_t n_words;
    int fill;                 /* 1: write the slice (first touch), 0: read it */
    uint64_t sum;
    pthread_barrier_t *start;
} Job;

static void *worker(void *arg) {
    Job *j = arg;
    pthread_barrier_wait(j->start);
    if (j->fill) {
        for (size_t i = 0; i < j->n_words; i++) j->p[i] = (uint64_t)i * 0x9E3779B97F4A7C15ull;
    } else {
        j->sum = read_sum((const unsigned char *)j->p, j->n_words * 8);
    }
    return NULL;
}

/* one parallel pass with T threads; returns wall seconds from the common start to the last join */
static double pass(uint64_t *buf, size_t n_words, int T, int fill, uint64_t *sum) {
    pthread_t th[MAX_THREADS];
    Job jobs[MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)T + 1);
    size_t per = (n_words / T) & ~(size_t)7; /* whole 64-byte lines */
    for (int t = 0; t < T; t++) {
        jobs[t].p = buf + (size_t)t * per;
        jobs[t].n_words = t == T - 1 ? n_words - (size_t)t * per : per;
        jobs[t].fill = fill;
        jobs[t].sum = 0;
        jobs[t].start = &start;
        if (pthread_create(&th[t], NULL, worker, &jobs[t]) != 0) {
            fprintf(stderr, "bandwidth: pthread_create failed\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&start);
    double t0 = now_s();
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    double dt = now_s() - t0;
    pthread_barrier_destroy(&start);
    for (int t = 0; t < T; t++) *sum += jobs[t].sum;
    return dt;
}

static void usage(void) {
    fprintf(stderr,
            "usage: bandwidth [-t 1,2] [-m MB] [-r RUNS] [--no-thp]\n"
            "  -t LIST   thread counts, comma separated (default 1,2)\n"
            "  -m MB     buffer size in MiB (default 2048)\n"
            "  -r RUNS   runs per thread count, the best is reported (default 7)\n"
            "  --no-thp  do not ask for transparent huge pages\n");
    exit(2);
}

volatile uint64_t sink; /* keeps the sums alive */

int main(int argc, char **argv) {
    int threads[64], n_threads = 0, runs = 7, thp = 1;
    size_t mb = 2048;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-t") && i + 1 < argc) {
            char *s = argv[++i], *end;
            while (*s) {
                long v = strtol(s, &end, 10);
                if (end == s || v < 1 || v > MAX_THREADS || n_threads == 64) usage();
                threads[n_threads++] = (int)v;
                s = *end == ',' ? end + 1 : end;
                if (*end && *end != ',') usage();
            }
        } else if (!strcmp(a, "-m") && i + 1 < argc) {
            long v = strtol(argv[++i], NULL, 10);
            if (v < 64) usage();
            mb = (size_t)v;
        } else if (!strcmp(a, "-r") && i + 1 < argc) {
            runs = atoi(argv[++i]);
            if (runs < 1) usage();
        } else if (!strcmp(a, "--no-thp")) {
            thp = 0;
        } else {
            usage();
        }
    }
    if (!n_threads) { threads[0] = 1; threads[1] = 2; n_threads = 2; }

    size_t bytes = mb << 20;
    size_t align = (size_t)2 << 20;
    uint64_t *buf = aligned_alloc(align, bytes);
    if (!buf) {
        fprintf(stderr, "bandwidth: cannot allocate %zu MB: %s\n", mb, strerror(errno));
        return 1;
    }
#ifdef MADV_HUGEPAGE
    if (thp) madvise(buf, bytes, MADV_HUGEPAGE);
#else
    (void)thp;
#endif
    size_t n_words = bytes / 8;
    uint64_t sum = 0;
    int max_t = 1;
    for (int k = 0; k < n_threads; k++) if (threads[k] > max_t) max_t = threads[k];
    pass(buf, n_words, max_t, 1, &sum); /* first touch, spread over the threads */
    pass(buf, n_words, 1, 0, &sum);     /* warm-up read */

    /* runs interleaved over the thread counts (1,2,1,2,...): each count sees the same machine noise */
    double best[64], worst[64];
    for (int k = 0; k < n_threads; k++) { best[k] = 1e30; worst[k] = 0; }
    for (int r = 0; r < runs; r++) {
        for (int k = 0; k < n_threads; k++) {
            double dt = pass(buf, n_words, threads[k], 0, &sum);
            if (dt < best[k]) best[k] = dt;
            if (dt > worst[k]) worst[k] = dt;
        }
    }
    for (int k = 0; k < n_threads; k++)
        printf("bandwidth threads=%d GB/s=%.2f MB=%zu runs=%d kernel=%s spread=%.1f%%\n", threads[k],
               bytes / best[k] / 1e9, mb, runs, READ_SUM_KERNEL, 100.0 * (worst[k] - best[k]) / worst[k]);
    sink = sum;
    free(buf);
    return 0;
}
