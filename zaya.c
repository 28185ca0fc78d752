/* zaya.c - the ZAYA1 model in plain C: its steps and forward().
 *
 * Read it top to bottom beside docs/architecture.md ("arch §n"); the upstream code it mirrors is
 * Hugging Face transformers' src/transformers/models/zaya/modeling_zaya.py ("HF"):
 *   1. the activations of a batch, and how a step reports them (taps)
 *   2. the steps, in the order of arch §3, each named after the HF module it mirrors
 *   3. forward() and decoder_layer(): the table of contents, one call per step
 *   4. the decoding state (arch §4) and the public entry points
 * Loading the blob is blob.c; matrix products and attention are calls into kernels.c (threads,
 * SIMD and storage layouts live there); sampling and the command line are in main.c, --dump in dump.c,
 * --replay in replay.c, --kld-base in kld.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "zaya.h"
#include "ggml_round.h"
#include "kernels.h"
#include "zmath.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * 1. The activations of a batch, and taps
 *
 * forward() runs n <= s->capacity (ZAYA_BATCH) tokens at positions pos .. pos+n-1 at once: row t of every
 * buffer below belongs to token t, so each weight matrix is read once for the n tokens. Symbols
 * are arch §3's: H hidden, nq/nkv query/KV heads of d, C = (nq+nkv)*d, R router width, E experts.
 * ------------------------------------------------------------------------------------------- */

typedef struct ZayaActivations {
    float *e;                   /* embedding rows [B, H] (§3.1) */
    float *r;                   /* the residual stream [B, H] (§3.1, 3.12, 3.16) */
    float *h;                   /* the normalized input of a block [B, H] (§3.2, 3.13, 3.17) */
    float *u;                   /* [q_proj h ; k_proj h] = the convolutions' input [B, C] (§3.3) */
    float *conv_seq;            /* the conv state, then u: u_{-K} .. u_{n-1} [K + B, C] (§3.4) */
    float *conv_a;              /* depthwise outputs a_{-(t1-1)} .. a_{n-1} [t1 - 1 + B, C] */
    float *conv_cols;           /* a_{t-t1+1} .. a_t of each token, in the grouped weights' order [B, C * t1] */
    float *z;                   /* grouped conv outputs [B, C] */
    float *q_res, *k_res;       /* the residual mix [B, nq*d], [B, nkv*d] (§3.5) */
    float *q, *key;             /* queries and keys [B, nq*d], [B, nkv*d] (§3.6, normalized and rotated in place) */
    float *v, *vd;              /* values [B, nkv*d]; v_proj_delayed of each token [B, nkv*d/2] (§3.7) */
    float *rope_cos, *rope_sin; /* one position's RoPE tables [rot/2] (§3.9) */
    float *att;                 /* one token's attention probabilities [nq, keys <= ctx] (§3.10) */
    float *attn_out;            /* [B, nq*d] */
    float *branch;              /* a block's output before the residual scaling [B, H] (§3.11, 3.15) */
    float *router_down, *router_state, *router_normed, *router_fc1, *router_fc2;   /* [B, R] (§3.14) */
    float *router_logits, *router_probs, *router_scores;                          /* [B, E+1] */
    float *expert_weight;       /* the chosen class's weight [B] */
    float *expert_in, *expert_hidden, *expert_out;   /* the tokens of one expert [B, H], [B, 2I], [B, H] (§3.15) */
    int *expert;                /* the chosen router class [B] (E = skip) */
    int *expert_tokens;         /* the batch rows routed to one expert [B] */
    /* ZAYA1-VL only (NULL otherwise): a LoRA pair's rank-r middle [B, r] and output [B, out]; an image
     * position's keys and values gathered for the bidirectional mask [nkv, <= ctx, d] */
    float *lora_r, *lora_out, *image_keys, *image_values;
    unsigned char *image;       /* 1 where token t of the batch is an image position [B] */
    unsigned char *expert_image;   /* the same for the rows routed to one expert [B] */
} Activations;

/* What a step works on besides its tensors: n tokens at positions pos .. pos+n-1 of layer `layer`
 * (-1 before and after the layers), the precision, the kernels, scratch and the tap. */
typedef struct {
    const ZayaConfig *c;
    Activations *act;
    Kernels *kern;
    ZayaTapFn tap;              /* NULL: no taps */
    void *tap_ctx;
    int layer, pos, n;
    int precision;              /* ZAYA_PRECISION_*: where the official run holds bf16 tensors */
    int placement;              /* ZAYA_BF16_* flags: steps another bf16 engine computes in float32 */
    const unsigned char *image; /* ZAYA1-VL: image positions of the batch [n] (the vision LoRA), or NULL */
    int both_ways;              /* ZAYA1-VL: image positions attend to each other in both directions */
} Batch;

/* x as the official code holds it: with --precision bf16 that tensor is bfloat16 in the official run,
 * so x is rounded (to nearest, ties to even); in float32 x is unchanged. Each call is a rounding
 * point of docs/bf16.md. */
static float held(const Batch *b, float x) { return b->precision != ZAYA_PRECISION_FP32 ? zaya_round_bf16(x) : x; }

/* A rounding point of the official bf16 run that the placement flag `moved` computes in float32
 * (zaya.h: ZAYA_BF16_FP32_RESIDUAL, _NORM, _LOGITS): x unchanged when this run has the flag, else held. */
static float held_unless(const Batch *b, int moved, float x) { return b->placement & moved ? x : held(b, x); }

/* The same for n values x[t * stride + i], i < len, t < n (a product's output rows). */
static void held_rows(const Batch *b, float *x, int stride, int len, int n) {
    for (int t = 0; b->precision != ZAYA_PRECISION_FP32 && t < n; t++)
        for (int i = 0; i < len; i++) x[(size_t)t * stride + i] = zaya_round_bf16(x[(size_t)t * stride + i]);
}

/* A Python float constant multiplying a tensor: torch 1.13 rounds it to the tensor's bfloat16 first,
 * current torch keeps it float32. */
static float scalar(const Batch *b, float v) {
    return b->precision == ZAYA_PRECISION_BF16_TORCH113 ? zaya_round_bf16(v) : v;
}

/* Reports a step's output to the tap (--dump, --trace) under its HF module path: row t, `stride`
 * floats after row t-1, is the tensor [d0] (d1 = 0) or [d0, d1] of position pos + t. */
static void tap(const Batch *b, const char *name, const float *x, int stride, int d0, int d1) {
    for (int t = 0; b->tap && t < b->n; t++) {
        const ZayaTap row = {name, b->layer, b->pos + t, 0, d1 ? 2 : 1, {d0, d1}, x + (size_t)t * stride, 0};
        b->tap(b->tap_ctx, &row);
    }
}

/* The same for one number per token (shape []): int32 or float. */
static void tap_scalars(const Batch *b, const char *name, const void *x, int is_int) {
    for (int t = 0; b->tap && t < b->n; t++) {
        const void *at = is_int ? (const void *)((const int *)x + t) : (const void *)((const float *)x + t);
        const ZayaTap row = {name, b->layer, b->pos + t, is_int, 0, {0, 0}, at, 0};
        b->tap(b->tap_ctx, &row);
    }
}

/* ---------------------------------------------------------------------------------------------
 * 2. The steps (arch §3). Each runs all n tokens of the batch and reports its outputs.
 * ------------------------------------------------------------------------------------------- */

/* exact (erf) GELU */
static float gelu(float x) { return x * 0.5f * (1.0f + zaya_erff(x * 0.70710678118654752440f)); }
static float silu(float x) { return x / (1.0f + zaya_expf(-x)); }

/* SiLU as the official run computes it: float32 inside, rounded once to bf16; torch 1.13 rounded
 * exp(-x), 1 + exp(-x) and the quotient each. */
static float silu_held(const Batch *b, float x) {
    if (b->precision == ZAYA_PRECISION_BF16_TORCH113) return held(b, x / held(b, 1.0f + held(b, zaya_expf(-x))));
    return held(b, silu(x));
}

/* GELU in place over n values, each result held (the router MLP's activations) */
static void gelu_held(const Batch *b, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = held(b, b->placement & ZAYA_GGML_GELU ? ggml_gelu(x[i]) : gelu(x[i]));
}

/* y[t] += bias for the n rows of y (stride floats apart), `len` values each. */
static void add_bias(float *y, int stride, const float *bias, int len, int n) {
    for (int t = 0; t < n; t++)
        for (int i = 0; i < len; i++) y[(size_t)t * stride + i] += bias[i];
}

/* §3.1 HF ZayaModel.forward: e = embed_tokens[id]; r = (e + input_hidden_states_bias) *
 * input_hidden_states_scale, no sqrt(H) factor; bf16: e, the sum and the product are bf16, then r
 * is kept float32 (the residual stream); ZAYA_BF16_FP32_RESIDUAL: the sum and product float32. ids [n] -> r [n, H] */
