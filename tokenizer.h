/* tokenizer.h - Hugging Face-exact tokenizer of ZAYA1-8B (the Gemma 3 vocabulary), C11, libc only.
 *
 * The tokenizer lives in a read-only section of the model blob, written by export_tokenizer.py
 * (format: the docstring of export_tokenizer.py). zaya_tok_load() validates the section and points
 * into it; nothing is parsed or copied, so loading takes a few milliseconds.
 *
 *   encode   zaya_tok_encode()   = HF Tokenizer.encode(text, add_special_tokens).ids / tokenizer(text)
 *   decode   zaya_tok_decode()   = HF Tokenizer.decode(ids, skip_special_tokens)
 *   stream   zaya_tok_stream_*() = decode for generation: text that is safe to print after each id;
 *                                  the concatenation equals zaya_tok_decode() of all ids
 *   chat     zaya_tok_chat_*()   = the chat template's turn format (ChatML or Gemma), rendered to text
 *                                  that is then encoded with add_special_tokens = 0 (the text already
 *                                  starts with "<bos>")
 *
 * Texts are byte strings with an explicit length (NULs allowed). Encode accepts invalid UTF-8: each
 * maximal invalid subsequence becomes U+FFFD first, exactly like Python's
 * bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy (HF itself only ever sees valid
 * strings). Decode returns UTF-8 (invalid byte-fallback runs become U+FFFD, as HF does).
 *
 * Thread safety: a loaded ZayaTokenizer is read-only; any number of threads may encode/decode with it.
 * There is no global state.
 */
#ifndef ZAYA_TOKENIZER_H
#define ZAYA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

enum { ZAYA_CHAT_NONE = 0, ZAYA_CHAT_CHATML = 1, ZAYA_CHAT_GEMMA = 2 };
enum { ZAYA_TOK_MAX_STOP = 8 };

typedef struct {
    const char *s;          /* not NUL-terminated: points into the section */
    size_t len;             /* bytes */
} ZayaTokStr;

/* The chat turn format recognised from tokenizer_config.json's chat_template. A turn is
 * turn_start + role + role_end + content + turn_end; a conversation starts with `begin`. */
typedef struct {
    int family;             /* ZAYA_CHAT_NONE / _CHATML / _GEMMA */
    unsigned flags;         /* 1 trim content, 2 system prompt goes into the first user turn (Gemma),
                               4 drop the reasoning (<think>...</think>) of earlier assistant turns */
    ZayaTokStr begin;       /* "<bos>" */
    ZayaTokStr turn_start;  /* "<|im_start|>" or "<start_of_turn>" */
    ZayaTokStr role_end;    /* "\n" */
    ZayaTokStr turn_end;    /* "<|im_end|>\n" or "<end_of_turn>\n" */
    ZayaTokStr user_role, assistant_role, system_role;  /* "user", "assistant" / "model", "system" / "" */
    ZayaTokStr think_off;   /* "<think>\n</think>\n\n" appended to the generation prompt when thinking
                               is off ("" if the template has no enable_thinking switch) */
    int n_stop;
    int stop[ZAYA_TOK_MAX_STOP];   /* generation stops on these ids (<|im_end|>, <eos>) */
} ZayaChatFormat;

typedef struct ZayaTokenizer ZayaTokenizer;

/* Fields are read-only after zaya_tok_load(); use the functions below rather than the pointers. */
struct ZayaTokenizer {
    int n_tokens;           /* max id + 1 (262147 for ZAYA1); ids below it may still have no token */
    int n_vocab, n_merges, n_added;
    int bos, eos, pad, unk; /* -1 = none */
    int byte_fallback, fuse_unk;
    int n_prefix, prefix[4], n_suffix, suffix[4];   /* what add_special_tokens puts around the ids */
    ZayaChatFormat chat;
    /* views into the section */
    const uint32_t *tokens;         /* 4 u32 per id: piece off, text off, lens, flags | byte << 8 */
    const unsigned char *strings;
    size_t strings_len;
    const uint32_t *piece_hash;     /* BPE vocab by piece bytes */
    uint32_t piece_mask;
    const uint32_t *merge_hash;     /* 4 u32 per slot: left, right, rank, merged id */
    uint32_t merge_mask;
    const uint32_t *trie_nodes;     /* 3 u32 per node: first edge, edge count, token id (or -1) */
    const uint32_t *trie_edges;     /* 2 u32 per edge: child, byte */
    uint32_t n_nodes, n_edges;
    int byte_ids[256];              /* "<0xNN>" ids for byte fallback, -1 = none */
    int ascii_ids[128];             /* BPE id of each ASCII char after normalization (' ' -> "\u2581") */
    unsigned char added_first[256]; /* 1 if an added token starts with this byte */
};

/* Validates the section (size bytes at `section`, 8-byte aligned, e.g. inside a read-only mmap) and
 * points t into it; the memory must outlive t. Everything is checked (magic, version, size, Adler-32,
 * every offset, count, string and id) so a corrupted file gives an error, never a crash or a hang.
 * Returns 0, or -1 with a message in err (what, where, expected vs found, hint). */
