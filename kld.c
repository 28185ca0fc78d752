/* kld.c - --kld-base: llama-perplexity's KL-divergence base file from the exact model (kld.h).
 * Every step follows tools/perplexity/perplexity.cpp of ggml-org/llama.cpp at commit
 * 050fc7f32de16858ac667d775b43a51ed8976e6f: perplexity() writes the file when --kl-divergence-base is
 * given without --kl-divergence, kl_divergence() reads it. */
#define _POSIX_C_SOURCE 200809L
#include "kld.h"
#include "tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    FILE *f;
    const int *targets;     /* the chunk's tokens: position p predicts targets[p + 1] */
    int n_vocab, first, last;   /* scored positions first..last */
    int next;               /* the next position expected */
    uint16_t *row;          /* one row: 4 uint16 (scale, min_log_prob) + n_vocab (+ pad) */
    size_t nv;
    double nll, nll2;       /* sums over every scored token so far (as llama-perplexity) */
    int count;
    char err[4600];
} Kld;

/* One row of the base: llama.cpp's log_softmax(n_vocab, logits, log_prob, tok) step for step in float,
 * so that the same logits give the same bytes. Log-probs below max - 16 are clamped to the row's
 * minimum; the rest are quantized to 65535 steps of scale = (max - min) / 65535 above it. Returns the
 * token's negative log-likelihood. */
static double quantize_row(int n_vocab, const float *logits, uint16_t *out, int tok) {
    float max_logit = logits[0], min_logit = logits[0];
    for (int i = 1; i < n_vocab; i++) {
        max_logit = logits[i] > max_logit ? logits[i] : max_logit;
        min_logit = logits[i] < min_logit ? logits[i] : min_logit;
    }
    min_logit = min_logit > max_logit - 16 ? min_logit : max_logit - 16;
    double sum_exp = 0.0;
    for (int i = 0; i < n_vocab; i++) sum_exp += expf(logits[i] - max_logit);
    const float log_sum_exp = (float)log(sum_exp);
    const float min_log_prob = min_logit - max_logit - log_sum_exp;
    const float scale = (max_logit - min_logit) / 65535.f;
    memcpy(out, &scale, 4);
    memcpy(out + 2, &min_log_prob, 4);
    out += 4;
    if (scale != 0.0f) {
        const float inv_scale = 1 / scale;
        /* lrintf rounds to nearest, ties to even: llama.cpp's nearest_int (the 1.5 * 2^23 trick) */
        for (int i = 0; i < n_vocab; i++) out[i] = logits[i] > min_logit ? (uint16_t)lrintf(inv_scale * (logits[i] - min_logit)) : 0;
    } else {
        memset(out, 0, sizeof(uint16_t) * (size_t)n_vocab);
    }
    return max_logit + log_sum_exp - logits[tok];
}

static void kld_tap(void *ctx, const ZayaTap *tap) {
    Kld *k = ctx;
    if (tap->layer != -1 || strcmp(tap->name, "logits") != 0 || tap->pos < k->first || k->err[0]) return;
    if (tap->pos != k->next || tap->pos > k->last) {
        snprintf(k->err, sizeof k->err, "--kld-base: the logits of position %d arrived, expected position %d", tap->pos, k->next);
        return;
    }
    double v = quantize_row(k->n_vocab, tap->data, k->row, k->targets[tap->pos + 1]);
    k->nll += v;
    k->nll2 += v * v;
    k->count++;
    k->next++;
    if (fwrite(k->row, sizeof(uint16_t), k->nv, k->f) != k->nv)
        snprintf(k->err, sizeof k->err, "cannot write the KL-divergence base: %s\n  hint: check the disk space", strerror(errno));
}

