/* replay.h - --replay: a port's dump, each layer recomputed from the port's own input (replay.c). */
#ifndef ZAYA_REPLAY_H
#define ZAYA_REPLAY_H

#include "zaya.h"

#include <stdio.h>

typedef struct {
    int *tokens, n_tokens;                                  /* the ids of the port's dump (index.json) */
    int input_computed;                                     /* 1: layer 0's input from zaya.c's embedding of the ids */
    int final_in_port;                                      /* 1: the dump has model.norm or logits: replay them */
    unsigned char router_state_from_port[ZAYA_MAX_LAYERS];  /* [i]: layer i's EDA read the port's state of layer i-1 */
    unsigned char *image;                                   /* ZAYA1-VL: [n_tokens] 1 at image positions, or NULL */
    int n_image;                                            /* image positions */
    int image_from_index;                                   /* 1: index.json's image_positions; 0: the image ids */
} ReplayInfo;

/* Reads the port's dump in dir: its ids (index.json "tokens"), which of the tensors that replay can
 * take from it are there (model:input_scaled, each layer's mlp.gate:router_state), and whether it has
 * anything after the last layer (model.norm, logits, logits:top*). ZAYA1-VL: the image positions, from
 * index.json's "image_positions" ([first, end) ranges), else (a VL model) the positions holding its image
 * token id. info->tokens and info->image are malloc'ed (free them). Returns 0, or -1 with a message in err. */
int zaya_replay_open(const ZayaModel *m, const char *dir, ReplayInfo *info, char *err, size_t errlen);

/* Replays every layer of the model, then the final norm and the LM head (only when the dump has model.norm
 * or logits: with taps on, the LM head runs at every position, most of a full-width replay's time), each
 * from the port's dump in dir (its model.layers.{i}.post_mlp_residual_scale, and mlp.gate:router_state where present), all
 * positions, reporting every tap to s->tap. Notes what it took from where on log (may be NULL). ZAYA1-VL: the
 * image positions run the vision LoRA and the bidirectional image mask; layer 0's input at them, without the
 * port's model:input_scaled, is its model.visual (the image features).
 * Returns 0, or -1 with a message in err (a missing or malformed tensor of the dump, too many
 * positions for the context). */
int zaya_replay_run(const ZayaModel *m, ZayaState *s, const char *dir, const ReplayInfo *info, FILE *log, char *err,
                    size_t errlen);

/* ZAYA1-VL: every block of the vision tower recomputed from the port's input to it (its model.visual.patch_embed
 * for block 0, model.visual.blocks.{N-1} after), on the grid of index.json's first "image_grid_thw", reporting
 * the blocks' taps to tap (zaya_vision_replay_block). A block whose input the dump lacks is left out (said on
 * log). Returns the number of blocks replayed (0: a text model, or no tower in the dump), or -1 with err. */
int zaya_replay_vision(const ZayaModel *m, int threads, const char *dir, ZayaVisionTapFn tap, void *tap_ctx, FILE *log,
                       char *err, size_t errlen);

#endif /* ZAYA_REPLAY_H */
