/* main.c - the zaya command line: generation, chat, sampling; --dump (dump.c), --kld-base (kld.c), --replay
 * (replay.c), --trace (trace.c), --encode/--decode.
 *
 *   ./zaya MODEL.bin -i "text" [-n 256] [-t 1.0] [-p 0.9] [-s seed] [-m generate|chat] ...
 *
 * Every mode runs the model through zaya_forward() (zaya.c), --replay through zaya_replay_layer().
 * ./zaya --help lists the options.
 */
#define _POSIX_C_SOURCE 200809L
#include "zaya.h"
#include "tokenizer.h"
#include "trace.h"
#include "kernels.h"   /* softmax (the sampler), the pool's counts */
#include "dump.h"
#include "replay.h"
#include "kld.h"
#include "image.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Prints "zaya: error: ..." and exits with status 1: only main() and its helpers end the program. */
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("zaya: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* ---- sampling (llama2.c style: xorshift RNG, temperature, top-p) ---- */

static uint32_t random_u32(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return (uint32_t)((*state * 0x2545F4914F6CDD1Dull) >> 32);
}
static float random_f32(uint64_t *state) { return (random_u32(state) >> 8) / 16777216.0f; }

typedef struct { float p; int id; } ProbIndex;
/* Sorts a[0..m) by probability, largest first, equal probabilities by lower id first (a[] arrives
 * in id order). An LSD radix sort, 8 bits a pass, on the float's bit pattern, which orders positive
 * floats like their values; each pass is stable, so ties keep their id order. O(m) where qsort was
 * O(m log m): a flat distribution keeps nearly all 262,144 tokens above the top-p cutoff. Uses tmp
 * (m entries); the result ends in a (four passes). */
static void sort_prob_desc(ProbIndex *a, ProbIndex *tmp, int m) {
    for (int shift = 0; shift < 32; shift += 8) {
        size_t start[257] = {0};   /* digit 255 - byte, so larger bytes come first */
        uint32_t bits;
        for (int i = 0; i < m; i++) { memcpy(&bits, &a[i].p, 4); start[1 + 255 - ((bits >> shift) & 255)]++; }
        for (int k = 0; k < 256; k++) start[k + 1] += start[k];
        for (int i = 0; i < m; i++) { memcpy(&bits, &a[i].p, 4); tmp[start[255 - ((bits >> shift) & 255)]++] = a[i]; }
        ProbIndex *t = a; a = tmp; tmp = t;
    }
}

/* Picks the next token from logits[0..n): n is the tokenizer's size, so ids the tokenizer cannot
 * print (embedding padding rows) are never chosen. temperature 0 = greedy (ties: lowest id).
 * scratch: 2n entries (candidates, and the sort's second buffer). */
static int sample(float *logits, int n, float temperature, float topp, uint64_t *rng, ProbIndex *scratch) {
    if (temperature == 0.0f) {
        int best = 0;
        for (int i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    for (int i = 0; i < n; i++) logits[i] /= temperature;
    softmax(logits, n);
    float r = random_f32(rng);
    if (topp <= 0.0f || topp >= 1.0f) {
        float cdf = 0.0f;
        for (int i = 0; i < n; i++) { cdf += logits[i]; if (r < cdf) return i; }
        return n - 1;
    }
    /* top-p: the smallest set of most likely tokens whose probability reaches topp */
    int m = 0;
    const float cutoff = (1.0f - topp) / (float)(n - 1);   /* tokens below this can never be in the set */
    for (int i = 0; i < n; i++) if (logits[i] >= cutoff) scratch[m++] = (ProbIndex){logits[i], i};
    sort_prob_desc(scratch, scratch + n, m);
    float cum = 0.0f;
    int last = m - 1;
    for (int i = 0; i < m; i++) { cum += scratch[i].p; if (cum > topp) { last = i; break; } }
    r *= cum;
    float cdf = 0.0f;
    for (int i = 0; i <= last; i++) { cdf += scratch[i].p; if (r < cdf) return scratch[i].id; }
    return scratch[last].id;
}

/* ---- arguments ---- */

static void usage(FILE *f) {
    fputs("usage: zaya MODEL.bin [options]\n"
          "\n"
          "Generate (default):\n"
          "  -i TEXT            prompt text (encoded as <bos> + text, like the HF fixture prompts)\n"
          "  --ids 2,818,...    prompt as token ids instead of text\n"
          "  -n N               tokens to generate (default 256; 0 with --dump)\n"
          "  -t T               temperature, 0 = greedy (default 1.0)\n"
          "  -p P               top-p (default 0.9)\n"
          "  -s SEED            random seed (default: time)\n"
          "  --print-ids        print generated ids comma-separated instead of text\n"
          "  -m generate|chat   mode (default generate)\n"
          "  -y TEXT            system prompt for chat\n"
          "  --image PATH       ZAYA1-VL: a PNG or PPM image before the text of -i (or chat's first message);\n"
          "                     with --ids, the ids must hold one image token per image feature\n"
          "  --no-think         chat: ask for an answer without a thinking block\n"
          "Model options:\n"
          "  --skip-expert zero|passthrough   skip-expert output: upstream zero (default) or Zyphra fork\n"
          "  --precision fp32|bf16|bf16-torch1.13   round as the official run in float32 (default) or loaded in\n"
          "                     bfloat16 (current torch; torch 1.13, the fixtures' torch); docs/bf16.md\n"
          "                     bf16[+fp32-residual][+fp32-norm][+fp32-logits]: other engines' placements (vLLM:\n"
          "                     bf16+fp32-residual+fp32-norm; +fp32-logits its fp32 LM head)\n"
          "                     fp32+ggml: a GGUF's blob computed as ggml's CPU backend does (activations quantized\n"
          "                     per weight type before each product; +ggml-ref: ggml's reference Q8_0; +ggml-kv-f16:\n"
          "                     its F16 KV cache; +ggml-fa: its flash attention; +ggml-conv, +ggml-gelu: llama.cpp ZAYA\n"
          "                     port's F16 conv, tanh GELU)\n"
          "  --ctx N            context length (default min(4096, max_position_embeddings))\n"
          "  --threads N        threads (default: the cores this process may use; results are identical for any number)\n"
          "  --batch N          prompt tokens per batch, 1..256 (default 256; results are identical)\n"
          "  --verify           check every tensor's CRC-32 at load\n"
          "  --hugepages        copy the weights into huge-page memory at load (the default reads a blob that\n"
          "                     fits in RAM in at load, in 2 MB pages where the kernel can: as fast, no copy)\n"
          "  --mmap             leave the weights in the file, read as they are first used (no read-in at load)\n"
          "Inspection:\n"
          "  --dump DIR         write every intermediate tensor (HF module paths) as .npy + index.json,\n"
          "                     streamed as the model runs (index.json last: it marks the dump complete)\n"
          "  --dump F.safetensors  the same tensors in one safetensors file (index.json's fields in __metadata__)\n"
          "                     ZAYA1-VL with --image: the vision tower's tensors (model.visual.*) first, and\n"
          "                     index.json's image_positions: the positions that take the image features\n"
          "  --dump-filter RE   only tensors whose name matches the POSIX extended regex RE\n"
          "  --list-taps        print the names and shapes of all tensors --dump writes\n"
          "  --dump-vision DIR  ZAYA1-VL: the vision tower's tensors of --image alone, as DIR/NAME.npy (HF module\n"
          "                     paths, [rows, cols] in the row order HF holds them: window order in the blocks)\n"
          "  --replay PORT_DUMP with --dump OUT: every layer recomputed from the port's own input to it (the\n"
          "                     residual stream its dump holds); compare.py --local PORT_DUMP OUT says where\n"
          "                     an error enters (docs/compare.md)\n"
          "  --trace POS        print every step of forward() at prompt position POS (needs --ids or -i;\n"
          "                     -n 0 unless given; not with --dump; see trace.h)\n"
          "  --trace-layer N    limit --trace to layer N (the model-level steps are still printed)\n"
          "KL-divergence base for llama.cpp (docs/golden-formats.md):\n"
          "  --kld-base FILE    write the log-probabilities of llama-perplexity --kl-divergence-base FILE\n"
          "  -f CORPUS          the text to score (needed by --kld-base), cut into chunks of --ctx tokens\n"
          "                     (default 512, llama-perplexity's -c); prints its [1]ppl,[2]ppl,... and PPL\n"
          "  --chunks N         score only the first N chunks (llama-perplexity --chunks)\n"
          "Tokenizer:\n"
          "  --encode           read UTF-8 text from stdin, print HF tokenizer(text) ids\n"
          "  --decode IDS       print HF decode(ids, skip_special_tokens=False)\n"
          "  -h, --help         this help\n", f);
}

/* Parses "2,818,3823" into a new array; every id must be a decimal number below `limit`. */
static int *parse_ids(const char *flag, const char *s, int limit, int *n_out) {
    int cap = 16, n = 0;
    int *ids = malloc(sizeof(int) * (size_t)cap);
    if (!ids) die("out of memory");
    const char *p = s;
    while (1) {
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') {
            free(ids);
            die("malformed %s at character %d: \"%s\"\n  expected: comma-separated decimal token ids, e.g. %s 2,818,3823\n  found:    %s%.20s%s",
                flag, (int)(p - s) + 1, s, flag, *p ? "\"" : "", *p ? p : "the end of the list", *p ? "\"" : "");
        }
        long v = 0;
        const char *start = p;
        while (*p >= '0' && *p <= '9') {
            v = v * 10 + (*p++ - '0');
            if (v > 2000000000L) break;
        }
        while (*p >= '0' && *p <= '9') p++;   /* the rest of a huge number, for the message */
        if (v >= limit) {
            free(ids);
            die("token id %.*s in %s is outside the vocabulary\n  expected: 0..%d\n  found:    %.*s", (int)(p - start), start, flag, limit - 1,
                (int)(p - start), start);
        }
        if (n == cap) { cap *= 2; ids = realloc(ids, sizeof(int) * (size_t)cap); if (!ids) die("out of memory"); }
        ids[n++] = (int)v;
        while (*p == ' ') p++;
        if (*p == 0) break;
        if (*p != ',') {
            free(ids);
            die("malformed %s at character %d: \"%s\"\n  expected: ',' between ids\n  found:    '%c'", flag, (int)(p - s) + 1, s, *p);
        }
        p++;
    }
    *n_out = n;
    return ids;
}

static long parse_int(const char *flag, const char *v, long lo, long hi) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        die("bad value for %s: \"%s\"\n  expected: an integer in %ld..%ld", flag, v, lo, hi);
    return x;
}

static float parse_float(const char *flag, const char *v, float lo, float hi) {
    char *end;
    errno = 0;
    float x = strtof(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        die("bad value for %s: \"%s\"\n  expected: a number in %g..%g", flag, v, (double)lo, (double)hi);
    return x;
}

typedef struct {
    const char *model_path, *prompt, *ids, *dump_dir, *dump_filter, *replay_dir, *system_prompt, *decode_ids, *mode;
    const char *kld_base, *corpus, *image, *dump_vision;
    int steps, steps_given, print_ids, skip_expert, precision, placement, ctx, threads, batch, verify, hugepages, mmap, list_taps, encode, no_think;
    int chunks;
    int trace_pos, trace_layer;
    float temperature, topp;
    uint64_t seed;
} Options;

static Options parse_args(int argc, char **argv) {
    Options o = {0};
    o.steps = 256;
    o.temperature = 1.0f;
    o.topp = 0.9f;
    o.seed = (uint64_t)time(NULL);
    o.trace_pos = -1;
    o.trace_layer = -1;
    o.mode = "generate";
    o.chunks = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); exit(0); }
        int flag_only = !strcmp(a, "--print-ids") || !strcmp(a, "--verify") || !strcmp(a, "--hugepages") || !strcmp(a, "--mmap") || !strcmp(a, "--list-taps") ||
                        !strcmp(a, "--encode") || !strcmp(a, "--no-think");
        if (a[0] != '-' || !a[1]) {
            if (o.model_path) die("unexpected argument \"%s\"\n  hint: options start with '-'; see zaya -h", a);
            o.model_path = a;
            continue;
        }
        if (flag_only) {
            if (!strcmp(a, "--print-ids")) o.print_ids = 1;
            else if (!strcmp(a, "--verify")) o.verify = 1;
            else if (!strcmp(a, "--hugepages")) o.hugepages = 1;
            else if (!strcmp(a, "--mmap")) o.mmap = 1;
            else if (!strcmp(a, "--list-taps")) o.list_taps = 1;
            else if (!strcmp(a, "--encode")) o.encode = 1;
            else o.no_think = 1;
            continue;
        }
        static const char *with_value[] = {"-i", "--ids", "-n", "-t", "-p", "-s", "-m", "-y", "--skip-expert", "--precision", "--ctx",
                                           "--threads", "--batch", "--dump", "--dump-filter", "--replay", "--trace", "--trace-layer",
                                           "--decode", "--kld-base", "-f", "--chunks", "--image", "--dump-vision",
                                           NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= !strcmp(a, with_value[k]);
        if (!known) die("unknown option \"%s\"\n  hint: see zaya -h for the list of options", a);
        if (i + 1 >= argc) die("option %s needs a value\n  hint: see zaya -h", a);
        const char *v = argv[++i];
        if (!strcmp(a, "-i")) o.prompt = v;
        else if (!strcmp(a, "--ids")) o.ids = v;
        else if (!strcmp(a, "-n")) { o.steps = (int)parse_int(a, v, 0, 1 << 30); o.steps_given = 1; }
        else if (!strcmp(a, "-t")) o.temperature = parse_float(a, v, 0.0f, 100.0f);
        else if (!strcmp(a, "-p")) o.topp = parse_float(a, v, 0.0f, 1.0f);
        else if (!strcmp(a, "-s")) o.seed = (uint64_t)parse_int(a, v, 0, 0x7fffffffffffffffL);
        else if (!strcmp(a, "-m")) {
            if (strcmp(v, "generate") && strcmp(v, "chat")) die("bad value for -m: \"%s\"\n  expected: generate or chat", v);
            o.mode = v;
        } else if (!strcmp(a, "-y")) o.system_prompt = v;
        else if (!strcmp(a, "--skip-expert")) {
            if (!strcmp(v, "zero")) o.skip_expert = ZAYA_SKIP_ZERO;
            else if (!strcmp(v, "passthrough")) o.skip_expert = ZAYA_SKIP_PASSTHROUGH;
            else die("bad value for --skip-expert: \"%s\"\n  expected: zero (upstream transformers/vLLM) or passthrough (Zyphra's fork)", v);
        } else if (!strcmp(a, "--precision")) {
            char why[512];
            if (zaya_parse_precision(v, &o.precision, &o.placement, why, sizeof why) != 0) die("--precision: %s", why);
        } else if (!strcmp(a, "--ctx")) o.ctx = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--threads")) o.threads = (int)parse_int(a, v, 1, 1024);
        else if (!strcmp(a, "--batch")) o.batch = (int)parse_int(a, v, 1, ZAYA_BATCH);
        else if (!strcmp(a, "--dump")) o.dump_dir = v;
        else if (!strcmp(a, "--dump-filter")) o.dump_filter = v;
        else if (!strcmp(a, "--replay")) o.replay_dir = v;
        else if (!strcmp(a, "--trace")) o.trace_pos = (int)parse_int(a, v, 0, 1 << 30);
        else if (!strcmp(a, "--trace-layer")) o.trace_layer = (int)parse_int(a, v, 0, ZAYA_MAX_LAYERS - 1);
        else if (!strcmp(a, "--decode")) o.decode_ids = v;
        else if (!strcmp(a, "--kld-base")) o.kld_base = v;
        else if (!strcmp(a, "-f")) o.corpus = v;
        else if (!strcmp(a, "--chunks")) o.chunks = (int)parse_int(a, v, 1, 1 << 30);
        else if (!strcmp(a, "--image")) o.image = v;
        else if (!strcmp(a, "--dump-vision")) o.dump_vision = v;
    }
    if (!o.model_path) { usage(stderr); die("no model file given\n  hint: zaya MODEL.bin -i \"prompt\" (export MODEL.bin with export_weights.py)"); }
    if (o.prompt && o.ids) die("give the prompt either as -i TEXT or as --ids, not both");
    if ((o.dump_dir || o.trace_pos >= 0) && !o.steps_given) o.steps = 0;
    if (o.trace_pos >= 0 && o.dump_dir) die("--trace and --dump cannot be combined\n  hint: run twice; the values are identical");
    if (o.trace_layer >= 0 && o.trace_pos < 0) die("--trace-layer needs --trace POS");
    if (o.replay_dir && (!o.dump_dir || o.prompt || o.ids || o.trace_pos >= 0 || o.kld_base || strcmp(o.mode, "generate")))
        die("--replay PORT_DUMP runs the ids of that dump and writes its taps with --dump OUT\n"
            "  expected: ./zaya MODEL --replay PORT_DUMP --dump OUT (no -i, --ids, --trace, --kld-base or -m chat)");
    if (o.kld_base && !o.corpus)
        die("--kld-base %s needs a corpus to score\n  hint: add -f corpus.txt (a UTF-8 text file, e.g. wikitext-2's wiki.test.raw)", o.kld_base);
    if (o.corpus && !o.kld_base) die("-f %s: a corpus is only read by --kld-base\n  hint: add --kld-base FILE, or give a prompt with -i", o.corpus);
    if (o.chunks >= 0 && !o.kld_base) die("--chunks only applies to --kld-base");
    if (o.kld_base && (o.prompt || o.ids || o.dump_dir || o.trace_pos >= 0 || o.list_taps || o.encode || o.decode_ids || strcmp(o.mode, "generate")))
        die("--kld-base runs over its corpus (-f) alone\n  hint: give no -i, --ids, --dump, --trace, --list-taps, --encode, --decode or -m with it");
    return o;
}

