/* ggml_round.c - ggml's CPU activation quantizers, as values (ggml_round.h). Written from ggml's
 * quantize_row_q8_0_ref / quantize_row_q8_1_ref / quantize_row_q8_K_ref (ggml/src/ggml-quants.c), x86's
 * quantize_row_q8_0 / quantize_row_q8_1 (ggml/src/ggml-cpu/arch/x86/quants.c) and the vec_dot_types of
 * ggml-cpu.c's type_traits_cpu. Plain loops: these are the references (test/test_ggml_round.py checks them
 * against values ggml's own from_float computed, tools/ggml_round_fixtures.c).
 */
#include "ggml_round.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

int ggml_vec_dot_type(int t) {
    switch (t) {
    case GGML_T_F16: return GGML_T_F16;
    case GGML_T_BF16: return GGML_T_BF16;
    case GGML_T_Q4_0: case GGML_T_Q5_0: case GGML_T_Q8_0: case GGML_T_IQ4_NL: case GGML_T_MXFP4: return GGML_T_Q8_0;
    case GGML_T_Q4_1: case GGML_T_Q5_1: return GGML_T_Q8_1;
    case GGML_T_Q2_K: case GGML_T_Q3_K: case GGML_T_Q4_K: case GGML_T_Q5_K: case GGML_T_Q6_K: case GGML_T_IQ4_XS:
    case GGML_T_IQ2_XXS: case GGML_T_IQ2_XS: case GGML_T_IQ3_XXS: case GGML_T_IQ1_S: case GGML_T_IQ3_S:
    case GGML_T_IQ2_S: case GGML_T_IQ1_M: case GGML_T_TQ1_0: case GGML_T_TQ2_0:
        return GGML_T_Q8_K;
    default: return GGML_T_F32;
    }
}

int ggml_block_size(int vec_dot_type) {
    return vec_dot_type == GGML_T_Q8_K ? 256 : vec_dot_type == GGML_T_Q8_0 || vec_dot_type == GGML_T_Q8_1 ? 32 : 1;
}

unsigned short ggml_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((x >> 13) & 0x3ffu);   /* NaN stays NaN */
    if (x >= 0x477ff000u) return sign | 0x7c00u;      /* >= 65520 (half way above 65504): infinity */
    if (x < 0x38800000u) {                            /* below 2^-14: a subnormal half, in units of 2^-24 */
        float a;
        memcpy(&a, &x, 4);
        return sign | (uint16_t)nearbyintf(a * 16777216.0f);   /* exact scaling, one rounding to even */
    }
    x -= 112u << 23;                                  /* rebias the exponent 127 -> 15 */
    return sign | (uint16_t)((x + 0xfffu + ((x >> 13) & 1u)) >> 13);   /* 13 bits off, ties to even */
}

float ggml_fp16_to_fp32(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | man << 13;
    else if (exp) bits = sign | (exp + 112) << 23 | man << 13;
    else {
        float f = (float)man / 16777216.0f;           /* subnormal: man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

float ggml_round_f16(float x) { return ggml_fp16_to_fp32(ggml_fp32_to_fp16(x)); }

float ggml_round_bf16(float x) {   /* ggml_compute_fp32_to_bf16: NaN quietened, else round to nearest even */
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) b = (b | 0x00400000u) & 0xffff0000u;
    else b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &b, 4);
    return x;
}

void ggml_q8_0_ref(const float *x, float *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));   /* MAX(amax, fabsf(v)) */
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    const float dh = ggml_round_f16(d);                              /* y[i].d = GGML_FP32_TO_FP16(d) */
    for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)roundf(x[j] * id) * dh;
}

void ggml_q8_0_x86(const float *x, float *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));   /* _mm256_max_ps of the magnitudes */
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    const float dh = ggml_round_f16(d);
    for (int j = 0; j < 32; j++) {
        const float q = nearbyintf(x[j] * id);                       /* _mm256_round_ps(_MM_ROUND_NEAREST) */
        /* _mm256_cvtps_epi32: out of range or NaN (x * inf when amax is tiny) gives INT32_MIN; the packs saturate */
        const int qi = !(q >= -2147483648.0f && q < 2147483648.0f) ? -128
                       : q > 127.0f ? 127 : q < -128.0f ? -128 : (int)q;
        y[j] = (float)qi * dh;
    }
}

