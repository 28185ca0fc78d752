/* tokenizer.c - Hugging Face-exact encode/decode of the ZAYA1-8B / Gemma 3 tokenizer (see tokenizer.h).
 *
 * Reading order: the section loader (zaya_tok_load), then zaya_tok_encode() top to bottom (UTF-8 repair,
 * added tokens, BPE with a heap over a linked list of symbols), then decode and streaming decode,
 * then chat rendering. Each step names the HF `tokenizers` behaviour it reproduces.
 */
#include "tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SECTION_MAGIC "ZAYATOK"        /* + NUL: 8 bytes */
enum { SECTION_VERSION = 1, SECTION_HEADER = 328, N_ARRAYS = 7 };
enum { F_EXISTS = 1, F_ADDED = 2, F_SKIP = 4, F_BYTE = 8, F_VOCAB = 16, F_ALL = 31 };
#define EMPTY 0xFFFFFFFFu
#define MAX_INPUT ((size_t)256 << 20)  /* encode refuses longer inputs (ids and positions are int) */
#define HINT "re-export the model with export_weights.py"

static const unsigned char REPLACEMENT[3] = {0xEF, 0xBF, 0xBD};   /* U+FFFD in UTF-8 */

/* ------------------------------------------------------------------------------------------------ */
/* small helpers                                                                                     */

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < errlen)
            snprintf(err + n, errlen - (size_t)n, "\n  hint: %s", HINT);
    }
    return -1;
}

static uint32_t rd32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* FNV-1a 32, as export_tokenizer.fnv1a */
static uint32_t fnv1a(const unsigned char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 16777619u;
    return h;
}

/* as export_tokenizer.merge_hash */
static uint32_t pair_hash(uint32_t a, uint32_t b) {
    uint32_t h = a * 0x9E3779B1u + b * 0x85EBCA77u + 1u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return h;
}

/* zlib's Adler-32 */
static uint32_t adler32(const unsigned char *p, size_t n) {
    uint32_t a = 1, b = 0;
    while (n) {
        size_t k = n < 5552 ? n : 5552;   /* largest block without 32-bit overflow */
        n -= k;
        while (k >= 8) {
            a += p[0]; b += a; a += p[1]; b += a; a += p[2]; b += a; a += p[3]; b += a;
            a += p[4]; b += a; a += p[5]; b += a; a += p[6]; b += a; a += p[7]; b += a;
            p += 8; k -= 8;
        }
        while (k--) { a += *p++; b += a; }
        a %= 65521u;
        b %= 65521u;
    }
    return b << 16 | a;
}

uint32_t zaya_tok_checksum(const void *section, size_t size) {
    return adler32((const unsigned char *)section + 32, size - 32);
}

static uint32_t tok_flags(const ZayaTokenizer *t, int id) { return t->tokens[4 * (size_t)id + 3] & 0xFF; }

static int has_token(const ZayaTokenizer *t, int id) {
    return id >= 0 && id < t->n_tokens && (tok_flags(t, id) & F_EXISTS);
}

/* decode-side text of a token (U+2581 already replaced by ' ') */
static const unsigned char *tok_text(const ZayaTokenizer *t, int id, size_t *len) {
    const uint32_t *row = t->tokens + 4 * (size_t)id;
    *len = row[2] >> 16;
    return t->strings + row[1];
}