/* ---- running ---- */

/* Runs `n` prompt tokens, then generates up to `steps` more (stops at an eos id). Generated ids
 * are printed as ids or streamed as text. Returns the number of generated tokens. */
typedef struct {
    const ZayaModel *m;
    ZayaState *s;
    const Options *o;
    uint64_t rng;
    ProbIndex *scratch;
    int sample_limit;          /* ids >= this are never sampled (not in the tokenizer) */
    int image_tokens;          /* ZAYA1-VL --image: image tokens chat's first message still has to take */
    double prefill_s, decode_s;
    int prefill_n, decode_n;
} Runner;

static void run_prompt(Runner *r, const int *ids, int n) {
    char err[512];
    double t0 = now_s();
    if (zaya_forward(r->m, r->s, ids, n, err, sizeof err) != 0) die("%s", err);
    r->prefill_s += now_s() - t0;
    r->prefill_n += n;
}

/* Generation stops at the config's eos ids and at the chat format's stop ids (<|im_end|>, <eos>). */
static int is_eos(const ZayaModel *m, int id) {
    for (int k = 0; k < m->config.n_eos; k++) if (m->config.eos_ids[k] == id) return 1;
    return m->tokenizer && zaya_tok_is_stop(m->tokenizer, id);
}

/* Generates up to `steps` tokens after the prompt; `emit` prints each. Returns the count. */
static int generate(Runner *r, int steps, void (*emit)(Runner *, int, int), int *last) {
    char err[512];
    int n = 0;
    double t0 = now_s();
    while (n < steps) {
        int next = sample(r->s->logits, r->sample_limit, r->o->temperature, r->o->topp, &r->rng, r->scratch);
        emit(r, next, n);
        n++;
        *last = next;
        if (is_eos(r->m, next)) break;
        if (n == steps) break;
        if (r->s->pos >= r->s->ctx) {
            fprintf(stderr, "\nzaya: context is full (%d positions); stopping\n  hint: raise --ctx (max %d)\n",
                    r->s->ctx, r->m->config.max_position);
            break;
        }
        if (zaya_forward(r->m, r->s, &next, 1, err, sizeof err) != 0) die("%s", err);
    }
    r->decode_s += now_s() - t0;
    r->decode_n += n;
    return n;
}