static void embed(const Batch *b, const ZayaModel *m, const int *tokens, const float *features, float *e, float *r) {
    const int H = b->c->hidden_size;
    for (int t = 0; t < b->n; t++) matrix_row(&m->embed_tokens, tokens[t], e + (size_t)t * H);
    held_rows(b, e, H, H, b->n);
    tap(b, "model.embed_tokens", e, H, H, 0);
    for (int t = 0, k = 0; b->image && t < b->n; t++)   /* §V.8 HF masked_scatter: image rows in order */
        if (b->image[t]) {
            for (int i = 0; i < H; i++) e[(size_t)t * H + i] = held(b, features[(size_t)k * H + i]);
            k++;
        }
    for (int t = 0; t < b->n; t++)
        for (int i = 0; i < H; i++) {
            const float sum = held_unless(b, ZAYA_BF16_FP32_RESIDUAL,
                                          e[(size_t)t * H + i] + m->input_hidden_states_bias[i]);
            r[(size_t)t * H + i] = held_unless(b, ZAYA_BF16_FP32_RESIDUAL, sum * m->input_hidden_states_scale[i]);
        }
    tap(b, "model:input_scaled", r, H, H, 0);
}

/* §3.2 (and 3.13, 3.14, 3.17) HF ZayaRMSNorm: out = w * (x / sqrt(mean(x^2) + eps)), the weight
 * itself (not 1+w); bf16: the input rounded (the residual stream is float32), the statistics in
 * float32, x / rms rounded before the weight, the product rounded. `moved`: the placement flag that
 * computes this norm in float32 with one rounding of its output (ZAYA_BF16_FP32_NORM for the norms of
 * the residual stream, 0 for the router's). [n, dim] -> [n, dim] */
static void rmsnorm_placed(const Batch *b, int moved, const char *name, float *out, const float *x, const float *w,
                           int dim, float eps) {
    for (int t = 0; t < b->n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim, ss = 0.0f;
        for (int i = 0; i < dim; i++) ss += held_unless(b, moved, xt[i]) * held_unless(b, moved, xt[i]);
        const float inv_rms = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++)
            o[i] = held(b, w[i] * held_unless(b, moved, held_unless(b, moved, xt[i]) * inv_rms));
    }
    tap(b, name, out, dim, dim, 0);
}

/* The router's norm (its input is the bf16 EDA state): the official placement in every bf16 engine. */
static void rmsnorm(const Batch *b, const char *name, float *out, const float *x, const float *w, int dim, float eps) {
    rmsnorm_placed(b, 0, name, out, x, w, dim, eps);
}

/* The norms of the float32 residual stream (input, post-attention, final). */
static void residual_norm(const Batch *b, const char *name, float *out, const float *r, const float *w, int dim,
                          float eps) {
    rmsnorm_placed(b, ZAYA_BF16_FP32_NORM, name, out, r, w, dim, eps);
}

/* HF nn.Linear: y = W x (+ bias) for each token; bf16: accumulated in float32, rounded once with
 * the bias inside. [n, W.cols] -> [n, W.rows] */
static void linear(const Batch *b, const char *name, float *y, const ZayaMatrix *w, const float *bias, const float *x) {
    matmul(b->kern, y, w->rows, w, x, w->cols, b->n);
    if (bias) add_bias(y, w->rows, bias, w->rows, b->n);
    held_rows(b, y, w->rows, w->rows, b->n);
    tap(b, name, y, w->rows, w->rows, 0);
}

/* §V.9 HF _apply_masked_lora (Zaya1VL*): y[t] += B (A x[t]) at the batch's image positions `image`
 * (upstream runs the pair on every token and multiplies by the 0/1 mask: text rows are unchanged).
 * bf16: A x and B (A x) each rounded, then the sum. x [n, xs] (A.cols read), y [n, ys] (B.rows written) */
static void masked_lora(const Batch *b, const ZayaMatrix *A, const ZayaMatrix *B, const float *x, int xs, float *y,
                        int ys, const unsigned char *image, int n) {
    float *mid = b->act->lora_r, *out = b->act->lora_out;
    matmul(b->kern, mid, A->rows, A, x, xs, n);
    held_rows(b, mid, A->rows, A->rows, n);
    matmul(b->kern, out, B->rows, B, mid, A->rows, n);
    held_rows(b, out, B->rows, B->rows, n);
    for (int t = 0; t < n; t++)
        for (int i = 0; image[t] && i < B->rows; i++)
            y[(size_t)t * ys + i] = held(b, y[(size_t)t * ys + i] + out[(size_t)t * B->rows + i]);
}

/* §V.9 HF Zaya1VLCCAProjection: the vision LoRA of q_proj and k_proj, added to u = [q~ ; k~] before the
 * convolutions and the residual mix. h [n, H] -> u [n, C] */
static void vision_lora_qk(const Batch *b, const ZayaLayer *L, const float *h, float *u) {
    const int QD = L->q_proj.rows, C = QD + L->k_proj.rows, H = L->q_proj.cols;
    if (!b->image) return;
    masked_lora(b, &L->q_lora_a, &L->q_lora_b, h, H, u, C, b->image, b->n);
    masked_lora(b, &L->k_lora_a, &L->k_lora_b, h, H, u + QD, C, b->image, b->n);
}

/* §3.3 HF ZayaCCAProjection: q~ = q_proj h, k~ = k_proj h (+ biases), side by side: u = [q~ ; k~].
 * [n, H] -> [n, C] */
static void cca_projections(const Batch *b, const ZayaLayer *L, const float *h, float *u) {
    const int QD = L->q_proj.rows, KD = L->k_proj.rows, C = QD + KD;
    const MatmulOut out[2] = {{&L->q_proj, u, C}, {&L->k_proj, u + QD, C}};
    matmuls(b->kern, out, 2, h, L->q_proj.cols, b->n);   /* two products of h in one call */
    if (L->q_proj_bias) add_bias(u, C, L->q_proj_bias, QD, b->n);
    if (L->k_proj_bias) add_bias(u + QD, C, L->k_proj_bias, KD, b->n);
    held_rows(b, u, C, C, b->n);
    tap(b, "self_attn.qkv_proj.q_proj", u, C, QD, 0);
    tap(b, "self_attn.qkv_proj.k_proj", u + QD, C, KD, 0);
}

/* §3.4 HF ZayaCCAProjection: the two causal convolutions over the sequence of u, which starts with
 * the K = (t0-1)+(t1-1) inputs before the batch (the conv state: zeros before position 0):
 *   depthwise (conv_qk_depthwise, kernel t0): a_j[c] = b0[c] + sum_m w0[c,0,m] u_{j-t0+1+m}[c]
 *   grouped   (conv_qk_grouped, kernel t1, a group of d channels per head, o in head g's group):
 *             z_t[o] = b1[o] + sum_k sum_i w1[o,i,k] a_{t-t1+1+k}[g*d + i]
 * The conv state then keeps the last K inputs, raw. bf16: a and z each rounded once, their bias
 * inside. u [n, C] -> z [n, C] */
static int conv_state_len(const ZayaConfig *c) { return (c->cca_time0 - 1) + (c->cca_time1 - 1); }

/* The grouped half of §3.4 from the depthwise outputs a (a_j at row t1 - 1 + j, j = -(t1-1) .. n-1):
 * token t's a_{t-t1+1+k}[ch] gathered at [ch * t1 + k], then one product. a -> z [n, C] */
static void conv_qk_grouped(const Batch *b, const ZayaLayer *L, const float *a, float *z) {
    const ZayaConfig *c = b->c;
    const int n = b->n, d = c->head_dim, C = (c->num_heads + c->num_kv_heads) * d, t1 = c->cca_time1;
    float *cols = b->act->conv_cols;
    for (int t = 0; t < n; t++)
        for (int ch = 0; ch < C; ch++)
            for (int k = 0; k < t1; k++) cols[((size_t)t * C + ch) * t1 + k] = a[(size_t)(t + k) * C + ch];
    const ZayaMatrix grouped = {.dtype = ZAYA_F32, .rows = C, .cols = d * t1, .data = L->conv_qk_grouped_weight};
    matmul_grouped(b->kern, z, C, &grouped, C / d, cols, C * t1, n);   /* torch's Conv1d(groups=nq+nkv), one product */
    add_bias(z, C, L->conv_qk_grouped_bias, C, n);
    held_rows(b, z, C, C, n);
    tap(b, "self_attn.qkv_proj.conv_qk_grouped", z, C, C, 0);
}

