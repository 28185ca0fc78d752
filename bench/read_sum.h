/* read_sum.h - the plain read of bench/bandwidth.c and bench/decode_vs_read.c: the sum of n bytes as
 * 64-bit words, 64-byte loads in 4 independent chains (AVX-512 where compiled with it, else a
 * portable 8-accumulator loop the compiler vectorizes), the tail byte by byte. Any alignment. */
#ifndef ZAYA_BENCH_READ_SUM_H
#define ZAYA_BENCH_READ_SUM_H
#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#define READ_SUM_KERNEL "avx512"
#else
#define READ_SUM_KERNEL "portable"
#endif

static uint64_t read_sum(const unsigned char *p, size_t n) {
    uint64_t s = 0;
    size_t i = 0;
#ifdef __AVX512F__
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 256 <= n; i += 256) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512((const void *)(p + i)));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512((const void *)(p + i + 64)));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512((const void *)(p + i + 128)));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512((const void *)(p + i + 192)));
    }
    s = (uint64_t)_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#else
    uint64_t w[8] = {0};
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 8; k++) {
            uint64_t v;
            memcpy(&v, p + i + 8 * k, 8);
            w[k] += v;
        }
    for (int k = 0; k < 8; k++) s += w[k];
#endif
    for (; i < n; i++) s += p[i];
    return s;
}
#endif