static void emit_id(Runner *r, int id, int i) {
    (void)r;
    printf(i ? ",%d" : "%d", id);
    fflush(stdout);
}

/* Streams generated text: only whole UTF-8 characters are printed (zaya_tok_stream_push). Stop
 * tokens end the text and are not printed. */
static ZayaTokStream text_stream;
static void emit_text(Runner *r, int id, int i) {
    (void)i;
    if (is_eos(r->m, id)) return;
    size_t len;
    const char *text = zaya_tok_stream_push(&text_stream, id, &len);
    if (!text) die("out of memory while decoding");
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

static void flush_text(void) {
    size_t len;
    const char *text = zaya_tok_stream_flush(&text_stream, &len);
    if (text) fwrite(text, 1, len, stdout);
    fflush(stdout);
}

/* Generates up to `steps` tokens and prints them: ids with --print-ids (or without a tokenizer),
 * else streamed text. */
static void generate_and_print(Runner *r, int steps, int *last) {
    if (r->o->print_ids || !r->m->tokenizer) {
        generate(r, steps, emit_id, last);
        return;
    }
    zaya_tok_stream_init(&text_stream, r->m->tokenizer, 0);
    generate(r, steps, emit_text, last);
    flush_text();
    zaya_tok_stream_free(&text_stream);
}

static const ZayaTokenizer *need_tokenizer(const ZayaModel *m, const char *what) {
    if (!m->tokenizer)
        die("%s needs the tokenizer, but this blob has none\n  hint: re-export it with export_weights.py from a folder with tokenizer.json", what);
    return m->tokenizer;
}

/* Encodes text like HF tokenizer(text) but without the trailing <|im_end|> that ZAYA1's
 * post-processor appends: a prompt to continue is <bos> + the text's tokens (as in the fixtures). */
static int *encode_prompt(const ZayaTokenizer *tok, const char *text, int *n_out) {
    int *body = NULL, *ids;
    size_t n = 0;
    if (zaya_tok_encode(tok, text, strlen(text), 0, &body, &n) != 0) die("out of memory while encoding the prompt");
    ids = malloc(sizeof(int) * (n + (size_t)tok->n_prefix + 1));
    if (!ids) die("out of memory");
    for (int k = 0; k < tok->n_prefix; k++) ids[k] = tok->prefix[k];
    memcpy(ids + tok->n_prefix, body, sizeof(int) * n);
    *n_out = (int)n + tok->n_prefix;
    free(body);
    return ids;
}

/* --encode: standard input, every byte, to HF tokenizer(text).ids on one line. */
static void run_encode(const ZayaTokenizer *tok) {
    size_t len = 0, cap = 1 << 16;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + len, 1, cap - len, stdin)) > 0) {
        len += got;
        if (len == cap) text = realloc(text, cap *= 2);
    }
    if (!text) die("out of memory reading standard input");
    int *ids = NULL;
    size_t n = 0;
    if (zaya_tok_encode(tok, text, len, 1, &ids, &n) != 0) die("cannot encode %zu bytes (out of memory, or over 256 MB)", len);
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
}