static void cca_convolutions(const Batch *b, const ZayaLayer *L, float *conv_state, const float *u, float *z) {
    const ZayaConfig *c = b->c;
    const int n = b->n, C = (c->num_heads + c->num_kv_heads) * c->head_dim;
    const int t0 = c->cca_time0, t1 = c->cca_time1, K = conv_state_len(c);
    float *seq = b->act->conv_seq, *a = b->act->conv_a;
    memcpy(seq, conv_state, sizeof(float) * (size_t)K * C);            /* u_j is row K + j of seq */
    memcpy(seq + (size_t)K * C, u, sizeof(float) * (size_t)n * C);
    for (int j = -(t1 - 1); j < n; j++)                                  /* a_j is row t1 - 1 + j of a */
        for (int ch = 0; ch < C; ch++) {
            float sum = L->conv_qk_depthwise_bias[ch];
            for (int m = 0; m < t0; m++)
                sum += L->conv_qk_depthwise_weight[ch * t0 + m] * seq[(size_t)(K + j - t0 + 1 + m) * C + ch];
            a[(size_t)(t1 - 1 + j) * C + ch] = held(b, sum);
        }
    tap(b, "self_attn.qkv_proj.conv_qk_depthwise", a + (size_t)(t1 - 1) * C, C, C, 0);
    conv_qk_grouped(b, L, a, z);
    memcpy(conv_state, seq + (size_t)n * C, sizeof(float) * (size_t)K * C);   /* u_{n-K} .. u_{n-1} */
}

/* §3.5 HF ZayaCCAProjection, the residual mix: q_res[n] = (q~[n] + k~[n/g]) / 2 for query head n,
 * k_res[j] = the mean of q_res over KV head j's g query heads; bf16: the sum of two heads rounded;
 * the mean summed in float32 and rounded once. u [n, C] -> [n, nq, d], [n, nkv, d] */
static void residual_mix(const Batch *b, const float *u, float *q_res, float *k_res) {
    const int d = b->c->head_dim, nq = b->c->num_heads, nkv = b->c->num_kv_heads, g = nq / nkv, C = (nq + nkv) * d;
    for (int t = 0; t < b->n; t++) {
        const float *q_tilde = u + (size_t)t * C, *k_tilde = q_tilde + (size_t)nq * d;
        float *qr = q_res + (size_t)t * nq * d, *kr = k_res + (size_t)t * nkv * d;
        for (int head = 0; head < nq; head++)
            for (int i = 0; i < d; i++)
                qr[head * d + i] = held(b, q_tilde[head * d + i] + k_tilde[(head / g) * d + i]) * 0.5f;
        for (int j = 0; j < nkv; j++)
            for (int i = 0; i < d; i++) {
                float sum = 0.0f;
                for (int r = 0; r < g; r++) sum += qr[(j * g + r) * d + i];
                kr[j * d + i] = held(b, sum / (float)g);
            }
    }
    tap(b, "self_attn.qkv_proj:query_residual", q_res, nq * d, nq, d);
    tap(b, "self_attn.qkv_proj:key_residual", k_res, nkv * d, nkv, d);
}

/* §3.6 q = z[query channels] + q_res, k = z[key channels] + k_res (HF qkv_proj outputs 0 and 1);
 * bf16: each sum rounded. -> [n, nq, d], [n, nkv, d] */
static void qk_assembly(const Batch *b, const float *z, const float *q_res, const float *k_res, float *q, float *key) {
    const int d = b->c->head_dim, QD = b->c->num_heads * d, KD = b->c->num_kv_heads * d, C = QD + KD;
    for (int t = 0; t < b->n; t++) {
        const float *zt = z + (size_t)t * C;
        for (int i = 0; i < QD; i++) q[(size_t)t * QD + i] = held(b, zt[i] + q_res[(size_t)t * QD + i]);
        for (int i = 0; i < KD; i++) key[(size_t)t * KD + i] = held(b, zt[QD + i] + k_res[(size_t)t * KD + i]);
    }
    tap(b, "self_attn.qkv_proj:query", q, QD, b->c->num_heads, d);
    tap(b, "self_attn.qkv_proj:key", key, KD, b->c->num_kv_heads, d);
}

/* §3.7 HF ZayaCCAProjection, the values: v_t = [v_proj_current h_t ; v_proj_delayed h_{t-1}] (+ biases),
 * viewed as [nkv, d] (with an odd nkv the middle head is half current, half delayed). The delayed
 * value carries v_proj_delayed h_{t-1} from token to token. bf16: both products rounded once, their
 * bias inside. h [n, H] -> v [n, nkv, d] */
static void values(const Batch *b, const ZayaLayer *L, float *delayed_value, const float *h, float *v, float *vd) {
    const int half = L->v_proj_current.rows, VD = 2 * half;
    const MatmulOut out[2] = {{&L->v_proj_current, v, VD}, {&L->v_proj_delayed, vd, half}};
    matmuls(b->kern, out, 2, h, L->v_proj_current.cols, b->n);           /* two products of h in one call */
    if (L->v_proj_current_bias) add_bias(v, VD, L->v_proj_current_bias, half, b->n);
    if (L->v_proj_delayed_bias) add_bias(vd, half, L->v_proj_delayed_bias, half, b->n);
    held_rows(b, v, VD, half, b->n);
    held_rows(b, vd, half, half, b->n);
    tap(b, "self_attn.qkv_proj.v_proj_current", v, VD, half, 0);
    tap(b, "self_attn.qkv_proj.v_proj_delayed", vd, half, half, 0);
    if (b->image) {   /* §V.9 ZAYA1-VL: the vision LoRA of both value projections, before the delay */
        masked_lora(b, &L->v_current_lora_a, &L->v_current_lora_b, h, L->v_proj_current.cols, v, VD, b->image, b->n);
        masked_lora(b, &L->v_delayed_lora_a, &L->v_delayed_lora_b, h, L->v_proj_delayed.cols, vd, half, b->image, b->n);
    }
    for (int t = 0; t < b->n; t++) {   /* token after token: the previous token's delayed value, then its own */
        memcpy(v + (size_t)t * VD + half, delayed_value, sizeof(float) * (size_t)half);
        memcpy(delayed_value, vd + (size_t)t * half, sizeof(float) * (size_t)half);
    }
    tap(b, "self_attn.qkv_proj:value", v, VD, b->c->num_kv_heads, b->c->head_dim);
}

/* Each of `heads` heads of x scaled to norm sqrt(d) (the norm clamped at the dtype's epsilon), times
 * temp[n] if given (HF ZayaQKNorm.forward on one tensor). bf16: the norm rounded and clamped at
 * bf16's epsilon 2^-7 (torch 1.13 summed the squares in bf16, rounding each square and each partial
 * sum); sqrt(d) / norm runs as torch runs a scalar over a tensor, reciprocal(norm) rounded then times
 * sqrt(d) rounded; x times that rounded; times temp rounded. */
static void normalize_heads(const Batch *b, float *x, int heads, int d, const float *temp) {
    const float sqrt_d = sqrtf((float)d);
    const int bf16_sum = b->precision == ZAYA_PRECISION_BF16_TORCH113;
    for (int n = 0; n < heads; n++) {
        float *v = x + (size_t)n * d, ss = 0.0f;
        for (int i = 0; i < d; i++) ss = bf16_sum ? held(b, ss + held(b, v[i] * v[i])) : ss + v[i] * v[i];
        const float scale = b->precision == ZAYA_PRECISION_FP32 ? sqrt_d / fmaxf(sqrtf(ss), FLT_EPSILON)
                            : held(b, held(b, 1.0f / fmaxf(held(b, sqrtf(ss)), 0x1p-7f)) * scalar(b, sqrt_d));
        for (int i = 0; i < d; i++) v[i] = held(b, held(b, v[i] * scale) * (temp ? temp[n] : 1.0f));
    }
}

/* §3.8 HF ZayaQKNorm: queries and keys L2-normalized per head to norm sqrt(d); keys also times
 * qk_norm temp[j]. In place, [n, nq, d] and [n, nkv, d] */
static void qk_norm(const Batch *b, float *q, float *key, const float *temp) {
    const int d = b->c->head_dim, nq = b->c->num_heads, nkv = b->c->num_kv_heads;
    for (int t = 0; t < b->n; t++) {
        normalize_heads(b, q + (size_t)t * nq * d, nq, d, NULL);
        normalize_heads(b, key + (size_t)t * nkv * d, nkv, d, temp);
    }
    tap(b, "self_attn.qk_norm:query", q, nq * d, nq, d);
    tap(b, "self_attn.qk_norm:key", key, nkv * d, nkv, d);
}

/* §3.9 HF ZayaRotaryEmbedding, apply_rotary_pos_emb: partial NeoX RoPE of the layer's type on dims
 * [0, rot) of every query and key head, pairs (j, j + rot/2), inv_freq and angles in float32; bf16:
 * cos and sin rounded, then each product and each sum. In place, [n, nq, d] and [n, nkv, d] */
