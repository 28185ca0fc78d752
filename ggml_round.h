/* ggml_round.h - ggml's CPU arithmetic as a placement (--precision fp32+ggml): the roundings ggml's CPU
 * backend applies to the activations before a product with a weight of a given ggml type.
 *
 * ggml's mul_mat converts its float32 input to the weight type's vec_dot_type (ggml-cpu.c, type_traits_cpu)
 * before the dot products: Q8_K for the K-quants and IQ4_XS, Q8_0 for Q8_0 / Q4_0 / Q5_0 / IQ4_NL, Q8_1
 * for Q4_1 / Q5_1, F16 for F16 weights, BF16 for BF16 weights, nothing for F32. ggml_round_row() gives
 * the values those quantized activations stand for (the quantized value times its scale, exact in
 * float32); the product of them with the dequantized weights is then ggml's up to the order of the float32
 * sums. Q4_1 / Q5_1 weights (w = d q + m per block of 32) meet Q8_1's second scale: ggml's dot product is
 * d d_x sum(q q_x) + m s with s = fp16(d_x * sum q_x), not m times the sum of the values the block stands
 * for; ggml_round_row_s() gives s minus that sum per block, and the product adds m times it.
 */
#ifndef ZAYA_GGML_ROUND_H
#define ZAYA_GGML_ROUND_H

/* ggml type ids (ggml.h enum ggml_type) of the weights and vec_dot_types used here. */
enum {
    GGML_T_F32 = 0, GGML_T_F16 = 1, GGML_T_Q4_0 = 2, GGML_T_Q4_1 = 3, GGML_T_Q5_0 = 6, GGML_T_Q5_1 = 7,
    GGML_T_Q8_0 = 8, GGML_T_Q8_1 = 9, GGML_T_Q2_K = 10, GGML_T_Q3_K = 11, GGML_T_Q4_K = 12, GGML_T_Q5_K = 13,
    GGML_T_Q6_K = 14, GGML_T_Q8_K = 15, GGML_T_IQ2_XXS = 16, GGML_T_IQ2_XS = 17, GGML_T_IQ3_XXS = 18, GGML_T_IQ1_S = 19,
    GGML_T_IQ4_NL = 20, GGML_T_IQ3_S = 21, GGML_T_IQ2_S = 22, GGML_T_IQ4_XS = 23, GGML_T_IQ1_M = 29, GGML_T_BF16 = 30,
    GGML_T_TQ1_0 = 34, GGML_T_TQ2_0 = 35, GGML_T_MXFP4 = 39
};

/* The vec_dot_type of weight type t (ggml-cpu.c type_traits_cpu): Q8_K for the K-quants, the IQ types but IQ4_NL,
 * TQ1_0 and TQ2_0; Q8_0 for Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4; Q8_1 for Q4_1, Q5_1; GGML_T_F32 for F32 weights and
 * for the types not listed above (no rounding modelled), -1 never. */
int ggml_vec_dot_type(int t);
/* Elements per block of a vec_dot_type: 256 (Q8_K), 32 (Q8_0, Q8_1), 1 (F16, BF16, F32). */
int ggml_block_size(int vec_dot_type);

/* float32 -> IEEE half, round to nearest even (ggml's GGML_CPU_FP32_TO_FP16: F16C's _cvtss_sh or
 * ggml_compute_fp32_to_fp16), and back (exact). */
unsigned short ggml_fp32_to_fp16(float f);
float ggml_fp16_to_fp32(unsigned short h);
/* x rounded to half / bfloat16 and widened back (ggml's F16 and BF16 conversions, ties to even). */
float ggml_round_f16(float x);
float ggml_round_bf16(float x);

/* Quantizers of one block, returning the values the block stands for (q * d in float32) in y:
 *   q8_0_ref   quantize_row_q8_0_ref (ggml-quants.c): d = amax / 127, q = roundf(x * (1 / d)) (ties away)
 *   q8_0_x86   quantize_row_q8_0 of ggml-cpu/arch/x86/quants.c (AVX/AVX2 builds; also the repacked
 *              4x8 kernels' ggml_quantize_mat_q8_0_4x8): q = round-to-even(x * (127 / amax)), saturated
 *   q8_1       quantize_row_q8_1 (x86 and reference round like their q8_0)
 *   q8_k       quantize_row_q8_K_ref (the x86 build calls it; the repacked 4x8 variant gives the same
 *              values): iscale = -127 / x_max (the value of largest magnitude, the first one), q = nearest
 *              int (ties to even), at most 127, d = 1 / iscale
 * d is stored as fp16 for Q8_0 / Q8_1 (y uses the stored half), as float32 for Q8_K. */
void ggml_q8_0_ref(const float *x, float *y);
void ggml_q8_0_x86(const float *x, float *y);
void ggml_q8_k(const float *x, float *y);

/* A row of n activations (n a multiple of the block size) as ggml's CPU backend hands it to the dot
 * products with a weight of ggml type `weight_type`: y = x rounded per its vec_dot_type (y may be x). x86
 * = 1: the AVX/AVX2 builds' Q8_0 / Q8_1 (what the port runs on this machine), 0: the reference one. */
void ggml_round_row(float *y, const float *x, int n, int weight_type, int x86);
/* The same, and for a weight type whose vec_dot_type is Q8_1 (Q4_1, Q5_1) with s_excess given: s_excess[b] =
 * s - sum(y[32 b .. 32 b + 31]) for each block b (n / 32 values; s the block's second scale, below). */
void ggml_round_row_s(float *y, float *s_excess, const float *x, int n, int weight_type, int x86);
/* Q8_1's second scale of a block of 32, s = fp16(d * sum q) widened, d = amax / 127 in float32 (not the stored
 * half): x86's quantize_row_q8_1 (the int32 q before the packs saturate, summed with int32 wraparound) or
 * quantize_row_q8_1_ref (x86 = 0: the sum of the stored int8 q). */
float ggml_q8_1_s(const float *x, int x86);

/* ggml_gelu's CPU value (ggml-cpu/vec.h ggml_vec_gelu_f32, GGML_GELU_FP16): 0 at x <= -10, x at x >= 10, else
 * its table of the tanh-approximated GELU, in F16, at x rounded to F16. ggml_gelu_init() fills the table
 * (65536 values, once; call it before ggml_gelu, from one thread). */
void ggml_gelu_init(void);
float ggml_gelu(float x);

#endif /* ZAYA_GGML_ROUND_H */