static int nearest_int(float fval) {   /* ggml-quants.c: ties to even through the float adder */
    const float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

void ggml_q8_k(const float *x, float *y) {
    float max = 0, amax = 0;
    for (int j = 0; j < 256; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (!amax) { for (int j = 0; j < 256; j++) y[j] = 0.0f; return; }
    const float iscale = -127.f / max;
    const float d = 1 / iscale;
    for (int j = 0; j < 256; j++) {
        const int v = nearest_int(iscale * x[j]);
        y[j] = d * (float)(v < 127 ? v : 127);
    }
}

float ggml_q8_1_s(const float *x, int x86) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.f;
    uint32_t sum = 0;   /* x86: hsum_i32_8 of the int32 values before the packs saturate (int32 adds wrap) */
    if (x86) {
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        for (int j = 0; j < 32; j++) {
            const float q = nearbyintf(x[j] * id);
            sum += !(q >= -2147483648.0f && q < 2147483648.0f) ? 0x80000000u : (uint32_t)(int32_t)q;
        }
    } else {            /* quantize_row_q8_1_ref: the sum of the stored int8 values */
        const float id = d ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) sum += (uint32_t)(int32_t)(int8_t)roundf(x[j] * id);
    }
    int32_t isum;
    memcpy(&isum, &sum, 4);
    return ggml_round_f16(d * (float)isum);   /* y[i].s = GGML_FP32_TO_FP16(d * sum) */
}

void ggml_round_row(float *y, const float *x, int n, int weight_type, int x86) {
    ggml_round_row_s(y, NULL, x, n, weight_type, x86);
}

void ggml_round_row_s(float *y, float *s_excess, const float *x, int n, int weight_type, int x86) {
    const int v = ggml_vec_dot_type(weight_type), bs = ggml_block_size(v);
    for (int i = 0; i + bs <= n; i += bs) {
        if (v == GGML_T_Q8_1 && s_excess) {   /* s before y: y may be x */
            const float s = ggml_q8_1_s(x + i, x86);
            (x86 ? ggml_q8_0_x86 : ggml_q8_0_ref)(x + i, y + i);
            float sum = 0.0f;   /* d * sum(q): exact in float32 (11 + 12 significant bits) */
            for (int j = 0; j < 32; j++) sum += y[i + j];
            s_excess[i / 32] = s - sum;
        } else if (v == GGML_T_Q8_K) ggml_q8_k(x + i, y + i);
        else if (v == GGML_T_Q8_0 || v == GGML_T_Q8_1) (x86 ? ggml_q8_0_x86 : ggml_q8_0_ref)(x + i, y + i);
        else if (v == GGML_T_F16) y[i] = ggml_round_f16(x[i]);
        else if (v == GGML_T_BF16) y[i] = ggml_round_bf16(x[i]);
        else y[i] = x[i];
    }
    for (int i = n / bs * bs; i < n; i++) y[i] = x[i];   /* a tail ggml never has (rows are whole blocks) */
}

/* ggml_vec_gelu_f32 with GGML_GELU_FP16 (ggml-cpu/vec.h, the CPU build's default): x <= -10 -> 0, x >= 10 -> x,
 * else the F16 table of ggml_gelu_f32 (the tanh approximation) at x rounded to F16, widened. */
static float gelu_table[1 << 16];
static int gelu_ready;

void ggml_gelu_init(void) {
    if (gelu_ready) return;
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f, coef_a = 0.044715f;
    for (int i = 0; i < 1 << 16; i++) {   /* ggml_cpu_init: table_gelu_f16[i] = f16(ggml_gelu_f32(f32(i))) */
        const float f = ggml_fp16_to_fp32((unsigned short)i);
        gelu_table[i] = ggml_round_f16(0.5f * f * (1.0f + tanhf(sqrt_2_over_pi * f * (1.0f + coef_a * f * f))));
    }
    gelu_ready = 1;
}

float ggml_gelu(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return gelu_table[ggml_fp32_to_fp16(x)];
}
