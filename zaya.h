/* zaya.h - public API of zaya.c, a readable C reference implementation of Zyphra's ZAYA1 models.
 *
 *   zaya_load() -> zaya_state_init() -> zaya_forward() on the prompt, then on each new token.
 * Activations are float32. bf16 weights are widened exactly; int8 weights (Q8 groups) meet the
 * activations quantized to int16 per group in exact integer dot products (kernels.c); FP8 / MXFP4
 * expert weights (blob format version 2) are dequantized at use to the official code's values.
 * The model is described in docs/architecture.md (cited below as "arch §n"); the upstream code
 * is Hugging Face transformers' src/transformers/models/zaya/modeling_zaya.py ("HF").
 *
 * Errors: functions that can fail return 0 on success and -1 on failure, with a message in the
 * caller's buffer `err` (what was wrong, where, expected vs found, a hint). Nothing here prints
 * or exits.
 */
#ifndef ZAYA_H
#define ZAYA_H

#include "tensor.h"
#include "vision.h"

/* the loader reads versions 1, 2 (adds the dtypes FP8 and MXFP4) and 3 (adds ZAYA1-VL: the vision tower
 * and the decoder's vision LoRA, docs/blob-format.md) */
#define ZAYA_FORMAT_VERSION 3
#define ZAYA_MAX_LAYERS 256
#define ZAYA_MAX_EOS 4

/* Layer types (config "layer_types"): full causal attention, or a sliding window of
 * `sliding_window` positions including the current one (arch §3.10). */
enum { ZAYA_HYBRID = 0, ZAYA_HYBRID_SLIDING = 1 };


/* Where forward() rounds (docs/bf16.md): float32 everywhere (the default, the official float32 run),
 * or where the official code loaded in bfloat16 holds a bf16 tensor (ZAYA_PRECISION_BF16: current
 * torch; ZAYA_PRECISION_BF16_TORCH113: torch 1.13, which made the fixtures: Python scalars rounded to
 * bf16 before they multiply a tensor, SiLU rounded at each of its steps, qk-norm's norm summed in bf16). */
enum { ZAYA_PRECISION_FP32 = 0, ZAYA_PRECISION_BF16 = 1, ZAYA_PRECISION_BF16_TORCH113 = 2 };

/* Placements (ZayaState.placement, a sum of flags; bf16 precisions only): other legitimate bf16 engines
 * compute some steps of the official bf16 run in float32 (docs/bf16.md, "Other placements"). Each flag
 * moves these rounding points, and only these, to float32:
 *   FP32_RESIDUAL  the input scaling and both residual scalings: the branch's bias add and scale are not
 *                  rounded (vLLM's and SGLang's ZayaResidualScaling: `hidden_states.float() + bias`);
 *   FP32_NORM      the RMSNorms of the residual stream (input, post-attention, final): the float32
 *                  residual is not rounded before them, x / rms is not rounded before the weight, the
 *                  output is rounded once (vLLM's RMSNorm.forward_native on the float32 residual);
 *   FP32_LOGITS    the LM head's output is not rounded (vLLM's zaya_high_prec: out_dtype float32).
 * vLLM = bf16 + FP32_RESIDUAL + FP32_NORM (+ FP32_LOGITS with zaya_high_prec). */
enum { ZAYA_BF16_FP32_RESIDUAL = 1, ZAYA_BF16_FP32_NORM = 2, ZAYA_BF16_FP32_LOGITS = 4 };
/* ggml's CPU arithmetic (fp32 only; "fp32+ggml", ggml_round.h): before each product with a matrix exported
 * from a GGUF (ZayaMatrix.ggml_type), the input rounded as ggml's CPU backend quantizes it for that weight
 * type (its vec_dot_type: Q8_K, Q8_0, Q8_1, F16, BF16), as llama.cpp computes a quantized GGUF.
 * ZAYA_GGML: x86's Q8_0 quantizer (AVX/AVX2 builds); ZAYA_GGML_REF ("fp32+ggml-ref"): ggml's reference one. */
enum { ZAYA_GGML = 8, ZAYA_GGML_REF = 16 };
/* ZAYA_GGML_CONV ("+ggml-conv", fp32 only, alone or with +ggml): the grouped CCA convolution as llama.cpp's
 * ZAYA port computes it: its kernel cast to F16 (zaya.cpp) and ggml_conv_1d's im2col in F16, i.e. kernel and
 * depthwise output rounded to F16, products summed in float32. Apart from +ggml: the port's choice, not
 * ggml's arithmetic of a quantized weight (tools/bisect_llama.sh names it as the port's difference). */