/* Strict UTF-8 check (Rust's String::from_utf8): no overlongs, surrogates or code points > U+10FFFF.
 * Returns the length of the valid sequence starting at s[0] (1..4), or 0 if it is invalid; *sub = length
 * of its maximal valid prefix (the "maximal subpart" replaced by one U+FFFD in lossy decoding). */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *sub) {
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;          /* allowed range of the second byte */
    *sub = 1;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    for (size_t i = 1; i < len; i++) {
        if (i >= n) return 0;
        unsigned char d = s[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
        *sub = i + 1;
    }
    return len;
}

static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0, sub;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t k = utf8_seq(s + i, n - i, &sub);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------------ */
/* loading: validate every byte we will ever read, then point into the section                       */

/* BPE vocab lookup by piece bytes (HF BPE vocab.get), -1 if absent */
static int piece_lookup(const ZayaTokenizer *t, const unsigned char *s, size_t n) {
    uint32_t h = fnv1a(s, n) & t->piece_mask;
    for (uint32_t probe = 0; probe <= t->piece_mask; probe++, h = (h + 1) & t->piece_mask) {
        uint32_t id = t->piece_hash[h];
        if (id == EMPTY) return -1;
        const uint32_t *row = t->tokens + 4 * (size_t)id;
        if ((row[2] & 0xFFFF) == n && memcmp(t->strings + row[0], s, n) == 0) return (int)id;
    }
    return -1;
}

/* merge table lookup (HF BPE merges.get(&(a, b))): the slot {left, right, rank, new id} or NULL */
static const uint32_t *merge_lookup(const ZayaTokenizer *t, uint32_t a, uint32_t b) {
    uint32_t h = pair_hash(a, b) & t->merge_mask;
    for (uint32_t probe = 0; probe <= t->merge_mask; probe++, h = (h + 1) & t->merge_mask) {
        const uint32_t *row = t->merge_hash + 4 * (size_t)h;
        if (row[0] == a && row[1] == b) return row;
        if (row[0] == EMPTY) return NULL;
    }
    return NULL;
}

static int check_id(const ZayaTokenizer *t, int32_t id, int allow_none, const char *what, char *err, size_t errlen) {
    if ((id == -1 && allow_none) || has_token(t, id)) return 0;
    return fail(err, errlen, "tokenizer section: %s = %d is not a token id\n  expected: an existing id below %d%s",
                what, (int)id, t->n_tokens, allow_none ? " or -1" : "");
}

int zaya_tok_load(ZayaTokenizer *t, const void *section, size_t size, char *err, size_t errlen) {
    const unsigned char *p = section;
    memset(t, 0, sizeof *t);
    if (!p) return fail(err, errlen, "tokenizer section: no data");
    if ((uintptr_t)p % 8)
        return fail(err, errlen, "tokenizer section: not 8-byte aligned (address %p)\n  expected: the section "
                    "at a 64-byte aligned file offset", section);
    {
        uint32_t one = 1;
        unsigned char first;
        memcpy(&first, &one, 1);
        if (first != 1) return fail(err, errlen, "tokenizer section: big-endian hosts are not supported");
    }
    if (size < SECTION_HEADER)
        return fail(err, errlen, "tokenizer section: truncated header\n  expected: at least %d bytes\n  found: %zu",
                    SECTION_HEADER, size);
    if (memcmp(p, SECTION_MAGIC, 8) != 0)
        return fail(err, errlen, "tokenizer section: bad magic\n  expected: \"ZAYATOK\\0\"\n  found: %02x %02x %02x "
                    "%02x %02x %02x %02x %02x", p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7]);
    uint32_t version = rd32(p + 8), header = rd32(p + 12);
    uint64_t total = rd64(p + 16);
    if (version != SECTION_VERSION)
        return fail(err, errlen, "tokenizer section: unsupported version\n  expected: %d\n  found: %u",
                    SECTION_VERSION, version);
    if (header != SECTION_HEADER)
        return fail(err, errlen, "tokenizer section: bad header size\n  expected: %d\n  found: %u", SECTION_HEADER, header);
    if (total != size)
        return fail(err, errlen, "tokenizer section: size mismatch (truncated or padded)\n  expected: %llu bytes "
                    "(from its header)\n  found: %zu", (unsigned long long)total, size);
    uint32_t sum = zaya_tok_checksum(p, size);
    if (sum != rd32(p + 24))
        return fail(err, errlen, "tokenizer section: checksum mismatch (corrupted)\n  expected: Adler-32 %08x\n"
                    "  found: %08x", rd32(p + 24), sum);

    /* scalars */
    uint32_t flags = rd32(p + 28);
    t->byte_fallback = flags & 1;
    t->fuse_unk = (flags >> 1) & 1;
    uint32_t n_tokens = rd32(p + 32);
    if (n_tokens < 1 || n_tokens > (1u << 30))
        return fail(err, errlen, "tokenizer section: n_tokens out of range\n  expected: 1..2^30\n  found: %u", n_tokens);
    t->n_tokens = (int)n_tokens;
    t->n_vocab = (int)rd32(p + 36);
    t->n_merges = (int)(rd32(p + 40) & 0x7FFFFFFF);
    t->n_added = (int)(rd32(p + 44) & 0x7FFFFFFF);

    /* arrays: (offset, count) with element sizes */
    static const size_t elem[N_ARRAYS] = {16, 1, 4, 16, 12, 8, 4};
    static const char *names[N_ARRAYS] = {"tokens", "strings", "piece_hash", "merge_hash", "trie_nodes",
                                          "trie_edges", "byte_ids"};
    const unsigned char *arr[N_ARRAYS];
    uint64_t cnt[N_ARRAYS];
    for (int k = 0; k < N_ARRAYS; k++) {
        uint64_t off = rd64(p + 216 + 16 * k), c = rd64(p + 216 + 16 * k + 8);
        if (off % 8 || off < SECTION_HEADER || off > size || c > (size - off) / elem[k])
            return fail(err, errlen, "tokenizer section: array %s out of bounds\n  expected: 8-aligned, inside "
                        "%zu bytes\n  found: offset %llu, %llu x %zu bytes", names[k], size,
                        (unsigned long long)off, (unsigned long long)c, elem[k]);
        arr[k] = p + off;
        cnt[k] = c;
    }
    if (cnt[0] != n_tokens || cnt[6] != 256 || cnt[4] < 1 || cnt[2] < 2 || (cnt[2] & (cnt[2] - 1)) ||
        cnt[3] < 2 || (cnt[3] & (cnt[3] - 1)) || cnt[1] > 0xFFFFFFFFu || cnt[4] > 0xFFFFFFFFu || cnt[5] > 0xFFFFFFFFu)
        return fail(err, errlen, "tokenizer section: inconsistent array sizes\n  expected: %u tokens, 256 byte ids, "
                    "power-of-2 hash tables, a trie root\n  found: %llu tokens, %llu byte ids, hash %llu / %llu, %llu "
                    "trie nodes", n_tokens, (unsigned long long)cnt[0], (unsigned long long)cnt[6],
                    (unsigned long long)cnt[2], (unsigned long long)cnt[3], (unsigned long long)cnt[4]);
    t->tokens = (const uint32_t *)(const void *)arr[0];
    t->strings = arr[1];
    t->strings_len = (size_t)cnt[1];
    t->piece_hash = (const uint32_t *)(const void *)arr[2];
    t->piece_mask = (uint32_t)(cnt[2] - 1);
    t->merge_hash = (const uint32_t *)(const void *)arr[3];
    t->merge_mask = (uint32_t)(cnt[3] - 1);
    t->trie_nodes = (const uint32_t *)(const void *)arr[4];
    t->n_nodes = (uint32_t)cnt[4];
    t->trie_edges = (const uint32_t *)(const void *)arr[5];
    t->n_edges = (uint32_t)cnt[5];

    /* token table: strings inside the pool, known flags, byte tokens are "<0xNN>" */
    for (uint32_t i = 0; i < n_tokens; i++) {
        const uint32_t *row = t->tokens + 4 * (size_t)i;
        uint32_t fl = row[3] & 0xFF, plen = row[2] & 0xFFFF, tlen = row[2] >> 16;
        if (!(fl & F_EXISTS)) {
            if (row[0] | row[1] | row[2] | row[3])
                return fail(err, errlen, "tokenizer section: id %u has no token but a non-zero table row", i);
            continue;
        }
        if ((row[3] >> 16) || (fl & ~(uint32_t)F_ALL) || row[0] > t->strings_len || plen > t->strings_len - row[0] ||
            row[1] > t->strings_len || tlen > t->strings_len - row[1] || ((fl & F_BYTE) && tlen != 6) ||
            (!(fl & F_BYTE) && (row[3] >> 8)))
            return fail(err, errlen, "tokenizer section: bad token row %u\n  expected: strings inside the %zu-byte "
                        "pool, known flags\n  found: piece %u+%u, text %u+%u, flags 0x%x", i, t->strings_len, row[0],
                        plen, row[1], tlen, row[3]);
    }
    /* piece hash: ids of BPE vocab tokens; the table must have an empty slot (lookups end) */
    uint32_t used = 0;
    for (uint32_t h = 0; h <= t->piece_mask; h++) {
        uint32_t id = t->piece_hash[h];
        if (id == EMPTY) continue;
        if (id >= n_tokens || !(tok_flags(t, (int)id) & F_VOCAB))
            return fail(err, errlen, "tokenizer section: piece hash slot %u holds %u\n  expected: a BPE vocab id "
                        "below %u or empty", h, id, n_tokens);
        used++;
    }
    if (used != (uint32_t)t->n_vocab || used > t->piece_mask)
        return fail(err, errlen, "tokenizer section: piece hash holds %u ids\n  expected: n_vocab = %d, below the "
                    "%u slots", used, t->n_vocab, t->piece_mask + 1);
    /* merge hash: ids in range, ranks below n_merges, an empty slot */
    used = 0;
    for (uint32_t h = 0; h <= t->merge_mask; h++) {
        const uint32_t *row = t->merge_hash + 4 * (size_t)h;
        if (row[0] == EMPTY) continue;
        if (row[0] >= n_tokens || row[1] >= n_tokens || row[3] >= n_tokens || row[2] >= (uint32_t)t->n_merges)
            return fail(err, errlen, "tokenizer section: merge slot %u = (%u, %u, rank %u, -> %u)\n  expected: ids "
                        "below %u, rank below %d", h, row[0], row[1], row[2], row[3], n_tokens, t->n_merges);
        used++;
    }
    if (used > (uint32_t)t->n_merges || used > t->merge_mask)
        return fail(err, errlen, "tokenizer section: merge hash holds %u pairs\n  expected: at most n_merges = %d "
                    "and fewer than the %u slots", used, t->n_merges, t->merge_mask + 1);
    /* trie: edges inside the edge array, children after their parent (no cycles), ids valid */
    for (uint32_t n = 0; n < t->n_nodes; n++) {
        const uint32_t *node = t->trie_nodes + 3 * (size_t)n;
        int32_t id = (int32_t)node[2];
        if (node[0] > t->n_edges || node[1] > t->n_edges - node[0] || node[1] > 256 ||
            (id != -1 && !has_token(t, id)))
            return fail(err, errlen, "tokenizer section: bad trie node %u (edges %u+%u of %u, id %d)", n, node[0],
                        node[1], t->n_edges, (int)id);
        for (uint32_t e = node[0]; e < node[0] + node[1]; e++) {
            const uint32_t *edge = t->trie_edges + 2 * (size_t)e;
            if (edge[0] <= n || edge[0] >= t->n_nodes || edge[1] > 255 ||
                (e > node[0] && edge[1] <= edge[-1]))
                return fail(err, errlen, "tokenizer section: bad trie edge %u of node %u (child %u of %u, byte %u)\n"
                            "  expected: a later node, bytes sorted", e, n, edge[0], t->n_nodes, edge[1]);
        }
    }
    for (int b = 0; b < 256; b++) {
        t->byte_ids[b] = (int32_t)rd32(arr[6] + 4 * b);
        if (check_id(t, t->byte_ids[b], 1, "byte fallback id", err, errlen)) return -1;
    }
    /* special ids and the post-processor */
    const char *idn[4] = {"bos", "eos", "pad", "unk"};
    int *idp[4] = {&t->bos, &t->eos, &t->pad, &t->unk};
    for (int k = 0; k < 4; k++) {
        *idp[k] = (int32_t)rd32(p + 48 + 4 * k);
        if (check_id(t, *idp[k], 1, idn[k], err, errlen)) return -1;
    }
    t->n_prefix = (int)rd32(p + 64);
    t->n_suffix = (int)rd32(p + 84);
    if (rd32(p + 64) > 4 || rd32(p + 84) > 4)
        return fail(err, errlen, "tokenizer section: post-processor id counts %u / %u\n  expected: at most 4",
                    rd32(p + 64), rd32(p + 84));
    for (int k = 0; k < t->n_prefix; k++)
        if (check_id(t, t->prefix[k] = (int32_t)rd32(p + 68 + 4 * k), 0, "prefix id", err, errlen)) return -1;
    for (int k = 0; k < t->n_suffix; k++)
        if (check_id(t, t->suffix[k] = (int32_t)rd32(p + 88 + 4 * k), 0, "suffix id", err, errlen)) return -1;
    /* chat format */
    ZayaChatFormat *c = &t->chat;
    c->family = (int)(rd32(p + 104) & 0xFF);
    c->flags = rd32(p + 108);
    if (rd32(p + 104) > ZAYA_CHAT_GEMMA || rd32(p + 112) > ZAYA_TOK_MAX_STOP || c->flags > 7)
        return fail(err, errlen, "tokenizer section: bad chat format (family %u, flags %u, %u stop ids)",
                    rd32(p + 104), c->flags, rd32(p + 112));
    c->n_stop = (int)rd32(p + 112);
    for (int k = 0; k < c->n_stop; k++)
        if (check_id(t, c->stop[k] = (int32_t)rd32(p + 116 + 4 * k), 0, "stop id", err, errlen)) return -1;
    ZayaTokStr *cs[8] = {&c->begin, &c->turn_start, &c->role_end, &c->turn_end, &c->user_role, &c->assistant_role,
                         &c->system_role, &c->think_off};
    for (int k = 0; k < 8; k++) {
        uint32_t off = rd32(p + 148 + 8 * k), len = rd32(p + 152 + 8 * k);
        if (off > t->strings_len || len > t->strings_len - off)
            return fail(err, errlen, "tokenizer section: chat string %d (%u+%u) outside the %zu-byte pool", k, off,
                        len, t->strings_len);
        cs[k]->s = (const char *)t->strings + off;
        cs[k]->len = len;
    }

    /* derived tables: ASCII chars after the normalizer (' ' -> U+2581), first bytes of added tokens */
    for (int ch = 0; ch < 128; ch++) {
        unsigned char b = (unsigned char)ch;
        t->ascii_ids[ch] = ch == ' ' ? piece_lookup(t, (const unsigned char *)"\xE2\x96\x81", 3)
                                     : piece_lookup(t, &b, 1);
    }
    const uint32_t *root = t->trie_nodes;
    for (uint32_t e = root[0]; e < root[0] + root[1]; e++) t->added_first[t->trie_edges[2 * (size_t)e + 1]] = 1;
    return 0;
}