int zaya_tok_load(ZayaTokenizer *t, const void *section, size_t size, char *err, size_t errlen);

/* The checksum a section's header holds at byte 24: zlib's Adler-32 of bytes 32..size-1 (size >= 32).
 * What zaya_tok_load verifies; tools that edit a section (the fuzzer, test_tokenizer.c) re-seal it with this. */
uint32_t zaya_tok_checksum(const void *section, size_t size);

/* Releases what zaya_tok_load allocated (nothing today; the section is not owned). */
void zaya_tok_free(ZayaTokenizer *t);

/* HF Tokenizer.encode(text, add_special_tokens).ids: added tokens matched first (leftmost-longest, in
 * the raw text), then ' ' -> U+2581, then BPE with byte fallback; add_special_tokens != 0 puts the
 * post-processor's ids around the result (ZAYA1: <bos> ... <|im_end|>). text: len bytes, any bytes
 * (invalid UTF-8 -> U+FFFD, see above). On success *ids is a malloc'ed array of *n_ids ids (free it)
 * and 0 is returned; -1 on out of memory or len > 256 MB (then *ids = NULL, *n_ids = 0). */
int zaya_tok_encode(const ZayaTokenizer *t, const char *text, size_t len, int add_special_tokens,
                    int **ids, size_t *n_ids);

/* HF Tokenizer.decode(ids, skip_special_tokens): ids without a token (negative, >= n_tokens, holes)
 * are skipped; skip_special_tokens drops tokens flagged special; U+2581 -> ' ' in every token; a run
 * of byte tokens <0xNN> becomes its bytes if valid UTF-8, else one U+FFFD per byte of the run.
 * Returns a malloc'ed NUL-terminated string (free it) of *len bytes (len may be NULL), or NULL on
 * out of memory. */
char *zaya_tok_decode(const ZayaTokenizer *t, const int *ids, size_t n, int skip_special_tokens, size_t *len);

/* Streaming decode for generation. push() returns the text that can be printed once `id` is known:
 * never half a UTF-8 character; a run of byte tokens is held until a non-byte token or flush() ends
 * it (an invalid byte later in the run turns the whole run into U+FFFD, as in decode()). The returned
 * pointer is valid until the next call on s; it is never NULL except on out of memory; *len = bytes.
 * Concatenating every push() and the final flush() gives exactly zaya_tok_decode(all ids). */
typedef struct {
    const ZayaTokenizer *t;
    int skip_special;
    unsigned char *run;     /* pending byte-fallback run */
    size_t run_len, run_cap;
    char *out;
    size_t out_cap;
} ZayaTokStream;

void zaya_tok_stream_init(ZayaTokStream *s, const ZayaTokenizer *t, int skip_special_tokens);
const char *zaya_tok_stream_push(ZayaTokStream *s, int id, size_t *len);
const char *zaya_tok_stream_flush(ZayaTokStream *s, size_t *len);
void zaya_tok_stream_free(ZayaTokStream *s);

/* Accessors. piece: the token string of id as in tokenizer.json (HF id_to_token; U+2581 kept, not
 * NUL-terminated), NULL if id has no token. */
const char *zaya_tok_piece(const ZayaTokenizer *t, int id, size_t *len);
int zaya_tok_is_special(const ZayaTokenizer *t, int id);  /* 1 if skip_special_tokens drops it */
int zaya_tok_is_stop(const ZayaTokenizer *t, int id);     /* 1 if id is one of chat.stop */
int zaya_tok_lookup(const ZayaTokenizer *t, const char *piece, size_t len); /* HF token_to_id, -1 none */

/* Chat rendering (the text is then encoded with add_special_tokens = 0). Each returns a malloc'ed
 * NUL-terminated string (*len bytes, len may be NULL), or NULL when the section has no chat format
 * or on out of memory. Roles: "system", "user", "assistant" (rendered as chat.assistant_role), any
 * other role is written as given. */
typedef struct {
    const char *role;
    const char *content;    /* NUL-terminated UTF-8 */
} ZayaChatMessage;

/* apply_chat_template(messages, add_generation_prompt, enable_thinking): begin + the turns (+ the
 * generation prompt). ChatML: the reasoning of assistant turns before the last user turn is dropped;
 * Gemma: a leading system message is put in front of the first user turn, contents are trimmed. */
char *zaya_tok_chat_render(const ZayaTokenizer *t, const ZayaChatMessage *msgs, int n,
                           int add_generation_prompt, int enable_thinking, size_t *len);
/* One turn: turn_start + role + role_end + content + turn_end (no begin, no reasoning removal). */
char *zaya_tok_chat_turn(const ZayaTokenizer *t, const char *role, const char *content, size_t *len);
/* The generation prompt: turn_start + assistant_role + role_end (+ think_off if !enable_thinking). */
char *zaya_tok_chat_generation_prompt(const ZayaTokenizer *t, int enable_thinking, size_t *len);

#endif
