/* kernels.h - the fast path of zaya.c: matrix products, attention, threads, huge pages.
 *
 * zaya.c (the model) calls these; it never sees SIMD, threads or a matrix's storage layout (blob.c
 * binds each tensor to a ZayaMatrix, tensor.h; kernels.c reads its values). Each fast kernel
 * has a plain-loop reference twin (*_ref) that test/test_kernels.c compares it with. The fast
 * kernels give the same bits for any thread count and any number of tokens per call.
 */
#ifndef ZAYA_KERNELS_H
#define ZAYA_KERNELS_H

#include "tensor.h"

/* Threads and scratch: one per ZayaState. threads <= 0 means zaya_default_threads(). NULL when out
 * of memory or when the threads cannot be started. */
typedef struct Kernels Kernels;
Kernels *kernels_new(int threads, int max_cols, int max_tokens);
/* The cores this process may run on (sched_getaffinity). */
int zaya_default_threads(void);
void kernels_free(Kernels *k);
int kernels_threads(const Kernels *k);
/* The pool's counts since kernels_new as one line for stderr (no newline; ./zaya's and decode_vs_read's
 * `pool:` line): stalls (a wait for a descheduled thread's piece), those when other programs wanted
 * the cores, the milliseconds they waited, jobs the caller then ran alone of all parallel jobs. */
void kernels_pool_report(const Kernels *k, char *line, size_t len);

/* Y[t][o] = W[o] . X[t] for tokens t < n (X's rows xs floats apart, Y's ys apart; n <= max_tokens,
 * W->cols <= max_cols). int8 weights meet the activations quantized to int16 per group. */
void matmul(Kernels *k, float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n);
/* The same with float activations and plain loops (int8 weights dequantized). */
void matmul_ref(float *y, int ys, const ZayaMatrix *w, const float *x, int xs, int n);
/* Y[t][o] = bias[o] + W[o] . X[t] summed as torch's CPU nn.Linear sums a float32 product (MKL's sgemm on one
 * thread: the bias, then each block of k (torch_cpu.h's torch_k_block) added in order): the vision tower's
 * products, the official float32 run's bits when its inputs are (4+ rows, 12+ outputs). bias: NULL for none.
 * Any weight dtype (widened to float32). The same bits for any thread count; matmul_chain_ref: plain loops. */
void matmul_chain(Kernels *k, float *y, int ys, const ZayaMatrix *w, const float *bias, const float *x, int xs, int n);
void matmul_chain_ref(float *y, int ys, const ZayaMatrix *w, const float *bias, const float *x, int xs, int n);
/* Several products of the same input X (n tokens, W_i->cols the same): Y_i[t] = W_i . X[t], Y_i's
 * rows ys_i apart. The same bits as one matmul() per product (its reference: matmul_ref on each);
 * one job for the threads, and for int8 weights of one format the input quantized once for all. */
typedef struct { const ZayaMatrix *w; float *y; int ys; } MatmulOut;
void matmuls(Kernels *k, const MatmulOut *out, int count, const float *x, int xs, int n);
/* A grouped product (torch Conv1d's groups, as one product): W's rows in `groups` equal groups,
 * group j's rows meet X[t]'s columns [j * W->cols, (j + 1) * W->cols). For int8 weights
 * groups * W->cols <= max_cols and W->cols a multiple of its group size. */
void matmul_grouped(Kernels *k, float *y, int ys, const ZayaMatrix *w, int groups, const float *x, int xs, int n);
void matmul_grouped_ref(float *y, int ys, const ZayaMatrix *w, int groups, const float *x, int xs, int n);

