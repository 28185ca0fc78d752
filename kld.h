/* kld.h - --kld-base: the exact model's log-probabilities over a corpus, in the file that
 * `llama-perplexity --kl-divergence-base FILE` writes and `llama-perplexity --kl-divergence` reads
 * (tools/perplexity/perplexity.cpp of ggml-org/llama.cpp; docs/golden-formats.md).
 *
 * The corpus is tokenized as llama-perplexity does (<bos> + the text, without its last newline), cut
 * into n_chunk = n_tokens / n_ctx chunks of n_ctx tokens; each chunk runs from an empty cache with
 * its first token replaced by <bos>, and the second half of it is scored: positions n_ctx/2 ..
 * n_ctx-2 predict the next token. File (native byte order = little-endian):
 *
 *   "_logits_"                 8 bytes
 *   n_ctx, n_vocab, n_chunk    int32 each
 *   tokens                     int32 [n_chunk * n_ctx], the corpus ids (not replaced by <bos>)
 *   per chunk, per scored position (n_ctx - 1 - n_ctx/2 of them), nv = 2*((n_vocab+1)/2) + 4 uint16:
 *     float scale, float min_log_prob (4 uint16), then n_vocab uint16 q[i] (+ one 0 if n_vocab is odd);
 *     log p(i) = scale * q[i] + min_log_prob
 *
 * n_vocab is the tokenizer's size (262147 for ZAYA1), not the embedding's 262272 rows: llama.cpp's
 * model has the tokenizer's n_vocab logits and refuses a base of another size; the log-softmax runs
 * over those ids only (the padding rows are never a token).
 */
#ifndef ZAYA_KLD_H
#define ZAYA_KLD_H

#include "zaya.h"
#include <stdio.h>

/* Writes the base file for the corpus at corpus_path (UTF-8 text) to out_path (through
 * out_path.partial, renamed when whole). n_ctx: tokens per chunk (s->ctx >= n_ctx); max_chunks < 0 =
 * all. Prints llama-perplexity's "[1]x,[2]y," progress to `out` and its "Final estimate" line to
 * `info` (with a few facts about the run). Needs the blob's tokenizer. Returns 0 or -1 + err. */
int zaya_kld_base(const ZayaModel *m, ZayaState *s, const char *corpus_path, const char *out_path, int n_ctx,
                  int max_chunks, FILE *out, FILE *info, char *err, size_t errlen);

#endif
