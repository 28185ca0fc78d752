/* vision.c - the ZAYA1-VL vision tower in plain C (a Qwen2.5-VL vision transformer).
 *
 * Read it beside docs/architecture.md "Vision tower" ("arch §V.n"); the upstream code it mirrors is
 * Hugging Face transformers' models/zaya1_vl/modeling_zaya1_vl.py (pull request #46011), class
 * Zaya1VLVisionModel ("HF"). Steps in order: patch embedding, the 2-D rotary embedding, the window
 * index permutation, the blocks (RMSNorm, attention over a window or the whole image, RMSNorm, SwiGLU
 * MLP), the patch merger, the inverse permutation. The Linear products are kernels.c calls (matmul_chain); the
 * patch embedding and the attention are plain loops here (one thread). The arithmetic is torch's CPU float32
 * arithmetic where this file can follow it (torch_cpu.h), so that the tower gives the official float32 run's
 * bits: only cos/sin (MKL's) and GELU (oneDNN's) are computed otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include "vision.h"
#include "kernels.h"
#include "torch_cpu.h"
#include "zmath.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The tower's products (matmul_chain) need the kernels' threads, not their per-token scratch. */
#define VISION_ROWS 1

typedef struct {
    const ZayaVisionConfig *c;
    Kernels *kern;
    ZayaVisionTapFn tap;
    void *tap_ctx;
    int n;                      /* patches (rows) */
} Run;

static void tap(const Run *r, const char *name, const float *x, int rows, int cols) {
    if (r->tap) r->tap(r->tap_ctx, name, x, rows, cols);
}

/* torch's SiLU: x / (1 + exp(-x)) with its vectorized exp */
static float silu(float x) { return x / (1.0f + torch_expf(-x)); }
/* exact (erf) GELU */
static float gelu(float x) { return x * 0.5f * (1.0f + zaya_erff(x * 0.70710678118654752440f)); }

/* HF nn.Linear on n rows: y = bias + W x, summed in torch's order (the official run's bits).
 * [n, W.cols] -> [n, W.rows] */
static void linear(const Run *r, const char *name, float *y, const ZayaMatrix *w, const float *bias, const float *x,
                   int n) {
    matmul_chain(r->kern, y, w->rows, w, bias, x, w->cols, n);
    if (name) tap(r, name, y, n, w->rows);
}

/* arch §V.4 HF Zaya1VLRMSNorm (eps 1e-6): out = w * (x / sqrt(mean(x^2) + eps)). [n, dim] */
static void rmsnorm(const Run *r, const char *name, float *out, const float *x, const float *w, int n, int dim) {
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        for (int i = 0; i < dim; i++) o[i] = xt[i] * xt[i];   /* hidden_states.pow(2) */
        const float inv_rms = 1.0f / sqrtf(torch_sum(o, dim) / (float)dim + 1e-6f);   /* .mean(-1), in torch's order */
        for (int i = 0; i < dim; i++) o[i] = w[i] * (xt[i] * inv_rms);
    }
    tap(r, name, out, n, dim);
}

/* arch §V.1 HF Qwen2_5_VisionPatchEmbed: a Conv3d with kernel = stride = [T, P, P] and no bias, i.e.
 * one product per patch of its C*T*P*P values (stored c, t, y, x), summed as torch's CPU Conv3d sums it
 * (oneDNN's direct convolution): one float32 multiply-add chain per output over (t, y, x, c), the official
 * float32 run's bits. w: a row's scratch [C*T*P*P]. [n, C*T*P*P] -> [n, D] */
static void patch_embed(const Run *r, const ZayaVision *v, const float *pixels, float *x, float *w) {
    const int C = r->c->in_channels, T = r->c->temporal_patch_size, P = r->c->patch_size;
    const int K = v->patch_embed.cols, D = v->patch_embed.rows;
    for (int o = 0; o < D; o++) {
        matrix_row(&v->patch_embed, o, w);
        for (int t = 0; t < r->n; t++) {
            const float *p = pixels + (size_t)t * K;
            float acc = 0.0f;
            for (int tt = 0; tt < T; tt++)
                for (int y = 0; y < P; y++)
                    for (int xx = 0; xx < P; xx++)
                        for (int ch = 0; ch < C; ch++) {
                            const int i = ((ch * T + tt) * P + y) * P + xx;
                            acc = fmaf(w[i], p[i], acc);
                        }
            x[(size_t)t * D + o] = acc;
        }
    }
    tap(r, "model.visual.patch_embed", x, r->n, D);
}