/* Feeds rendered chat text to the model (encoded without special tokens: it carries its own <bos>). */
/* ZAYA1-VL: ids[0..n) with the image block [vision_start, image x k, vision_end] inserted at `at`. */
static int *insert_image_block(const ZayaModel *m, const int *ids, int n, int at, int k, int *n_out) {
    int *out = malloc(sizeof(int) * ((size_t)n + (size_t)k + 2));
    if (!out) die("out of memory");
    memcpy(out, ids, sizeof(int) * (size_t)at);
    out[at] = m->vision_start_id;
    for (int j = 0; j < k; j++) out[at + 1 + j] = m->image_token_id;
    out[at + 1 + k] = m->vision_end_id;
    memcpy(out + at + k + 2, ids + at, sizeof(int) * (size_t)(n - at));
    *n_out = n + k + 2;
    return out;
}

/* Chat's first message with an image: before + the image block + after, fed as one prompt. */
static void feed_with_image(Runner *r, const char *before, const char *after) {
    int *a = NULL, *b = NULL, n;
    size_t na = 0, nb = 0;
    if (zaya_tok_encode(r->m->tokenizer, before, strlen(before), 0, &a, &na) != 0 ||
        zaya_tok_encode(r->m->tokenizer, after, strlen(after), 0, &b, &nb) != 0)
        die("out of memory while encoding");
    int *joined = malloc(sizeof(int) * (na + nb + 1));
    if (!joined) die("out of memory");
    memcpy(joined, a, sizeof(int) * na);
    memcpy(joined + na, b, sizeof(int) * nb);
    int *ids = insert_image_block(r->m, joined, (int)(na + nb), (int)na, r->image_tokens, &n);
    if (r->s->pos + n > r->s->ctx)
        die("the first message with its image (%d tokens) does not fit the context of %d\n  hint: raise --ctx", n,
            r->s->ctx);
    if (r->o->print_ids) {    /* as feed_text: what the model is fed, on stderr */
        fprintf(stderr, "[fed");
        for (int i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "]\n");
    }
    run_prompt(r, ids, n);
    free(a), free(b), free(joined), free(ids);
}

