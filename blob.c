/* blob.c - zaya_load(): maps a blob written by export_weights.py and validates all of it before
 * the model reads a byte of its data (docs/blob-format.md is this file's specification).
 *
 * The loader is a file of its own so that zaya.c is the model alone, read top to bottom beside
 * docs/architecture.md: a porter never needs this file, a fuzzer (test/fuzz/fuzz_blob.c) needs
 * little else. In reading order: the header and config, the tensor directory, binding each
 * tensor of the model to its entry (name, dtype, shape, offset, size), then zaya_load itself.
 */
#define _POSIX_C_SOURCE 200809L
#define _DARWIN_C_SOURCE   /* macOS: sysconf(_SC_PHYS_PAGES) beside POSIX (no effect elsewhere) */
#include "zaya.h"
#include "kernels.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_SIZE 1024
#define DIR_ENTRY_SIZE 192
#define NAME_SIZE 128
#define GGML_TYPE_AT 124   /* a GGUF's blob: u32 1 + the tensor's ggml type in the name field's tail */
#define HINT_REEXPORT "hint: re-export the checkpoint with export_weights.py"

static uint32_t rd_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t rd_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static float rd_f32(const unsigned char *p) { float v; memcpy(&v, p, 4); return v; }

typedef struct {
    char name[NAME_SIZE];
    uint32_t dtype, ndim;
    uint64_t shape[4], offset, nbytes;
    uint32_t crc, group;      /* field 188: int8 group size; FP8: the scale dtype; MXFP4: 32; else 0 */
    uint32_t ggml_type;       /* name field bytes 124..127 (names of at most 123 bytes): 1 + ggml type; else 0 */
    int used;
} DirEntry;

/* Bytes a tensor of `numel` values in rows of `cols` takes in the blob (docs/blob-format.md). */
static uint64_t tensor_bytes(int dtype, uint64_t numel, uint64_t cols, int group) {
    if (dtype == ZAYA_F32) return numel * 4;
    if (dtype == ZAYA_BF16) return numel * 2;
    if (dtype == ZAYA_FP8) return (numel + 63) / 64 * 64 + 4 * (numel / cols);    /* values, one scale per row */
    if (dtype == ZAYA_MXFP4) return (numel / 2 + 63) / 64 * 64 + numel / 32;      /* nibbles, one E8M0 per 32 */
    return (numel + 63) / 64 * 64 + 4 * (numel / (uint64_t)group);
}

typedef struct {
    const char *path;
    const unsigned char *base;
    DirEntry *dir;
    int n;
    char *err;
    size_t errlen;
    uint32_t version;         /* the blob's format version: 1 has no FP8 / MXFP4 tensors */
} Loader;

/* Finds tensor `name` with the expected shape (up to 3 dims; 0 = unused); `matrix` = may be any
 * dtype, otherwise must be float32. Returns the entry or NULL with a message. */
static const DirEntry *find_tensor(Loader *ld, const char *name, int matrix, uint64_t d0, uint64_t d1, uint64_t d2) {
    uint64_t want[3] = {d0, d1, d2};
    int ndim = d2 ? 3 : d1 ? 2 : 1;
    for (int i = 0; i < ld->n; i++) {
        DirEntry *e = &ld->dir[i];
        if (strcmp(e->name, name) != 0) continue;
        if (e->used) { zaya_fail(ld->err, ld->errlen, "%s: tensor %s appears twice in the directory\n  %s", ld->path, name, HINT_REEXPORT); return NULL; }
        e->used = 1;
        int shape_ok = (int)e->ndim == ndim;
        for (int k = 0; k < ndim && shape_ok; k++) shape_ok = e->shape[k] == want[k];
        if (!shape_ok) {
            zaya_fail(ld->err, ld->errlen, "%s: tensor %s has the wrong shape\n  expected: [%llu, %llu, %llu] (%d dims)\n  found:    [%llu, %llu, %llu] (%u dims)\n  %s",
                 ld->path, name, (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)d2, ndim,
                 (unsigned long long)e->shape[0], (unsigned long long)e->shape[1], (unsigned long long)e->shape[2], e->ndim, HINT_REEXPORT);
            return NULL;
        }
        if (!matrix && e->dtype != ZAYA_F32) {
            zaya_fail(ld->err, ld->errlen, "%s: tensor %s has dtype %u\n  expected: 0 (float32; only the big matrices are bf16/int8)\n  %s", ld->path, name, e->dtype, HINT_REEXPORT);
            return NULL;
        }
        return e;
    }
    zaya_fail(ld->err, ld->errlen, "%s: tensor %s is missing from the blob\n  expected: a tensor [%llu, %llu, %llu] of that name (the header's config asks for it)\n  found:    none in the %d directory entries\n  %s",
         ld->path, name, (unsigned long long)d0, (unsigned long long)d1, (unsigned long long)d2, ld->n, HINT_REEXPORT);
    return NULL;
}

static int load_vector(Loader *ld, const float **out, const char *name, uint64_t d0, uint64_t d1, uint64_t d2) {
    const DirEntry *e = find_tensor(ld, name, 0, d0, d1, d2);
    if (!e) return -1;
    *out = (const float *)(ld->base + e->offset);
    return 0;
}

/* A 2-D matrix [rows, cols], or a 3-D stack [n, rows, cols] seen as [n*rows, cols]. */
static int load_matrix(Loader *ld, ZayaMatrix *m, const char *name, uint64_t n, uint64_t rows, uint64_t cols) {
    const DirEntry *e = n ? find_tensor(ld, name, 1, n, rows, cols) : find_tensor(ld, name, 1, rows, cols, 0);
    if (!e) return -1;
    uint64_t total_rows = n ? n * rows : rows;
    if (total_rows > INT32_MAX || cols > INT32_MAX)   /* the kernels index rows and columns with int */
        return zaya_fail(ld->err, ld->errlen, "%s: tensor %s is too large for this zaya.c\n  expected: at most 2^31-1 rows and columns\n  found:    %llu rows, %llu columns\n  %s",
                    ld->path, name, (unsigned long long)total_rows, (unsigned long long)cols, HINT_REEXPORT);
    if (e->dtype == ZAYA_Q8 && cols % e->group != 0)
        return zaya_fail(ld->err, ld->errlen, "%s: tensor %s is int8 with %llu columns, not a multiple of its group size %u\n  %s",
                    ld->path, name, (unsigned long long)cols, e->group, HINT_REEXPORT);
    if ((e->dtype == ZAYA_FP8 || e->dtype == ZAYA_MXFP4) && n == 0)   /* the stacked experts are the n > 0 matrices */
        return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has dtype %u (%s)\n  expected: dtype 0..2 (FP8 and MXFP4 are only for mlp.experts.gate_up_proj / down_proj)\n  found:    dtype %u\n  %s",
                    ld->path, name, e->dtype, e->dtype == ZAYA_FP8 ? "FP8" : "MXFP4", e->dtype, HINT_REEXPORT);
    const unsigned char *after = ld->base + e->offset;   /* where the scales follow the padded values */
    after += e->dtype == ZAYA_MXFP4 ? (total_rows * cols / 2 + 63) / 64 * 64 : (total_rows * cols + 63) / 64 * 64;
    m->dtype = (int)e->dtype;
    m->rows = (int)total_rows;
    m->cols = (int)cols;
    m->group_size = e->dtype == ZAYA_FP8 ? 0 : (int)e->group;
    m->data = ld->base + e->offset;
    m->scales = e->dtype == ZAYA_Q8 || e->dtype == ZAYA_FP8 ? (const float *)after : NULL;
    m->exponents = e->dtype == ZAYA_MXFP4 ? after : NULL;
    m->scale_dtype = e->dtype == ZAYA_FP8 ? (int)e->group : 0;
    m->ggml_type = (int)e->ggml_type;
    return 0;
}