/* ggml's CPU arithmetic as a placement (--precision fp32+ggml, ggml_round.h), a sum of flags: with
 * KERNELS_GGML_X86 (x86's Q8_0, the AVX/AVX2 builds) or KERNELS_GGML_REF (ggml's reference Q8_0), matmul and
 * matmuls first round their input as ggml's CPU backend hands it to the dot products with a weight of the
 * matrix's ggml type (ZayaMatrix.ggml_type; a matrix without one is not touched); KERNELS_GGML_CONV:
 * matmul_grouped (float32 weights) computes as llama.cpp's ZAYA port does its grouped conv: weights and input
 * rounded to F16 (ggml_cast and ggml_conv_1d's im2col), products summed in float32 (plain loops). 0 turns
 * it off. KERNELS_GGML_KV: attention as ggml's without flash attention over an F16 KV cache: keys and query
 * in F16 for the scores, values and probabilities in F16 for the output (float32 sums, plain loops).
 * KERNELS_GGML_FA: the attention output as ggml-cpu's flash attention's one-chunk path computes it (zaya.h
 * ZAYA_GGML_FA: keys, values and query in F16, the values accumulated in F16); the probabilities stay the plain
 * softmax of the scores (flash attention has none).
 * Out of memory: stays off. */
enum { KERNELS_GGML_X86 = 1, KERNELS_GGML_REF = 2, KERNELS_GGML_CONV = 4, KERNELS_GGML_KV = 8, KERNELS_GGML_FA = 16 };
void kernels_set_ggml(Kernels *k, int mode);

/* Zeroed memory aligned to a cache line (the buffers the kernels stream through); free() it. */
void *calloc_lines(size_t n, size_t size);

/* Row `row` of W widened to float32 (the embedding lookup). */
void matrix_row(const ZayaMatrix *w, int row, float *out);
/* Rows [row0, row0 + nrows) of W as a matrix of their own (one expert of a stacked tensor). */
ZayaMatrix matrix_rows(const ZayaMatrix *w, int row0, int nrows);

/* The KV cache of one layer: [nkv, cache_len, d]; position pos of KV head h at kv_row(). A sliding
 * layer's cache is a ring of cache_len slots. */
typedef struct {
    float *keys, *values;
    int cache_len, nkv, d;
} KvCache;
static inline size_t kv_row(const KvCache *kv, int h, int pos) {
    const int slot = pos < kv->cache_len ? pos : pos % kv->cache_len;
    return ((size_t)h * (size_t)kv->cache_len + (size_t)slot) * (size_t)kv->d;
}

/* Causal attention of one query token over the cached keys and values of positions first..pos:
 * for query head n (of nq) and its KV head n / (nq / nkv),
 *   probs[n][t - first] = softmax_t(q[n] . k_t * scale),  out[n] = sum_t probs[n][t - first] v_t.
 * q [nq, d], out [nq, d], probs [nq, pos - first + 1]; scale = d^-1/2 (HF's scaling). bf16: as the
 * official code in bfloat16 (eager_attention_forward): q . k, its product with scale, the
 * probabilities and out each rounded to bfloat16 (float32 inside the dot products and the softmax). */
void attention(Kernels *k, float *out, float *probs, const float *q, int nq, const KvCache *kv, int first, int pos,
               float scale, int bf16);
void attention_ref(float *out, float *probs, const float *q, int nq, const KvCache *kv, int first, int pos, float scale,
                   int bf16);

/* softmax in float32 with the maximum subtracted (torch.softmax). */
void softmax(float *x, int n);

/* The blob mapped into memory that may use 2 MB transparent huge pages: a private copy of `size`
 * bytes of map (each piece dropped from map once copied). NULL when out of memory. */
void *copy_to_huge_pages(void *map, size_t size, size_t *alloc_size);
/* The file mapped read-only at a 2 MB boundary with MADV_HUGEPAGE (the page cache's 2 MB pieces
 * map whole); MAP_FAILED if it cannot be mapped. */
void *map_file_huge(int fd, size_t size);
/* Reads a mapping's pages in now (MADV_POPULATE_READ); -1 where the kernel cannot. */
int populate_mapping(void *p, size_t size);
/* Of the mapping that holds p: resident bytes, bytes in 2 MB pages, whether it maps a file
 * (/proc/self/smaps); -1 where unknown. */
int mapping_pages(const void *p, uint64_t *resident, uint64_t *huge, int *file);
/* In such a copy, lays out an int8 matrix's rows the way the fast kernel reads them fastest (where
 * it has such a layout; sets w->interleaved_rows). slice: rows per expert of a stacked matrix.
 * Returns -1 when out of memory. */
int kernels_arrange_rows(ZayaMatrix *w, int slice);

#endif /* ZAYA_KERNELS_H */
