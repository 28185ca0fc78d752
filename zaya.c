/* zaya.c - ZAYA1 inference in plain C: the blob loader and the forward pass.
 *
 * Read it top to bottom beside docs/architecture.md ("arch §n"); the upstream code it mirrors is
 * Hugging Face transformers' src/transformers/models/zaya/modeling_zaya.py ("HF"):
 *   1. helpers: errors, RMSNorm, the residual scaling
 *   2. loading and validating the blob (docs/blob-format.md)
 *   3. the decoding state (arch §4)
 *   4. forward(): every token of every mode, in the order of arch §3
 * The matrix products and attention are calls into kernels.c (threads, SIMD and storage layouts
 * live there); sampling, dumps and the command line are in main.c.
 */
#define _POSIX_C_SOURCE 200809L
#include "zaya.h"
#include "kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * 1. Helpers
 * ------------------------------------------------------------------------------------------- */

/* RMSNorm(x; w) = w * (x / sqrt(mean(x^2) + eps)), HF ZayaRMSNorm.forward (weight not 1+w). */
static void rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    float ss = 0.0f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

/* (branch + hb) * hs + (residual + rb) * rs, into residual (HF ZayaResidualScaling.forward). */
static void residual_scale(float *residual, const float *branch, const ZayaResidualScale *p, int n) {
    for (int i = 0; i < n; i++)
        residual[i] = (branch[i] + p->hidden_states_bias[i]) * p->hidden_states_scale[i] +
                      (residual[i] + p->residual_bias[i]) * p->residual_scale[i];
}


/* ---------------------------------------------------------------------------------------------
 * 3. The decoding state (arch §4)
 * ------------------------------------------------------------------------------------------- */

static int conv_state_len(const ZayaConfig *c) { return (c->cca_time0 - 1) + (c->cca_time1 - 1); }

/* With a tap (--dump) every token's logits: the LM head (the whole embedding, 2.1 GB for 74B in
 * bf16) is read once for LOGIT_ROWS tokens. */
#define LOGIT_ROWS 8

/* The state's float buffers and their lengths for config c (B tokens a batch). */
#define STATE_BUFFERS 28
static void state_buffers(ZayaState *s, float **b[STATE_BUFFERS], size_t n[STATE_BUFFERS], const ZayaConfig *c) {
    float **all[STATE_BUFFERS] = {&s->x, &s->h, &s->u, &s->q, &s->k, &s->v, &s->vd, &s->attn_out, &s->branch,
                                  &s->router_state, &s->router_a, &s->router_b, &s->router_logits, &s->router_probs,
                                  &s->expert_weight, &s->expert_in, &s->expert_hidden, &s->expert_out,
                                  &s->conv_a, &s->z, &s->a_t, &s->q_res, &s->k_res, &s->att, &s->router_scores,
                                  &s->rope_cos, &s->rope_sin, &s->logits};
    memcpy(b, all, sizeof all);
    if (!n) return;
    const size_t H = (size_t)c->hidden_size, d = (size_t)c->head_dim, nq = (size_t)c->num_heads,
                 nkv = (size_t)c->num_kv_heads, C = (nq + nkv) * d, E1 = (size_t)c->num_experts + 1,
                 I = (size_t)c->moe_intermediate, R = (size_t)c->router_hidden, B = ZAYA_BATCH;
    const size_t len[STATE_BUFFERS] = {B * H, B * H, B * C, B * nq * d, B * nkv * d, B * nkv * d, B * nkv * d / 2,
                                       B * nq * d, B * H, B * R, B * R, B * R, B * E1, B * E1, B, B * H, B * 2 * I,
                                       B * H, B * (size_t)c->cca_time1 * C, B * C, C, nq * d, nkv * d, nq * (size_t)s->ctx,
                                       E1, d, d, LOGIT_ROWS * (size_t)c->vocab_size};
    memcpy(n, len, sizeof len);
}