static int load_residual_scale(Loader *ld, ZayaResidualScale *p, const char *prefix, int H) {
    char name[2 * NAME_SIZE];
    const char *parts[4] = {"hidden_states_scale", "hidden_states_bias", "residual_scale", "residual_bias"};
    const float **dst[4] = {&p->hidden_states_scale, &p->hidden_states_bias, &p->residual_scale, &p->residual_bias};
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "%s.%s", prefix, parts[k]);
        if (load_vector(ld, dst[k], name, (uint64_t)H, 0, 0)) return -1;
    }
    return 0;
}

/* Reads and range-checks the config block (offset 128 of the header). */
static int read_config(ZayaConfig *c, const unsigned char *h, const char *path, char *err, size_t errlen) {
    const unsigned char *p = h + 128;
    int *ints[] = {&c->vocab_size, &c->hidden_size, &c->num_layers, &c->num_heads, &c->num_kv_heads, &c->head_dim,
                   &c->num_experts, &c->experts_per_tok, &c->moe_intermediate, &c->router_hidden, &c->cca_time0,
                   &c->cca_time1, &c->sliding_window, &c->max_position};
    const char *names[] = {"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                           "num_experts", "experts_per_tok", "moe_intermediate", "router_hidden", "cca_time0",
                           "cca_time1", "sliding_window", "max_position"};
    const uint32_t lo[] = {1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 0, 1};
    const uint32_t hi[] = {1u << 24, 1u << 16, ZAYA_MAX_LAYERS, 1024, 1024, 4096, 4096, 1, 1u << 18, 1u << 14, 16, 16,
                           1u << 24, 1u << 30};
    for (int k = 0; k < 14; k++) {
        uint32_t v = rd_u32(p + 4 * k);
        if (v < lo[k] || v > hi[k])
            return zaya_fail(err, errlen, "%s: config value %s is out of range\n  expected: %u..%u\n  found:    %u\n  %s",
                        path, names[k], lo[k], hi[k], v, HINT_REEXPORT);
        *ints[k] = (int)v;
    }
    c->bos_id = (int32_t)rd_u32(p + 56);
    c->pad_id = (int32_t)rd_u32(p + 60);
    c->n_eos = (int)rd_u32(p + 64);
    if (c->n_eos < 0 || c->n_eos > ZAYA_MAX_EOS)
        return zaya_fail(err, errlen, "%s: config n_eos is out of range\n  expected: 0..%d\n  found:    %d\n  %s", path, ZAYA_MAX_EOS, c->n_eos, HINT_REEXPORT);
    for (int k = 0; k < ZAYA_MAX_EOS; k++) c->eos_ids[k] = (int32_t)rd_u32(p + 68 + 4 * k);
    c->rope_dim[0] = (int)rd_u32(p + 84);
    c->rope_dim[1] = (int)rd_u32(p + 88);
    c->rms_norm_eps = rd_f32(p + 92);
    const uint32_t flags = rd_u32(p + 116);   /* bit 0 attention_bias, bit 1 lm_head_bias */
    c->attention_bias = (int)(flags & 1);
    c->lm_head_bias = (int)(flags >> 1 & 1);
    c->router_norm_eps = rd_f32(p + 120);      /* 0: the same as rms_norm_eps */
    if (flags > 3)
        return zaya_fail(err, errlen, "%s: config flags are unknown\n  expected: bits 0 (attention_bias) and 1 (lm_head_bias) only\n  found:    0x%x\n  %s", path, flags, HINT_REEXPORT);
    if (c->router_norm_eps == 0.0f) c->router_norm_eps = rd_f32(p + 92);
    c->rope_theta[0] = rd_f32(p + 96);
    c->rope_theta[1] = rd_f32(p + 100);
    c->partial_rotary_factor[0] = rd_f32(p + 104);
    c->partial_rotary_factor[1] = rd_f32(p + 108);
    memcpy(c->layer_types, h + 256, ZAYA_MAX_LAYERS);

    if (c->num_heads % c->num_kv_heads != 0 || (c->num_kv_heads * c->head_dim) % 2 != 0)
        return zaya_fail(err, errlen, "%s: config has %d query heads and %d KV heads of %d\n  expected: KV heads that divide the query heads, KV heads x head_dim even (half current, half delayed value channels)\n  %s",
                    path, c->num_heads, c->num_kv_heads, c->head_dim, HINT_REEXPORT);
    for (int k = 0; k < 2; k++)
        if (c->rope_dim[k] < 2 || c->rope_dim[k] > c->head_dim || c->rope_dim[k] % 2 ||
            !(c->rope_theta[k] > 0.0f) || !isfinite(c->rope_theta[k]))
            return zaya_fail(err, errlen, "%s: config RoPE for layer type %d is out of range\n  expected: rotary dims even in 2..%d, theta > 0\n  found:    dims %d, theta %g\n  %s",
                        path, k, c->head_dim, c->rope_dim[k], (double)c->rope_theta[k], HINT_REEXPORT);
    for (int k = 0; k < 2; k++) {   /* rope_dim = int(head_dim * factor) is what is used; the factor must agree */
        double r = c->head_dim * (double)c->partial_rotary_factor[k];   /* (the factor is a float32 here) */
        if (!(c->partial_rotary_factor[k] > 0.0f && c->partial_rotary_factor[k] <= 1.0f) || !(r > c->rope_dim[k] - 0.01 && r < c->rope_dim[k] + 1.0))
            return zaya_fail(err, errlen, "%s: config partial_rotary_factor of layer type %d is out of range\n  expected: 0 < factor <= 1 with int(head_dim %d x factor) = rotary dims %d\n  found:    %g\n  %s",
                        path, k, c->head_dim, c->rope_dim[k], (double)c->partial_rotary_factor[k], HINT_REEXPORT);
    }
    if (rd_u32(p + 112) != 1)
        return zaya_fail(err, errlen, "%s: config tie_word_embeddings is not supported\n  expected: 1 (the LM head is the embedding)\n  found:    %u\n  %s", path, rd_u32(p + 112), HINT_REEXPORT);
    if (memchr(h + 512, 0, 512) == NULL)
        return zaya_fail(err, errlen, "%s: header provenance is not NUL-terminated\n  expected: a NUL within its 512 bytes\n  found:    none\n  %s", path, HINT_REEXPORT);
    if (!(c->rms_norm_eps > 0.0f) || !(c->rms_norm_eps < 1.0f) || !(c->router_norm_eps > 0.0f) || !(c->router_norm_eps < 1.0f))
        return zaya_fail(err, errlen, "%s: config rms_norm_eps or router_norm_eps is out of range\n  expected: 0 < eps < 1\n  found:    %g, %g\n  %s", path, (double)c->rms_norm_eps, (double)c->router_norm_eps, HINT_REEXPORT);
    int ids[2 + ZAYA_MAX_EOS] = {c->bos_id, c->pad_id};
    for (int k = 0; k < c->n_eos; k++) ids[2 + k] = c->eos_ids[k];
    for (int k = 0; k < 2 + c->n_eos; k++)
        if (ids[k] < 0 || ids[k] >= c->vocab_size)
            return zaya_fail(err, errlen, "%s: config special token id %d (%s) is outside the vocabulary\n  expected: 0..%d\n  found:    %d\n  %s",
                        path, ids[k], k == 0 ? "bos" : k == 1 ? "pad" : "eos", c->vocab_size - 1, ids[k], HINT_REEXPORT);
    for (int l = 0; l < ZAYA_MAX_LAYERS; l++) {
        int t = c->layer_types[l];
        if (l < c->num_layers && t != ZAYA_HYBRID && t != ZAYA_HYBRID_SLIDING)
            return zaya_fail(err, errlen, "%s: layer %d has an unknown type %d\n  expected: 0 (hybrid) or 1 (hybrid_sliding)\n  %s", path, l, t, HINT_REEXPORT);
        if (l < c->num_layers && t == ZAYA_HYBRID_SLIDING && c->sliding_window < 1)
            return zaya_fail(err, errlen, "%s: layer %d is hybrid_sliding but sliding_window is 0\n  %s", path, l, HINT_REEXPORT);
    }
    return 0;
}

