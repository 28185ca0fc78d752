/* vision.h - the ZAYA1-VL vision tower (a Qwen2.5-VL vision transformer): pixels -> image features.
 *
 * Mirrors HF transformers' Zaya1VLVisionModel (models/zaya1_vl/modeling_zaya1_vl.py, pull request
 * #46011): patch embedding, the 2-D rotary embedding, window and full attention blocks with their window
 * index permutation, RMSNorm, the SwiGLU MLP, the patch merger. docs/architecture.md "Vision tower".
 * Weights are ZayaMatrix / float pointers into wherever they live (the blob, or a test's files).
 */
#ifndef ZAYA_VISION_H
#define ZAYA_VISION_H

#include "tensor.h"
#include <stddef.h>

#define ZAYA_MAX_VISION_DEPTH 64

/* HF Zaya1VLVisionConfig (the names of config.json's vision_config). */
typedef struct {
    int depth;                 /* blocks */
    int hidden_size;           /* D */
    int num_heads;             /* heads of D / num_heads */
    int intermediate_size;     /* the MLP's width */
    int in_channels;           /* 3 */
    int patch_size;            /* P = 14 */
    int temporal_patch_size;   /* T = 1 */
    int spatial_merge_size;    /* M = 2: the merger joins M x M patches */
    int window_size;           /* 112 pixels: window attention over (window / M / P)^2 merged patches */
    int out_hidden_size;       /* the merger's output = the decoder's hidden size */
    int n_fullatt;             /* blocks with full attention: fullatt_block_indexes */
    int fullatt[ZAYA_MAX_VISION_DEPTH];
} ZayaVisionConfig;

/* HF Zaya1VLVisionBlock: norm1, attn.qkv, attn.proj, norm2, mlp.{gate,up,down}_proj (all with biases). */
typedef struct {
    const float *norm1, *norm2;                        /* [D] */
    ZayaMatrix qkv, proj;                              /* [3D, D], [D, D] */
    const float *qkv_bias, *proj_bias;                 /* [3D], [D] */
    ZayaMatrix gate_proj, up_proj, down_proj;          /* [I, D], [I, D], [D, I] */
    const float *gate_proj_bias, *up_proj_bias, *down_proj_bias;
} ZayaVisionBlock;

typedef struct {
    ZayaVisionConfig config;
    ZayaMatrix patch_embed;            /* patch_embed.proj (Conv3d, no bias) as [D, C*T*P*P] */
    ZayaVisionBlock *blocks;           /* [depth] */
    const float *merger_ln_q;          /* merger.ln_q [D] */
    ZayaMatrix merger_fc1, merger_fc2; /* merger.mlp.0 [4D, 4D], merger.mlp.2 [out, 4D] (M = 2) */
    const float *merger_fc1_bias, *merger_fc2_bias;
} ZayaVision;

/* A vision tap: the output of the HF module `name` (full path, e.g. "model.visual.blocks.0.attn"),
 * rows x cols floats, row-major, in the row order HF holds it (window order inside the blocks). */
typedef void (*ZayaVisionTapFn)(void *ctx, const char *name, const float *x, int rows, int cols);

/* The number of image features (merged patches) of a grid_h x grid_w patch grid: grid_h*grid_w / M^2. */
int zaya_vision_tokens(const ZayaVisionConfig *c, int grid_h, int grid_w);

/* HF Zaya1VLVisionModel.forward(pixel_values, grid_thw = [[1, grid_h, grid_w]]).pooler_output for one
 * image: pixels [grid_h*grid_w, C*T*P*P] as the image processor lays them out (merge blocks of M x M
 * patches, channel-major patches) -> features [zaya_vision_tokens(), out_hidden_size] in image order.
 * threads: as zaya_state_init. tap may be NULL. Returns 0, or -1 + err when the grid is not a
 * multiple of M or out of memory. */
int zaya_vision_encode(const ZayaVision *v, int threads, const float *pixels, int grid_h, int grid_w, float *features,
                       ZayaVisionTapFn tap, void *tap_ctx, char *err, size_t errlen);

/* Layer-local replay (docs/compare.md §11): block `block` of the tower alone on the input x [grid_h*grid_w, D]
 * (a port's: the previous block's output in window order, or with image_order = 1 block 0's input as the patch
 * embedding gives it, in image order), reporting the block's taps (model.visual.blocks.N.*) to tap. Returns 0, or
 * -1 + err for a block or grid out of range or out of memory. */
int zaya_vision_replay_block(const ZayaVision *v, int threads, int block, const float *x, int image_order, int grid_h,
                             int grid_w, ZayaVisionTapFn tap, void *tap_ctx, char *err, size_t errlen);

#endif /* ZAYA_VISION_H */