void zaya_tok_free(ZayaTokenizer *t) {
    if (t) memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------------------------------------------ */
/* encode                                                                                            */

typedef struct { int id, prev, next; } Symbol;            /* HF bpe::word::Symbol (id -1 = merged away) */
typedef struct { uint32_t rank, pos, new_id; } Candidate; /* HF bpe::word::Merge */

typedef struct {
    int *ids;               /* output */
    size_t n, cap;
    Symbol *sym;            /* symbols of the current word */
    size_t sym_cap;
    Candidate *heap;        /* min-heap by (rank, pos) */
    size_t heap_n, heap_cap;
    int oom;
} Encoder;

static void emit(Encoder *e, int id) {
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 64;
        int *ids = realloc(e->ids, cap * sizeof *ids);
        if (!ids) { e->oom = 1; return; }
        e->ids = ids;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
}

static int cand_less(const Candidate *a, const Candidate *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_sift_down(Candidate *h, size_t n, size_t i) {
    Candidate x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heap_push(Encoder *e, uint32_t rank, uint32_t pos, uint32_t new_id) {
    if (e->heap_n == e->heap_cap) {
        size_t cap = e->heap_cap ? 2 * e->heap_cap : 256;
        Candidate *h = realloc(e->heap, cap * sizeof *h);
        if (!h) { e->oom = 1; return; }
        e->heap = h;
        e->heap_cap = cap;
    }
    Candidate x = {rank, pos, new_id};
    size_t i = e->heap_n++;
    while (i > 0 && cand_less(&x, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = x;
}

static Candidate heap_pop(Encoder *e) {
    Candidate top = e->heap[0];
    e->heap[0] = e->heap[--e->heap_n];
    if (e->heap_n) heap_sift_down(e->heap, e->heap_n, 0);
    return top;
}

/* pushes the merge candidate of symbols (left, left.next), if that pair has a merge */
static void push_pair(const ZayaTokenizer *t, Encoder *e, int left) {
    int right = e->sym[left].next;
    if (right < 0) return;
    const uint32_t *m = merge_lookup(t, (uint32_t)e->sym[left].id, (uint32_t)e->sym[right].id);
    if (m) heap_push(e, m[2], (uint32_t)left, m[3]);
}

/* One word through the BPE model (HF models::bpe::BPE::tokenize -> merge_word + Word::merge_all).
 * The word is a stretch of text between added tokens; the normalizer's ' ' -> U+2581 is applied here,
 * char by char, and the pre-tokenizer has nothing left to split, so the stretch is one word. */
static void bpe_word(const ZayaTokenizer *t, Encoder *e, const unsigned char *s, size_t n) {
    if (!n) return;
    /* at most one symbol per byte, except a ' ' that falls back to the 3 bytes of U+2581 */
    size_t need = t->ascii_ids[' '] >= 0 ? n : 3 * n;
    if (e->sym_cap < need) {
        Symbol *sym = realloc(e->sym, need * sizeof *sym);
        if (!sym) { e->oom = 1; return; }
        e->sym = sym;
        e->sym_cap = need;
    }
    /* 1. initial symbols, one per char (HF merge_word): the vocab piece of the char, else its bytes as
     *    <0xNN> tokens (byte_fallback), else <unk> (consecutive unknown chars fused when fuse_unk) */
    int nsym = 0, unk_pending = 0;
    #define ADD_SYMBOL(ID) do { e->sym[nsym].id = (ID); e->sym[nsym].prev = nsym - 1; \
                                e->sym[nsym].next = nsym + 1; nsym++; } while (0)
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t clen = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;    /* input is valid UTF-8 */
        int id = c < 0x80 ? t->ascii_ids[c] : piece_lookup(t, s + i, clen);
        if (id >= 0) {
            if (unk_pending) { ADD_SYMBOL(t->unk); unk_pending = 0; }
            ADD_SYMBOL(id);
        } else {
            const unsigned char *b = c == ' ' ? (const unsigned char *)"\xE2\x96\x81" : s + i;
            size_t blen = c == ' ' ? 3 : clen, k = 0;
            if (t->byte_fallback)
                while (k < blen && t->byte_ids[b[k]] >= 0) k++;
            if (t->byte_fallback && k == blen) {
                for (k = 0; k < blen; k++) ADD_SYMBOL(t->byte_ids[b[k]]);   /* HF: does not flush a pending unk */
            } else if (t->unk >= 0) {
                if (unk_pending && !t->fuse_unk) ADD_SYMBOL(t->unk);
                unk_pending = 1;
            }
        }
        i += clen;
    }
    if (unk_pending) ADD_SYMBOL(t->unk);
    #undef ADD_SYMBOL
    if (!nsym) return;
    e->sym[nsym - 1].next = -1;

    /* 2. every adjacent pair with a merge goes into a min-heap ordered by (rank, position) */
    e->heap_n = 0;
    for (int i = 0; i + 1 < nsym; i++) {
        const uint32_t *m = merge_lookup(t, (uint32_t)e->sym[i].id, (uint32_t)e->sym[i + 1].id);
        if (!m) continue;
        if (e->heap_n == e->heap_cap) { heap_push(e, m[2], (uint32_t)i, m[3]); continue; }   /* grows the heap */
        e->heap[e->heap_n++] = (Candidate){m[2], (uint32_t)i, m[3]};
    }
    if (e->oom) return;
    for (size_t i = e->heap_n / 2; i-- > 0;) heap_sift_down(e->heap, e->heap_n, i);

    /* 3. HF Word::merge_all: pop the lowest (rank, pos); skip it if stale (left symbol merged away,
     *    no right neighbour, or the pair there now has another result); else merge right into left and
     *    push the new pairs with the left and right neighbours. */
    while (e->heap_n && !e->oom) {
        Candidate top = heap_pop(e);
        Symbol *l = &e->sym[top.pos];
        if (l->id < 0 || l->next < 0) continue;
        Symbol *r = &e->sym[l->next];
        const uint32_t *m = merge_lookup(t, (uint32_t)l->id, (uint32_t)r->id);
        if (!m || m[3] != top.new_id) continue;
        l->id = (int)top.new_id;
        l->next = r->next;
        r->id = -1;
        if (l->next >= 0) e->sym[l->next].prev = (int)top.pos;
        if (l->prev >= 0) push_pair(t, e, l->prev);
        push_pair(t, e, (int)top.pos);
    }
    /* 4. emit the remaining symbols (symbol 0 is never merged away) */
    for (int i = 0; i >= 0; i = e->sym[i].next) emit(e, e->sym[i].id);
}

/* Lossy UTF-8 (Python bytes.decode("utf-8", "replace"), Rust String::from_utf8_lossy): each maximal
 * invalid subpart becomes U+FFFD. Returns a malloc'ed copy, *out_len bytes. */
static unsigned char *utf8_lossy(const unsigned char *s, size_t n, size_t *out_len) {
    unsigned char *out = malloc(3 * n + 1), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        size_t sub, k = utf8_seq(s + i, n - i, &sub);
        if (k) { memcpy(o, s + i, k); o += k; i += k; }
        else { memcpy(o, REPLACEMENT, 3); o += 3; i += sub; }
    }
    *out_len = (size_t)(o - out);
    return out;
}

/* longest added token starting at s (HF AddedVocabulary's aho-corasick, LeftmostLongest): its length
 * in bytes (0 = none) and *id */
static size_t match_added(const ZayaTokenizer *t, const unsigned char *s, size_t n, int *id) {
    uint32_t node = 0;
    size_t best = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t *nd = t->trie_nodes + 3 * (size_t)node;
        const uint32_t *edges = t->trie_edges + 2 * (size_t)nd[0];
        uint32_t lo = 0, hi = nd[1];              /* binary search of the sorted edges */
        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;
            if (edges[2 * mid + 1] < s[i]) lo = mid + 1; else hi = mid;
        }
        if (lo == nd[1] || edges[2 * lo + 1] != s[i]) break;
        node = edges[2 * lo];
        int32_t tid = (int32_t)t->trie_nodes[3 * (size_t)node + 2];
        if (tid >= 0) { best = i + 1; *id = tid; }
    }
    return best;
}