/* Format version 3 (ZAYA1-VL): the block at offset 896 of the header (docs/blob-format.md), read and
 * range-checked; m->vl = 1. */
static int read_vl_config(ZayaModel *m, const unsigned char *h, const char *path, char *err, size_t errlen) {
    const unsigned char *p = h + 896;
    ZayaVisionConfig *v = &m->vision.config;
    int *ints[] = {&m->image_token_id, &m->vision_start_id, &m->vision_end_id, &m->lora_rank_attn, &m->lora_rank_mlp,
                   &v->depth, &v->hidden_size, &v->num_heads, &v->intermediate_size, &v->in_channels, &v->patch_size,
                   &v->temporal_patch_size, &v->spatial_merge_size, &v->window_size, &v->out_hidden_size,
                   &v->n_fullatt};
    const char *names[] = {"image_token_id", "vision_start_token_id", "vision_end_token_id", "vision_lora_rank_attn",
                           "vision_lora_rank_mlp", "vision depth", "vision hidden_size", "vision num_heads",
                           "vision intermediate_size", "vision in_channels", "vision patch_size",
                           "vision temporal_patch_size", "vision spatial_merge_size", "vision window_size",
                           "vision out_hidden_size", "vision fullatt_block_indexes count"};
    const uint32_t V = (uint32_t)m->config.vocab_size - 1;
    const uint32_t lo[] = {0, 0, 0, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    const uint32_t hi[] = {V, V, V, 4096, 4096, ZAYA_MAX_VISION_DEPTH, 1u << 16, 1024, 1u << 18, 16, 1024, 16, 16,
                           1u << 16, 1u << 16, 16};
    for (int k = 0; k < 16; k++) {
        const uint32_t x = rd_u32(p + 4 * k);
        if (x < lo[k] || x > hi[k])
            return zaya_fail(err, errlen, "%s: VL config value %s is out of range\n  expected: %u..%u\n  found:    %u\n  %s",
                             path, names[k], lo[k], hi[k], x, HINT_REEXPORT);
        *ints[k] = (int)x;
    }
    for (int k = 0; k < v->n_fullatt; k++) {
        v->fullatt[k] = (int)rd_u32(p + 64 + 4 * k);
        if (v->fullatt[k] < 0 || v->fullatt[k] >= v->depth)
            return zaya_fail(err, errlen, "%s: VL config fullatt_block_indexes[%d] = %d is not a block\n  expected: 0..%d\n  %s",
                             path, k, v->fullatt[k], v->depth - 1, HINT_REEXPORT);
    }
    const int hd = v->hidden_size / v->num_heads;
    if (v->hidden_size % v->num_heads || hd % 4 || hd > 1024 || v->out_hidden_size != m->config.hidden_size ||
        v->window_size / v->spatial_merge_size / v->patch_size < 1)
        return zaya_fail(err, errlen, "%s: VL vision config is inconsistent (hidden %d, heads %d, out %d, window %d, "
                         "merge %d, patch %d)\n  expected: heads dividing hidden with head_dim a multiple of 4 up to "
                         "1024, out_hidden_size = the decoder's hidden size %d, window >= merge x patch\n  %s",
                         path, v->hidden_size, v->num_heads, v->out_hidden_size, v->window_size, v->spatial_merge_size,
                         v->patch_size, m->config.hidden_size, HINT_REEXPORT);
    m->vl = 1;
    return 0;
}

/* ZAYA1-VL (format version 3): the decoder's vision LoRA pairs and the vision tower (arch §V). */
static int bind_vl_tensors(ZayaModel *m, Loader *ld) {
    const ZayaConfig *c = &m->config;
    ZayaVision *vis = &m->vision;
    const ZayaVisionConfig *v = &vis->config;
    const uint64_t H = (uint64_t)c->hidden_size, QD = (uint64_t)c->num_heads * c->head_dim,
                   KD = (uint64_t)c->num_kv_heads * c->head_dim, E = (uint64_t)c->num_experts,
                   I = (uint64_t)c->moe_intermediate, ra = (uint64_t)m->lora_rank_attn, rm = (uint64_t)m->lora_rank_mlp;
    const uint64_t D = (uint64_t)v->hidden_size, VI = (uint64_t)v->intermediate_size,
                   U = (uint64_t)v->spatial_merge_size * v->spatial_merge_size,
                   pin = (uint64_t)v->in_channels * v->temporal_patch_size * v->patch_size * v->patch_size;
    char n[NAME_SIZE], p[64];
#define NAME(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
    for (int i = 0; i < c->num_layers; i++) {
        ZayaLayer *L = &m->layers[i];
        snprintf(p, sizeof p, "model.layers.%d", i);
        if (load_matrix(ld, &L->q_lora_a, NAME("self_attn.qkv_proj.q_lora_a.weight"), 0, ra, H) ||
            load_matrix(ld, &L->q_lora_b, NAME("self_attn.qkv_proj.q_lora_b.weight"), 0, QD, ra) ||
            load_matrix(ld, &L->k_lora_a, NAME("self_attn.qkv_proj.k_lora_a.weight"), 0, ra, H) ||
            load_matrix(ld, &L->k_lora_b, NAME("self_attn.qkv_proj.k_lora_b.weight"), 0, KD, ra) ||
            load_matrix(ld, &L->v_current_lora_a, NAME("self_attn.qkv_proj.v_current_lora_a.weight"), 0, ra, H) ||
            load_matrix(ld, &L->v_current_lora_b, NAME("self_attn.qkv_proj.v_current_lora_b.weight"), 0, KD / 2, ra) ||
            load_matrix(ld, &L->v_delayed_lora_a, NAME("self_attn.qkv_proj.v_delayed_lora_a.weight"), 0, ra, H) ||
            load_matrix(ld, &L->v_delayed_lora_b, NAME("self_attn.qkv_proj.v_delayed_lora_b.weight"), 0, KD / 2, ra) ||
            load_matrix(ld, &L->o_lora_a, NAME("self_attn.o_lora_a.weight"), 0, ra, QD) ||
            load_matrix(ld, &L->o_lora_b, NAME("self_attn.o_lora_b.weight"), 0, H, ra) ||
            load_matrix(ld, &L->experts_lora_gate_up_a, NAME("mlp.experts.lora_gate_up_proj_a"), E, rm, H) ||
            load_matrix(ld, &L->experts_lora_gate_up_b, NAME("mlp.experts.lora_gate_up_proj_b"), E, 2 * I, rm) ||
            load_matrix(ld, &L->experts_lora_down_a, NAME("mlp.experts.lora_down_proj_a"), E, rm, I) ||
            load_matrix(ld, &L->experts_lora_down_b, NAME("mlp.experts.lora_down_proj_b"), E, H, rm))
            return -1;
    }
    vis->blocks = calloc((size_t)v->depth, sizeof(ZayaVisionBlock));
    if (!vis->blocks) return zaya_fail(ld->err, ld->errlen, "out of memory");
    if (load_matrix(ld, &vis->patch_embed, "model.visual.patch_embed.proj.weight", 0, D, pin)) return -1;
    for (int i = 0; i < v->depth; i++) {
        ZayaVisionBlock *B = &vis->blocks[i];
        snprintf(p, sizeof p, "model.visual.blocks.%d", i);
        if (load_vector(ld, &B->norm1, NAME("norm1.weight"), D, 0, 0) ||
            load_matrix(ld, &B->qkv, NAME("attn.qkv.weight"), 0, 3 * D, D) ||
            load_vector(ld, &B->qkv_bias, NAME("attn.qkv.bias"), 3 * D, 0, 0) ||
            load_matrix(ld, &B->proj, NAME("attn.proj.weight"), 0, D, D) ||
            load_vector(ld, &B->proj_bias, NAME("attn.proj.bias"), D, 0, 0) ||
            load_vector(ld, &B->norm2, NAME("norm2.weight"), D, 0, 0) ||
            load_matrix(ld, &B->gate_proj, NAME("mlp.gate_proj.weight"), 0, VI, D) ||
            load_vector(ld, &B->gate_proj_bias, NAME("mlp.gate_proj.bias"), VI, 0, 0) ||
            load_matrix(ld, &B->up_proj, NAME("mlp.up_proj.weight"), 0, VI, D) ||
            load_vector(ld, &B->up_proj_bias, NAME("mlp.up_proj.bias"), VI, 0, 0) ||
            load_matrix(ld, &B->down_proj, NAME("mlp.down_proj.weight"), 0, D, VI) ||
            load_vector(ld, &B->down_proj_bias, NAME("mlp.down_proj.bias"), D, 0, 0))
            return -1;
    }
#undef NAME
    return load_vector(ld, &vis->merger_ln_q, "model.visual.merger.ln_q.weight", D, 0, 0) ||
           load_matrix(ld, &vis->merger_fc1, "model.visual.merger.mlp.0.weight", 0, U * D, U * D) ||
           load_vector(ld, &vis->merger_fc1_bias, "model.visual.merger.mlp.0.bias", U * D, 0, 0) ||
           load_matrix(ld, &vis->merger_fc2, "model.visual.merger.mlp.2.weight", 0, (uint64_t)v->out_hidden_size, U * D) ||
           load_vector(ld, &vis->merger_fc2_bias, "model.visual.merger.mlp.2.bias", (uint64_t)v->out_hidden_size, 0, 0)
               ? -1 : 0;
}

/* The tensors of arch §2.2, bound to the model struct. */
static int bind_tensors(ZayaModel *m, Loader *ld) {
    const ZayaConfig *c = &m->config;
    const uint64_t H = (uint64_t)c->hidden_size, d = (uint64_t)c->head_dim, nq = (uint64_t)c->num_heads,
                   nkv = (uint64_t)c->num_kv_heads, E = (uint64_t)c->num_experts, I = (uint64_t)c->moe_intermediate,
                   R = (uint64_t)c->router_hidden, C = (nq + nkv) * d;
    if (load_matrix(ld, &m->embed_tokens, "model.embed_tokens.weight", 0, (uint64_t)c->vocab_size, H) ||
        load_vector(ld, &m->input_hidden_states_scale, "model.input_hidden_states_scale", H, 0, 0) ||
        load_vector(ld, &m->input_hidden_states_bias, "model.input_hidden_states_bias", H, 0, 0) ||
        load_vector(ld, &m->norm, "model.norm.weight", H, 0, 0) ||
        (c->lm_head_bias && load_vector(ld, &m->lm_head_bias, "lm_head.bias", (uint64_t)c->vocab_size, 0, 0)))
        return -1;
    m->layers = calloc((size_t)c->num_layers, sizeof(ZayaLayer));
    if (!m->layers) return zaya_fail(ld->err, ld->errlen, "out of memory");
    char n[NAME_SIZE], p[64];
#define NAME(fmt) (snprintf(n, sizeof n, "%s." fmt, p), n)
    for (int i = 0; i < c->num_layers; i++) {
        ZayaLayer *L = &m->layers[i];
        snprintf(p, sizeof p, "model.layers.%d", i);
        if (load_vector(ld, &L->input_layernorm, NAME("input_layernorm.weight"), H, 0, 0) ||
            load_matrix(ld, &L->q_proj, NAME("self_attn.qkv_proj.q_proj.weight"), 0, nq * d, H) ||
            load_matrix(ld, &L->k_proj, NAME("self_attn.qkv_proj.k_proj.weight"), 0, nkv * d, H) ||
            load_matrix(ld, &L->v_proj_current, NAME("self_attn.qkv_proj.v_proj_current.weight"), 0, nkv * d / 2, H) ||
            load_matrix(ld, &L->v_proj_delayed, NAME("self_attn.qkv_proj.v_proj_delayed.weight"), 0, nkv * d / 2, H) ||
            (c->attention_bias && (load_vector(ld, &L->q_proj_bias, NAME("self_attn.qkv_proj.q_proj.bias"), nq * d, 0, 0) ||
                                   load_vector(ld, &L->k_proj_bias, NAME("self_attn.qkv_proj.k_proj.bias"), nkv * d, 0, 0) ||
                                   load_vector(ld, &L->v_proj_current_bias, NAME("self_attn.qkv_proj.v_proj_current.bias"), nkv * d / 2, 0, 0) ||
                                   load_vector(ld, &L->v_proj_delayed_bias, NAME("self_attn.qkv_proj.v_proj_delayed.bias"), nkv * d / 2, 0, 0) ||
                                   load_vector(ld, &L->o_proj_bias, NAME("self_attn.o_proj.bias"), H, 0, 0))) ||
            load_vector(ld, &L->conv_qk_depthwise_weight, NAME("self_attn.qkv_proj.conv_qk_depthwise.weight"), C, 1, (uint64_t)c->cca_time0) ||
            load_vector(ld, &L->conv_qk_depthwise_bias, NAME("self_attn.qkv_proj.conv_qk_depthwise.bias"), C, 0, 0) ||
            load_vector(ld, &L->conv_qk_grouped_weight, NAME("self_attn.qkv_proj.conv_qk_grouped.weight"), C, d, (uint64_t)c->cca_time1) ||
            load_vector(ld, &L->conv_qk_grouped_bias, NAME("self_attn.qkv_proj.conv_qk_grouped.bias"), C, 0, 0) ||
            load_vector(ld, &L->qk_norm_temp, NAME("self_attn.qk_norm.temp"), nkv, 0, 0) ||
            load_matrix(ld, &L->o_proj, NAME("self_attn.o_proj.weight"), 0, H, nq * d) ||
            load_residual_scale(ld, &L->post_attention_residual_scale, NAME("post_attention_residual_scale"), (int)H) ||
            load_vector(ld, &L->post_attention_layernorm, NAME("post_attention_layernorm.weight"), H, 0, 0) ||
            load_matrix(ld, &L->router_down_proj, NAME("mlp.gate.down_proj.weight"), 0, R, H) ||
            load_vector(ld, &L->router_down_proj_bias, NAME("mlp.gate.down_proj.bias"), R, 0, 0) ||
            (i > 0 && load_vector(ld, &L->router_states_scale, NAME("mlp.gate.router_states_scale"), R, 0, 0)) ||
            load_vector(ld, &L->router_norm, NAME("mlp.gate.router_mlp.norm.weight"), R, 0, 0) ||
            load_matrix(ld, &L->router_fc1, NAME("mlp.gate.router_mlp.fc1.weight"), 0, R, R) ||
            load_vector(ld, &L->router_fc1_bias, NAME("mlp.gate.router_mlp.fc1.bias"), R, 0, 0) ||
            load_matrix(ld, &L->router_fc2, NAME("mlp.gate.router_mlp.fc2.weight"), 0, R, R) ||
            load_vector(ld, &L->router_fc2_bias, NAME("mlp.gate.router_mlp.fc2.bias"), R, 0, 0) ||
            load_matrix(ld, &L->router_out_proj, NAME("mlp.gate.router_mlp.out_proj.weight"), 0, E + 1, R) ||
            load_vector(ld, &L->balancing_biases, NAME("mlp.gate.balancing_biases"), E + 1, 0, 0) ||
            load_matrix(ld, &L->experts_gate_up, NAME("mlp.experts.gate_up_proj"), E, 2 * I, H) ||
            load_matrix(ld, &L->experts_down, NAME("mlp.experts.down_proj"), E, H, I) ||
            load_residual_scale(ld, &L->post_mlp_residual_scale, NAME("post_mlp_residual_scale"), (int)H))
            return -1;
    }
#undef NAME
    if (m->vl && bind_vl_tensors(m, ld) != 0) return -1;
    for (int i = 0; i < ld->n; i++) {
        if (ld->dir[i].used) continue;
        for (int j = 0; j < ld->n; j++)   /* an unused entry with the name of a used one is a duplicate */
            if (ld->dir[j].used && strcmp(ld->dir[j].name, ld->dir[i].name) == 0)
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s appears twice in the directory (entries %d and %d)\n  expected: every tensor once\n  %s",
                            ld->path, ld->dir[i].name, j, i, HINT_REEXPORT);
        return zaya_fail(ld->err, ld->errlen, "%s: unexpected tensor %s in the blob\n  expected: only the tensors of docs/architecture.md 2.2 for this config\n  %s",
                    ld->path, ld->dir[i].name, HINT_REEXPORT);
    }
    return 0;
}