int zaya_state_init(ZayaState *s, const ZayaModel *m, int ctx, int threads, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    memset(s, 0, sizeof *s);
    if (ctx < 1 || ctx > c->max_position)
        return zaya_fail(err, errlen, "context length %d is out of range\n  expected: 1..%d (max_position_embeddings)", ctx, c->max_position);
    const size_t d = (size_t)c->head_dim, nkv = (size_t)c->num_kv_heads, C = (size_t)(c->num_heads + c->num_kv_heads) * d;
    s->ctx = ctx;
    s->batch = ZAYA_BATCH;
    s->num_layers = c->num_layers;
    s->layers = calloc((size_t)c->num_layers, sizeof(ZayaLayerState));
    int ok = s->layers != NULL;
    for (int i = 0; ok && i < c->num_layers; i++) {
        ZayaLayerState *ls = &s->layers[i];
        ls->cache_len = c->layer_types[i] == ZAYA_HYBRID_SLIDING && c->sliding_window < ctx ? c->sliding_window : ctx;
        ls->key_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->value_cache = calloc_lines((size_t)ls->cache_len * nkv * d, sizeof(float));
        ls->conv_state = calloc((size_t)conv_state_len(c) * C + 1, sizeof(float));
        ls->delayed_value = calloc(nkv * d / 2, sizeof(float));
        ok = ls->key_cache && ls->value_cache && ls->conv_state && ls->delayed_value;
    }
    float **bufs[STATE_BUFFERS];
    size_t lens[STATE_BUFFERS];
    state_buffers(s, bufs, lens, c);
    for (int k = 0; ok && k < STATE_BUFFERS; k++) ok = (*bufs[k] = calloc_lines(lens[k], sizeof(float))) != NULL;
    if (ok) ok = (s->expert = calloc(ZAYA_BATCH, sizeof(int))) != NULL;
    int max_in = c->hidden_size > c->num_heads * c->head_dim ? c->hidden_size : c->num_heads * c->head_dim;
    max_in = max_in > c->moe_intermediate ? max_in : c->moe_intermediate;
    max_in = max_in > c->router_hidden ? max_in : c->router_hidden;
    if (ok) ok = (s->kernels = kernels_new(threads, max_in, ZAYA_BATCH)) != NULL;
    if (!ok) {
        zaya_state_free(s);
        return zaya_fail(err, errlen, "out of memory allocating the state for %d positions\n  hint: use a smaller --ctx", ctx);
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
        if (m->layers[i].v_proj_delayed_bias) memcpy(ls->delayed_value, m->layers[i].v_proj_delayed_bias, nkv * d / 2 * sizeof(float));
        else memset(ls->delayed_value, 0, nkv * d / 2 * sizeof(float));
    }
    s->pos = 0;
}

void zaya_state_free(ZayaState *s) {
    for (int i = 0; s->layers && i < s->num_layers; i++) {
        free(s->layers[i].key_cache);
        free(s->layers[i].value_cache);
        free(s->layers[i].conv_state);
        free(s->layers[i].delayed_value);
    }
    free(s->layers);
    float **bufs[STATE_BUFFERS];
    state_buffers(s, bufs, NULL, NULL);
    for (int k = 0; k < STATE_BUFFERS; k++) free(*bufs[k]);
    free(s->expert);
    kernels_free(s->kernels);
    memset(s, 0, sizeof *s);
}

int zaya_state_threads(const ZayaState *s) { return kernels_threads(s->kernels); }

/* ---------------------------------------------------------------------------------------------
 * 4. Forward (arch §3)
 *
 * forward() runs n tokens at positions s->pos .. s->pos+n-1 through the model: a decoded token
 * (n = 1), a prompt in batches, a dump or a trace all take this one path. Row t of every [B, dim]
 * buffer of the state belongs to token t. The projections are matmuls over the n rows (each weight
 * is read once for all of them); the steps that carry state from token to token (the convolutions'
 * inputs, the delayed value, the KV cache) go token after token. Each intermediate is reported to
 * the tap, if any (--dump, --trace), under its HF module path (docs/compare.md).
 * ------------------------------------------------------------------------------------------- */

static void tap(ZayaState *s, int layer, int pos, const char *name, const void *data, int ndim, int d0, int d1) {
    ZayaTap t = {name, layer, pos, 0, ndim, {d0, d1}, data, 0};
    s->tap(s->tap_ctx, &t);
}
#define TAP(name, data, n) do { if (s->tap) tap(s, layer, pos, name, data, 1, n, 0); } while (0)          /* [n] */
#define TAP2(name, data, n0, n1) do { if (s->tap) tap(s, layer, pos, name, data, 2, n0, n1); } while (0) /* [n0, n1] */