enum { ZAYA_GGML_CONV = 32 };
/* ZAYA_GGML_GELU ("+ggml-gelu"): the router's GELU as the port calls it, ggml_gelu (the tanh approximation
 * read from an F16 table, ggml_round.h) where the official code has the exact (erf) GELU: the port's choice. */
enum { ZAYA_GGML_GELU = 64 };
/* ZAYA_GGML_KV ("+ggml-kv-f16"): llama.cpp's F16 KV cache without flash attention (--kv f16 / -ctk f16 -ctv
 * f16): keys, values, the query and the attention probabilities in F16 in the two products. */
enum { ZAYA_GGML_KV = 128 };
/* ZAYA_GGML_FA ("+ggml-fa"): attention as ggml-cpu's flash attention (FLASH_ATTN_EXT, its one-chunk path: a
 * batch of fewer than 64 positions; llama.cpp's default -fa auto turns it on for the CPU): per query head the
 * keys and values in F16 (llama.cpp casts an F32 cache to F16 for it), the query converted to F16, online softmax
 * in float32 (expf), the values accumulated in F16 (each step rounded), divided by the sum at the end. */
enum { ZAYA_GGML_FA = 256 };

/* "fp32", "bf16", "bf16-torch1.13", each bf16 one optionally followed by placements:
 * "bf16+fp32-residual+fp32-norm+fp32-logits"; "fp32+ggml" or "fp32+ggml-ref". Returns 0, or -1 with a
 * message in err. */
int zaya_parse_precision(const char *text, int *precision, int *placement, char *err, size_t errlen);
/* The same text for a precision and placement, in buf. */
const char *zaya_precision_name(int precision, int placement, char *buf, size_t len);

/* Skip expert (router class num_experts): upstream transformers/vLLM give it a zero output;
 * Zyphra's original fork passes the MoE input through, times its probability (arch §6a). */
enum { ZAYA_SKIP_ZERO = 0, ZAYA_SKIP_PASSTHROUGH = 1 };

/* The model hyper-parameters, as stored in the blob header (native names of config.json). */
typedef struct {
    int vocab_size;        /* embedding / LM-head rows (262272); the tokenizer has fewer ids */
    int hidden_size;       /* H */
    int num_layers;        /* native layers (attention + MoE each) */
    int num_heads;         /* nq: query heads after CCA */
    int num_kv_heads;      /* nkv: key/value heads; a query head n uses KV head n / (nq/nkv) */
    int head_dim;          /* d */
    int num_experts;       /* E; the router has E+1 classes, class E = skip expert */
    int experts_per_tok;   /* always 1 */
    int moe_intermediate;  /* I: expert width (gate_up has 2I rows) */
    int router_hidden;     /* R */
    int cca_time0;         /* depthwise conv kernel */
    int cca_time1;         /* grouped conv kernel */
    int sliding_window;    /* window of hybrid_sliding layers (0 if none) */
    int max_position;      /* max_position_embeddings */
    int bos_id, pad_id;
    int n_eos, eos_ids[ZAYA_MAX_EOS];
    int rope_dim[2];       /* rotated dims per layer type = int(head_dim * partial_rotary_factor) */
    float rms_norm_eps;
    float router_norm_eps;   /* router_mlp.norm's epsilon: rms_norm_eps except for the ZAYA1-base schema */
    int attention_bias;      /* q/k/v_proj_current/v_proj_delayed/o_proj have biases (HF attention_bias) */
    int lm_head_bias;        /* the LM head has a bias (HF lm_head_bias) */
    float rope_theta[2];   /* per layer type: [hybrid, hybrid_sliding] */
    float partial_rotary_factor[2];
    unsigned char layer_types[ZAYA_MAX_LAYERS];
} ZayaConfig;


/* (x + bias) * scale on the branch plus (r + bias) * scale on the residual (HF ZayaResidualScaling). */
typedef struct {
    const float *hidden_states_scale, *hidden_states_bias, *residual_scale, *residual_bias;
} ZayaResidualScale;