static void feed_text(Runner *r, const char *text) {
    int *ids = NULL;
    size_t n = 0;
    if (zaya_tok_encode(r->m->tokenizer, text, strlen(text), 0, &ids, &n) != 0) die("out of memory while encoding");
    if (r->s->pos + (int)n > r->s->ctx)
        die("the conversation no longer fits the context (%d + %zu tokens > %d)\n  hint: raise --ctx (max %d) or start over",
            r->s->pos, n, r->s->ctx, r->m->config.max_position);
    if (r->o->print_ids) {    /* --print-ids: show what the model is fed, as ids, on stderr */
        fprintf(stderr, "[fed");
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "]\n");
    }
    run_prompt(r, ids, (int)n);
    free(ids);
}

/* Drops the line ending ("\n" or "\r\n") that getline() keeps. */
static void chomp(char *line, ssize_t *len) {
    while (*len > 0 && (line[*len - 1] == '\n' || line[*len - 1] == '\r')) line[--*len] = 0;
}

/* Closes an assistant turn as the template does (turn_end, e.g. "<|im_end|>\n"). */
static void close_assistant_turn(Runner *r) {
    ZayaTokStr end = r->m->tokenizer->chat.turn_end;
    char *text = malloc(end.len + 1);
    if (!text) die("out of memory");
    memcpy(text, end.s, end.len);
    text[end.len] = 0;
    feed_text(r, text);
    free(text);
}

/* -m chat: one user message per line of standard input. Turns are rendered with the checkpoint's chat
 * format (the template family recorded by the exporter); the KV/conv/delayed-value state is kept
 * across turns, so history is never prefilled again. A line "/assistant TEXT" right after a user
 * line gives the assistant's reply instead of generating one (to replay a transcript). */
static void run_chat(Runner *r) {
    const ZayaTokenizer *tok = need_tokenizer(r->m, "-m chat");
    if (tok->chat.family == ZAYA_CHAT_NONE)
        die("this blob has no chat format\n  hint: re-export with export_weights.py --chat-format chatml|gemma");
    const char *replay = "/assistant ";
    int think = !r->o->no_think, turn = 0, interactive = isatty(STDIN_FILENO), have_line = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len = 0;
    while (1) {
        if (!have_line) {
            if (interactive) fputs("user> ", stderr);
            if ((len = getline(&line, &cap, stdin)) < 0) break;
        }
        have_line = 0;
        chomp(line, &len);
        char *text, *with_image = NULL;
        if (turn == 0 && r->image_tokens) {   /* ZAYA1-VL: a mark where the image block goes */
            with_image = malloc(strlen(line) + 2);
            if (!with_image) die("out of memory");
            strcpy(with_image, "\x01"), strcat(with_image, line);
        }
        if (turn == 0) {   /* <bos>, the system prompt, the first user turn, the generation prompt */
            ZayaChatMessage msgs[2] = {{"system", r->o->system_prompt}, {"user", with_image ? with_image : line}};
            text = r->o->system_prompt ? zaya_tok_chat_render(tok, msgs, 2, 1, think, NULL)
                                       : zaya_tok_chat_render(tok, msgs + 1, 1, 1, think, NULL);
        } else {           /* the user turn and the generation prompt */
            char *user = zaya_tok_chat_turn(tok, "user", line, NULL), *gen = zaya_tok_chat_generation_prompt(tok, think, NULL);
            text = user && gen ? malloc(strlen(user) + strlen(gen) + 1) : NULL;
            if (text) { strcpy(text, user); strcat(text, gen); }
            free(user);
            free(gen);
        }
        if (!text) die("out of memory rendering the chat turn");
        char *mark = with_image ? strchr(text, '\x01') : NULL;
        if (mark) {   /* the text before the mark, the image block, the rest: one prompt */
            *mark = 0;
            feed_with_image(r, text, mark + 1);
            r->image_tokens = 0;
        } else feed_text(r, text);
        free(text);
        free(with_image);
        turn++;

        if (!interactive && (len = getline(&line, &cap, stdin)) >= 0) {
            if (!strncmp(line, replay, strlen(replay))) {   /* a given reply: feed it, do not generate */
                chomp(line, &len);
                feed_text(r, line + strlen(replay));
                close_assistant_turn(r);
                continue;
            }
            have_line = 1;
        }
        if (interactive) fputs("assistant> ", stderr);
        int last = -1;
        generate_and_print(r, r->o->steps, &last);
        printf("\n");
        fflush(stdout);
        /* the last sampled token was not fed; a stop token is replaced by the template's turn end */
        if (last >= 0 && !is_eos(r->m, last)) {
            if (r->s->pos >= r->s->ctx) die("the conversation no longer fits the context (%d tokens)\n  hint: raise --ctx (max %d)", r->s->ctx, r->m->config.max_position);
            run_prompt(r, &last, 1);
        }
        close_assistant_turn(r);
    }
    free(line);
}