/* The corpus file as llama-perplexity -f reads it: every byte, one trailing newline dropped. */
static char *read_corpus(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) { zaya_fail(err, errlen, "cannot open the corpus %s: %s\n  hint: -f takes a UTF-8 text file, e.g. wiki.test.raw", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0, got;
    char *text = malloc(cap);
    while (text && (got = fread(text + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *t = cap < ((size_t)1 << 30) ? realloc(text, cap *= 2) : NULL;
            if (!t) { free(text); text = NULL; }
            else text = t;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!text || bad) {
        free(text);
        zaya_fail(err, errlen, "cannot read the corpus %s (%s)\n  hint: a text file under 1 GB", path, bad ? "read error" : "out of memory or too large");
        return NULL;
    }
    if (n && text[n - 1] == '\n') n--;
    *len = n;
    return text;
}

int zaya_kld_base(const ZayaModel *m, ZayaState *s, const char *corpus_path, const char *out_path, int n_ctx,
                  int max_chunks, FILE *out, FILE *info, char *err, size_t errlen) {
    const ZayaTokenizer *tok = m->tokenizer;
    if (!tok) return zaya_fail(err, errlen, "--kld-base needs the tokenizer to read the corpus, but this blob has none\n"
                               "  hint: re-export it with export_weights.py from a folder with tokenizer.json");
    if (n_ctx < 4 || n_ctx > s->ctx)
        return zaya_fail(err, errlen, "--kld-base: bad chunk length n_ctx = %d\n  expected: 4..%d (--ctx)", n_ctx, s->ctx);
    const int n_vocab = tok->n_tokens;
    if (n_vocab > m->config.vocab_size)
        return zaya_fail(err, errlen, "--kld-base: the tokenizer has %d ids but the model only %d logits", n_vocab, m->config.vocab_size);
    /* llama-perplexity: common_tokenize(text, add_special = true) = <bos> (if the vocabulary adds it) + the text */
    const int add_bos = tok->n_prefix > 0, bos = add_bos ? tok->prefix[0] : -1;
    size_t len, n_body = 0;
    char *text = read_corpus(corpus_path, &len, err, errlen);
    if (!text) return -1;
    int *body = NULL;
    int rc = zaya_tok_encode(tok, text, len, 0, &body, &n_body);
    free(text);
    if (rc != 0) return zaya_fail(err, errlen, "cannot tokenize the corpus %s (out of memory, or over 256 MB)", corpus_path);
    size_t n_tokens = n_body + (size_t)add_bos;
    if (n_tokens < 2 * (size_t)n_ctx) {
        free(body);
        return zaya_fail(err, errlen, "the corpus %s has %zu tokens, too few for a context of %d\n  expected: at least 2 * n_ctx = %d tokens "
                         "(llama-perplexity's rule)\n  hint: a longer corpus, or a smaller --ctx", corpus_path, n_tokens, n_ctx, 2 * n_ctx);
    }
    int *tokens = malloc(sizeof(int) * n_tokens);
    if (!tokens) { free(body); return zaya_fail(err, errlen, "out of memory"); }
    if (add_bos) tokens[0] = bos;
    memcpy(tokens + add_bos, body, sizeof(int) * n_body);
    free(body);
    int n_chunk = (int)(n_tokens / (size_t)n_ctx);
    if (max_chunks >= 0 && max_chunks < n_chunk) n_chunk = max_chunks;
    const int first = n_ctx / 2, per_chunk = n_ctx - 1 - first;

    struct stat st;
    if (stat(out_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        free(tokens);
        return zaya_fail(err, errlen, "--kld-base %s is a folder\n  hint: give the name of the base file to write, e.g. %s/zaya.kld", out_path, out_path);
    }
    char tmp[4200];
    if (strlen(out_path) + 9 >= sizeof tmp) { free(tokens); return zaya_fail(err, errlen, "--kld-base path is too long"); }
    snprintf(tmp, sizeof tmp, "%s.partial", out_path);
    Kld k = {0};
    k.n_vocab = n_vocab;
    k.nv = 2 * (((size_t)n_vocab + 1) / 2) + 4;
    k.row = calloc(k.nv, sizeof(uint16_t));   /* the odd-n_vocab pad stays 0, as in llama.cpp's zeroed buffer */
    int *chunk = malloc(sizeof(int) * (size_t)n_ctx);
    k.f = k.row && chunk ? fopen(tmp, "wb") : NULL;
    if (!k.f) {
        int e = errno;
        free(tokens); free(k.row); free(chunk);
        return zaya_fail(err, errlen, "cannot write the KL-divergence base %s: %s\n  hint: check that the folder exists and is writable",
                         tmp, k.row && chunk ? strerror(e) : "out of memory");
    }
    int32_t head[3] = {n_ctx, n_vocab, n_chunk};
    int ok = fwrite("_logits_", 1, 8, k.f) == 8 && fwrite(head, 4, 3, k.f) == 3;
    for (size_t i = 0; ok && i < (size_t)n_chunk * (size_t)n_ctx; i++) {
        int32_t id = tokens[i];
        ok = fwrite(&id, 4, 1, k.f) == 1;
    }
    if (!ok) snprintf(k.err, sizeof k.err, "cannot write %s: %s\n  hint: check the disk space", tmp, strerror(errno));
    fprintf(info, "kld-base: %zu tokens, %d chunks of n_ctx = %d, n_vocab = %d (the tokenizer's; the model has %d logits), "
            "scoring positions %d..%d of each chunk\n", n_tokens, n_chunk, n_ctx, n_vocab, m->config.vocab_size, first, n_ctx - 2);

    char ferr[512];
    for (int c = 0; c < n_chunk && !k.err[0]; c++) {
        memcpy(chunk, tokens + (size_t)c * n_ctx, sizeof(int) * (size_t)n_ctx);
        if (add_bos) chunk[0] = bos;   /* as llama-perplexity: the chunk's first token becomes <bos> */
        k.targets = chunk;
        k.first = first;
        k.last = n_ctx - 2;
        k.next = first;
        zaya_state_reset(s, m);
        /* the first half only builds the cache (no logits needed); the scored half runs with the tap,
         * which makes forward() report every position's logits. Batching does not change results. */
        s->tap = NULL;
        if (zaya_forward(m, s, chunk, first, ferr, sizeof ferr) != 0) { snprintf(k.err, sizeof k.err, "%s", ferr); break; }
        s->tap = kld_tap;
        s->tap_ctx = &k;
        if (zaya_forward(m, s, chunk + first, per_chunk, ferr, sizeof ferr) != 0) { snprintf(k.err, sizeof k.err, "%s", ferr); break; }
        s->tap = NULL;
        if (!k.err[0] && k.next != n_ctx - 1)
            snprintf(k.err, sizeof k.err, "--kld-base: chunk %d gave logits for %d of its %d scored positions", c + 1, k.next - first, per_chunk);
        if (!k.err[0]) {
            fprintf(out, "[%d]%.4lf,", c + 1, exp(k.nll / k.count));
            fflush(out);
        }
    }
    s->tap = NULL;
    free(tokens);
    free(chunk);
    free(k.row);
    if (fclose(k.f) != 0 && !k.err[0]) snprintf(k.err, sizeof k.err, "cannot write %s: %s\n  hint: check the disk space", tmp, strerror(errno));
    if (k.err[0]) {
        remove(tmp);
        return zaya_fail(err, errlen, "%s", k.err);
    }
    if (rename(tmp, out_path) != 0) return zaya_fail(err, errlen, "cannot rename %s to %s: %s", tmp, out_path, strerror(errno));
    fprintf(out, "\n");
    fflush(out);
    /* llama-perplexity's final line: PPL = exp(mean NLL) and its standard error */
    double nll = k.nll / k.count, nll2 = k.nll2 / k.count;
    const double ppl = exp(nll);
    nll2 -= nll * nll;
    if (nll2 > 0) fprintf(info, "Final estimate: PPL = %.4lf +/- %.5lf\n", ppl, sqrt(nll2 / (k.count - 1)) * ppl);
    else fprintf(info, "Unexpected negative standard deviation of log(prob)\n");
    fprintf(info, "kld-base: wrote %s (%d chunks x %d scored tokens)\n", out_path, n_chunk, per_chunk);
    return 0;
}