/* Reads and checks the tensor directory: names, dtypes, sizes, offsets inside the data section,
 * alignment and no overlap. Touches no tensor data. */
static int read_directory(Loader *ld, const unsigned char *h, uint64_t data_off, uint64_t data_end) {
    for (int i = 0; i < ld->n; i++) {
        const unsigned char *p = h + HEADER_SIZE + (size_t)i * DIR_ENTRY_SIZE;
        DirEntry *e = &ld->dir[i];
        memcpy(e->name, p, NAME_SIZE);
        if (memchr(e->name, 0, NAME_SIZE) == NULL || e->name[0] == 0)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor directory entry %d has no valid name\n  %s", ld->path, i, HINT_REEXPORT);
        e->ggml_type = strlen(e->name) < GGML_TYPE_AT ? rd_u32(p + GGML_TYPE_AT) : 0;
        if (e->ggml_type > 64)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s records ggml type %u - 1 (name field bytes %d..%d)\n"
                             "  expected: 0 (not from a GGUF) or 1 + a ggml type id (0..63)\n  %s", ld->path, e->name,
                             e->ggml_type, GGML_TYPE_AT, NAME_SIZE - 1, HINT_REEXPORT);
        e->dtype = rd_u32(p + NAME_SIZE);
        e->ndim = rd_u32(p + NAME_SIZE + 4);
        uint64_t numel = 1;
        for (int k = 0; k < 4; k++) {
            e->shape[k] = rd_u64(p + NAME_SIZE + 8 + 8 * k);
            if (e->shape[k] == 0 || e->shape[k] > (1ull << 32))
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has dimension %d = %llu\n  expected: 1..2^32\n  %s", ld->path, e->name, k, (unsigned long long)e->shape[k], HINT_REEXPORT);
            if (numel > (1ull << 40) / e->shape[k])   /* checked before multiplying: no wrap-around */
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s is impossibly large\n  expected: at most 2^40 values\n  found:    shape [%llu, %llu, %llu, %llu]\n  %s",
                            ld->path, e->name, (unsigned long long)rd_u64(p + NAME_SIZE + 8), (unsigned long long)rd_u64(p + NAME_SIZE + 16),
                            (unsigned long long)rd_u64(p + NAME_SIZE + 24), (unsigned long long)rd_u64(p + NAME_SIZE + 32), HINT_REEXPORT);
            numel *= e->shape[k];
        }
        e->offset = rd_u64(p + NAME_SIZE + 40);
        e->nbytes = rd_u64(p + NAME_SIZE + 48);
        e->crc = rd_u32(p + NAME_SIZE + 56);
        e->group = rd_u32(p + NAME_SIZE + 60);
        e->used = 0;
        const uint32_t max_dtype = ld->version >= 2 ? ZAYA_MXFP4 : ZAYA_Q8;
        if (e->dtype > max_dtype || e->ndim < 1 || e->ndim > 4)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has dtype %u and %u dims\n  expected: dtype 0..%u (format version %u), 1..4 dims\n  %s",
                        ld->path, e->name, e->dtype, e->ndim, max_dtype, ld->version, HINT_REEXPORT);
        const uint64_t cols = e->shape[e->ndim - 1];
        if (e->dtype == ZAYA_FP8 && e->group != ZAYA_F32 && e->group != ZAYA_BF16 && e->group != ZAYA_F16)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s is FP8 with scale dtype %u (directory field 188)\n  expected: 0 (f32), 1 (bf16) or 5 (f16), the dtype each weight is rounded to\n  found:    %u\n  %s",
                        ld->path, e->name, e->group, e->group, HINT_REEXPORT);
        if (e->dtype == ZAYA_MXFP4 && (e->group != 32 || cols % 32))
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s is MXFP4 with group %u (directory field 188) and rows of %llu values\n  expected: group 32 and rows a multiple of 32 (one E8M0 scale per 32 values)\n  found:    group %u, rows of %llu\n  %s",
                        ld->path, e->name, e->group, (unsigned long long)cols, e->group, (unsigned long long)cols, HINT_REEXPORT);
        if (e->dtype == ZAYA_Q8 ? (e->group < 1 || e->group > 4096 || cols % e->group) : e->dtype <= ZAYA_BF16 && e->group != 0)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has group size %u\n  expected: for int8 a divisor (1..4096) of its row length %llu, otherwise 0\n  %s",
                        ld->path, e->name, e->group, (unsigned long long)cols, HINT_REEXPORT);
        uint64_t want = tensor_bytes((int)e->dtype, numel, cols, (int)e->group);
        if (e->nbytes != want)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has a byte size that does not match its shape\n  expected: %llu bytes\n  found:    %llu bytes\n  %s",
                        ld->path, e->name, (unsigned long long)want, (unsigned long long)e->nbytes, HINT_REEXPORT);
        if (e->offset % 64 || e->offset < data_off || e->offset > data_end || e->nbytes > data_end - e->offset)
            return zaya_fail(ld->err, ld->errlen, "%s: tensor %s lies outside the data section or is misaligned\n  expected: a 64-byte aligned range within [%llu, %llu)\n  found:    [%llu, %llu)\n  hint: the file is truncated or corrupt; re-export it with export_weights.py",
                        ld->path, e->name, (unsigned long long)data_off, (unsigned long long)data_end,
                        (unsigned long long)e->offset, (unsigned long long)(e->offset + e->nbytes));
    }
    /* no overlap: check every pair in offset order (insertion sort on an index; n is ~1300) */
    int *order = malloc(sizeof(int) * (size_t)ld->n);
    if (!order) return zaya_fail(ld->err, ld->errlen, "out of memory");
    for (int i = 0; i < ld->n; i++) {
        int j = i;
        while (j > 0 && ld->dir[order[j - 1]].offset > ld->dir[i].offset) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    for (int i = 1; i < ld->n; i++) {
        const DirEntry *a = &ld->dir[order[i - 1]], *b = &ld->dir[order[i]];
        if (a->offset + a->nbytes > b->offset) {
            free(order);
            return zaya_fail(ld->err, ld->errlen, "%s: tensors %s and %s overlap\n  %s", ld->path, a->name, b->name, HINT_REEXPORT);
        }
    }
    free(order);
    return 0;
}