typedef struct {
    const float *input_layernorm;                          /* [H] */
    ZayaMatrix q_proj, k_proj;                             /* [nq*d, H], [nkv*d, H] */
    ZayaMatrix v_proj_current, v_proj_delayed;             /* [nkv*d/2, H] each */
    const float *q_proj_bias, *k_proj_bias;                /* [nq*d], [nkv*d]; NULL without attention_bias */
    const float *v_proj_current_bias, *v_proj_delayed_bias;   /* [nkv*d/2] each; NULL without attention_bias */
    const float *o_proj_bias;                              /* [H]; NULL without attention_bias */
    const float *conv_qk_depthwise_weight, *conv_qk_depthwise_bias;   /* [C, 1, t0], [C] */
    const float *conv_qk_grouped_weight, *conv_qk_grouped_bias;       /* [C, d, t1], [C] */
    const float *qk_norm_temp;                             /* [nkv] */
    ZayaMatrix o_proj;                                     /* [H, nq*d] */
    ZayaResidualScale post_attention_residual_scale;
    const float *post_attention_layernorm;                 /* [H] */
    ZayaMatrix router_down_proj;                           /* mlp.gate.down_proj [R, H] */
    const float *router_down_proj_bias;                    /* [R] */
    const float *router_states_scale;                      /* [R]; NULL at layer 0 (no EDA there) */
    const float *router_norm;                              /* router_mlp.norm [R] */
    ZayaMatrix router_fc1, router_fc2;                     /* [R, R] */
    const float *router_fc1_bias, *router_fc2_bias;        /* [R] */
    ZayaMatrix router_out_proj;                            /* [E+1, R] */
    const float *balancing_biases;                         /* [E+1] */
    ZayaMatrix experts_gate_up;                            /* [E*2I, H]: expert e = rows e*2I.. */
    ZayaMatrix experts_down;                               /* [E*H, I]:  expert e = rows e*H.. */
    ZayaResidualScale post_mlp_residual_scale;
    /* ZAYA1-VL only (HF Zaya1VL*: vision LoRA pairs, A [r, in] then B [out, r], added at image positions) */
    ZayaMatrix q_lora_a, q_lora_b, k_lora_a, k_lora_b;                     /* self_attn.qkv_proj.*, rank_attn */
    ZayaMatrix v_current_lora_a, v_current_lora_b, v_delayed_lora_a, v_delayed_lora_b;
    ZayaMatrix o_lora_a, o_lora_b;                                         /* self_attn.o_lora_* */
    ZayaMatrix experts_lora_gate_up_a, experts_lora_gate_up_b;             /* [E*r, H], [E*2I, r] (rank_mlp) */
    ZayaMatrix experts_lora_down_a, experts_lora_down_b;                   /* [E*r, I], [E*H, r] */
} ZayaLayer;

typedef struct ZayaTokenizer ZayaTokenizer;

typedef struct {
    ZayaConfig config;
    int weight_format;           /* dtype of the big matrices as exported */
    int group_size;              /* Q8 group size (0 if none) */
    int source_layout;           /* 0 native, 1 legacy checkpoint */
    char provenance[512];        /* exporter's JSON note */
    ZayaMatrix embed_tokens;     /* [V, H]; also the tied LM head */
    const float *input_hidden_states_scale, *input_hidden_states_bias, *norm;   /* [H] */
    const float *lm_head_bias;   /* [V]; NULL unless config.lm_head_bias */
    ZayaLayer *layers;           /* [L] */
    ZayaTokenizer *tokenizer;    /* NULL if the blob has none */
    int vl;                      /* 1: a ZAYA1-VL blob (format version 3): vision, the ids and ranks below */
    int image_token_id, vision_start_id, vision_end_id;   /* HF Zaya1VLConfig: 262147, 255999, 256000 */
    int lora_rank_attn, lora_rank_mlp;                    /* vision_lora_rank_attn / _mlp */
    ZayaVision vision;           /* the vision tower (model.visual.*) */
    void *map;                   /* the read-only mmap of the whole file */
    size_t map_size;
} ZayaModel;

/* Maps and validates a blob written by export_weights.py: header, config ranges, every tensor's
 * name, dtype, shape, offset and size against the file size (no tensor data is read before the header
 * is checked), then the tokenizer section. flags: ZAYA_LOAD_VERIFY also checks every tensor's CRC-32
 * (reads the whole file); ZAYA_LOAD_HUGEPAGES copies the file into transparent-huge-page memory instead
 * of using the mmap in place (a copy at load, seconds for GBs) and, with the AVX-512 VNNI kernels, interleaves the
 * int8 matrices' rows there (ZayaMatrix.interleaved_rows; same results). Without it, a blob that fits
 * in RAM is read in at load, in 2 MB pages where the kernel can (blob.c); ZAYA_LOAD_MMAP leaves the
 * pages to be read as they are first used. Returns 0, or -1 with a message in err. */
