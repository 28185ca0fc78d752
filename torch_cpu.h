/* torch_cpu.h - torch's CPU float32 arithmetic as the official code runs it on x86 (one thread, AVX-512
 * dispatch), so that the vision tower (vision.c) gives the official float32 run's bits where its inputs are the
 * same: the blocks MKL sums a matrix product in, the order of torch.sum, the vectorized exp (softmax, SiLU) and
 * softmax. Plain C with fmaf (correctly rounded everywhere): the same bits on every machine.
 * tools/torch_order.py measures each rule against the installed torch; test/test_torch_cpu.py checks them
 * against its recorded outputs.
 */
#ifndef ZAYA_TORCH_CPU_H
#define ZAYA_TORCH_CPU_H

/* The blocks a float32 matrix product's sum over k runs in, in torch's CPU run with one thread (MKL's sgemm
 * and batched sgemm, measured by tools/torch_order.py for 4+ rows and 12+ columns; golden_vl.py runs torch on one
 * thread): k < 193 one block; k < 385 two halves (an odd k there sums in an order not found yet); longer, blocks
 * of 192 and the rest. Each block is one fused multiply-add chain from 0, the blocks' sums added in order.
 * Returns the block length. */
int torch_k_block(int k);
/* Row i of an m-row float32 torch.matmul A @ B as torch's CPU run sums it: y[c] = sum_k a[k * as] b[k * bs + c]
 * for c < cols; a product of fewer than 400 multiply-adds (m * k * cols) in torch's own loop (rounded products
 * added in order), a larger one in torch_k_block's blocks of fused multiply-add chains. part: [cols] scratch. */
void torch_matmul_row(float *y, const float *a, int as, const float *b, int bs, int cols, int k, int m, float *part);
/* x[0] + ... + x[n-1] in the order of torch.sum over a contiguous float32 row (aten SumKernel.cpp,
 * vectorized_inner_sum at its 8-lane (AVX2) dispatch: four vector accumulators, the cascade of row_sum,
 * the scalar tail, then the lanes in order). mean(-1) is this divided by n. */
float torch_sum(const float *x, int n);
/* e^x as torch's Vectorized<float>::exp computes it (SLEEF's expf_u10 with FMA): within 1 ulp of e^x,
 * 0 below -104, inf above 100, NaN for NaN. */
float torch_expf(float x);
/* softmax over the last dimension as aten's _vec_softmax_lastdim: m = max, e_j = torch_expf(x_j - m),
 * their sum as vec::reduce_all (16 lanes, then the lanes halved: AVX-512; a row of n < 16 in order), then
 * e_j * (1 / sum). In place. */
void torch_softmax(float *x, int n);

#endif /* ZAYA_TORCH_CPU_H */