static void report_speed(const Runner *r, double load_s) {
    fprintf(stderr, "load: %.3f s\n", load_s);
    if (r->prefill_n)
        fprintf(stderr, "prefill: %d tokens in %.3f s (%.2f tok/s)\n", r->prefill_n, r->prefill_s,
                r->prefill_n / (r->prefill_s > 0 ? r->prefill_s : 1e-9));
    if (r->decode_n)
        fprintf(stderr, "decode: %d tokens in %.3f s (%.2f tok/s)\n", r->decode_n, r->decode_s,
                r->decode_n / (r->decode_s > 0 ? r->decode_s : 1e-9));
    if (kernels_threads(r->s->kernels) > 1) {   /* whether the threads ran: a descheduled one is a stall */
        char line[256];
        kernels_pool_report(r->s->kernels, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
}

static void list_taps(const ZayaModel *m, ZayaState *s) {
    Dump d = {0};
    d.fd = -1;
    s->tap = dump_learn;
    s->tap_ctx = &d;
    char err[512];
    if (zaya_forward(m, s, &m->config.bos_id, 1, err, sizeof err) != 0) die("%s", err);
    if (dump_error(&d)) die("%s", dump_error(&d));
    for (int i = 0; i < d.n; i++) {
        const DumpTensor *t = &d.t[i];
        if (t->ndim == 0) printf("%-64s [T] %s\n", t->name, t->is_int ? "int32" : "float32");
        else if (t->ndim == 1) printf("%-64s [T, %d] float32\n", t->name, t->shape[0]);
        else printf("%-64s [T, %d, %d] float32\n", t->name, t->shape[0], t->shape[1]);
    }
    printf("(after the last position: model.layers.{i}.self_attn.qkv_proj:conv_state, "
           ":delayed_value_state, self_attn:key_cache, self_attn:value_cache)\n");
    dump_free(&d);
}

/* --replay PORT_DUMP --dump OUT: every layer recomputed from the port's input to it (replay.c), written as a
 * dump of the port's ids; index.json's "replay" says what came from the port. */
static void replay(const ZayaModel *m, ZayaState *s, const Options *o, Dump *dump) {
    char err[1024], json[4096];
    ReplayInfo info;
    if (zaya_replay_open(m, o->replay_dir, &info, err, sizeof err) != 0) die("%s", err);
    if (info.n_tokens > s->ctx)
        die("replay: the port's dump has %d positions, the context %d\n  hint: raise --ctx (max %d)", info.n_tokens, s->ctx,
            m->config.max_position);
    /* ZAYA1-VL: the tower's blocks first (whole tensors, before the decoder's in the dump) */
    if (zaya_replay_vision(m, o->threads, o->replay_dir, dump_vision_tap, dump, stderr, err, sizeof err) < 0)
        die("%s", err);
    if (dump_error(dump)) die("%s", dump_error(dump));
    int len = snprintf(json, sizeof json, "{\"of\": \"");
    for (const char *p = o->replay_dir; *p && len < 2048; p++)
        if ((unsigned char)*p >= 0x20) len += snprintf(json + len, sizeof json - (size_t)len, "%s%c", *p == '"' || *p == '\\' ? "\\" : "", *p);
    len += snprintf(json + len, sizeof json - (size_t)len, "\", \"layer_0_input\": \"%s\", \"router_state_from_port\": [",
                    info.input_computed ? "computed from the ids" : "model:input_scaled");
    for (int i = 0; i < m->config.num_layers; i++)
        len += snprintf(json + len, sizeof json - (size_t)len, "%s%s", i ? ", " : "", info.router_state_from_port[i] ? "true" : "false");
    snprintf(json + len, sizeof json - (size_t)len, "], \"final_norm_and_logits\": %s}", info.final_in_port ? "true" : "false");
    dump->replay_json = json;
    s->tap = dump_learn;   /* the taps of one position of the replay itself: every layer, then the LM head */
    s->tap_ctx = dump;
    const int H = m->config.hidden_size, L = m->config.num_layers;
    float *zero = calloc((size_t)H + (size_t)m->config.router_hidden, sizeof(float));
    if (!zero) die("out of memory");
    for (int i = 0; i <= (info.final_in_port ? L : L - 1); i++) {   /* the LM head only where the port has its outputs */
        zaya_state_reset(s, m);
        if (zaya_replay_layer(m, s, i, zero, zero + H, 1, err, sizeof err) != 0) die("%s", err);
    }
    free(zero);
    zaya_state_reset(s, m);
    dump->image_mask = info.image;   /* ZAYA1-VL: the replay dump records the image positions it ran (before the
                                      * plan: the safetensors header's room counts them) */
    if (dump_plan(dump, info.n_tokens, m, o->model_path, o->skip_expert, info.tokens, err, sizeof err) != 0) die("%s", err);
    s->tap = dump_tap;
    if (zaya_replay_run(m, s, o->replay_dir, &info, stderr, err, sizeof err) != 0) die("%s", err);
    if (dump_error(dump)) die("%s", dump_error(dump));
    if (dump_finish(dump, err, sizeof err) != 0) die("%s", err);
    fprintf(stderr, "replay: wrote %s; compare with: python3 compare.py --local %s %s\n", o->dump_dir, o->replay_dir, o->dump_dir);
    dump_free(dump);
    free(info.tokens);
    free(info.image);
}

/* --dump-vision: one vision tap as DIR/NAME.npy, float32 [rows, cols] (a failed write ends the run). */
static void write_vision_tap(const char *dir, const char *name, const float *x, int rows, int cols) {
    char path[4096], header[128];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    int len = snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }", rows,
                       cols);
    while ((10 + len + 1) % 64) header[len++] = ' ';
    header[len++] = '\n';
    const unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 255),
                                     (unsigned char)(len >> 8)};
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(magic, 1, 10, f) != 10 || fwrite(header, 1, (size_t)len, f) != (size_t)len ||
        fwrite(x, sizeof(float), (size_t)rows * cols, f) != (size_t)rows * cols || fclose(f) != 0)
        die("--dump-vision: cannot write %s: %s\n  hint: the folder must exist and be writable", path, strerror(errno));
}

/* Where the vision tower's taps go: --dump-vision's folder and/or --dump's dump (with the decoder's). */
typedef struct {
    const char *dir;
    Dump *dump;
} VisionTaps;

static void vision_tap(void *ctx, const char *name, const float *x, int rows, int cols) {
    const VisionTaps *v = ctx;
    if (v->dir) write_vision_tap(v->dir, name, x, rows, cols);
    if (v->dump) dump_vision_tap(v->dump, name, x, rows, cols);
}

/* ZAYA1-VL --image: the file decoded and preprocessed as the official processor does (image.c), then the
 * vision tower (vision.c) -> features [*n, hidden_size] for the prompt's image tokens. Its taps go to `taps`
 * (may be NULL); what --dump records of the image (file, size, grid) is written into info[info_len]. */
