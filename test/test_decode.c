/* test_decode.c - a generated token gives the same bits whatever runs it.
 *
 *   make build/test_decode && ZAYA_THREADS=2 build/test_decode BLOB IDS STEPS [hugepages] [passthrough]
 *
 * Two states take the prompt IDS (comma-separated), then STEPS greedy tokens, each with
 * zaya_forward: state a as generation runs it (no tap, the prompt in one batch, ZAYA_THREADS
 * threads, default 2), state b as --dump runs it (a tap that does nothing, so every position's
 * logits are computed; the prompt token by token; one thread). The logits must be bit-identical at
 * every step, and so the KV cache, conv state and delayed value of every layer at the end. Prints one
 * PASS or FAIL line; exit status 1 on FAIL, 2 on usage or load errors.
 */
#include "zaya.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void no_tap(void *ctx, const ZayaTap *tap) { (void)ctx, (void)tap; }

static int same(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: test_decode BLOB IDS STEPS [hugepages] [passthrough]\n");
        return 2;
    }
    int flags = 0, skip = ZAYA_SKIP_ZERO, threads = getenv("ZAYA_THREADS") ? atoi(getenv("ZAYA_THREADS")) : 2;
    for (int i = 4; i < argc; i++) {
        if (!strcmp(argv[i], "hugepages")) flags |= ZAYA_LOAD_HUGEPAGES;
        else if (!strcmp(argv[i], "passthrough")) skip = ZAYA_SKIP_PASSTHROUGH;
        else { fprintf(stderr, "test_decode: unknown option '%s'\n", argv[i]); return 2; }
    }
    char err[1024], label[512];
    snprintf(label, sizeof label, "generation = --dump, bit for bit (%s, %d thread(s) vs 1, batch vs token by token%s%s)", argv[1], threads,
             flags ? ", hugepages" : "", skip == ZAYA_SKIP_PASSTHROUGH ? ", skip passthrough" : "");
    int ids[256], n = 0;
    for (char *p = argv[2], *end; *p && n < 256; p = end + (*end == ',')) {
        ids[n++] = (int)strtol(p, &end, 10);
        if (end == p) { fprintf(stderr, "test_decode: IDS must be comma-separated token ids (got '%s')\n", argv[2]); return 2; }
    }
    const int steps = atoi(argv[3]);
    ZayaModel m;
    ZayaState a, b;
    if (zaya_load(&m, argv[1], flags, err, sizeof err) != 0) { fprintf(stderr, "test_decode: %s\n", err); return 2; }
    if (zaya_state_init(&a, &m, n + steps, threads, err, sizeof err) != 0 || zaya_state_init(&b, &m, n + steps, 1, err, sizeof err) != 0) {
        fprintf(stderr, "test_decode: %s\n", err);
        return 2;
    }
    a.skip_expert = b.skip_expert = skip;
    b.tap = no_tap;
    b.batch = 1;
    if (zaya_forward(&m, &a, ids, n, err, sizeof err) != 0 || zaya_forward(&m, &b, ids, n, err, sizeof err) != 0) {
        fprintf(stderr, "test_decode: %s\n", err);
        return 2;
    }
    const ZayaConfig *c = &m.config;
    const size_t V = (size_t)c->vocab_size, d = (size_t)c->head_dim, nkv = (size_t)c->num_kv_heads;
    const size_t C = (size_t)(c->num_heads + c->num_kv_heads) * d, K = (size_t)(c->cca_time0 + c->cca_time1 - 2);
    int bad_step = -1;
    for (int i = 0; i < steps && bad_step < 0; i++) {
        int next = 0;
        for (size_t v = 1; v < V; v++) if (a.logits[v] > a.logits[next]) next = (int)v;
        if (zaya_forward(&m, &a, &next, 1, err, sizeof err) != 0 || zaya_forward(&m, &b, &next, 1, err, sizeof err) != 0) {
            fprintf(stderr, "test_decode: %s\n", err);
            return 2;
        }
        if (!same(a.logits, b.logits, V)) bad_step = i;
    }
    const char *bad_state = NULL;
    for (int l = 0; l < c->num_layers && !bad_state && bad_step < 0; l++) {
        const ZayaLayerState *x = &a.layers[l], *y = &b.layers[l];
        const size_t kv = (size_t)x->cache_len * nkv * d;
        if (!same(x->key_cache, y->key_cache, kv) || !same(x->value_cache, y->value_cache, kv)) bad_state = "KV cache";
        else if (!same(x->conv_state, y->conv_state, K * C)) bad_state = "conv state";
        else if (!same(x->delayed_value, y->delayed_value, nkv * d / 2)) bad_state = "delayed value";
    }
    if (bad_step >= 0) printf("FAIL %s: logits differ at decode step %d of %d\n", label, bad_step + 1, steps);
    else if (bad_state) printf("FAIL %s: the %s differs after %d steps\n", label, bad_state, steps);
    else printf("PASS %s: %d steps\n", label, steps);
    zaya_state_free(&a);
    zaya_state_free(&b);
    zaya_free(&m);
    return bad_step >= 0 || bad_state ? 1 : 0;
}