/* arch §V.2 HF Zaya1VLVisionModel.get_window_index: the merged patches (units of M x M patches,
 * unit u = row-major over the (grid_h/M) x (grid_w/M) grid) listed window by window, windows of
 * w x w units with w = window_size / M / P in row-major order, units row-major inside a window
 * (the grid's edge windows are cut short). index[k] = the unit at window order k; seg[j] = the first
 * unit of window j, seg[n_windows] = all units. Returns the number of windows. */
static int window_index(const ZayaVisionConfig *c, int lh, int lw, int *index, int *seg) {
    const int w = c->window_size / c->spatial_merge_size / c->patch_size;
    int k = 0, windows = 0;
    for (int wh = 0; wh * w < lh; wh++)
        for (int ww = 0; ww * w < lw; ww++) {
            seg[windows++] = k;
            for (int i = wh * w; i < (wh + 1) * w && i < lh; i++)
                for (int j = ww * w; j < (ww + 1) * w && j < lw; j++) index[k++] = i * lw + j;
        }
    seg[windows] = k;
    return windows;
}

/* arch §V.3 HF Qwen2_5_VisionRotaryEmbedding and rot_pos_emb: patch i of unit u (image order) sits at
 * row hpos, column wpos of the patch grid; with dim = head_dim / 2 and inv_freq[j] =
 * 1 / 10000^(2j / dim), j < dim / 2, its angles are [hpos * inv_freq ; wpos * inv_freq] (dim values),
 * repeated twice over the head (emb = cat(freqs, freqs)). cos_t/sin_t [n, head_dim] in window order. */
static void rotary(const Run *r, const int *index, int lh, int lw, float *cos_t, float *sin_t) {
    const ZayaVisionConfig *c = r->c;
    const int hd = c->hidden_size / c->num_heads, dim = hd / 2, M = c->spatial_merge_size, U = M * M;
    const int side = (lh > lw ? lh : lw) * M;   /* HF's table: positions 0 .. max(grid_h, grid_w) - 1 */
    float *table = r->tap ? malloc(sizeof(float) * (size_t)side * (dim / 2) + 1) : NULL;
    for (int p = 0; table && p < side; p++)
        for (int j = 0; j < dim / 2; j++)
            table[(size_t)p * (dim / 2) + j] = (float)p * (1.0f / zaya_powf(10000.0f, (float)(2 * j) / (float)dim));
    if (table) tap(r, "model.visual.rotary_pos_emb", table, side, dim / 2);
    free(table);
    for (int k = 0; k < r->n / U; k++)
        for (int q = 0; q < U; q++) {
            const int u = index[k], hpos = (u / lw) * M + q / M, wpos = (u % lw) * M + q % M;
            float *co = cos_t + ((size_t)k * U + q) * hd, *si = sin_t + ((size_t)k * U + q) * hd;
            for (int j = 0; j < hd; j++) {
                const int f = j % dim, which = f < dim / 2 ? hpos : wpos;
                const float inv_freq = 1.0f / zaya_powf(10000.0f, (float)(2 * (f % (dim / 2))) / (float)dim);
                const float angle = (float)which * inv_freq;
                co[j] = zaya_cosf(angle);
                si[j] = zaya_sinf(angle);
            }
        }
}

/* HF apply_rotary_pos_emb_vision on one head x [hd]: x * cos + rotate_half(x) * sin. In place. */
static void rope_head(float *x, const float *co, const float *si, int hd) {
    float tmp[1024];
    const int half = hd / 2;
    for (int j = 0; j < hd; j++) tmp[j] = x[j] * co[j] + (j < half ? -x[j + half] : x[j - half]) * si[j];
    memcpy(x, tmp, sizeof(float) * (size_t)hd);
}

typedef struct {
    float *x, *h, *qkv, *attn, *branch, *gate, *up, *cos_t, *sin_t, *keys, *part, *probs;
} Scratch;

/* The buffers of n patch rows (all or none: 0 when out of memory), and their release. */
static int scratch_new(Scratch *s, const ZayaVisionConfig *c, int n) {
    const int D = c->hidden_size, I = c->intermediate_size, hd = D / c->num_heads;
    float **bufs[] = {&s->x, &s->h, &s->qkv, &s->attn, &s->branch, &s->gate, &s->up, &s->cos_t, &s->sin_t, &s->keys,
                      &s->part, &s->probs};
    const size_t lens[] = {(size_t)n * D, (size_t)n * D, (size_t)n * 3 * D, (size_t)n * D, (size_t)n * D,
                           (size_t)n * (I > D ? I : D), (size_t)n * I, (size_t)n * hd, (size_t)n * hd, (size_t)n * D,
                           (size_t)n * D, (size_t)c->num_heads * n};
    int ok = 1;
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++)
        ok = (*bufs[k] = ok ? calloc_lines(lens[k], sizeof(float)) : NULL) && ok;
    return ok;
}