static void rope(const Batch *b, int type, float *q, float *key) {
    const ZayaConfig *c = b->c;
    const int d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, rot = c->rope_dim[type], half = rot / 2;
    float *cos_t = b->act->rope_cos, *sin_t = b->act->rope_sin;
    for (int t = 0; t < b->n; t++) {
        const int pos = b->pos + t;
        for (int j = 0; j < half; j++) {
            const float inv_freq = 1.0f / zaya_powf(c->rope_theta[type], (float)(2 * j) / (float)rot);
            cos_t[j] = held(b, zaya_cosf((float)pos * inv_freq));
            sin_t[j] = held(b, zaya_sinf((float)pos * inv_freq));
        }
        for (int head = 0; head < nq + nkv; head++) {
            float *x = head < nq ? q + ((size_t)t * nq + head) * d : key + ((size_t)t * nkv + head - nq) * d;
            for (int j = 0; j < half; j++) {
                const float x0 = x[j], x1 = x[j + half];
                x[j] = held(b, held(b, x0 * cos_t[j]) - held(b, x1 * sin_t[j]));
                x[j + half] = held(b, held(b, x1 * cos_t[j]) + held(b, x0 * sin_t[j]));
            }
        }
    }
    tap(b, "self_attn:query_after_rope", q, nq * d, nq, d);
    tap(b, "self_attn:key_after_rope", key, nkv * d, nkv, d);
}

/* §3.10 HF ZayaAttention, eager_attention_forward: token after token, its key and value join the KV
 * cache (arch §4), then each query head n attends, with KV head n/g, over the keys first..pos:
 * softmax(q . k * d^-1/2) . v (sliding layers: the last sliding_window positions); bf16: the
 * kernel rounds where eager_attention_forward holds bf16 (q . k, scaled, probabilities, output).
 * q [n, nq*d], key and v [n, nkv*d] -> [n, nq*d] */
/* §V.10 the bidirectional image mask (HF Zaya1VLTextModel.forward: the causal mask cleared for every pair
 * of image positions of the prompt): image position pos attends to the keys first..pos its causal (or
 * sliding) mask allows and to every image position of the batch, in position order. The keys gathered
 * into a cache of their own [nkv, keys, d]: the batch's from key and v, earlier ones from the layer's
 * cache. Returns that cache. */
static int attends(const Batch *b, int k, int first, int pos) {   /* key k is unmasked for image position pos */
    return (k >= first && k <= pos) || (k >= b->pos && b->image[k - b->pos]);
}

static KvCache image_keys(const Batch *b, const KvCache *kv, const float *key, const float *v, int first, int pos) {
    const int nkv = kv->nkv, d = kv->d, end = b->pos + b->n, from = first < b->pos ? first : b->pos;
    int keys = 0;
    for (int k = from; k < end; k++) keys += attends(b, k, first, pos);
    const KvCache g = {b->act->image_keys, b->act->image_values, keys, nkv, d};
    for (int k = from, j = 0; k < end; k++) {
        if (!attends(b, k, first, pos)) continue;
        for (int h = 0; h < nkv; h++) {
            const float *ks = k >= b->pos ? key + ((size_t)(k - b->pos) * nkv + h) * d : kv->keys + kv_row(kv, h, k);
            const float *vs = k >= b->pos ? v + ((size_t)(k - b->pos) * nkv + h) * d : kv->values + kv_row(kv, h, k);
            memcpy(g.keys + kv_row(&g, h, j), ks, sizeof(float) * (size_t)d);
            memcpy(g.values + kv_row(&g, h, j), vs, sizeof(float) * (size_t)d);
        }
        j++;
    }
    return g;
}

static void self_attention(const Batch *b, int type, ZayaLayerState *ls, const float *q, const float *key,
                           const float *v, float *out) {
    const ZayaConfig *c = b->c;
    const int d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads;
    const KvCache kv = {ls->key_cache, ls->value_cache, ls->cache_len, nkv, d};
    const float scale = scalar(b, 1.0f / sqrtf((float)d));   /* HF: scaling = head_dim ** -0.5 */
    for (int t = 0; t < b->n; t++) {
        const int pos = b->pos + t;
        for (int j = 0; j < nkv; j++) {
            memcpy(ls->key_cache + kv_row(&kv, j, pos), key + ((size_t)t * nkv + j) * d, sizeof(float) * (size_t)d);
            memcpy(ls->value_cache + kv_row(&kv, j, pos), v + ((size_t)t * nkv + j) * d, sizeof(float) * (size_t)d);
        }
        const int window_start = pos - c->sliding_window + 1;
        const int first = type == ZAYA_HYBRID_SLIDING && window_start > 0 ? window_start : 0;
        const int both_ways = b->both_ways && b->image[t];   /* §V.10 an image position of the prompt */
        const KvCache g = both_ways ? image_keys(b, &kv, key, v, first, pos) : kv;
        attention(b->kern, out + (size_t)t * nq * d, b->act->att, q + (size_t)t * nq * d, nq, &g,
                  both_ways ? 0 : first, both_ways ? g.cache_len - 1 : pos, scale, b->precision != ZAYA_PRECISION_FP32);
        if (b->tap) {   /* [nq, keys]: HF's attn_weights row without the masked zeros (ragged) */
            const int keys = both_ways ? g.cache_len : pos - first + 1;
            const ZayaTap w = {"self_attn:attn_weights", b->layer, pos, 0, 2, {nq, keys}, b->act->att, 1};
            b->tap(b->tap_ctx, &w);
        }
    }
    tap(b, "self_attn:attn_output", out, nq * d, nq * d, 0);
}

/* §3.12 and 3.16 HF ZayaResidualScaling: r = (branch + hidden_states_bias) * hidden_states_scale +
 * (r + residual_bias) * residual_scale; bf16: the branch's sum and product rounded (float32 with
 * ZAYA_BF16_FP32_RESIDUAL), the residual's side and the total float32 (the residual stream). In place on r [n, H] */
static void residual_scaling(const Batch *b, const char *name, float *r, const float *branch,
                             const ZayaResidualScale *p) {
    const int H = b->c->hidden_size;
    for (int t = 0; t < b->n; t++)
        for (int i = 0; i < H; i++) {
            const size_t at = (size_t)t * H + i;
            const float sum = held_unless(b, ZAYA_BF16_FP32_RESIDUAL, branch[at] + p->hidden_states_bias[i]);
            r[at] = held_unless(b, ZAYA_BF16_FP32_RESIDUAL, sum * p->hidden_states_scale[i]) +
                    (r[at] + p->residual_bias[i]) * p->residual_scale[i];
        }
    tap(b, name, r, H, H, 0);
}

/* §3.14.2 EDA, exponential decay averaging over depth: rho = down + rho_prev * router_states_scale,
 * rho_prev the previous layer's state of the same token; layer 0 (no scale) starts it. bf16: the
 * product rounded, then the sum. [n, R] */
static void eda(const Batch *b, const float *states_scale, const float *down, float *rho) {
    const int R = b->c->router_hidden;
    for (size_t i = 0; i < (size_t)b->n * R; i++)
        rho[i] = states_scale ? held(b, down[i] + held(b, rho[i] * states_scale[i % R])) : down[i];
    tap(b, "mlp.gate:router_state", rho, R, R, 0);
}

/* §3.14.5-6 softmax over all E+1 classes, then top-1 of the probabilities plus balancing_biases
 * (ties: the lowest class); the weight is the unbiased probability. bf16: the probabilities rounded
 * (float32 inside), the float32 biases added to them in float32. [n, E+1] -> class, weight [n] */
static void route(const Batch *b, const float *balancing_biases, const float *logits, float *probs, float *scores,
                  int *expert, float *weight) {
    const int E1 = b->c->num_experts + 1;
    for (int t = 0; t < b->n; t++) {
        float *p = probs + (size_t)t * E1, *score = scores + (size_t)t * E1;
        memcpy(p, logits + (size_t)t * E1, sizeof(float) * (size_t)E1);
        softmax(p, E1);
        for (int e = 0; e < E1; e++) p[e] = held(b, p[e]);
        int best = 0;
        for (int e = 0; e < E1; e++) {
            score[e] = p[e] + balancing_biases[e];
            if (score[e] > score[best]) best = e;
        }
        expert[t] = best;
        weight[t] = p[best];
    }
    tap(b, "mlp.gate:router_probs", probs, E1, E1, 0);
    tap(b, "mlp.gate:router_scores", scores, E1, E1, 0);
    tap_scalars(b, "mlp.gate.router_indices", expert, 1);
}

/* §3.14 HF ZayaRouter (mlp.gate) and ZayaRouterMLP: down_proj, EDA, RMSNorm, fc1, GELU, fc2, GELU,
 * out_proj, then the choice. rho carries the EDA state from layer to layer. h [n, H] -> class, weight [n] */