static float *encode_image(const ZayaModel *m, const char *path, int threads, VisionTaps *taps, int *n, char *info,
                           size_t info_len) {
    char err[1024];
    if (!m->vl) die("--image needs a ZAYA1-VL model\n  found:    %s is a text-only blob\n  hint: export a ZAYA1-VL "
                    "checkpoint (model_type zaya1_vl) with export_weights.py", path);
    ZayaImage img;
    float *pixels = NULL;
    int gh = 0, gw = 0;
    double t0 = now_s();
    if (zaya_image_read(path, &img, err, sizeof err) != 0 ||
        zaya_image_pixels(&img, &m->vision.config, &pixels, &gh, &gw, err, sizeof err) != 0)
        die("%s", err);
    *n = zaya_vision_tokens(&m->vision.config, gh, gw);
    float *features = malloc(sizeof(float) * (size_t)*n * m->config.hidden_size + 1);
    if (!features) die("out of memory for %d image features", *n);
    if (zaya_vision_encode(&m->vision, threads, pixels, gh, gw, features, taps ? vision_tap : NULL, taps, err,
                           sizeof err) != 0)
        die("%s", err);
    if (taps && taps->dump && dump_error(taps->dump)) die("%s", dump_error(taps->dump));
    fprintf(stderr, "image: %s, %d x %d -> %d x %d patches, %d image tokens, encoded in %.3f s\n", path, img.width,
            img.height, gw, gh, *n, now_s() - t0);
    int len = snprintf(info, info_len, "[{\"file\": \"");
    for (const char *p = path; *p && len < (int)info_len - 8; p++)   /* the path as a JSON string */
        len += *p == '"' || *p == '\\' ? snprintf(info + len, info_len - (size_t)len, "\\%c", *p)
               : (unsigned char)*p < 0x20 ? snprintf(info + len, info_len - (size_t)len, "\\u%04x", *p)
               : snprintf(info + len, info_len - (size_t)len, "%c", *p);
    snprintf(info + len, info_len - (size_t)len, "\", \"height\": %d, \"width\": %d, \"image_grid_thw\": [1, %d, %d], "
             "\"image_tokens\": %d}]", img.height, img.width, gh, gw, *n);
    free(img.rgb), free(pixels);
    return features;
}