int zaya_tok_encode(const ZayaTokenizer *t, const char *text, size_t len, int add_special_tokens,
                    int **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (len > MAX_INPUT || (!text && len)) return -1;
    Encoder e = {0};
    const unsigned char *s = (const unsigned char *)(text ? text : "");
    unsigned char *repaired = NULL;
    /* 0. invalid UTF-8 -> U+FFFD (HF takes a Rust &str, which is always valid) */
    if (!utf8_valid(s, len)) {
        if (!(repaired = utf8_lossy(s, len, &len))) return -1;
        s = repaired;
    }
    /* 1. post-processor (TemplateProcessing): the ids before the text */
    if (add_special_tokens)
        for (int k = 0; k < t->n_prefix; k++) emit(&e, t->prefix[k]);
    /* 2. added tokens first, in the raw text (HF AddedVocabulary::extract_and_normalize): the leftmost
     *    match, longest at that position, anywhere (inside words too); every stretch between matches
     *    goes to the normalizer + BPE as one word */
    size_t start = 0;
    for (size_t i = 0; i < len && !e.oom;) {
        int id;
        size_t m = t->added_first[s[i]] ? match_added(t, s + i, len - i, &id) : 0;
        if (!m) { i++; continue; }
        bpe_word(t, &e, s + start, i - start);
        emit(&e, id);
        i += m;
        start = i;
    }
    bpe_word(t, &e, s + start, len - start);
    /* 3. post-processor: the ids after the text */
    if (add_special_tokens)
        for (int k = 0; k < t->n_suffix; k++) emit(&e, t->suffix[k]);
    if (!e.ids && !e.oom) emit(&e, 0), e.n = 0;       /* always return an array */
    free(e.sym);
    free(e.heap);
    free(repaired);
    if (e.oom) { free(e.ids); return -1; }
    *ids = e.ids;
    *n_ids = e.n;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* decode                                                                                            */

/* Writes a finished byte run (HF decoders::ByteFallback): its bytes if they are valid UTF-8, else one
 * U+FFFD per byte. Returns the end of the written text. */
static char *flush_run(char *o, const unsigned char *run, size_t n) {
    if (utf8_valid(run, n)) {
        if (n) memmove(o, run, n);
        return o + n;
    }
    for (size_t i = 0; i < n; i++, o += 3) memcpy(o, REPLACEMENT, 3);
    return o;
}

/* the token of id as the decoder sees it: 0 = skipped, 1 = byte token (*byte), 2 = text */
static int classify(const ZayaTokenizer *t, int id, int skip_special, unsigned char *byte) {
    if (!has_token(t, id)) return 0;                               /* HF: ids with no token are dropped */
    uint32_t fl = t->tokens[4 * (size_t)id + 3];
    if (skip_special && (fl & F_SKIP)) return 0;
    if (fl & F_BYTE) { *byte = (unsigned char)(fl >> 8); return 1; }
    return 2;
}

char *zaya_tok_decode(const ZayaTokenizer *t, const int *ids, size_t n, int skip_special_tokens, size_t *len) {
    size_t bound = 1;
    unsigned char b;
    for (size_t i = 0; i < n; i++) {                                /* pass 1: output size bound */
        int k = classify(t, ids[i], skip_special_tokens, &b);
        size_t tl;
        if (k == 1) bound += 3;
        else if (k == 2) { tok_text(t, ids[i], &tl); bound += tl; }
    }
    char *out = malloc(bound), *o = out;
    if (!out) return NULL;
    /* pass 2: texts concatenated (Fuse) with U+2581 -> ' ' (Replace, precomputed); byte runs are
     * collected in place at the output position and converted when a non-byte token ends them */
    char *run = NULL;
    for (size_t i = 0; i < n; i++) {
        int k = classify(t, ids[i], skip_special_tokens, &b);
        if (k == 1) {
            if (!run) run = o;
            *o++ = (char)b;
        } else if (k == 2) {
            if (run) { o = flush_run(run, (unsigned char *)run, (size_t)(o - run)); run = NULL; }
            size_t tl;
            const unsigned char *txt = tok_text(t, ids[i], &tl);
            memcpy(o, txt, tl);
            o += tl;
        }
    }
    if (run) o = flush_run(run, (unsigned char *)run, (size_t)(o - run));
    *o = 0;
    if (len) *len = (size_t)(o - out);
    return out;
}

/* streaming decode */

void zaya_tok_stream_init(ZayaTokStream *s, const ZayaTokenizer *t, int skip_special_tokens) {
    memset(s, 0, sizeof *s);
    s->t = t;
    s->skip_special = skip_special_tokens;
}

static int stream_reserve(ZayaTokStream *s, size_t need) {
    if (need <= s->out_cap) return 0;
    size_t cap = need < 256 ? 256 : need * 2;
    char *o = realloc(s->out, cap);
    if (!o) return -1;
    s->out = o;
    s->out_cap = cap;
    return 0;
}

const char *zaya_tok_stream_push(ZayaTokStream *s, int id, size_t *len) {
    unsigned char b;
    *len = 0;
    int k = classify(s->t, id, s->skip_special, &b);
    if (stream_reserve(s, 1)) return NULL;
    if (k == 0) { s->out[0] = 0; return s->out; }
    if (k == 1) {                                   /* hold the byte until the run ends */
        if (s->run_len == s->run_cap) {
            size_t cap = s->run_cap ? 2 * s->run_cap : 16;
            unsigned char *r = realloc(s->run, cap);
            if (!r) return NULL;
            s->run = r;
            s->run_cap = cap;
        }
        s->run[s->run_len++] = b;
        s->out[0] = 0;
        return s->out;
    }
    size_t tl;
    const unsigned char *txt = tok_text(s->t, id, &tl);
    if (stream_reserve(s, 3 * s->run_len + tl + 1)) return NULL;
    char *o = flush_run(s->out, s->run, s->run_len);
    s->run_len = 0;
    memcpy(o, txt, tl);
    o += tl;
    *o = 0;
    *len = (size_t)(o - s->out);
    return s->out;
}

const char *zaya_tok_stream_flush(ZayaTokStream *s, size_t *len) {
    *len = 0;
    if (stream_reserve(s, 3 * s->run_len + 1)) return NULL;
    char *o = flush_run(s->out, s->run, s->run_len);
    s->run_len = 0;
    *o = 0;
    *len = (size_t)(o - s->out);
    return s->out;
}

void zaya_tok_stream_free(ZayaTokStream *s) {
    free(s->run);
    free(s->out);
    memset(s, 0, sizeof *s);
}

/* ------------------------------------------------------------------------------------------------ */
/* accessors                                                                                         */

const char *zaya_tok_piece(const ZayaTokenizer *t, int id, size_t *len) {
    if (!has_token(t, id)) { if (len) *len = 0; return NULL; }
    const uint32_t *row = t->tokens + 4 * (size_t)id;
    if (len) *len = row[2] & 0xFFFF;
    return (const char *)t->strings + row[0];
}

int zaya_tok_is_special(const ZayaTokenizer *t, int id) { return has_token(t, id) && (tok_flags(t, id) & F_SKIP); }

int zaya_tok_is_stop(const ZayaTokenizer *t, int id) {
    for (int k = 0; k < t->chat.n_stop; k++)
        if (t->chat.stop[k] == id) return 1;
    return 0;
}

int zaya_tok_lookup(const ZayaTokenizer *t, const char *piece, size_t len) {
    int id;
    const unsigned char *s = (const unsigned char *)piece;
    if (t->n_nodes && match_added(t, s, len, &id) == len && len) return id;    /* added tokens first */
    return piece_lookup(t, s, len);
}

/* ------------------------------------------------------------------------------------------------ */
/* chat                                                                                              */

typedef struct { char *p; size_t n, cap; int oom; } Buf;

static void put(Buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void put_str(Buf *b, ZayaTokStr s) { put(b, s.s, s.len); }

static char *finish(Buf *b, size_t *len) {
    put(b, "", 0);
    if (b->oom) { free(b->p); return NULL; }
    if (len) *len = b->n;
    return b->p;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static const char *find(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, pat, m)) return s + i;
    return NULL;
}

static const char *find_last(const char *s, size_t n, const char *pat) {
    size_t m = strlen(pat);
    for (size_t i = n + 1; i-- > 0;)
        if (i + m <= n && !memcmp(s + i, pat, m)) return s + i;
    return NULL;
}

/* the role as the template writes it */
static ZayaTokStr role_name(const ZayaTokenizer *t, const char *role) {
    if (!strcmp(role, "assistant")) return t->chat.assistant_role;
    return (ZayaTokStr){role, strlen(role)};
}

static void put_turn(const ZayaTokenizer *t, Buf *b, const char *role, const char *prefix, size_t plen,
                     const char *content, size_t clen) {
    put_str(b, t->chat.turn_start);
    put_str(b, role_name(t, role));
    put_str(b, t->chat.role_end);
    put(b, prefix, plen);
    put(b, content, clen);
    put_str(b, t->chat.turn_end);
}

char *zaya_tok_chat_turn(const ZayaTokenizer *t, const char *role, const char *content, size_t *len) {
    Buf b = {0};
    if (t->chat.family == ZAYA_CHAT_NONE) return NULL;
    put_turn(t, &b, role, "", 0, content, strlen(content));
    return finish(&b, len);
}

char *zaya_tok_chat_generation_prompt(const ZayaTokenizer *t, int enable_thinking, size_t *len) {
    Buf b = {0};
    if (t->chat.family == ZAYA_CHAT_NONE) return NULL;
    put_str(&b, t->chat.turn_start);
    put_str(&b, t->chat.assistant_role);
    put_str(&b, t->chat.role_end);
    if (!enable_thinking) put_str(&b, t->chat.think_off);
    return finish(&b, len);
}

char *zaya_tok_chat_render(const ZayaTokenizer *t, const ZayaChatMessage *msgs, int n,
                           int add_generation_prompt, int enable_thinking, size_t *len) {
    const ZayaChatFormat *c = &t->chat;
    Buf b = {0};
    if (c->family == ZAYA_CHAT_NONE) return NULL;
    put_str(&b, c->begin);
    int first = 0, last_user = -1;
    const char *sys = NULL;
    if ((c->flags & 2) && n > 0 && !strcmp(msgs[0].role, "system")) { sys = msgs[0].content; first = 1; }
    for (int i = first; i < n; i++)
        if (!strcmp(msgs[i].role, "user")) last_user = i;
    for (int i = first; i < n; i++) {
        const char *content = msgs[i].content;
        size_t clen = strlen(content);
        if (c->flags & 1) {                                     /* Jinja | trim */
            while (clen && is_space(*content)) content++, clen--;
            while (clen && is_space(content[clen - 1])) clen--;
        }
        if ((c->flags & 4) && !strcmp(msgs[i].role, "assistant")) {
            /* Qwen3-like: content.split('</think>')[-1].lstrip('\n'); the reasoning
             * content.split('</think>')[0].split('<think>')[-1].strip('\n') is kept only after the last
             * user turn */
            const char *end = find(content, clen, "</think>");
            const char *rs = content, *re = content;
            if (end) {
                const char *open = find_last(content, (size_t)(end - content), "<think>");
                rs = open ? open + 7 : content;
                re = end;
                while (rs < re && *rs == '\n') rs++;
                while (re > rs && re[-1] == '\n') re--;
                const char *after = find_last(content, clen, "</think>") + 8;
                clen -= (size_t)(after - content);
                content = after;
                while (clen && *content == '\n') content++, clen--;
            }
            put_str(&b, c->turn_start);
            put_str(&b, c->assistant_role);
            put_str(&b, c->role_end);
            if (i > last_user && re > rs) {
                put(&b, "<think>\n", 8);
                put(&b, rs, (size_t)(re - rs));
                put(&b, "\n</think>\n\n", 11);
            }
            put(&b, content, clen);
            put_str(&b, c->turn_end);
            continue;
        }
        const char *prefix = "";
        size_t plen = 0;
        char *tmp = NULL;
        if (sys && i == first) {                                /* Gemma: system prompt + "\n\n" */
            plen = strlen(sys) + 2;
            if (!(tmp = malloc(plen + 1))) { b.oom = 1; break; }
            memcpy(tmp, sys, plen - 2);
            memcpy(tmp + plen - 2, "\n\n", 3);
            prefix = tmp;
        }
        put_turn(t, &b, msgs[i].role, prefix, plen, content, clen);
        free(tmp);
    }
    if (add_generation_prompt) {
        put_str(&b, c->turn_start);
        put_str(&b, c->assistant_role);
        put_str(&b, c->role_end);
        if (!enable_thinking) put_str(&b, c->think_off);
    }
    return finish(&b, len);
}