/* arch §3.4: the two causal convolutions of the batch's n tokens. Token t's window is u_{t-K} .. u_t,
 * K = (t0-1) + (t1-1): the conv state (the K inputs before the batch, oldest first), then the batch's
 * u = [q_tilde ; k_tilde] rows. They read inputs only, so the whole batch goes at once; the conv state
 * then keeps the last K inputs (raw, pre-conv).
 *   depthwise (conv_qk_depthwise, kernel t0): a_s[c] = b0[c] + sum_m w0[c,0,m] u_{s-t0+1+m}[c] for
 *     s = t-t1+1 .. t; a zero-padded u gives a_{<0} = b0, not 0. Kept per token as
 *     conv_a[t][c * t1 + (s-(t-t1+1))], the order of the grouped conv's weights [o, j, k].
 *   grouped (conv_qk_grouped, kernel t1, one group of d channels per head): z_t[o] = b1[o] +
 *     sum_j sum_k w1[o,j,k] a_{t-t1+1+k}[head*d + j]: per head, a product of its [d, d*t1] weights
 *     with the head's d*t1 values of conv_a. */
static void cca_convolutions(Kernels *k, const ZayaConfig *c, const ZayaLayer *L, ZayaLayerState *ls, const float *u,
                             int n, float *conv_a, float *z) {
    const int d = c->head_dim, C = (c->num_heads + c->num_kv_heads) * d;
    const int t0 = c->cca_time0, t1 = c->cca_time1, K = conv_state_len(c);
#define INPUT(i) ((i) < 0 ? ls->conv_state + (size_t)((i) + K) * C : u + (size_t)(i) * C)   /* u_i, i >= -K */
    for (int t = 0; t < n; t++)
        for (int ch = 0; ch < C; ch++)
            for (int kk = 0; kk < t1; kk++) {   /* a_s, s = t-t1+1+kk, reads u_{s-t0+1} .. u_s */
                float sum = L->conv_qk_depthwise_bias[ch];
                for (int m = 0; m < t0; m++) sum += L->conv_qk_depthwise_weight[ch * t0 + m] * INPUT(t - K + kk + m)[ch];
                conv_a[((size_t)t * C + ch) * t1 + kk] = sum;
            }
    const ZayaMatrix grouped = {.dtype = ZAYA_F32, .rows = C, .cols = d * t1, .data = L->conv_qk_grouped_weight};
    matmul_grouped(k, z, C, &grouped, C / d, conv_a, C * t1, n);   /* a group per head */
    for (int t = 0; t < n; t++)
        for (int o = 0; o < C; o++) z[(size_t)t * C + o] += L->conv_qk_grouped_bias[o];
    for (int j = 0; j < K; j++)   /* the last K inputs: u_{n-K} .. u_{n-1} */
        memmove(ls->conv_state + (size_t)j * C, INPUT(n - K + j), sizeof(float) * (size_t)C);
#undef INPUT
}

/* arch §3.7: L2-normalize each head to norm sqrt(d) (clamped at FLT_EPSILON); keys also times
 * temp[j] (HF ZayaQKNorm.forward). */
static void qk_norm(float *x, int heads, int d, const float *temp) {
    const float sqrt_d = sqrtf((float)d);
    for (int n = 0; n < heads; n++) {
        float *v = x + (size_t)n * d, ss = 0.0f;
        for (int i = 0; i < d; i++) ss += v[i] * v[i];
        float scale = sqrt_d / fmaxf(sqrtf(ss), FLT_EPSILON);
        for (int i = 0; i < d; i++) v[i] = v[i] * scale * (temp ? temp[n] : 1.0f);
    }
}

/* arch §3.8: partial NeoX RoPE on dims [0, rot) of every query and key head, pairs (j, j + rot/2);
 * inv_freq and the angles in float32 (HF ZayaRotaryEmbedding, apply_rotary_pos_emb). q [nq, d],
 * k [nkv, d]; cos_t/sin_t: [rot/2] scratch. */
static void rope(float *q, int nq, float *k, int nkv, int d, int pos, int rot, float theta, float *cos_t, float *sin_t) {
    const int half = rot / 2;
    for (int j = 0; j < half; j++) {
        float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)rot);
        cos_t[j] = cosf((float)pos * inv_freq);
        sin_t[j] = sinf((float)pos * inv_freq);
    }
    for (int n = 0; n < nq + nkv; n++) {
        float *v = n < nq ? q + (size_t)n * d : k + (size_t)(n - nq) * d;
        for (int j = 0; j < half; j++) {
            float a = v[j], b = v[j + half];
            v[j] = a * cos_t[j] - b * sin_t[j];
            v[j + half] = b * cos_t[j] + a * sin_t[j];
        }
    }
}