static void scratch_free(Scratch *s) {
    float *bufs[] = {s->x, s->h, s->qkv, s->attn, s->branch, s->gate, s->up, s->cos_t, s->sin_t, s->keys, s->part,
                     s->probs};
    for (size_t k = 0; k < sizeof bufs / sizeof *bufs; k++) free(bufs[k]);
}

/* arch §V.5 HF Zaya1VLVisionAttention: qkv (one product, [q ; k ; v] per row), RoPE on q and k,
 * then each segment [seg[j], seg[j+1]) of rows attends within itself, unmasked (a window, or the
 * whole image on a full-attention block): softmax(q . k * head_dim^-0.5) . v, then proj.
 * h [n, D] -> branch [n, D] */
static void attention_block(const Run *r, const ZayaVisionBlock *B, const char *prefix, Scratch *s, const int *seg,
                            int segments) {
    const ZayaVisionConfig *c = r->c;
    const int D = c->hidden_size, heads = c->num_heads, hd = D / heads;
    char name[160];
    snprintf(name, sizeof name, "%s.attn.qkv", prefix);
    linear(r, name, s->qkv, &B->qkv, B->qkv_bias, s->h, r->n);
    for (int t = 0; t < r->n; t++)
        for (int head = 0; head < heads; head++) {
            const float *co = s->cos_t + (size_t)t * hd, *si = s->sin_t + (size_t)t * hd;
            rope_head(s->qkv + (size_t)t * 3 * D + head * hd, co, si, hd);       /* q */
            rope_head(s->qkv + (size_t)t * 3 * D + D + head * hd, co, si, hd);   /* k */
        }
    const float scale = (float)pow((double)hd, -0.5);   /* HF: self.scaling = head_dim**-0.5 */
    for (int j = 0; j < segments; j++) {
        const int first = seg[j], len = seg[j + 1] - seg[j];
        float *kt = s->keys;   /* one head's keys of the segment, transposed: [hd, len] */
        for (int head = 0; head < heads; head++) {
            for (int t = 0; t < len; t++)
                for (int d = 0; d < hd; d++)
                    kt[(size_t)d * len + t] = s->qkv[(size_t)(first + t) * 3 * D + D + head * hd + d];
            for (int t = 0; t < len; t++) {
                const float *q = s->qkv + (size_t)(first + t) * 3 * D + head * hd;
                float *p = s->probs, *o = s->attn + (size_t)(first + t) * D + head * hd;
                const float *v = s->qkv + (size_t)first * 3 * D + 2 * D + head * hd;
                /* eager_attention_forward, summed as the official run sums it (torch_cpu.h) */
                torch_matmul_row(p, q, 1, kt, len, len, hd, len, s->part);    /* matmul(q, k^T) */
                for (int u = 0; u < len; u++) p[u] *= scale;                    /* * scaling */
                torch_softmax(p, len);                                          /* softmax(dim=-1) */
                torch_matmul_row(o, p, 1, v, 3 * D, hd, len, len, s->part);   /* matmul(probs, v) */
            }
        }
    }
    snprintf(name, sizeof name, "%s.attn", prefix);
    linear(r, name, s->branch, &B->proj, B->proj_bias, s->attn, r->n);   /* attn.proj: the module's output */
}

/* arch §V.6 HF Zaya1VLMLP (bias=True): down_proj(SiLU(gate_proj h) * up_proj h). h [n, D] -> branch [n, D] */
static void mlp(const Run *r, const ZayaVisionBlock *B, const char *prefix, Scratch *s) {
    const int I = r->c->intermediate_size;
    char name[160];
    snprintf(name, sizeof name, "%s.mlp.gate_proj", prefix);
    linear(r, name, s->gate, &B->gate_proj, B->gate_proj_bias, s->h, r->n);
    snprintf(name, sizeof name, "%s.mlp.up_proj", prefix);
    linear(r, name, s->up, &B->up_proj, B->up_proj_bias, s->h, r->n);
    for (size_t i = 0; i < (size_t)r->n * I; i++) s->gate[i] = silu(s->gate[i]) * s->up[i];
    snprintf(name, sizeof name, "%s.mlp", prefix);
    linear(r, name, s->branch, &B->down_proj, B->down_proj_bias, s->gate, r->n);
}