/* The RAM a copy of the blob can get: MemAvailable of /proc/meminfo (free memory plus the page
 * cache that can be dropped), else all physical memory; 0 if neither is known. */
static uint64_t available_ram(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    if (kb) return (uint64_t)kb * 1024;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

/* --verify on an FP8 / MXFP4 tensor: values the exporter never writes (a NaN E4M3 byte 0x7f / 0xff, a
 * non-finite row scale, the E8M0 byte 255 = NaN) would turn whole rows into NaN. */
static int verify_quantized(Loader *ld, const DirEntry *e) {
    uint64_t numel = e->shape[0] * e->shape[1] * e->shape[2] * e->shape[3], cols = e->shape[e->ndim - 1];
    const uint64_t rows = e->ndim == 3 ? e->shape[1] : numel / cols;   /* rows of one expert [E, rows, cols] */
    const unsigned char *v = ld->base + e->offset;
    if (e->dtype == ZAYA_FP8) {
        for (uint64_t i = 0; i < numel; i++)
            if ((v[i] & 0x7f) == 0x7f)
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s holds the NaN FP8 E4M3 byte 0x%02x at expert %llu, row %llu, column %llu\n  expected: no NaN weight (bytes 0x7f and 0xff are NaN)\n  found:    0x%02x\n  hint: the file is corrupt; re-export it with export_weights.py",
                            ld->path, e->name, v[i], (unsigned long long)(i / cols / rows), (unsigned long long)(i / cols % rows),
                            (unsigned long long)(i % cols), v[i]);
        const unsigned char *s = v + (numel + 63) / 64 * 64;
        for (uint64_t r = 0; r < numel / cols; r++) {
            const float f = rd_f32(s + 4 * r);
            if (!isfinite(f))
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has FP8 row scale %g at expert %llu, row %llu\n  expected: a finite scale\n  found:    %g\n  hint: the file is corrupt; re-export it with export_weights.py",
                            ld->path, e->name, (double)f, (unsigned long long)(r / rows), (unsigned long long)(r % rows), (double)f);
        }
    } else if (e->dtype == ZAYA_MXFP4) {
        const unsigned char *s = v + (numel / 2 + 63) / 64 * 64;
        for (uint64_t g = 0; g < numel / 32; g++)
            if (s[g] == 255)
                return zaya_fail(ld->err, ld->errlen, "%s: tensor %s has the MXFP4 scale byte 255 (E8M0 NaN) at expert %llu, row %llu, columns %llu..%llu\n  expected: exponent bytes 0..254\n  found:    255\n  hint: the file is corrupt; re-export it with export_weights.py",
                            ld->path, e->name, (unsigned long long)(g * 32 / cols / rows), (unsigned long long)(g * 32 / cols % rows),
                            (unsigned long long)(g * 32 % cols), (unsigned long long)(g * 32 % cols + 31));
    }
    return 0;
}