enum { ZAYA_LOAD_VERIFY = 1, ZAYA_LOAD_HUGEPAGES = 2, ZAYA_LOAD_MMAP = 4 };
int zaya_load(ZayaModel *m, const char *path, int flags, char *err, size_t errlen);
void zaya_free(ZayaModel *m);

/* Intermediate tensors ("taps"), named by HF module path (docs/compare.md): one call per tensor per
 * position with the row for this position. Within a prefill batch the calls come layer by layer.
 * One tap is ragged (its width changes with the position): "self_attn:attn_weights" [nq, n_keys], the
 * attention probabilities over the keys first..pos (first = pos-sliding_window+1 on sliding layers,
 * else 0); --trace prints it, --dump leaves ragged taps out (they are not [T, ...] arrays). */
typedef struct {
    const char *name;      /* e.g. "self_attn.o_proj" (layer prefix "model.layers.{i}." not included) */
    int layer;             /* -1 for model-level tensors */
    int pos;               /* position of the token (-1 for the state after the last position) */
    int is_int;            /* data is int32 instead of float */
    int ndim;              /* of one row: 0 (scalar), 1 or 2 */
    int shape[2];
    const void *data;
    int ragged;            /* 1: shape[1] depends on the position */
} ZayaTap;
typedef void (*ZayaTapFn)(void *ctx, const ZayaTap *tap);

/* Decoding state of one layer (arch §4). */
typedef struct {
    float *key_cache, *value_cache;   /* [nkv, cache_len, d]: keys after qk-norm and RoPE, values */
    int cache_len;                    /* ctx, or sliding_window on hybrid_sliding layers (ring) */
    float *conv_state;                /* [K, C], K = (t0-1)+(t1-1): raw u_{t-K} .. u_{t-1}, oldest first */
    float *delayed_value;             /* [nkv*d/2]: v_proj_delayed of the previous token */
} ZayaLayerState;

/* forward() takes at most ZAYA_BATCH tokens at once: each weight matrix is read once per batch
 * instead of once per token. Results are identical to running the tokens one by one. */
#define ZAYA_BATCH 256
/* ZAYA1-VL: the bidirectional image mask needs all of a prompt's image tokens in one batch, so a VL blob's
 * state holds batches of up to this many tokens (bounded by its context): one image of the processor's
 * largest size (1280 tokens) and its text. */
#define ZAYA_VL_BATCH 2048

struct Kernels;   /* the fast kernels' threads and scratch (kernels.h) */

struct ZayaActivations;   /* a batch's intermediate tensors (zaya.c) */

/* Everything that changes while running: per-layer state, the position, options, scratch. */
typedef struct {
    ZayaLayerState *layers;   /* [num_layers] */
    int num_layers;
    int ctx;                  /* maximum number of positions */
    int pos;                  /* next position to run (= tokens seen so far) */
    int batch;                /* tokens per forward() batch, 1..ZAYA_BATCH (default ZAYA_BATCH) */
    int capacity;             /* the most tokens one batch can hold: ZAYA_BATCH, or for a ZAYA1-VL blob
                               * min(ctx, ZAYA_VL_BATCH) (a prompt with images runs in batches of this) */
    int skip_expert;          /* ZAYA_SKIP_ZERO (default) or ZAYA_SKIP_PASSTHROUGH */
    int precision;            /* ZAYA_PRECISION_FP32 (default), _BF16 or _BF16_TORCH113 */
    int placement;            /* ZAYA_BF16_* flags (0: the official bf16 placement; bf16 precisions only) */
    ZayaTapFn tap;            /* optional: called with every intermediate tensor */
    void *tap_ctx;
    float *logits;            /* [V]: logits of the last token run (room for a few rows: a tap's batches) */
    const float *image_features;   /* ZAYA1-VL (zaya_set_images): [n_image_features, H], or NULL */
    int n_image_features, image_next;   /* rows given; the row the next image placeholder takes */
    int image_both_ways;      /* 1: the images came with a prompt at position 0 (bidirectional image mask) */
    const unsigned char *image_mask;   /* ZAYA1-VL replay (zaya_replay_layer): [ctx] 1 at the image positions of the
                                        * replayed prompt, or NULL (kept by zaya_state_reset) */
    struct ZayaActivations *act;   /* the intermediate tensors of a batch of up to ZAYA_BATCH tokens */
    struct Kernels *kernels;
} ZayaState;