int main(int argc, char **argv) {
    Options o = parse_args(argc, argv);
    char err[1024];
    double t0 = now_s();
    ZayaModel m;
    if (o.hugepages && o.mmap) die("--hugepages and --mmap exclude each other\n  hint: --hugepages copies the weights at load, --mmap reads them from the file as they are used");
    const int tokenizer_only = o.encode || o.decode_ids;   /* no weight is read: nothing to read in */
    if (zaya_load(&m, o.model_path, (o.verify ? ZAYA_LOAD_VERIFY : 0) | (o.hugepages ? ZAYA_LOAD_HUGEPAGES : 0) |
                  (o.mmap || tokenizer_only ? ZAYA_LOAD_MMAP : 0), err, sizeof err) != 0) die("%s", err);
    double load_s = now_s() - t0;
    const ZayaConfig *c = &m.config;
    uint64_t resident, huge;
    int file;
    if (!tokenizer_only && mapping_pages(m.map, &resident, &huge, &file) == 0)   /* where the weights are: a TLB entry per 2 MB or per 4 KB */
        fprintf(stderr, "weights: %.2f GB, %s, %.2f GB resident, %.2f GB in 2 MB pages\n", m.map_size / 1e9,
                file ? "the file mapped in place" : "copied into anonymous memory", resident / 1e9, huge / 1e9);

    if (o.encode) {
        run_encode(need_tokenizer(&m, "--encode"));
        zaya_free(&m);
        return 0;
    }
    if (o.decode_ids) {
        int n = 0;
        int *ids = parse_ids("--decode", o.decode_ids, c->vocab_size, &n);
        size_t len;
        char *text = zaya_tok_decode(need_tokenizer(&m, "--decode"), ids, (size_t)n, 0, &len);
        if (!text) die("out of memory while decoding");
        fwrite(text, 1, len, stdout);
        free(text);
        free(ids);
        zaya_free(&m);
        return 0;
    }
    if (o.kld_base) {   /* llama-perplexity's chunks: --ctx is its -c (default 512) */
        int n_ctx = o.ctx ? o.ctx : (c->max_position < 512 ? c->max_position : 512);
        if (n_ctx > c->max_position) die("--ctx %d is larger than the model's max_position_embeddings %d", n_ctx, c->max_position);
        need_tokenizer(&m, "--kld-base (to tokenize the corpus)");
        ZayaState s;
        if (zaya_state_init(&s, &m, n_ctx, o.threads, err, sizeof err) != 0) die("%s", err);
        s.skip_expert = o.skip_expert;
        s.precision = o.precision;
        s.placement = o.placement;
        if (o.batch) s.batch = o.batch;
        t0 = now_s();
        if (zaya_kld_base(&m, &s, o.corpus, o.kld_base, n_ctx, o.chunks, stdout, stderr, err, sizeof err) != 0) die("%s", err);
        fprintf(stderr, "load: %.3f s, kld-base: %.3f s\n", load_s, now_s() - t0);
        zaya_state_free(&s);
        zaya_free(&m);
        return 0;
    }
    int n_prompt = 0, n_features = 0;
    int *prompt = NULL;
    if (o.dump_vision && !o.image)
        die("--dump-vision writes the vision tower's tensors for --image: give --image PATH");
    Dump dump = {0};
    dump.fd = -1;
    if (o.dump_dir) {   /* before the image: --dump holds the vision tower's tensors too */
        if (!o.ids && !o.prompt && !o.replay_dir) die("--dump needs a prompt: --ids 2,818,... or -i TEXT");
        if (o.image && o.replay_dir) die("--replay takes the image positions from the port's dump: give no --image");
        if (dump_open(&dump, o.dump_dir, o.dump_filter, err, sizeof err) != 0) die("%s", err);
        dump.precision = o.precision;
        dump.placement = o.placement;
    }
    VisionTaps vtaps = {o.dump_vision, o.dump_dir ? &dump : NULL};
    char image_json[5000];
    float *features = o.image ? encode_image(&m, o.image, o.threads, o.dump_vision || o.dump_dir ? &vtaps : NULL,
                                             &n_features, image_json, sizeof image_json) : NULL;
    if (o.ids) prompt = parse_ids("--ids", o.ids, c->vocab_size, &n_prompt);
    else if (o.prompt) prompt = encode_prompt(need_tokenizer(&m, "-i"), o.prompt, &n_prompt);
    if (features && o.prompt) {   /* -i with --image: <bos>, the image block, the text */
        int n_with, *with = insert_image_block(&m, prompt, n_prompt, m.tokenizer->n_prefix, n_features, &n_with);
        free(prompt);
        prompt = with, n_prompt = n_with;
    } else if (features && o.ids) {
        int k = 0;
        for (int t = 0; t < n_prompt; t++) k += prompt[t] == m.image_token_id;
        if (k != n_features)
            die("--ids has %d image tokens (id %d) but the image gives %d features\n  expected: one image token per "
                "feature, inside vision_start (%d) ... vision_end (%d)", k, m.image_token_id, n_features,
                m.vision_start_id, m.vision_end_id);
    }
    unsigned char *image_mask = NULL;   /* --dump: the positions that take the image features (zaya.c's rule) */
    if (features && (o.dump_dir || o.trace_pos >= 0)) {   /* and --trace */
        image_mask = calloc((size_t)n_prompt + 1, 1);
        if (!image_mask) die("out of memory");
        for (int t = 0, k = 0; t < n_prompt && k < n_features; t++)
            if (prompt[t] == m.image_token_id) image_mask[t] = 1, k++;
        if (o.dump_dir) dump.image_mask = image_mask, dump.image_json = image_json;
    }
    int ctx = o.ctx ? o.ctx : (c->max_position < 4096 ? c->max_position : 4096);
    if (ctx > c->max_position) die("--ctx %d is larger than the model's max_position_embeddings %d", ctx, c->max_position);
    if (n_prompt + o.steps > ctx && (o.dump_dir || o.print_ids) && n_prompt > ctx)
        die("the prompt has %d tokens but the context holds %d\n  hint: raise --ctx (max %d)", n_prompt, ctx, c->max_position);
    ZayaState s;
    if (zaya_state_init(&s, &m, ctx, o.threads, err, sizeof err) != 0) die("%s", err);
    fprintf(stderr, "threads: %d%s\n", zaya_state_threads(&s), o.threads ? "" : " (the cores this process may use; --threads N to change)");
    s.skip_expert = o.skip_expert;
    s.precision = o.precision;
    s.placement = o.placement;
    if (o.batch) s.batch = o.batch;
    if (o.list_taps) { list_taps(&m, &s); zaya_state_free(&s); zaya_free(&m); return 0; }
    if (o.replay_dir) { replay(&m, &s, &o, &dump); zaya_state_free(&s); zaya_free(&m); return 0; }
    int chat = !strcmp(o.mode, "chat");
    if (!prompt && !chat) die("no prompt\n  hint: give -i \"text\" or --ids 2,818,..., or use -m chat");
    if (chat && (prompt || o.dump_dir || o.trace_pos >= 0)) die("-m chat reads the user's messages from standard input: give no -i, --ids, --dump or --trace");
    if (n_prompt > ctx) die("the prompt has %d tokens but the context holds %d\n  hint: raise --ctx (max %d)", n_prompt, ctx, c->max_position);

    ZayaTrace trace = {0};    /* --trace: a second tap consumer (trace.c) */
    if (o.trace_pos >= 0) {
        if (zaya_trace_init(&trace, &m, o.trace_pos, o.trace_layer, prompt, n_prompt, o.skip_expert, stdout, err, sizeof err) != 0)
            die("%s", err);
        if (image_mask && zaya_trace_set_images(&trace, image_mask, err, sizeof err) != 0) die("%s", err);
        s.tap = zaya_trace_tap;
        s.tap_ctx = &trace;
    }
    if (o.dump_dir) {   /* one position learns every tap's name and shape, then the files are laid out */
        s.tap = dump_learn;
        s.tap_ctx = &dump;
        if (zaya_forward(&m, &s, prompt, 1, err, sizeof err) != 0) die("%s", err);
        zaya_state_taps(&m, &s, dump_learn_state, &dump);
        zaya_state_reset(&s, &m);
        if (dump_plan(&dump, n_prompt, &m, o.model_path, o.skip_expert, prompt, err, sizeof err) != 0) die("%s", err);
        s.tap = dump_tap;
    }
    /* never sample an id the tokenizer cannot print (the embedding has padding rows beyond it) */
    int limit = m.tokenizer && m.tokenizer->n_tokens < c->vocab_size ? m.tokenizer->n_tokens : c->vocab_size;
    Runner r = {&m, &s, &o, o.seed ? o.seed : 0x9E3779B97F4A7C15ull, NULL, limit, 0, 0, 0, 0, 0};
    if (features && zaya_set_images(&m, &s, features, n_features, err, sizeof err) != 0) die("%s", err);
    if (features && chat) r.image_tokens = n_features;
    r.scratch = malloc(sizeof(ProbIndex) * 2 * (size_t)c->vocab_size);
    if (!r.scratch) die("out of memory");
    if (chat) run_chat(&r);
    else {
        if (o.dump_dir) {   /* a batch at a time, so that a write error stops the run early */
            const int step = features ? s.capacity : s.batch;   /* ZAYA1-VL: the image tokens in one call */
            for (int i = 0; i < n_prompt; i += step) {
                run_prompt(&r, prompt + i, n_prompt - i < step ? n_prompt - i : step);
                if (dump_error(&dump)) die("%s", dump_error(&dump));
            }
            /* the state after the last prompt position, then what marks the dump complete */
            zaya_state_taps(&m, &s, dump_state_tap, &dump);
            if (dump_finish(&dump, err, sizeof err) != 0) die("%s", err);
            dump_free(&dump);
        } else {
            run_prompt(&r, prompt, n_prompt);
        }
        int last = -1;
        if (o.steps > 0) {
            s.tap = NULL;   /* dumps cover the prompt positions only */
            generate_and_print(&r, o.steps, &last);
            printf("\n");
            fflush(stdout);   /* before the speed report on stderr */
        }
    }
    zaya_trace_free(&trace);
    report_speed(&r, load_s);
    free(r.scratch);
    free(prompt);
    free(features);
    free(image_mask);
    zaya_state_free(&s);
    zaya_free(&m);
    return 0;
}