/* Blobs from this size on are read in at load where they fit in RAM (below, the L2 TLB's few
 * thousand entries of 4 KB pages cover much of the blob). */
#define HUGE_MIN ((uint64_t)32 << 20)

/* The default for a blob that fits in RAM: its pages read in now through the 2 MB-aligned mapping, so
 * that decode streams them through 2 MB pages as fast as --hugepages' copy, without a copy and at no
 * start-up cost once the page cache holds the file in 2 MB pieces (docs/loading.md). A page cache that
 * holds more than a tenth of it in small pieces (the file read before by another program, or written)
 * is dropped and read again, in 2 MB pieces, once; where even then most of it stays in 4 KB pages (a
 * kernel or file system without large folios), *copy asks for --hugepages' copy. Returns the mapping (m->map), or
 * NULL (errno set) if the file cannot be mapped again. */
static void *read_in_huge_pages(ZayaModel *m, int fd, int *copy) {
    uint64_t resident, huge;
    int file;
    if (populate_mapping(m->map, m->map_size) != 0 || mapping_pages(m->map, &resident, &huge, &file) != 0) return m->map;
    if (huge >= m->map_size / 10 * 9) return m->map;
    munmap(m->map, m->map_size);
    m->map = NULL;
#ifdef POSIX_FADV_DONTNEED   /* (macOS has no posix_fadvise) */
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);   /* only pages no process maps: nobody loses a page */
#endif
    void *map = map_file_huge(fd, m->map_size);
    if (map == MAP_FAILED) { m->map_size = 0; return NULL; }
    m->map = map;
    if (populate_mapping(map, m->map_size) != 0 || mapping_pages(map, &resident, &huge, &file) != 0 || huge < m->map_size / 2)
        *copy = 1;
    return map;
}