/* Allocates the state for up to ctx positions (1 <= ctx <= max_position) and zeroes it: an empty HF
 * cache (DynamicCache with conv/recurrent slots). threads: how many threads the kernels use (0 = the
 * cores this process may run on); results are identical for any count. Returns 0 or -1 + err. */
int zaya_state_init(ZayaState *s, const ZayaModel *m, int ctx, int threads, char *err, size_t errlen);
/* The number of threads the state's kernels run. */
int zaya_state_threads(const ZayaState *s);
/* Back to position 0 with empty caches (keeps the allocation and the options). */
void zaya_state_reset(ZayaState *s, const ZayaModel *m);
void zaya_state_free(ZayaState *s);

/* Runs tokens[0..n) at positions s->pos .. s->pos+n-1 through the model (HF ZayaForCausalLM.forward
 * with a cache) and advances s->pos by n: a prompt (n > 1) or one generated token (n = 1) alike. The
 * next token's logits are in s->logits [vocab_size]; with a tap set, every position's logits are
 * computed and reported. Returns 0, or -1 + err when an id is not in 0..vocab_size-1, the context
 * would overflow, or a bf16 precision meets a legacy blob or the passthrough skip expert (Zyphra's
 * fork rounds differently in bf16, docs/bf16.md; not emulated); nothing is run then. */
int zaya_forward(const ZayaModel *m, ZayaState *s, const int *tokens, int n, char *err, size_t errlen);

/* Layer-local replay (docs/compare.md): runs positions s->pos .. s->pos+n-1 through layer `layer`
 * alone, from a given residual stream r [n, H] (a port's input to that layer: the output of layer
 * layer-1), and advances s->pos. rho [n, R]: the router's EDA state of layer layer-1 (read; ignored
 * at layer 0), replaced by this layer's. layer = num_layers runs the final norm and the LM head on r
 * (rho unused). Taps, caches and precision as zaya_forward (the layer's caches continue from
 * s->pos: zaya_state_reset() first to replay from position 0). Returns 0, or -1 + err when the
 * layer is out of range, the context would overflow, or the precision is refused as by zaya_forward.
 * ZAYA1-VL: with s->image_mask set, the positions it marks are image positions (the vision LoRA, and the
 * bidirectional image mask among them: they must all fall in one batch of s->capacity positions). */
int zaya_replay_layer(const ZayaModel *m, ZayaState *s, int layer, const float *r, float *rho, int n, char *err,
                      size_t errlen);

/* The input of layer 0 for n token ids: the embedding and the input scaling (arch §3.1, HF
 * ZayaModel before the layers) into r [n, H], with their taps; s->pos and the caches are left as they
 * are. ZAYA1-VL: image placeholders take the rows of zaya_set_images' features, as in zaya_forward. Returns 0,
 * or -1 + err for an id outside the vocabulary or a refused precision. */
int zaya_embed(const ZayaModel *m, ZayaState *s, const int *tokens, int n, float *r, char *err, size_t errlen);

/* ZAYA1-VL (HF Zaya1VLModel.forward): the next image placeholder tokens (m->image_token_id) that
 * zaya_forward runs take the rows of features [n, hidden_size] (zaya_vision_encode's output, images in
 * prompt order) instead of their embeddings, in order, and run the decoder's vision LoRA; given at
 * position 0 (a prompt, HF's call without a cache), the image positions also attend to each other in
 * both directions, and then all of them must come in one zaya_forward call and one batch of s->capacity
 * tokens (zaya_forward refuses them otherwise).
 * features must stay valid until they are used; zaya_state_reset() drops them. Returns 0, or -1 + err
 * when the blob is not a ZAYA1-VL blob. */
int zaya_set_images(const ZayaModel *m, ZayaState *s, const float *features, int n, char *err, size_t errlen);

/* Calls fn with the decoding state after the last position: conv state, delayed value and the
 * KV cache of every layer (names in docs/compare.md), row-major with full shapes in tap->shape. */
void zaya_state_taps(const ZayaModel *m, const ZayaState *s, ZayaTapFn fn, void *ctx);


#endif /* ZAYA_H */