static void add(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* arch §V.4-6 HF Zaya1VLVisionBlock: x += attn(norm1 x); x += mlp(norm2 x). In place on s->x [n, D] */
static void vision_block(const Run *r, const ZayaVision *v, int i, Scratch *s, const int *seg, int segments) {
    const ZayaVisionBlock *B = &v->blocks[i];
    const size_t nD = (size_t)r->n * r->c->hidden_size;
    char prefix[96], name[160];
    snprintf(prefix, sizeof prefix, "model.visual.blocks.%d", i);
    snprintf(name, sizeof name, "%s.norm1", prefix);
    rmsnorm(r, name, s->h, s->x, B->norm1, r->n, r->c->hidden_size);
    attention_block(r, B, prefix, s, seg, segments);
    add(s->x, s->branch, nD);
    snprintf(name, sizeof name, "%s.norm2", prefix);
    rmsnorm(r, name, s->h, s->x, B->norm2, r->n, r->c->hidden_size);
    mlp(r, B, prefix, s);
    add(s->x, s->branch, nD);
    tap(r, prefix, s->x, r->n, r->c->hidden_size);
}

/* arch §V.7 HF Zaya1VLPatchMerger: ln_q (RMSNorm) on each patch, the M*M patches of a unit side by side
 * ([n/U, U*D]), mlp.0, GELU, mlp.2. x [n, D] (window order) -> merged [n/U, out] (window order) */
static void merger(const Run *r, const ZayaVision *v, Scratch *s, float *merged) {
    const int D = r->c->hidden_size, U = r->c->spatial_merge_size * r->c->spatial_merge_size, units = r->n / U;
    rmsnorm(r, "model.visual.merger.ln_q", s->h, s->x, v->merger_ln_q, r->n, D);
    linear(r, "model.visual.merger.mlp.0", s->gate, &v->merger_fc1, v->merger_fc1_bias, s->h, units);
    for (size_t i = 0; i < (size_t)units * U * D; i++) s->gate[i] = gelu(s->gate[i]);
    tap(r, "model.visual.merger.mlp.1", s->gate, units, U * D);
    linear(r, "model.visual.merger", merged, &v->merger_fc2, v->merger_fc2_bias, s->gate, units);
}

int zaya_vision_tokens(const ZayaVisionConfig *c, int grid_h, int grid_w) {
    return grid_h * grid_w / (c->spatial_merge_size * c->spatial_merge_size);
}

static int is_full_attention(const ZayaVisionConfig *c, int i) {
    for (int k = 0; k < c->n_fullatt; k++)
        if (c->fullatt[k] == i) return 1;
    return 0;
}

int zaya_vision_encode(const ZayaVision *v, int threads, const float *pixels, int grid_h, int grid_w, float *features,
                       ZayaVisionTapFn tapfn, void *tap_ctx, char *err, size_t errlen) {
    const ZayaVisionConfig *c = &v->config;
    const int M = c->spatial_merge_size, U = M * M, D = c->hidden_size, I = c->intermediate_size;
    const int hd = D / c->num_heads, out = c->out_hidden_size;
    if (grid_h < M || grid_w < M || grid_h % M || grid_w % M || hd > 1024)
        return zaya_fail(err, errlen, "image grid %d x %d patches\n  expected: positive multiples of the merge size %d "
                         "(the image processor resizes to multiples of %d pixels)", grid_h, grid_w, M,
                         M * c->patch_size);
    const int n = grid_h * grid_w, lh = grid_h / M, lw = grid_w / M, units = lh * lw;
    const int pin = v->patch_embed.cols, wide = U * D;
    int max_cols = pin > D ? pin : D;
    max_cols = max_cols > I ? max_cols : I;
    max_cols = max_cols > wide ? max_cols : wide;
    Scratch s;
    const int ok = scratch_new(&s, c, n);
    float *merged = calloc_lines((size_t)units * out + 1, sizeof(float));
    int *index = malloc(sizeof(int) * (size_t)units), *seg = malloc(sizeof(int) * ((size_t)units + 2));
    int *rows = malloc(sizeof(int) * ((size_t)units + 2));
    float *wrow = malloc(sizeof(float) * (size_t)pin);
    Kernels *kern = ok && merged && index && seg && rows && wrow ? kernels_new(threads, max_cols, VISION_ROWS) : NULL;
    if (!kern) {
        scratch_free(&s);
        free(merged), free(index), free(seg), free(rows), free(wrow);
        return zaya_fail(err, errlen, "out of memory for the vision tower on a %d x %d patch grid", grid_h, grid_w);
    }
    const Run r = {c, kern, tapfn, tap_ctx, n};

    patch_embed(&r, v, pixels, s.h, wrow);                                        /* §V.1 -> [n, D] image order */
    const int windows = window_index(c, lh, lw, index, seg);                      /* §V.2 */
    for (int k = 0; k < units; k++)                                               /* rows into window order */
        memcpy(s.x + (size_t)k * U * D, s.h + (size_t)index[k] * U * D, sizeof(float) * (size_t)U * D);
    rotary(&r, index, lh, lw, s.cos_t, s.sin_t);                                      /* §V.3 */
    for (int j = 0; j <= windows; j++) rows[j] = seg[j] * U;                      /* window segments in rows */
    const int whole[2] = {0, n};
    for (int i = 0; i < c->depth; i++)                                            /* §V.4-6 */
        vision_block(&r, v, i, &s, is_full_attention(c, i) ? whole : rows, is_full_attention(c, i) ? 1 : windows);
    merger(&r, v, &s, merged);                                                    /* §V.7 -> [units, out] */
    for (int k = 0; k < units; k++)                                               /* back to image order */
        memcpy(features + (size_t)index[k] * out, merged + (size_t)k * out, sizeof(float) * (size_t)out);
    tap(&r, "model.visual", features, units, out);

    kernels_free(kern);
    scratch_free(&s);
    free(merged), free(index), free(seg), free(rows), free(wrow);
    return 0;
}

/* Layer-local replay of the tower (replay.c): one block from a given input, as zaya_vision_encode runs it. */
int zaya_vision_replay_block(const ZayaVision *v, int threads, int block, const float *x, int image_order, int grid_h,
                             int grid_w, ZayaVisionTapFn tapfn, void *tap_ctx, char *err, size_t errlen) {
    const ZayaVisionConfig *c = &v->config;
    const int M = c->spatial_merge_size, U = M * M, D = c->hidden_size, I = c->intermediate_size;
    const int hd = D / c->num_heads;
    if (block < 0 || block >= c->depth || grid_h < M || grid_w < M || grid_h % M || grid_w % M || hd > 1024)
        return zaya_fail(err, errlen, "vision replay: block %d of %d on a %d x %d patch grid\n  expected: a block of "
                         "the tower and a grid of positive multiples of %d", block, c->depth, grid_h, grid_w, M);
    const int n = grid_h * grid_w, lh = grid_h / M, lw = grid_w / M, units = lh * lw;
    Scratch s;
    const int ok = scratch_new(&s, c, n);
    int *index = malloc(sizeof(int) * (size_t)units), *seg = malloc(sizeof(int) * ((size_t)units + 2));
    int *rows = malloc(sizeof(int) * ((size_t)units + 2));
    const int max_cols = D > I ? D : I;
    Kernels *kern = ok && index && seg && rows ? kernels_new(threads, max_cols, VISION_ROWS) : NULL;
    if (!kern) {
        scratch_free(&s);
        free(index), free(seg), free(rows);
        return zaya_fail(err, errlen, "out of memory for the vision replay on a %d x %d patch grid", grid_h, grid_w);
    }
    const Run r = {c, kern, tapfn, tap_ctx, n}, quiet = {c, kern, NULL, NULL, n};
    const int windows = window_index(c, lh, lw, index, seg);                      /* §V.2 */
    for (int k = 0; k < units; k++)   /* the block's input in window order (block 0: the patch embedding's) */
        memcpy(s.x + (size_t)k * U * D, x + (size_t)(image_order ? index[k] : k) * U * D,
               sizeof(float) * (size_t)U * D);
    rotary(&quiet, index, lh, lw, s.cos_t, s.sin_t);                              /* §V.3 */
    for (int j = 0; j <= windows; j++) rows[j] = seg[j] * U;
    const int whole[2] = {0, n};
    vision_block(&r, v, block, &s, is_full_attention(c, block) ? whole : rows,
                 is_full_attention(c, block) ? 1 : windows);                      /* §V.4-6 */
    kernels_free(kern);
    scratch_free(&s);
    free(index), free(seg), free(rows);
    return 0;
}