/* --hugepages: the int8 matrices' rows in the layout the fast kernel reads fastest, in the private
 * copy (kernels_arrange_rows); stacked experts are arranged expert by expert. */
static int arrange_model_rows(ZayaModel *m) {
    const ZayaConfig *c = &m->config;
    int rc = kernels_arrange_rows(&m->embed_tokens, ZAYA_Q8_INTERLEAVE);
    for (int l = 0; l < c->num_layers && rc == 0; l++) {
        ZayaLayer *L = &m->layers[l];
        ZayaMatrix *plain[] = {&L->q_proj, &L->k_proj, &L->v_proj_current, &L->v_proj_delayed, &L->o_proj};
        for (int i = 0; i < 5 && rc == 0; i++) rc = kernels_arrange_rows(plain[i], ZAYA_Q8_INTERLEAVE);
        if (rc == 0) rc = kernels_arrange_rows(&L->experts_gate_up, 2 * c->moe_intermediate);
        if (rc == 0) rc = kernels_arrange_rows(&L->experts_down, c->hidden_size);
    }
    return rc;
}

int zaya_load(ZayaModel *m, const char *path, int flags, char *err, size_t errlen) {
    const int verify_crc = flags & ZAYA_LOAD_VERIFY;
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return zaya_fail(err, errlen, "cannot open model file %s: %s\n  hint: export one with: python3 export_weights.py CKPT_DIR %s", path, strerror(errno), path);
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zaya_fail(err, errlen, "%s is not a regular file\n  hint: give the .bin written by export_weights.py", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < HEADER_SIZE) {
        close(fd);
        return zaya_fail(err, errlen, "%s is too small to be a zaya.c model\n  expected: at least %d bytes\n  found:    %llu bytes\n  hint: the file is empty or truncated; re-export it with export_weights.py",
                    path, HEADER_SIZE, (unsigned long long)size);
    }
    const uint64_t avail = available_ram();
    if ((flags & ZAYA_LOAD_HUGEPAGES) && avail && size > avail) {
        close(fd);
        return zaya_fail(err, errlen, "%s is too big for --hugepages\n  expected: a blob that fits in the available RAM (%.2f GB, MemAvailable)\n  found:    %.2f GB\n  hint: run without --hugepages: the weights then stay memory-mapped and are read layer by layer",
                         path, avail / 1e9, size / 1e9);
    }
    void *map = map_file_huge(fd, (size_t)size);
    if (map == MAP_FAILED) { close(fd); return zaya_fail(err, errlen, "cannot mmap %s: %s", path, strerror(errno)); }
    m->map = map;
    m->map_size = (size_t)size;
    const unsigned char *h = map;   /* the header is checked before any tensor data is read */

    if (memcmp(h, "ZAYABLOB", 8) != 0) {
        char found[8 * 4 + 1], *q = found;   /* the first 8 bytes, non-printable ones as \xHH */
        for (int k = 0; k < 8; k++) q += sprintf(q, h[k] >= 0x20 && h[k] < 0x7f && h[k] != '"' && h[k] != '\\' ? "%c" : "\\x%02x", h[k]);
        zaya_fail(err, errlen, "%s is not a zaya.c model\n  expected: magic \"ZAYABLOB\"\n  found:    \"%s\"%s\n  hint: a Hugging Face checkpoint folder must first be exported: python3 export_weights.py CKPT_DIR OUT.bin",
             path, found, h[8] == '{' ? " (a safetensors file?)" : "");
        zaya_free(m);   /* after the message: h points into the mapping */
        close(fd);
        return -1;
    }
    uint32_t version = rd_u32(h + 8);
    if (version < 1 || version > ZAYA_FORMAT_VERSION) {   /* version 1 is version 2 without FP8 / MXFP4 tensors */
        zaya_free(m);
        close(fd);
        return zaya_fail(err, errlen, "%s has blob format version %u\n  expected: 1 to %d (this zaya.c)\n  found:    %u\n  %s", path, version, ZAYA_FORMAT_VERSION, version, HINT_REEXPORT);
    }
    uint64_t file_size = rd_u64(h + 16), dir_off = rd_u64(h + 24), data_off = rd_u64(h + 48),
             tok_off = rd_u64(h + 56), tok_size = rd_u64(h + 64);
    uint32_t n_tensors = rd_u32(h + 32), wformat = rd_u32(h + 36), group = rd_u32(h + 40), layout = rd_u32(h + 44);
    int rc = -1;
    if (file_size != size) {
        zaya_fail(err, errlen, "%s is %s\n  expected: %llu bytes (from its header)\n  found:    %llu bytes\n  hint: the file is truncated or was changed; re-export it with export_weights.py",
             path, size < file_size ? "truncated" : "longer than its header says", (unsigned long long)file_size, (unsigned long long)size);
    } else if (dir_off != HEADER_SIZE || n_tensors == 0 || n_tensors > 100000 ||
               data_off < HEADER_SIZE + (uint64_t)n_tensors * DIR_ENTRY_SIZE || data_off > size || data_off % 4096 ||
               tok_off < data_off || tok_off > size || tok_size > size - tok_off) {
        zaya_fail(err, errlen, "%s: header offsets are inconsistent (directory %llu, %u tensors, data %llu, tokenizer %llu+%llu, file %llu)\n  %s",
             path, (unsigned long long)dir_off, n_tensors, (unsigned long long)data_off, (unsigned long long)tok_off,
             (unsigned long long)tok_size, (unsigned long long)size, HINT_REEXPORT);
    } else if (wformat > ZAYA_Q8 || layout > 1 || (wformat == ZAYA_Q8 ? (group < 1 || group > 4096) : group != 0)) {
        zaya_fail(err, errlen, "%s: header weight format %u, group size %u, layout %u are out of range\n  expected: format 0..2, group size 1..4096 for int8 else 0, layout 0..1\n  %s",
             path, wformat, group, layout, HINT_REEXPORT);
    } else {
        /* header CRC covers the header (with its CRC field zeroed) and the directory */
        uint32_t want = rd_u32(h + 12), zero = 0;
        uint32_t crc = zaya_crc32(0, h, 12);
        crc = zaya_crc32(crc, (const unsigned char *)&zero, 4);
        crc = zaya_crc32(crc, h + 16, HEADER_SIZE - 16 + (size_t)n_tensors * DIR_ENTRY_SIZE);
        if (crc != want)
            zaya_fail(err, errlen, "%s: header checksum mismatch\n  expected: %08x\n  found:    %08x\n  hint: the file is corrupt; re-export it with export_weights.py", path, want, crc);
        else
            rc = read_config(&m->config, h, path, err, errlen);
        if (rc == 0 && version >= 3) rc = read_vl_config(m, h, path, err, errlen);
    }
    if (rc != 0) { zaya_free(m); close(fd); return -1; }

    /* where the weights will be read from (the tensor data is read from here on) */
    int copy = flags & ZAYA_LOAD_HUGEPAGES;
    if (!copy && !(flags & ZAYA_LOAD_MMAP) && size >= HUGE_MIN && (!avail || size <= avail)) map = read_in_huge_pages(m, fd, &copy);
    close(fd);
    if (!map) return zaya_fail(err, errlen, "cannot mmap %s again after dropping its small pages from the page cache: %s", path, strerror(errno));
    if (copy) {
        size_t alloc = 0;
        void *anon = copy_to_huge_pages(map, (size_t)size, &alloc);
        if (!anon && (flags & ZAYA_LOAD_HUGEPAGES)) { zaya_free(m); return zaya_fail(err, errlen, "cannot allocate %llu bytes for --hugepages\n  hint: run without --hugepages (the blob is then used in place)", (unsigned long long)size); }
        if (anon) {
            munmap(map, (size_t)size);
            m->map = map = anon;
            m->map_size = alloc;
        } else copy = 0;   /* the default's last resort failed: the mapping as it is */
    }
    h = map;
    m->weight_format = (int)wformat;
    m->group_size = (int)group;
    m->source_layout = (int)layout;
    memcpy(m->provenance, h + 512, sizeof m->provenance - 1);

    Loader ld = {path, h, calloc(n_tensors, sizeof(DirEntry)), (int)n_tensors, err, errlen, version};
    if (!ld.dir) { zaya_free(m); return zaya_fail(err, errlen, "out of memory"); }
    rc = read_directory(&ld, h, data_off, tok_off);
    if (rc == 0) rc = bind_tensors(m, &ld);   /* (with a VL blob, bind_vl_tensors first) */
    if (rc == 0 && verify_crc) {
        for (int i = 0; i < ld.n && rc == 0; i++)
            if (zaya_crc32(0, h + ld.dir[i].offset, ld.dir[i].nbytes) != ld.dir[i].crc)
                rc = zaya_fail(err, errlen, "%s: tensor %s fails its CRC-32 check\n  hint: the file is corrupt; re-export it with export_weights.py", path, ld.dir[i].name);
        for (int i = 0; i < ld.n && rc == 0; i++) rc = verify_quantized(&ld, &ld.dir[i]);
    }
    free(ld.dir);
    if (rc == 0 && tok_size > 0) {
        m->tokenizer = calloc(1, sizeof(ZayaTokenizer));
        char terr[512];
        if (!m->tokenizer) rc = zaya_fail(err, errlen, "out of memory");
        else if (zaya_tok_load(m->tokenizer, h + tok_off, (size_t)tok_size, terr, sizeof terr) != 0) {
            free(m->tokenizer);
            m->tokenizer = NULL;
            rc = zaya_fail(err, errlen, "%s: tokenizer section: %s", path, terr);
        }
    }
    if (rc == 0 && copy && arrange_model_rows(m) != 0)
        rc = zaya_fail(err, errlen, "out of memory while interleaving the int8 rows of the copy\n  hint: %s",
                       flags & ZAYA_LOAD_HUGEPAGES ? "run without --hugepages" : "run with --mmap (the blob used in place)");
    if (rc != 0) { zaya_free(m); return -1; }
    return 0;
}

void zaya_free(ZayaModel *m) {
    if (m->tokenizer) { zaya_tok_free(m->tokenizer); free(m->tokenizer); }
    free(m->layers);
    free(m->vision.blocks);
    if (m->map) munmap(m->map, m->map_size);
    memset(m, 0, sizeof *m);
}