static void router(const Batch *b, const ZayaLayer *L, const float *h, float *rho, int *expert, float *weight) {
    Activations *act = b->act;
    const size_t nR = (size_t)b->n * b->c->router_hidden;
    linear(b, "mlp.gate.down_proj", act->router_down, &L->router_down_proj, L->router_down_proj_bias, h);
    eda(b, L->router_states_scale, act->router_down, rho);
    rmsnorm(b, "mlp.gate.router_mlp.norm", act->router_normed, rho, L->router_norm, b->c->router_hidden,
            b->c->router_norm_eps);
    linear(b, "mlp.gate.router_mlp.fc1", act->router_fc1, &L->router_fc1, L->router_fc1_bias, act->router_normed);
    gelu_held(b, act->router_fc1, nR);
    tap(b, "mlp.gate.router_mlp.act_fn:fc1", act->router_fc1, b->c->router_hidden, b->c->router_hidden, 0);
    linear(b, "mlp.gate.router_mlp.fc2", act->router_fc2, &L->router_fc2, L->router_fc2_bias, act->router_fc1);
    gelu_held(b, act->router_fc2, nR);
    tap(b, "mlp.gate.router_mlp.act_fn:fc2", act->router_fc2, b->c->router_hidden, b->c->router_hidden, 0);
    linear(b, "mlp.gate.router_mlp", act->router_logits, &L->router_out_proj, NULL, act->router_fc2);   /* out_proj */
    route(b, L->balancing_biases, act->router_logits, act->router_probs, act->router_scores, expert, weight);
}

/* §3.15 HF ZayaSparseMoeBlock, ZayaExperts (SwiGLU): y = weight * down_proj(SiLU(gate) * up) with
 * [gate ; up] = gate_up_proj h of the chosen expert; each chosen expert runs once, on the tokens
 * routed to it. The skip class (arch §6a): upstream a zero output and weight, Zyphra's fork
 * (skip_mode ZAYA_SKIP_PASSTHROUGH) weight * h. bf16: each product rounded, SiLU(gate), times up
 * and times the weight each rounded. h [n, H] -> y [n, H] */
static void experts(const Batch *b, const ZayaLayer *L, int skip_mode, const float *h, const int *expert, float *weight,
                    float *y) {
    Activations *act = b->act;
    const int H = b->c->hidden_size, E = b->c->num_experts, I = b->c->moe_intermediate;
    for (int e = 0; e < E; e++) {
        int *idx = act->expert_tokens, cnt = 0;
        for (int t = 0; t < b->n; t++)
            if (expert[t] == e) {
                memcpy(act->expert_in + (size_t)cnt * H, h + (size_t)t * H, sizeof(float) * (size_t)H);
                idx[cnt++] = t;
            }
        if (!cnt) continue;   /* only the chosen experts' weights are read */
        const ZayaMatrix gate_up = matrix_rows(&L->experts_gate_up, e * 2 * I, 2 * I);
        const ZayaMatrix down = matrix_rows(&L->experts_down, e * H, H);
        unsigned char *image = act->expert_image;   /* §V.9 ZAYA1-VL: the expert's LoRA at its image tokens */
        for (int j = 0; b->image && j < cnt; j++) image[j] = b->image[idx[j]];
        matmul(b->kern, act->expert_hidden, 2 * I, &gate_up, act->expert_in, H, cnt);
        held_rows(b, act->expert_hidden, 2 * I, 2 * I, cnt);
        if (b->image) {
            const int r = L->experts_lora_gate_up_a.rows / E;
            const ZayaMatrix A = matrix_rows(&L->experts_lora_gate_up_a, e * r, r);
            const ZayaMatrix B = matrix_rows(&L->experts_lora_gate_up_b, e * 2 * I, 2 * I);
            masked_lora(b, &A, &B, act->expert_in, H, act->expert_hidden, 2 * I, image, cnt);
        }
        for (int j = 0; j < cnt; j++) {
            float *gate = act->expert_hidden + (size_t)j * 2 * I, *up = gate + I;
            for (int i = 0; i < I; i++) gate[i] = held(b, silu_held(b, gate[i]) * up[i]);
        }
        matmul(b->kern, act->expert_out, H, &down, act->expert_hidden, 2 * I, cnt);
        held_rows(b, act->expert_out, H, H, cnt);
        if (b->image) {
            const int r = L->experts_lora_down_a.rows / E;
            const ZayaMatrix A = matrix_rows(&L->experts_lora_down_a, e * r, r);
            const ZayaMatrix B = matrix_rows(&L->experts_lora_down_b, e * H, H);
            masked_lora(b, &A, &B, act->expert_hidden, 2 * I, act->expert_out, H, image, cnt);
        }
        for (int j = 0; j < cnt; j++)
            for (int i = 0; i < H; i++)
                y[(size_t)idx[j] * H + i] = held(b, weight[idx[j]] * act->expert_out[(size_t)j * H + i]);
    }
    for (int t = 0; t < b->n; t++) {
        if (expert[t] != E) continue;
        if (skip_mode == ZAYA_SKIP_PASSTHROUGH)
            for (int i = 0; i < H; i++) y[(size_t)t * H + i] = weight[t] * h[(size_t)t * H + i];
        else {
            weight[t] = 0.0f;
            memset(y + (size_t)t * H, 0, sizeof(float) * (size_t)H);
        }
    }
    tap_scalars(b, "mlp.gate:router_weight", weight, 0);
    tap(b, "mlp.experts", y, H, H, 0);
}

/* With a tap (--dump) every token's logits: the LM head (the whole embedding) is read once for
 * LOGIT_ROWS tokens. */
#define LOGIT_ROWS 8

/* §3.18 HF ZayaForCausalLM.lm_head, tied to embed_tokens: logits = embed_tokens f (+ lm_head bias);
 * bf16: rounded once (not with ZAYA_BF16_FP32_LOGITS). The last token's logits end in logits[0, V); with a tap,
 * every token's are computed and reported. f [n, H] -> [V] */
static void lm_head(const Batch *b, const ZayaModel *m, const float *f, float *logits) {
    const int V = b->c->vocab_size, H = b->c->hidden_size;
    for (int first = b->tap ? 0 : b->n - 1, rows = 0; first < b->n; first += rows) {
        rows = b->n - first < LOGIT_ROWS ? b->n - first : LOGIT_ROWS;
        matmul(b->kern, logits, V, &m->embed_tokens, f + (size_t)first * H, H, rows);
        if (m->lm_head_bias) add_bias(logits, V, m->lm_head_bias, V, rows);
        if (!(b->placement & ZAYA_BF16_FP32_LOGITS)) held_rows(b, logits, V, V, rows);
        Batch chunk = *b;
        chunk.pos += first, chunk.n = rows;
        tap(&chunk, "logits", logits, V, V, 0);
        if (first + rows == b->n) memmove(logits, logits + (size_t)(rows - 1) * V, sizeof(float) * (size_t)V);
    }
}

/* ---------------------------------------------------------------------------------------------
 * 3. forward(): tokens[0..n) at positions s->pos .. s->pos+n-1, in the order of arch §3
 * ------------------------------------------------------------------------------------------- */

/* §3.2-3.16 HF ZayaDecoderLayer: layer i on the batch's residual stream a->r [n, H], in place; the
 * router state a->router_state [n, R] comes from layer i-1 and goes to layer i+1. */
static void decoder_layer(Batch *b, const ZayaModel *m, ZayaState *s, int i) {
    const ZayaConfig *c = &m->config;
    const ZayaLayer *L = &m->layers[i];
    ZayaLayerState *ls = &s->layers[i];
    Activations *a = s->act;
    const int H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    b->layer = i;
    residual_norm(b, "input_layernorm", a->h, a->r, L->input_layernorm, H, eps); /* §3.2  [n, H] */
    cca_projections(b, L, a->h, a->u);                                          /* §3.3  -> u [n, C] */
    vision_lora_qk(b, L, a->h, a->u);                                           /* §V.9  VL: u += LoRA at images */
    cca_convolutions(b, L, ls->conv_state, a->u, a->z);                         /* §3.4  -> z [n, C] */
    residual_mix(b, a->u, a->q_res, a->k_res);                                  /* §3.5  -> [n, nq|nkv, d] */
    qk_assembly(b, a->z, a->q_res, a->k_res, a->q, a->key);                     /* §3.6  -> q, k */
    values(b, L, ls->delayed_value, a->h, a->v, a->vd);                         /* §3.7  -> v [n, nkv, d] */
    qk_norm(b, a->q, a->key, L->qk_norm_temp);                                  /* §3.8 */
    rope(b, c->layer_types[i], a->q, a->key);                                   /* §3.9 */
    self_attention(b, c->layer_types[i], ls, a->q, a->key, a->v, a->attn_out);  /* §3.10 -> [n, nq*d] */
    linear(b, "self_attn.o_proj", a->branch, &L->o_proj, L->o_proj_bias, a->attn_out);  /* §3.11 -> [n, H] */
    if (b->image) masked_lora(b, &L->o_lora_a, &L->o_lora_b, a->attn_out, L->o_proj.cols, a->branch, H,
                              b->image, b->n);                                  /* §V.9  VL: o_proj's LoRA */
    residual_scaling(b, "post_attention_residual_scale", a->r, a->branch,
                     &L->post_attention_residual_scale);                        /* §3.12 */
    residual_norm(b, "post_attention_layernorm", a->h, a->r, L->post_attention_layernorm, H,
                  eps);                                                         /* §3.13 */
    router(b, L, a->h, a->router_state, a->expert, a->expert_weight);           /* §3.14 -> class, weight [n] */
    experts(b, L, s->skip_expert, a->h, a->expert, a->expert_weight, a->branch);  /* §3.15 -> [n, H] */
    residual_scaling(b, "post_mlp_residual_scale", a->r, a->branch, &L->post_mlp_residual_scale);     /* §3.16 */
}

