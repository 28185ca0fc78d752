/* trace.h - `zaya --trace POS`: one token through forward(), step by step, with real numbers.
 *
 * A tap consumer (ZayaTapFn, like --dump): forward() reports every intermediate tensor of every
 * position; the trace keeps the rows of position POS and prints one line per step, in execution
 * order, with the HF module path (the --dump name), the shape, the L2 norm, min, max and the first
 * four values (%.6g, the same floats --dump writes). Below some lines, indented lines explain the
 * step with the numbers of this token: which past positions the CCA convolutions read, where the
 * delayed value comes from, the top-3 attended keys of every head, the router's E+1 probabilities
 * and its choice, the top-5 next tokens. docs/walkthrough.md follows one token with it.
 *
 * With a layer filter only that layer's lines are printed; the model-level lines (embedding, input
 * scaling, final norm, logits) are always printed, so the trace still starts at the token and ends
 * at the next-token prediction.
 */
#ifndef ZAYA_TRACE_H
#define ZAYA_TRACE_H

#include <stdio.h>
#include "zaya.h"

typedef struct {
    const ZayaModel *m;
    FILE *out;
    int pos;                  /* the traced position */
    int layer;                /* only this layer's lines (-1 = every layer) */
    const int *tokens;        /* the prompt ids (token text of attended positions) */
    int n_tokens;
    int skip_expert;          /* ZAYA_SKIP_ZERO or ZAYA_SKIP_PASSTHROUGH, to explain the skip class */
    /* remembered between the taps of one layer at `pos` */
    int cur_layer;            /* layer whose header was printed last (-1 = none yet) */
    float *probs, *scores;    /* router probabilities and biased scores [E+1] */
    int chosen;               /* router class (E = skip) */
    float weight;             /* its weight after skip handling */
    const unsigned char *image;   /* ZAYA1-VL: [n_tokens] 1 at the positions that take image features, or NULL */
    float *h, *h2, *attn;     /* ZAYA1-VL at an image position: the rows of input_layernorm, post_attention_layernorm,
                               * self_attn:attn_output (the vision LoRA's inputs) */
} ZayaTrace;

/* Prints the trace header (the token, the model, the column titles). layer = -1 for all layers.
 * Returns 0, or -1 with a message in err (pos not in the prompt, layer out of range, no memory). */
int zaya_trace_init(ZayaTrace *t, const ZayaModel *m, int pos, int layer, const int *tokens, int n_tokens,
                    int skip_expert, FILE *out, char *err, size_t errlen);

/* ZAYA1-VL: image[n_tokens] marks the prompt's image positions (the image features given with it, as
 * zaya_set_images); at such a position the trace explains the image row, the vision LoRA additions (with their
 * norms, computed from the step's input and the blob's LoRA pairs) and the bidirectional image mask. Returns 0,
 * or -1 + err (no memory). */
int zaya_trace_set_images(ZayaTrace *t, const unsigned char *image, char *err, size_t errlen);

/* The ZayaTapFn: set s->tap = zaya_trace_tap, s->tap_ctx = &trace, then run the prompt. */
void zaya_trace_tap(void *ctx, const ZayaTap *tap);

void zaya_trace_free(ZayaTrace *t);

#endif /* ZAYA_TRACE_H */