static void forward(const ZayaModel *m, ZayaState *s, const int *tokens, int n) {
    const ZayaConfig *c = &m->config;
    const int H = c->hidden_size, d = c->head_dim, nq = c->num_heads, nkv = c->num_kv_heads, g = nq / nkv;
    const int C = (nq + nkv) * d, vhalf = nkv * d / 2, R = c->router_hidden, E = c->num_experts, I = c->moe_intermediate;
    const float eps = c->rms_norm_eps;
    Kernels *k = s->kernels;
    int layer = -1;

    for (int t = 0; t < n; t++) {   /* §3.1 embedding and input scaling, no sqrt(H) factor (HF ZayaModel.forward) */
        const int pos = s->pos + t;
        float *e = s->h + (size_t)t * H, *x = s->x + (size_t)t * H;
        matrix_row(&m->embed_tokens, tokens[t], e);
        TAP("model.embed_tokens", e, H);
        for (int i = 0; i < H; i++) x[i] = (e[i] + m->input_hidden_states_bias[i]) * m->input_hidden_states_scale[i];
        TAP("model:input_scaled", x, H);
    }

    for (layer = 0; layer < c->num_layers; layer++) {   /* HF ZayaDecoderLayer.forward */
        const ZayaLayer *L = &m->layers[layer];
        ZayaLayerState *ls = &s->layers[layer];
        const int type = c->layer_types[layer];
        const KvCache kv = {ls->key_cache, ls->value_cache, ls->cache_len, nkv, d};

        for (int t = 0; t < n; t++) {   /* §3.2 input_layernorm */
            const int pos = s->pos + t;
            rmsnorm(s->h + (size_t)t * H, s->x + (size_t)t * H, L->input_layernorm, H, eps);
            TAP("input_layernorm", s->h + (size_t)t * H, H);
        }
        /* §3.3 q_proj and k_proj: u = [q_tilde ; k_tilde] (HF ZayaCCAProjection); §3.6 the value projections */
        const MatmulOut projections[4] = {{&L->q_proj, s->u, C}, {&L->k_proj, s->u + (size_t)nq * d, C},
                                          {&L->v_proj_current, s->v, nkv * d}, {&L->v_proj_delayed, s->vd, vhalf}};
        matmuls(k, projections, 4, s->h, H, n);   /* four products of h */
        if (c->attention_bias)   /* the four projections' biases (config attention_bias) */
            for (int t = 0; t < n; t++) {
                for (int i = 0; i < C; i++) s->u[(size_t)t * C + i] += i < nq * d ? L->q_proj_bias[i] : L->k_proj_bias[i - nq * d];
                for (int i = 0; i < vhalf; i++) {
                    s->v[(size_t)t * nkv * d + i] += L->v_proj_current_bias[i];
                    s->vd[(size_t)t * vhalf + i] += L->v_proj_delayed_bias[i];
                }
            }

        cca_convolutions(k, c, L, ls, s->u, n, s->conv_a, s->z);                /* §3.4 the two convolutions */

        for (int t = 0; t < n; t++) {   /* token after token: the delayed value and the KV cache carry over */
            const int pos = s->pos + t;
            const float *u = s->u + (size_t)t * C, *q_tilde = u, *k_tilde = u + (size_t)nq * d;
            float *q = s->q + (size_t)t * nq * d, *key = s->k + (size_t)t * nkv * d, *v = s->v + (size_t)t * nkv * d;
            const float *z = s->z + (size_t)t * C;
            TAP("self_attn.qkv_proj.q_proj", q_tilde, nq * d);
            TAP("self_attn.qkv_proj.k_proj", k_tilde, nkv * d);
            if (s->tap) {   /* the depthwise conv's output a_t: its last column */
                for (int ch = 0; ch < C; ch++) s->a_t[ch] = s->conv_a[((size_t)t * C + ch) * c->cca_time1 + c->cca_time1 - 1];
                TAP("self_attn.qkv_proj.conv_qk_depthwise", s->a_t, C);
            }
            TAP("self_attn.qkv_proj.conv_qk_grouped", z, C);

            for (int h = 0; h < nq; h++)   /* §3.3 residual mix: q_res[h] = (q_tilde[h] + k_tilde[h/g]) / 2 */
                for (int i = 0; i < d; i++) s->q_res[h * d + i] = (q_tilde[h * d + i] + k_tilde[(h / g) * d + i]) * 0.5f;
            for (int j = 0; j < nkv; j++)   /* k_res[j] = mean of q_res over KV head j's g query heads */
                for (int i = 0; i < d; i++) {
                    float sum = 0.0f;
                    for (int r = 0; r < g; r++) sum += s->q_res[(j * g + r) * d + i];
                    s->k_res[j * d + i] = sum / (float)g;
                }
            TAP2("self_attn.qkv_proj:query_residual", s->q_res, nq, d);
            TAP2("self_attn.qkv_proj:key_residual", s->k_res, nkv, d);
            for (int i = 0; i < nq * d; i++) q[i] = z[i] + s->q_res[i];   /* §3.5 q/k assembly */
            for (int i = 0; i < nkv * d; i++) key[i] = z[nq * d + i] + s->k_res[i];
            TAP2("self_attn.qkv_proj:query", q, nq, d);
            TAP2("self_attn.qkv_proj:key", key, nkv, d);

            /* §3.6 values: the channels [v_proj_current(h_t) ; v_proj_delayed(h_{t-1})], then viewed as [nkv, d]
             * (with an odd nkv the middle head is half current, half delayed) */
            const float *vd = s->vd + (size_t)t * vhalf;
            TAP("self_attn.qkv_proj.v_proj_current", v, vhalf);
            TAP("self_attn.qkv_proj.v_proj_delayed", vd, vhalf);
            memcpy(v + vhalf, ls->delayed_value, sizeof(float) * (size_t)vhalf);
            memcpy(ls->delayed_value, vd, sizeof(float) * (size_t)vhalf);
            TAP2("self_attn.qkv_proj:value", v, nkv, d);

            qk_norm(q, nq, d, NULL);                                              /* §3.7 qk_norm */
            qk_norm(key, nkv, d, L->qk_norm_temp);
            TAP2("self_attn.qk_norm:query", q, nq, d);
            TAP2("self_attn.qk_norm:key", key, nkv, d);

            rope(q, nq, key, nkv, d, pos, c->rope_dim[type], c->rope_theta[type], s->rope_cos, s->rope_sin);   /* §3.8 RoPE */
            TAP2("self_attn:query_after_rope", q, nq, d);
            TAP2("self_attn:key_after_rope", key, nkv, d);

            for (int j = 0; j < nkv; j++) {                                       /* §4 the KV cache */
                memcpy(ls->key_cache + kv_row(&kv, j, pos), key + (size_t)j * d, sizeof(float) * (size_t)d);
                memcpy(ls->value_cache + kv_row(&kv, j, pos), v + (size_t)j * d, sizeof(float) * (size_t)d);
            }
            /* §3.9 attention over keys first..pos: sliding layers see the last sliding_window positions */
            const int first = type == ZAYA_HYBRID_SLIDING && pos - c->sliding_window + 1 > 0 ? pos - c->sliding_window + 1 : 0;
            float *o = s->attn_out + (size_t)t * nq * d;
            attention(k, o, s->att, q, nq, &kv, first, pos);
            if (s->tap) {   /* [nq, keys]: HF's attn_weights row without the masked zeros (ragged) */
                ZayaTap w = {"self_attn:attn_weights", layer, pos, 0, 2, {nq, pos - first + 1}, s->att, 1};
                s->tap(s->tap_ctx, &w);
            }
            TAP("self_attn:attn_output", o, nq * d);
        }

        matmul(k, s->branch, H, &L->o_proj, s->attn_out, nq * d, n);               /* §3.10 o_proj */
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *x = s->x + (size_t)t * H, *h = s->h + (size_t)t * H;
            if (c->attention_bias) for (int i = 0; i < H; i++) s->branch[(size_t)t * H + i] += L->o_proj_bias[i];
            TAP("self_attn.o_proj", s->branch + (size_t)t * H, H);
            residual_scale(x, s->branch + (size_t)t * H, &L->post_attention_residual_scale, H);   /* §3.11 */
            TAP("post_attention_residual_scale", x, H);
            rmsnorm(h, x, L->post_attention_layernorm, H, eps);                   /* §3.12 */
            TAP("post_attention_layernorm", h, H);
        }

        /* §3.13 router (HF ZayaRouter, ZayaRouterMLP): down_proj, EDA over depth, MLP, softmax, top-1 */
        float *a = s->router_a, *b = s->router_b;
        matmul(k, a, R, &L->router_down_proj, s->h, H, n);                       /* mlp.gate.down_proj */
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *at = a + (size_t)t * R, *rho = s->router_state + (size_t)t * R;
            for (int i = 0; i < R; i++) at[i] += L->router_down_proj_bias[i];
            TAP("mlp.gate.down_proj", at, R);
            /* EDA: rho = down + rho_prev * router_states_scale; layer 0 (no scale) starts it */
            for (int i = 0; i < R; i++) rho[i] = L->router_states_scale ? at[i] + rho[i] * L->router_states_scale[i] : at[i];
            TAP("mlp.gate:router_state", rho, R);
            rmsnorm(b + (size_t)t * R, rho, L->router_norm, R, c->router_norm_eps);   /* router_mlp.norm */
            TAP("mlp.gate.router_mlp.norm", b + (size_t)t * R, R);
        }
        matmul(k, a, R, &L->router_fc1, b, R, n);                                /* router_mlp.fc1, GELU */
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *at = a + (size_t)t * R;
            for (int i = 0; i < R; i++) at[i] += L->router_fc1_bias[i];
            TAP("mlp.gate.router_mlp.fc1", at, R);
            for (int i = 0; i < R; i++) at[i] = at[i] * 0.5f * (1.0f + erff(at[i] * 0.70710678118654752440f));   /* exact GELU */
        }
        matmul(k, b, R, &L->router_fc2, a, R, n);                                /* router_mlp.fc2, GELU */
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *bt = b + (size_t)t * R;
            for (int i = 0; i < R; i++) bt[i] += L->router_fc2_bias[i];
            TAP("mlp.gate.router_mlp.fc2", bt, R);
            for (int i = 0; i < R; i++) bt[i] = bt[i] * 0.5f * (1.0f + erff(bt[i] * 0.70710678118654752440f));
        }
        matmul(k, s->router_logits, E + 1, &L->router_out_proj, b, R, n);        /* router_mlp.out_proj */
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *logits = s->router_logits + (size_t)t * (E + 1), *probs = s->router_probs + (size_t)t * (E + 1);
            TAP("mlp.gate.router_mlp", logits, E + 1);
            memcpy(probs, logits, sizeof(float) * (size_t)(E + 1));
            softmax(probs, E + 1);                                                /* over all E+1 classes */
            TAP("mlp.gate:router_probs", probs, E + 1);
            int best = 0;   /* top-1 of the biased scores (ties: lowest index); the weight is unbiased */
            for (int e = 0; e <= E; e++) {
                s->router_scores[e] = probs[e] + L->balancing_biases[e];
                if (s->router_scores[e] > s->router_scores[best]) best = e;
            }
            TAP("mlp.gate:router_scores", s->router_scores, E + 1);
            if (s->tap) {
                ZayaTap ti = {"mlp.gate.router_indices", layer, pos, 1, 0, {0, 0}, &best, 0};
                s->tap(s->tap_ctx, &ti);
            }
            s->expert[t] = best;
            s->expert_weight[t] = probs[best];
        }

        /* §3.14 experts (SwiGLU): each chosen expert runs once on the tokens routed to it */
        for (int e = 0; e < E; e++) {
            int idx[ZAYA_BATCH], cnt = 0;
            for (int t = 0; t < n; t++)
                if (s->expert[t] == e) {
                    memcpy(s->expert_in + (size_t)cnt * H, s->h + (size_t)t * H, sizeof(float) * (size_t)H);
                    idx[cnt++] = t;
                }
            if (!cnt) continue;   /* only the chosen experts' weights are read */
            const ZayaMatrix gate_up = matrix_rows(&L->experts_gate_up, e * 2 * I, 2 * I);
            const ZayaMatrix down = matrix_rows(&L->experts_down, e * H, H);
            matmul(k, s->expert_hidden, 2 * I, &gate_up, s->expert_in, H, cnt);  /* [gate ; up] */
            for (int j = 0; j < cnt; j++) {
                float *gate = s->expert_hidden + (size_t)j * 2 * I, *up = gate + I;
                for (int i = 0; i < I; i++) gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];   /* SiLU(gate) * up */
            }
            matmul(k, s->expert_out, H, &down, s->expert_hidden, 2 * I, cnt);     /* down_proj(SiLU(gate) * up) */
            for (int j = 0; j < cnt; j++)                                        /* y = weight * down(...) */
                for (int i = 0; i < H; i++)
                    s->branch[(size_t)idx[j] * H + i] = s->expert_weight[idx[j]] * s->expert_out[(size_t)j * H + i];
        }
        for (int t = 0; t < n; t++) {
            const int pos = s->pos + t;
            float *y = s->branch + (size_t)t * H, *x = s->x + (size_t)t * H;
            if (s->expert[t] == E) {   /* the skip class (arch §6a) */
                if (s->skip_expert == ZAYA_SKIP_PASSTHROUGH)                     /* Zyphra's fork: P[skip] * h2 */
                    for (int i = 0; i < H; i++) y[i] = s->expert_weight[t] * s->h[(size_t)t * H + i];
                else {                                                           /* upstream: a zero output */
                    s->expert_weight[t] = 0.0f;
                    memset(y, 0, sizeof(float) * (size_t)H);
                }
            }
            if (s->tap) {
                ZayaTap tw = {"mlp.gate:router_weight", layer, pos, 0, 0, {0, 0}, &s->expert_weight[t], 0};
                s->tap(s->tap_ctx, &tw);
            }
            TAP("mlp.experts", y, H);
            residual_scale(x, y, &L->post_mlp_residual_scale, H);                /* §3.15 post_mlp_residual_scale */
            TAP("post_mlp_residual_scale", x, H);
        }
    }

    layer = -1;   /* §3.16 final norm and the tied LM head: the last token's logits (every token's for a tap) */
    for (int t = 0; t < n; t++) {
        const int pos = s->pos + t;
        rmsnorm(s->h + (size_t)t * H, s->x + (size_t)t * H, m->norm, H, eps);
        TAP("model.norm", s->h + (size_t)t * H, H);
    }
    const int V = c->vocab_size;
    for (int t0 = s->tap ? 0 : n - 1, rows = 0; t0 < n; t0 += rows) {   /* a tap: LOGIT_ROWS tokens a product */
        rows = n - t0 < LOGIT_ROWS ? n - t0 : LOGIT_ROWS;
        matmul(k, s->logits, V, &m->embed_tokens, s->h + (size_t)t0 * H, H, rows);
        for (int t = t0; t < t0 + rows; t++) {
            const int pos = s->pos + t;
            float *logits = s->logits + (size_t)(t - t0) * V;
            if (c->lm_head_bias) for (int v = 0; v < V; v++) logits[v] += m->lm_head_bias[v];
            TAP("logits", logits, V);
        }
        if (t0 + rows == n)   /* the last token's logits first, where generation reads them */
            memmove(s->logits, s->logits + (size_t)(rows - 1) * V, sizeof(float) * (size_t)V);
    }
    s->pos += n;
}

int zaya_forward(const ZayaModel *m, ZayaState *s, const int *tokens, int n, char *err, size_t errlen) {
    const ZayaConfig *c = &m->config;
    for (int t = 0; t < n; t++)
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return zaya_fail(err, errlen, "token id %d (position %d) is outside the vocabulary\n  expected: 0..%d",
                        tokens[t], s->pos + t, c->vocab_size - 1);
    if (n > s->ctx - s->pos)
        return zaya_fail(err, errlen, "context is full: %d positions used of %d, %d more needed\n  hint: start a new conversation or raise --ctx (max %d)",
                    s->pos, s->ctx, n, c->max_position);
    const int batch = s->batch >= 1 && s->batch <= ZAYA_BATCH ? s->batch : ZAYA_BATCH;
    for (int done = 0; done < n; done += batch) forward(m, s, tokens + done, n - done < batch ? n - done : batch);
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
        float *kc = malloc(sizeof(float) * ((size_t)n * nkv * d + 1)), *vc = malloc(sizeof(float) * ((size_t)n * nkv * d + 1));
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