/* §3.17-3.18 the final norm and the LM head on the residual stream a->r [n, H] -> s->logits */
static void lm_output(Batch *b, const ZayaModel *m, ZayaState *s) {
    const ZayaConfig *c = &m->config;
    b->layer = -1;
    residual_norm(b, "model.norm", s->act->h, s->act->r, m->norm, c->hidden_size,
                  c->rms_norm_eps);                                             /* §3.17 */
    lm_head(b, m, s->act->h, s->logits);                                        /* §3.18 -> [V] */
}

static Batch batch_of(const ZayaModel *m, const ZayaState *s, int layer, int n) {
    return (Batch){&m->config, s->act, s->kernels, s->tap, s->tap_ctx, layer, s->pos, n, s->precision, s->placement,
                   NULL, 0};
}

/* §V.8 ZAYA1-VL: the batch's image positions: its image placeholder tokens while image features remain
 * (zaya_set_images). Returns the first feature row they take; s->image_next moves past them. */
static const float *image_positions(Batch *b, const ZayaModel *m, ZayaState *s, const int *tokens) {
    const float *first = s->image_features + (size_t)s->image_next * m->config.hidden_size;
    int count = 0;
    for (int t = 0; s->image_features && t < b->n; t++)
        count += s->act->image[t] = tokens[t] == m->image_token_id && s->image_next + count < s->n_image_features;
    b->image = count ? s->act->image : NULL;
    b->both_ways = count && s->image_both_ways;
    s->image_next += count;
    return first;
}

static void forward(const ZayaModel *m, ZayaState *s, const int *tokens, int n) {
    Batch b = batch_of(m, s, -1, n);
    const float *features = image_positions(&b, m, s, tokens);                  /* §V.8  VL: which take images */
    embed(&b, m, tokens, features, s->act->e, s->act->r);                       /* §3.1  ids -> r [n, H] */
    for (int i = 0; i < m->config.num_layers; i++) decoder_layer(&b, m, s, i);  /* §3.2-3.16, HF ZayaDecoderLayer */
    lm_output(&b, m, s);                                                        /* §3.17-3.18 -> logits [V] */
    s->pos += n;
}

/* ---------------------------------------------------------------------------------------------
 * 4. The decoding state (arch §4) and the public entry points
 * ------------------------------------------------------------------------------------------- */

/* The activations' float buffers and their lengths for config c and batches of B tokens. */
#define ACT_BUFFERS 32
static void act_buffers(Activations *a, float **buf[ACT_BUFFERS], size_t len[ACT_BUFFERS], const ZayaConfig *c,
                        int ctx, size_t B) {
    float **all[ACT_BUFFERS] = {&a->e, &a->r, &a->h, &a->u, &a->conv_seq, &a->conv_a, &a->conv_cols, &a->z,
                                &a->q_res, &a->k_res, &a->q, &a->key, &a->v, &a->vd, &a->rope_cos, &a->rope_sin,
                                &a->att, &a->attn_out, &a->branch, &a->router_down, &a->router_state,
                                &a->router_normed, &a->router_fc1, &a->router_fc2, &a->router_logits,
                                &a->router_probs, &a->router_scores, &a->expert_weight, &a->expert_in,
                                &a->expert_hidden, &a->expert_out, NULL};
    memcpy(buf, all, sizeof all);
    if (!len) return;
    const size_t H = (size_t)c->hidden_size, d = (size_t)c->head_dim, nq = (size_t)c->num_heads,
                 nkv = (size_t)c->num_kv_heads, C = (nq + nkv) * d, E1 = (size_t)c->num_experts + 1,
                 I = (size_t)c->moe_intermediate, R = (size_t)c->router_hidden;
    const size_t n[ACT_BUFFERS] = {B * H, B * H, B * H, B * C, ((size_t)conv_state_len(c) + B) * C,
                                   ((size_t)c->cca_time1 - 1 + B) * C, B * C * (size_t)c->cca_time1, B * C, B * nq * d,
                                   B * nkv * d, B * nq * d, B * nkv * d, B * nkv * d, B * nkv * d / 2, d, d,
                                   nq * (size_t)ctx, B * nq * d, B * H, B * R, B * R, B * R, B * R, B * R, B * E1,
                                   B * E1, B * E1, B, B * H, B * 2 * I, B * H, 0};
    memcpy(len, n, sizeof n);
}

int zaya_state_init(ZayaState *s, const ZayaModel *m, int ctx, int threads, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    memset(s, 0, sizeof *s);
    if (ctx < 1 || ctx > c->max_position)
        return zaya_fail(err, errlen, "context length %d is out of range\n  expected: 1..%d (max_position_embeddings)",
                         ctx,
                         c->max_position);
    const size_t d = (size_t)c->head_dim, nkv = (size_t)c->num_kv_heads, C = (size_t)c->num_heads * d + nkv * d;
    s->ctx = ctx;
    s->batch = ZAYA_BATCH;
    s->capacity = m->vl && ctx > ZAYA_BATCH ? (ctx < ZAYA_VL_BATCH ? ctx : ZAYA_VL_BATCH) : ZAYA_BATCH;
    const size_t B = (size_t)s->capacity;
    s->num_layers = c->num_layers;
    s->layers = calloc((size_t)c->num_layers, sizeof(ZayaLayerState));
    s->act = calloc(1, sizeof(Activations));
    int ok = s->layers && s->act;
    for (int i = 0; ok && i < c->num_layers; i++) {
        ZayaLayerState *ls = &s->layers[i];
        ls->cache_len = c->layer_types[i] == ZAYA_HYBRID_SLIDING && c->sliding_window < ctx ? c->sliding_window : ctx;
        ls->key_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->value_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->conv_state = calloc((size_t)conv_state_len(c) * C + 1, sizeof(float));
        ls->delayed_value = calloc(nkv * d / 2, sizeof(float));
        ok = ls->key_cache && ls->value_cache && ls->conv_state && ls->delayed_value;
    }
    float **bufs[ACT_BUFFERS];
    size_t lens[ACT_BUFFERS];
    if (ok) act_buffers(s->act, bufs, lens, c, ctx, B);
    for (int k = 0; ok && bufs[k]; k++) ok = (*bufs[k] = calloc_lines(lens[k], sizeof(float))) != NULL;
    if (ok) ok = (s->act->expert = calloc(B, sizeof(int))) && (s->act->expert_tokens = calloc(B, sizeof(int)));
    if (ok && m->vl) {   /* ZAYA1-VL: the LoRA pairs' scratch and the bidirectional mask's gathered keys */
        const int r = m->lora_rank_attn > m->lora_rank_mlp ? m->lora_rank_attn : m->lora_rank_mlp;
        const size_t H = (size_t)c->hidden_size, QD = (size_t)c->num_heads * d;
        size_t out = H > QD ? H : QD;
        out = out > 2 * (size_t)c->moe_intermediate ? out : 2 * (size_t)c->moe_intermediate;
        ok = (s->act->lora_r = calloc_lines(B * r, sizeof(float))) &&
             (s->act->lora_out = calloc_lines(B * out, sizeof(float))) &&
             (s->act->image_keys = calloc_lines((size_t)ctx * nkv * d, sizeof(float))) &&
             (s->act->image_values = calloc_lines((size_t)ctx * nkv * d, sizeof(float))) &&
             (s->act->image = calloc(B, 1)) && (s->act->expert_image = calloc(B, 1));
    }
    if (ok) ok = (s->logits = calloc_lines(LOGIT_ROWS * (size_t)c->vocab_size, sizeof(float))) != NULL;
    int max_in = c->hidden_size > c->num_heads * c->head_dim ? c->hidden_size : c->num_heads * c->head_dim;
    max_in = max_in > c->moe_intermediate ? max_in : c->moe_intermediate;
    max_in = max_in > c->router_hidden ? max_in : c->router_hidden;
    if (ok) ok = (s->kernels = kernels_new(threads, max_in, (int)B)) != NULL;
    if (!ok) {
        zaya_state_free(s);
        return zaya_fail(err, errlen, "out of memory allocating the state for %d positions\n"
                         "  hint: use a smaller --ctx", ctx);
    }
    zaya_state_reset(s, m);
    return 0;
}

