/* fuzz_tokenizer.c - libFuzzer target for tokenizer.c.
 *
 * Input byte 0 picks the mode:
 *   even: encode(rest) with and without specials, decode(ids), streaming decode of the same ids, and
 *         decode of the rest read as raw int32 ids. Needs the real section: $ZAYA_TOK_SECTION
 *         (default build/tokenizer_section.bin, made by test/make_tokenizer_section.py).
 *   odd:  the rest is spliced over a copy of the real section at an offset given by bytes 1..4 (with the
 *         checksum fixed up, so the structural checks are reached), then loaded; if it loads, it is used.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -I. test/fuzz/fuzz_tokenizer.c tokenizer.c \
 *       -o build/fuzz_tokenizer
 *   python3 test/make_tokenizer_section.py build/tokenizer_section.bin test/fixtures/tokenizer
 *   build/fuzz_tokenizer -max_total_time=60 -max_len=4096
 */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static unsigned char *g_sec;
static size_t g_size;
static ZayaTokenizer g_tok;

static void init(void) {
    if (g_sec) return;
    const char *path = getenv("ZAYA_TOK_SECTION");
    FILE *f = fopen(path ? path : "build/tokenizer_section.bin", "rb");
    if (!f) { fprintf(stderr, "fuzz_tokenizer: cannot open the section (set ZAYA_TOK_SECTION)\n"); abort(); }
    fseek(f, 0, SEEK_END);
    g_size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    g_sec = malloc(g_size);
    if (!g_sec || fread(g_sec, 1, g_size, f) != g_size) abort();
    fclose(f);
    char err[512];
    if (zaya_tok_load(&g_tok, g_sec, g_size, err, sizeof err)) { fprintf(stderr, "%s\n", err); abort(); }
}

static void use(const ZayaTokenizer *t, const unsigned char *data, size_t n) {
    int *ids;
    size_t ni, dl;
    for (int special = 0; special < 2; special++) {
        if (zaya_tok_encode(t, (const char *)data, n, special, &ids, &ni)) continue;
        char *d = zaya_tok_decode(t, ids, ni, special, &dl);
        ZayaTokStream s;
        zaya_tok_stream_init(&s, t, special);
        size_t total = 0, l;
        for (size_t i = 0; i < ni; i++) if (zaya_tok_stream_push(&s, ids[i], &l)) total += l;
        if (zaya_tok_stream_flush(&s, &l)) total += l;
        if (d && total != dl) abort();          /* streaming must give the same text */
        zaya_tok_stream_free(&s);
        free(d);
        free(ids);
    }
    int raw[1024];
    size_t nr = n / 4 < 1024 ? n / 4 : 1024;
    memcpy(raw, data, nr * 4);
    free(zaya_tok_decode(t, raw, nr, 0, &dl));
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    init();
    if (size < 1) return 0;
    if (!(data[0] & 1)) {
        use(&g_tok, data + 1, size - 1);
        return 0;
    }
    if (size < 5) return 0;
    size_t at = (size_t)(data[1] | data[2] << 8 | data[3] << 16 | (size_t)data[4] << 24);
    at = data[1] & 1 ? at % 4096 : at % g_size;            /* half the time the header and first rows */
    size_t n = size - 5;
    unsigned char *buf = malloc(g_size);
    memcpy(buf, g_sec, g_size);
    if (at + n > g_size) n = g_size - at;
    memcpy(buf + at, data + 5, n);
    uint32_t sum = zaya_tok_checksum(buf, g_size);
    memcpy(buf + 24, &sum, 4);
    ZayaTokenizer t;
    char err[256];
    if (zaya_tok_load(&t, buf, g_size, err, sizeof err) == 0) {
        static const char txt[] = "Hello <bos> w\xC3\xB6rld\n\n\t <|im_end|>\xFF\xE4\xB8 x";
        use(&t, (const unsigned char *)txt, sizeof txt - 1);
        zaya_tok_free(&t);
    }
    free(buf);
    return 0;
}