void zaya_state_reset(ZayaState *s, const ZayaModel *m) {
    const ZayaConfig *c = &m->config;
    size_t d = (size_t)c->head_dim, nkv = (size_t)c->num_kv_heads, C = (size_t)(c->num_heads + c->num_kv_heads) * d;
    for (int i = 0; i < c->num_layers; i++) {
        ZayaLayerState *ls = &s->layers[i];
        memset(ls->key_cache, 0, (size_t)ls->cache_len * nkv * d * sizeof(float));
        memset(ls->value_cache, 0, (size_t)ls->cache_len * nkv * d * sizeof(float));
        memset(ls->conv_state, 0, (size_t)conv_state_len(c) * C * sizeof(float));
        /* the delayed value of position -1 is v_proj_delayed(0): its bias, or 0 without one */
        const float *bias = m->layers[i].v_proj_delayed_bias;
        if (bias) memcpy(ls->delayed_value, bias, nkv * d / 2 * sizeof(float));
        else memset(ls->delayed_value, 0, nkv * d / 2 * sizeof(float));
    }
    s->pos = 0;
    s->image_features = NULL;   /* ZAYA1-VL: no images until zaya_set_images */
    s->n_image_features = s->image_next = s->image_both_ways = 0;
}

void zaya_state_free(ZayaState *s) {
    for (int i = 0; s->layers && i < s->num_layers; i++) {
        free(s->layers[i].key_cache);
        free(s->layers[i].value_cache);
        free(s->layers[i].conv_state);
        free(s->layers[i].delayed_value);
    }
    free(s->layers);
    if (s->act) {
        float **bufs[ACT_BUFFERS];
        act_buffers(s->act, bufs, NULL, NULL, 0, 0);
        for (int k = 0; bufs[k]; k++) free(*bufs[k]);
        free(s->act->expert), free(s->act->expert_tokens), free(s->act->expert_image);
        free(s->act->lora_r), free(s->act->lora_out), free(s->act->image_keys), free(s->act->image_values);
        free(s->act->image);
        free(s->act);
    }
    free(s->logits);
    kernels_free(s->kernels);
    memset(s, 0, sizeof *s);
}

int zaya_state_threads(const ZayaState *s) { return kernels_threads(s->kernels); }

/* bit k: 1 << k */
static const char *const placement_names[] = {"fp32-residual", "fp32-norm", "fp32-logits", "ggml",
                                              "ggml-ref", "ggml-conv", "ggml-gelu", "ggml-kv-f16", "ggml-fa"};
#define N_PLACEMENTS 9
#define GGML_PLACEMENTS (ZAYA_GGML | ZAYA_GGML_REF | ZAYA_GGML_CONV | ZAYA_GGML_GELU | ZAYA_GGML_KV | ZAYA_GGML_FA)

int zaya_parse_precision(const char *text, int *precision, int *placement, char *err, size_t errlen) {
    const char *plus = strchr(text, '+');
    const size_t base = plus ? (size_t)(plus - text) : strlen(text);
    *placement = 0;
    if (base == 4 && !strncmp(text, "fp32", 4)) *precision = ZAYA_PRECISION_FP32;
    else if (base == 4 && !strncmp(text, "bf16", 4)) *precision = ZAYA_PRECISION_BF16;
    else if (base == 14 && !strncmp(text, "bf16-torch1.13", 14)) *precision = ZAYA_PRECISION_BF16_TORCH113;
    else
        return zaya_fail(err, errlen, "bad precision \"%s\"\n  expected: fp32 (default), bf16 (the official code "
                         "loaded in bfloat16), bf16-torch1.13 (the same with torch 1.13's rounding, as the fixtures "
                         "were made), a bf16 one followed by placements: bf16+fp32-residual+fp32-norm (vLLM), "
                         "+fp32-logits (docs/bf16.md), or fp32+ggml (+ggml-conv, +ggml-gelu, +ggml-kv-f16, +ggml-fa: "
                         "ggml's CPU arithmetic, docs/compare.md 9)", text);
    for (const char *p = plus; p; p = strchr(p + 1, '+')) {
        const char *end = strchr(p + 1, '+');
        const size_t len = end ? (size_t)(end - p - 1) : strlen(p + 1);
        int k = 0;
        while (k < N_PLACEMENTS && !(strlen(placement_names[k]) == len && !strncmp(p + 1, placement_names[k], len)))
            k++;
        if (k == N_PLACEMENTS)
            return zaya_fail(err, errlen, "bad placement \"%.*s\" in precision \"%s\"\n  expected: fp32-residual, "
                             "fp32-norm or fp32-logits after a bf16 precision (docs/bf16.md), ggml or ggml-ref after "
                             "fp32", (int)len, p + 1, text);
        *placement |= 1 << k;
    }
    if ((*placement & (ZAYA_GGML | ZAYA_GGML_REF)) == (ZAYA_GGML | ZAYA_GGML_REF))
        return zaya_fail(err, errlen, "precision \"%s\": +ggml and +ggml-ref are two versions of ggml's Q8_0; give one",
                         text);
    if (*placement & GGML_PLACEMENTS && *precision != ZAYA_PRECISION_FP32)
        return zaya_fail(err, errlen, "precision \"%s\": ggml's CPU arithmetic is float32 with its own roundings\n"
                         "  hint: fp32+ggml", text);
    if (*placement & GGML_PLACEMENTS) return 0;
    if (*placement && *precision == ZAYA_PRECISION_FP32)
        return zaya_fail(err, errlen, "precision \"%s\": a placement moves bf16 rounding points to float32; fp32 "
                         "has none\n"
                         "  hint: bf16+... or bf16-torch1.13+...", text);
    return 0;
}

const char *zaya_precision_name(int precision, int placement, char *buf, size_t len) {
    const char *base = precision == ZAYA_PRECISION_BF16 ? "bf16"
                       : precision == ZAYA_PRECISION_BF16_TORCH113 ? "bf16-torch1.13" : "fp32";
    int at = snprintf(buf, len, "%s", base);
    for (int k = 0; k < N_PLACEMENTS; k++)
        if (placement & 1 << k && at >= 0 && (size_t)at < len)
            at += snprintf(buf + at, len - (size_t)at, "+%s", placement_names[k]);
    return buf;
}

/* The kernels' ggml mode (kernels_set_ggml) of the state's placement. */
static int ggml_mode(const ZayaState *s) {
    if (s->placement & ZAYA_GGML_GELU) ggml_gelu_init();
    return (s->placement & ZAYA_GGML ? KERNELS_GGML_X86 : s->placement & ZAYA_GGML_REF ? KERNELS_GGML_REF : 0)
           | (s->placement & ZAYA_GGML_CONV ? KERNELS_GGML_CONV : 0)
           | (s->placement & ZAYA_GGML_KV ? KERNELS_GGML_KV : 0) | (s->placement & ZAYA_GGML_FA ? KERNELS_GGML_FA : 0);
}

/* bf16 emulates upstream's bf16 run only: the fork's (legacy layout, passthrough skip) rounds elsewhere. */
static int check_precision(const ZayaModel *m, const ZayaState *s, char *err, size_t errlen) {
    if (s->placement & ~GGML_PLACEMENTS && s->precision == ZAYA_PRECISION_FP32)
        return zaya_fail(err, errlen, "bf16 placement flags %d with the fp32 precision\n  hint: placements apply to "
                         "bf16 runs",
                         s->placement);
    if (s->placement & GGML_PLACEMENTS && s->precision != ZAYA_PRECISION_FP32)
        return zaya_fail(err, errlen, "the ggml placement with a bf16 precision\n  hint: fp32+ggml");
    if (s->precision == ZAYA_PRECISION_FP32 || (m->source_layout == 0 && s->skip_expert != ZAYA_SKIP_PASSTHROUGH))
        return 0;
    return zaya_fail(err, errlen, "--precision bf16 emulates upstream transformers' bf16 run; this run is Zyphra's "
                     "fork's (%s)\n  expected: a blob exported from the native layout, --skip-expert zero\n"
                     "  hint: the fork rounds differently in bf16 (docs/bf16.md); run it in fp32, or export the "
                     "native checkpoint",
                     m->source_layout != 0 ? "a legacy-layout blob" : "--skip-expert passthrough");
}

static int check_tokens(const ZayaModel *m, const ZayaState *s, const int *tokens, int n, char *err, size_t errlen) {
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= m->config.vocab_size)
            return zaya_fail(err, errlen, "token id %d (position %d) is outside the vocabulary\n  expected: 0..%d",
                             tokens[t], s->pos + t, m->config.vocab_size - 1);
    return check_precision(m, s, err, errlen);
}

/* ZAYA1-VL (arch §V): a prompt's image tokens attend to each other both ways, so they must all be in this call
 * and in one batch of forward(); *batch becomes the state's capacity when the tokens hold image tokens. */
static int image_batch(const ZayaModel *m, const ZayaState *s, const int *tokens, int n, int *batch, char *err,
                       size_t errlen) {
    int images = 0;
    for (int t = 0; s->image_both_ways && t < n && s->image_next + images < s->n_image_features; t++)
        images += tokens[t] == m->image_token_id;
    if (!images) return 0;
    *batch = s->capacity;
    if (s->image_next > 0 || s->image_next + images < s->n_image_features)
        return zaya_fail(err, errlen, "positions %d..%d hold %d of the prompt's %d image tokens\n  expected: all of "
                         "them in one zaya_forward call (the bidirectional image mask)\n  hint: run the whole prompt "
                         "at once", s->pos, s->pos + n - 1, images, s->n_image_features);
    for (int t = 0, k = s->image_next, last = -1; t < n && k < s->n_image_features; t++)
        if (tokens[t] == m->image_token_id) {
            k++;
            if (last >= 0 && t / *batch != (last - s->pos) / *batch)
                return zaya_fail(err, errlen, "the image tokens at positions %d and %d are in different batches of %d\n"
                                 "  expected: every image token of a prompt in its first batch (the bidirectional "
                                 "image mask)\n  hint: a shorter prompt, fewer or smaller images, or a larger --ctx "
                                 "(batches of min(ctx, %d) tokens)", last, s->pos + t, *batch, ZAYA_VL_BATCH);
            last = s->pos + t;
        }
    return 0;
}

int zaya_forward(const ZayaModel *m, ZayaState *s, const int *tokens, int n, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    if (check_tokens(m, s, tokens, n, err, errlen) != 0) return -1;
    if (n > s->ctx - s->pos)
        return zaya_fail(err, errlen, "context is full: %d positions used of %d, %d more needed\n"
                         "  hint: start a new conversation or raise --ctx (max %d)", s->pos, s->ctx, n,
                         c->max_position);
    kernels_set_ggml(s->kernels, ggml_mode(s));
    int batch = s->batch >= 1 && s->batch <= ZAYA_BATCH ? s->batch : ZAYA_BATCH;
    if (image_batch(m, s, tokens, n, &batch, err, errlen) != 0) return -1;
    for (int done = 0; done < n; done += batch) forward(m, s, tokens + done, n - done < batch ? n - done : batch);
    return 0;
}

int zaya_set_images(const ZayaModel *m, ZayaState *s, const float *features, int n, char *err, size_t errlen) {
    if (!m->vl)
        return zaya_fail(err, errlen, "images need a ZAYA1-VL model\n  found:    a text-only blob\n"
                         "  hint: export a ZAYA1-VL checkpoint (model_type zaya1_vl) with export_weights.py");
    s->image_features = features;
    s->n_image_features = n;
    s->image_next = 0;
    s->image_both_ways = s->pos == 0;
    return 0;
}

int zaya_replay_layer(const ZayaModel *m, ZayaState *s, int layer, const float *r, float *rho, int n, char *err,
                      size_t errlen) {
    const ZayaConfig *c = &m->config;
    const size_t H = (size_t)c->hidden_size, R = (size_t)c->router_hidden;
    if (layer < 0 || layer > c->num_layers)
        return zaya_fail(err, errlen, "replay of layer %d: the model has layers 0..%d (%d = the final norm and LM "
                         "head)",
                         layer, c->num_layers - 1, c->num_layers);
    if (check_precision(m, s, err, errlen) != 0) return -1;
    kernels_set_ggml(s->kernels, ggml_mode(s));
    if (n > s->ctx - s->pos)
        return zaya_fail(err, errlen, "replay: %d positions do not fit the context of %d (%d used)\n  hint: raise "
                         "--ctx",
                         n, s->ctx, s->pos);
    int batch = ZAYA_BATCH, first_image = -1, last_image = -1;   /* ZAYA1-VL: the image positions in one batch */
    for (int t = s->pos; s->image_mask && layer < c->num_layers && t < s->pos + n; t++)
        if (s->image_mask[t]) first_image = first_image < 0 ? t : first_image, last_image = t;
    if (first_image >= 0) {
        batch = s->capacity;
        if ((first_image - s->pos) / batch != (last_image - s->pos) / batch)
            return zaya_fail(err, errlen, "replay: the image positions %d..%d are not in one batch of %d\n  expected: "
                             "every image position of a prompt in one batch (the bidirectional image mask)\n  hint: a "
                             "larger --ctx (batches of min(ctx, %d) positions)", first_image, last_image, batch,
                             ZAYA_VL_BATCH);
    }
    for (int done = 0, cnt; done < n; done += cnt) {
        cnt = n - done < batch ? n - done : batch;
        Batch b = batch_of(m, s, layer, cnt);
        if (first_image >= 0 && first_image < s->pos + cnt && last_image >= s->pos)
            b.image = s->image_mask + s->pos, b.both_ways = 1;                  /* §V.9, §V.10 at image positions */
        memcpy(s->act->r, r + done * H, sizeof(float) * cnt * H);
        if (layer == c->num_layers) lm_output(&b, m, s);
        else {
            memcpy(s->act->router_state, rho + done * R, sizeof(float) * cnt * R);
            decoder_layer(&b, m, s, layer);
            memcpy(rho + done * R, s->act->router_state, sizeof(float) * cnt * R);
        }
        s->pos += cnt;
    }
    return 0;
}

int zaya_embed(const ZayaModel *m, ZayaState *s, const int *tokens, int n, float *r, char *err, size_t errlen) {
    const size_t H = (size_t)m->config.hidden_size;
    if (check_tokens(m, s, tokens, n, err, errlen) != 0) return -1;
    for (int done = 0, cnt; done < n; done += cnt) {
        cnt = n - done < ZAYA_BATCH ? n - done : ZAYA_BATCH;
        Batch b = batch_of(m, s, -1, cnt);
        const float *features = image_positions(&b, m, s, tokens + done);      /* ZAYA1-VL: zaya_set_images */
        embed(&b, m, tokens + done, features, s->act->e, s->act->r);
        memcpy(r + done * H, s->act->r, sizeof(float) * cnt * H);
    }
    return 0;
}

void zaya_state_taps(const ZayaModel *m, const ZayaState *s, ZayaTapFn fn, void *ctx) {
    const ZayaConfig *c = &m->config;
    const int d = c->head_dim, nkv = c->num_kv_heads, C = (c->num_heads + nkv) * d, K = conv_state_len(c);
    for (int i = 0; i < c->num_layers; i++) {
        const ZayaLayerState *ls = &s->layers[i];
        const KvCache kv = {ls->key_cache, ls->value_cache, ls->cache_len, nkv, d};
        ZayaTap conv = {"self_attn.qkv_proj:conv_state", i, -1, 0, 2, {K, C}, ls->conv_state, 0};
        ZayaTap dv = {"self_attn.qkv_proj:delayed_value_state", i, -1, 0, 1, {nkv * d / 2, 0}, ls->delayed_value, 0};
        if (K > 0) fn(ctx, &conv);
        fn(ctx, &dv);
        /* the KV cache in position order (a sliding layer's ring unrolled): [n, nkv * d] */
        int n = s->pos < ls->cache_len ? s->pos : ls->cache_len;
        const size_t size = sizeof(float) * ((size_t)n * nkv * d + 1);
        float *kc = malloc(size), *vc = malloc(size);
        if (kc && vc) {
            for (int r = 0; r < n; r++)
                for (int j = 0; j < nkv; j++) {
                    const size_t from = kv_row(&kv, j, s->pos - n + r);
                    memcpy(kc + ((size_t)r * nkv + j) * d, ls->key_cache + from, sizeof(float) * (size_t)d);
                    memcpy(vc + ((size_t)r * nkv + j) * d, ls->value_cache + from, sizeof(float) * (size_t)d);
                }
            ZayaTap kt = {"self_attn:key_cache", i, -1, 0, 2, {n, nkv * d}, kc, 0};
            ZayaTap vt = {"self_attn:value_cache", i, -1, 0, 2, {n, nkv * d}, vc, 0};
            fn(ctx, &kt);
            fn(ctx, &vt);
        }
        free(kc);
        free(vc);
    }
}
