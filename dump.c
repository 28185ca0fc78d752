/* dump.c - --dump written as the model runs: a folder of .npy files + index.json, or one
 * .safetensors file (dump.h; formats in docs/compare.md and docs/golden-formats.md). */
#define _POSIX_C_SOURCE 200809L
#include "dump.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#ifndef ZAYA_VERSION
#define ZAYA_VERSION "1.0"
#endif
#ifndef ZAYA_COMMIT
#define ZAYA_COMMIT "unknown"
#endif

/* ---- small helpers ---- */

/* The first error of a tap callback is kept; later rows are ignored (dump_error reports it). */
static void tap_fail(Dump *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tap_fail(Dump *d, const char *fmt, ...) {
    if (d->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof d->err, fmt, ap);
    va_end(ap);
}

/* pwrite() of all n bytes (it may write fewer, or be interrupted). */
static int write_at(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static uint64_t hash_key(const char *name, int layer) {
    uint64_t h = 1469598103934665603ull;   /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 1099511628211ull;
    return (h ^ (uint64_t)(layer + 1)) * 1099511628211ull;
}

static int same_tap(const DumpTensor *t, const ZayaTap *tap) {
    return t->layer == tap->layer && strcmp(t->name + t->base, tap->name) == 0;
}

static void hash_insert(Dump *d, int idx) {
    const DumpTensor *t = &d->t[idx];
    size_t mask = (size_t)d->hash_cap - 1, k = (size_t)hash_key(t->name + t->base, t->layer) & mask;
    while (d->hash[k] >= 0) k = (k + 1) & mask;
    d->hash[k] = idx;
}

/* The entry of this tap (name and layer), or -1. Taps mostly arrive in a fixed order: the entry after
 * the previous one is tried first. */
static int find(Dump *d, const ZayaTap *tap) {
    if (d->n && same_tap(&d->t[d->cursor % d->n], tap)) return d->cursor++ % d->n;
    if (!d->hash_cap) return -1;
    size_t mask = (size_t)d->hash_cap - 1, k = (size_t)hash_key(tap->name, tap->layer) & mask;
    for (; d->hash[k] >= 0; k = (k + 1) & mask)
        if (same_tap(&d->t[d->hash[k]], tap)) {
            d->cursor = d->hash[k] + 1;
            return d->hash[k];
        }
    return -1;
}

static void stats_add(DumpTensor *t, const void *data, size_t n) {
    for (size_t k = 0; k < n; k++) {
        double v;
        if (t->is_int) { int32_t iv; memcpy(&iv, (const char *)data + 4 * k, 4); v = iv; }
        else { float fv; memcpy(&fv, (const char *)data + 4 * k, 4); v = fv; }
        if (isnan(v)) { t->nan++; continue; }
        if (isinf(v)) { t->inf++; continue; }
        t->fin++;
        t->mn = v < t->mn ? v : t->mn;
        t->mx = v > t->mx ? v : t->mx;
        t->sum += v;
        t->ss += v * v;
    }
}

/* The .npy file of a tensor: its name with ':' -> '~' (docs/compare.md). */
static void npy_file(const DumpTensor *t, char *out, size_t n) {
    snprintf(out, n, "%s.npy", t->name);
    for (char *p = out; *p; p++) if (*p == ':') *p = '~';
}

static void npy_path(const Dump *d, const DumpTensor *t, char *out, size_t n) {
    char file[200];
    npy_file(t, file, sizeof file);
    snprintf(out, n, "%s/%s", d->path, file);
}

/* NumPy format 1.0: magic, version, header length, a dict padded with spaces to 64 bytes. */
static int npy_header(const Dump *d, const DumpTensor *t, char *out) {
    char shape[96];
    if (t->state) {
        if (t->ndim == 2) snprintf(shape, sizeof shape, "(%d, %d)", t->shape[0], t->shape[1]);
        else snprintf(shape, sizeof shape, "(%d,)", t->shape[0]);
    } else if (t->ndim == 0) snprintf(shape, sizeof shape, "(%d,)", d->T);
    else if (t->ndim == 1) snprintf(shape, sizeof shape, "(%d, %d)", d->T, t->shape[0]);
    else snprintf(shape, sizeof shape, "(%d, %d, %d)", d->T, t->shape[0], t->shape[1]);
    char *header = out + 10;
    int len = snprintf(header, 200, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", t->is_int ? "<i4" : "<f4", shape);
    int total = (10 + len + 1 + 63) / 64 * 64;
    while (10 + len + 1 < total) header[len++] = ' ';
    header[len++] = '\n';
    const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(len & 0xFF), (unsigned char)(len >> 8)};
    memcpy(out, pre, 10);
    return 10 + len;
}

/* The open file of a tensor. With more tensors than the process may hold open files, all are closed
 * and reopened on demand (slower, same bytes). */
static int npy_fd(Dump *d, DumpTensor *t) {
    if (t->fd >= 0) return t->fd;
    char path[4400];
    npy_path(d, t, path, sizeof path);
    for (int attempt = 0; attempt < 2; attempt++) {
        t->fd = open(path, O_WRONLY);
        if (t->fd >= 0 || (errno != EMFILE && errno != ENFILE)) break;
        for (int i = 0; i < d->n; i++)
            if (d->t[i].fd >= 0) { close(d->t[i].fd); d->t[i].fd = -1; }
    }
    if (t->fd < 0) tap_fail(d, "cannot open %s: %s\n  hint: check the disk and the folder", path, strerror(errno));
    return t->fd;
}

/* ---- opening ---- */

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

int dump_open(Dump *d, const char *path, const char *filter, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    d->fd = -1;
    if (strlen(path) + 200 >= sizeof d->path) return zaya_fail(err, errlen, "--dump path is too long (%zu bytes)\n  hint: use a shorter path", strlen(path));
    snprintf(d->path, sizeof d->path, "%s", path);
    if (filter) {
        if (regcomp(&d->filter, filter, REG_EXTENDED | REG_NOSUB) != 0)
            return zaya_fail(err, errlen, "--dump-filter \"%s\" is not a valid POSIX extended regular expression\n"
                             "  hint: e.g. --dump-filter 'logits|layers\\.0\\.'", filter);
        d->has_filter = 1;
    }
    struct stat st;
    d->safetensors = ends_with(path, ".safetensors");
    if (d->safetensors) {
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return zaya_fail(err, errlen, "--dump %s is a folder, but the name ends in .safetensors (the one-file form)\n"
                             "  hint: give a file name, or a folder name without .safetensors", path);
        /* O_TRUNC: an earlier file of this name no longer looks complete from here on */
        d->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (d->fd < 0)
            return zaya_fail(err, errlen, "cannot create the dump file %s: %s\n  hint: check that its folder exists and is writable",
                             path, strerror(errno));
        return 0;
    }
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return zaya_fail(err, errlen, "--dump %s exists and is not a folder\n  hint: give a new or existing folder, or a name ending in .safetensors", path);
    } else if (mkdir(path, 0777) != 0) {
        return zaya_fail(err, errlen, "cannot create the dump folder %s: %s\n  hint: check the parent folder exists and is writable", path, strerror(errno));
    }
    char probe[4400];
    snprintf(probe, sizeof probe, "%s/.zaya_write_test", path);
    FILE *f = fopen(probe, "w");
    if (!f) return zaya_fail(err, errlen, "the dump folder %s is not writable: %s\n  hint: choose another folder", path, strerror(errno));
    fclose(f);
    remove(probe);
    /* index.json is what marks a dump complete: an earlier run's must not describe this run's files */
    snprintf(probe, sizeof probe, "%s/index.json", path);
    if (remove(probe) != 0 && errno != ENOENT)
        return zaya_fail(err, errlen, "cannot remove the earlier %s: %s\n  hint: remove it by hand, or dump to a new folder", probe, strerror(errno));
    return 0;
}

/* ---- learning the taps ---- */

static void learn(Dump *d, const ZayaTap *tap, int state) {
    if (tap->ragged || find(d, tap) >= 0) return;   /* ragged taps are not [T, ...] arrays: --trace shows them */
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 256;
        DumpTensor *t = realloc(d->t, sizeof(DumpTensor) * (size_t)d->cap);
        if (!t) { tap_fail(d, "out of memory in --dump"); return; }
        d->t = t;
    }
    if (2 * (d->n + 1) > d->hash_cap) {   /* keep the table at most half full */
        int cap = d->hash_cap ? 2 * d->hash_cap : 1024;
        int *h = malloc(sizeof(int) * (size_t)cap);
        if (!h) { tap_fail(d, "out of memory in --dump"); return; }
        free(d->hash);
        d->hash = h;
        d->hash_cap = cap;
        for (int k = 0; k < cap; k++) h[k] = -1;
        for (int i = 0; i < d->n; i++) hash_insert(d, i);
    }
    DumpTensor *t = &d->t[d->n];
    memset(t, 0, sizeof *t);
    if (tap->layer >= 0) t->base = snprintf(t->name, sizeof t->name, "model.layers.%d.", tap->layer);
    snprintf(t->name + t->base, sizeof t->name - (size_t)t->base, "%s", tap->name);
    t->layer = tap->layer;
    t->is_int = tap->is_int;
    t->ndim = tap->ndim;
    t->shape[0] = tap->shape[0];
    t->shape[1] = tap->shape[1];
    t->row = tap->ndim == 0 ? 1 : tap->ndim == 1 ? (size_t)tap->shape[0] : (size_t)tap->shape[0] * tap->shape[1];
    t->state = state;
    t->skip = d->has_filter && regexec(&d->filter, t->name, 0, NULL, 0) != 0;
    t->fd = -1;
    t->mn = INFINITY;
    t->mx = -INFINITY;
    hash_insert(d, d->n);
    d->cursor = ++d->n;
}

void dump_learn(void *ctx, const ZayaTap *tap) { learn(ctx, tap, 0); }
void dump_learn_state(void *ctx, const ZayaTap *tap) { learn(ctx, tap, 1); }

/* ---- the index (index.json, or the safetensors __metadata__) ---- */

/* `worst`: every number whose value is not known before the run (stats, state shapes, offsets) is
 * printed at its widest, to size the safetensors header before any data is written. */
#define WORST_FLOAT "-1.23456789e-308"
#define WORST_COUNT "18446744073709551615"

static void json_number(FILE *f, double v, int worst) {
    if (worst) fputs(WORST_FLOAT, f);
    else if (isfinite(v)) fprintf(f, "%.9g", v);
    else fputs("null", f);
}

static void json_count(FILE *f, uint64_t v, int worst) {
    if (worst) fputs(WORST_COUNT, f);
    else fprintf(f, "%llu", (unsigned long long)v);
}

static void write_producer(FILE *f) {
    fprintf(f, "{\"program\": \"zaya.c\", \"version\": \"%s\", \"commit\": \"%s\"}", ZAYA_VERSION, ZAYA_COMMIT);
}

static void write_model(FILE *f, const Dump *d) {
    fputs("{\"path\": \"", f);
    for (const char *p = d->model_path; *p; p++) {
        if (*p == '"' || *p == '\\') fputc('\\', f);
        if ((unsigned char)*p >= 0x20) fputc(*p, f);
    }
    fprintf(f, "\", \"source_layout\": \"%s\", \"provenance\": %s}", d->m->source_layout ? "legacy" : "native",
            d->m->provenance[0] == '{' ? d->m->provenance : "null");
}

static void write_weight_format(FILE *f, const Dump *d) {
    const char *formats[] = {"fp32", "bf16", "int8"};
    fprintf(f, "{\"dtype\": \"%s\", \"group_size\": %d}", formats[d->m->weight_format], d->m->group_size);
}

static const char *skip_name(const Dump *d) { return d->skip_mode == ZAYA_SKIP_PASSTHROUGH ? "passthrough" : "zero"; }
static const char *precision_name(const Dump *d) {
    static char name[96];
    return zaya_precision_name(d->precision, d->placement, name, sizeof name);
}

/* ZAYA1-VL: the positions that take image features, as [first, end) ranges: [[2, 37]] */
static void write_image_positions(FILE *f, const Dump *d, int worst) {
    (void)worst;
    fputc('[', f);
    for (int t = 0, k = 0; t < d->T; t++) {
        if (!d->image_mask[t] || (t > 0 && d->image_mask[t - 1])) continue;
        int end = t;
        while (end < d->T && d->image_mask[end]) end++;
        fprintf(f, "%s[%d, %d]", k++ ? ", " : "", t, end);
    }
    fputc(']', f);
}

static void write_tokens(FILE *f, const Dump *d) {
    fputc('[', f);
    for (int i = 0; i < d->T; i++) fprintf(f, "%s%d", i ? ", " : "", d->tokens[i]);
    fputc(']', f);
}

/* The dims of a tensor: [T, row shape...] or a state tensor's full shape. */
static void write_shape(FILE *f, const Dump *d, const DumpTensor *t, const char *sep, int worst) {
    if (t->state) {
        json_count(f, (uint64_t)t->shape[0], worst);
        if (t->ndim == 2) { fputs(sep, f); json_count(f, (uint64_t)t->shape[1], worst); }
        return;
    }
    fprintf(f, "%d", d->T);
    for (int k = 0; k < t->ndim; k++) fprintf(f, "%s%d", sep, t->shape[k]);
}

/* One tensor of index.json's "tensors" (the safetensors metadata leaves out "file"). */
static void write_entry(FILE *f, const Dump *d, const DumpTensor *t, int order, int with_file, int worst) {
    fprintf(f, "{\"name\": \"%s\", ", t->name);
    if (with_file) {
        char file[200];
        npy_file(t, file, sizeof file);
        fprintf(f, "\"file\": \"%s\", ", file);
    }
    fputs("\"shape\": [", f);
    write_shape(f, d, t, ", ", worst);
    fprintf(f, "], \"dtype\": \"%s\", \"order\": %d, \"stats\": {\"min\": ", t->is_int ? "int32" : "float32", order);
    int fin = t->fin > 0;
    json_number(f, fin ? t->mn : NAN, worst);
    fputs(", \"max\": ", f);
    json_number(f, fin ? t->mx : NAN, worst);
    fputs(", \"mean\": ", f);
    json_number(f, fin ? t->sum / (double)t->fin : NAN, worst);
    fputs(", \"rms\": ", f);
    json_number(f, fin ? sqrt(t->ss / (double)t->fin) : NAN, worst);
    fputs(", \"nan\": ", f);
    json_count(f, t->nan, worst);
    fputs(", \"inf\": ", f);
    json_count(f, t->inf, worst);
    fputs("}}", f);
}

static int write_index_json(const Dump *d, char *err, size_t errlen) {
    char path[4400], tmp[4400];
    snprintf(path, sizeof path, "%s/index.json", d->path);
    snprintf(tmp, sizeof tmp, "%s/index.json.partial", d->path);
    FILE *f = fopen(tmp, "w");
    if (!f) return zaya_fail(err, errlen, "cannot write %s: %s\n  hint: check that the folder is writable", tmp, strerror(errno));
    fputs("{\n  \"format_version\": 1,\n  \"producer\": ", f);
    write_producer(f);
    fputs(",\n  \"model\": ", f);
    write_model(f, d);
    fputs(",\n  \"weight_format\": ", f);
    write_weight_format(f, d);
    fprintf(f, ",\n  \"skip_expert\": \"%s\"", skip_name(d));
    if (d->precision != ZAYA_PRECISION_FP32) fprintf(f, ",\n  \"precision\": \"%s\"", precision_name(d));
    if (d->placement & (ZAYA_GGML | ZAYA_GGML_REF))   /* fp32 with ggml's roundings (ggml_round.h) */
        fprintf(f, ",\n  \"arithmetic\": \"%s\"", precision_name(d));
    if (d->replay_json) fprintf(f, ",\n  \"replay\": %s", d->replay_json);
    if (d->image_mask) {
        fputs(",\n  \"image_positions\": ", f);
        write_image_positions(f, d, 0);
    }
    if (d->image_json) fprintf(f, ",\n  \"images\": %s", d->image_json);
    fputs(",\n  \"tokens\": ", f);
    write_tokens(f, d);
    fputs(",\n  \"tensors\": [\n", f);
    int last = -1, order = 0;
    for (int i = 0; i < d->n; i++) if (!d->t[i].skip) last = i;
    for (int i = 0; i < d->n; i++) {
        if (d->t[i].skip) continue;
        fputs("    ", f);
        write_entry(f, d, &d->t[i], order++, 1, 0);
        fputs(i < last ? ",\n" : "\n", f);
    }
    fputs("  ]\n}\n", f);
    if (fclose(f) != 0) return zaya_fail(err, errlen, "cannot write %s: %s\n  hint: check the disk space", tmp, strerror(errno));
    /* renamed into place last: index.json exists only once every tensor file is whole */
    if (rename(tmp, path) != 0) return zaya_fail(err, errlen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    return 0;
}

/* Appends text to a JSON string being built (escapes quotes, backslashes and control characters). */
static void put_escaped(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') { fputc('\\', f); fputc(c, f); }
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

/* One __metadata__ entry whose value is JSON text, stored as a string (metadata is string -> string). */
static void meta_json(FILE *f, const char *key, void (*writer)(FILE *, const Dump *, int), const Dump *d, int worst) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (m) { writer(m, d, worst); fclose(m); }
    fprintf(f, ",\"%s\":\"", key);
    if (buf) put_escaped(f, buf, len);
    fputc('"', f);
    free(buf);
}

/* The writers of the metadata fields, in meta_json's form. */
static void meta_entries(FILE *f, const Dump *d, int worst) {
    fputc('[', f);
    int order = 0;
    for (int i = 0; i < d->n; i++) {
        if (d->t[i].skip) continue;
        if (order) fputs(", ", f);
        write_entry(f, d, &d->t[i], order++, 0, worst);
    }
    fputc(']', f);
}
static void meta_producer(FILE *f, const Dump *d, int worst) { (void)d; (void)worst; write_producer(f); }
static void meta_model(FILE *f, const Dump *d, int worst) { (void)worst; write_model(f, d); }
static void meta_weight_format(FILE *f, const Dump *d, int worst) { (void)worst; write_weight_format(f, d); }
static void meta_tokens(FILE *f, const Dump *d, int worst) { (void)worst; write_tokens(f, d); }

/* The safetensors JSON header: __metadata__ first (what index.json holds, each field as a string),
 * then every tensor in execution order with dtype, shape and data_offsets. Returns malloc'ed text. */
static char *st_header(const Dump *d, int worst, size_t *len) {
    char *buf = NULL;
    *len = 0;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fputs("{\"__metadata__\":{\"format_version\":\"1\"", f);
    meta_json(f, "producer", meta_producer, d, worst);
    meta_json(f, "model", meta_model, d, worst);
    meta_json(f, "weight_format", meta_weight_format, d, worst);
    fprintf(f, ",\"skip_expert\":\"%s\"", skip_name(d));
    if (d->precision != ZAYA_PRECISION_FP32) fprintf(f, ",\"precision\":\"%s\"", precision_name(d));
    if (d->replay_json) {
        fputs(",\"replay\":\"", f);
        put_escaped(f, d->replay_json, strlen(d->replay_json));
        fputc('"', f);
    }
    if (d->image_mask) meta_json(f, "image_positions", write_image_positions, d, worst);
    if (d->image_json) {
        fputs(",\"images\":\"", f);
        put_escaped(f, d->image_json, strlen(d->image_json));
        fputc('"', f);
    }
    meta_json(f, "tokens", meta_tokens, d, worst);
    meta_json(f, "tensors", meta_entries, d, worst);
    fputc('}', f);
    for (int i = 0; i < d->n; i++) {
        const DumpTensor *t = &d->t[i];
        if (t->skip) continue;
        uint64_t bytes = (t->state ? 1 : (uint64_t)d->T) * t->row * 4;
        fprintf(f, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t->name, t->is_int ? "I32" : "F32");
        write_shape(f, d, t, ",", worst);
        fputs("],\"data_offsets\":[", f);
        json_count(f, t->offset, worst);
        fputc(',', f);
        json_count(f, t->offset + bytes, worst);
        fputs("]}", f);
    }
    fputc('}', f);
    if (fclose(f) != 0) { free(buf); return NULL; }
    return buf;
}

/* ---- the run ---- */

static int write_whole(Dump *d, DumpTensor *t, const void *data, size_t bytes);

int dump_plan(Dump *d, int T, const ZayaModel *m, const char *model_path, int skip_mode, const int *tokens,
              char *err, size_t errlen) {
    if (d->err[0]) return zaya_fail(err, errlen, "%s", d->err);
    d->T = T;
    d->m = m;
    d->model_path = model_path;
    d->skip_mode = skip_mode;
    d->tokens = tokens;
    for (int i = 0; d->safetensors && i < d->n; i++) {   /* the vision tower's tensors first: they run first */
        DumpTensor *t = &d->t[i];
        if (t->skip || !t->vision) continue;
        t->offset = d->end;
        d->end += t->row * 4;
    }
    for (int i = 0; i < d->n; i++) {
        DumpTensor *t = &d->t[i];
        if (t->skip || t->state) continue;
        if (d->safetensors) {   /* token-major tensors first, in execution order; state tensors after the run */
            t->offset = d->end;
            d->end += (uint64_t)T * t->row * 4;
            continue;
        }
        char path[4400], header[256];
        npy_path(d, t, path, sizeof path);
        int len = npy_header(d, t, header);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {   /* too many open files: reopen on demand */
            for (int k = 0; k < i; k++)
                if (d->t[k].fd >= 0) { close(d->t[k].fd); d->t[k].fd = -1; }
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
        }
        if (fd < 0 || write_at(fd, header, (size_t)len, 0) != 0) {
            int e = errno;
            if (fd >= 0) close(fd);
            return zaya_fail(err, errlen, "cannot write %s: %s\n  hint: check the disk space and that the folder is writable", path, strerror(e));
        }
        t->fd = fd;
        t->offset = (uint64_t)len;
    }
    if (d->safetensors) {
        size_t len;
        char *h = st_header(d, 1, &len);
        if (!h) return zaya_fail(err, errlen, "out of memory in --dump");
        free(h);
        d->header_room = (len + 7) / 8 * 8;   /* the data starts 8-byte aligned, as the reference writer does */
        for (int i = 0; i < d->n; i++) {
            DumpTensor *t = &d->t[i];
            if (!t->held) continue;
            int bad = write_whole(d, t, t->held, t->row * 4);
            free(t->held);
            t->held = NULL;
            if (bad) return zaya_fail(err, errlen, "%s", d->err);
        }
    }
    return 0;
}

void dump_tap(void *ctx, const ZayaTap *tap) {
    Dump *d = ctx;
    if (tap->ragged || d->err[0]) return;
    int idx = find(d, tap);
    if (idx < 0) {
        tap_fail(d, "--dump: tap %s (layer %d) at position %d was not produced by the first position\n"
                 "  hint: the tap list changed (zaya.c); the dump writer lays files out from the first position's taps",
                 tap->name, tap->layer, tap->pos);
        return;
    }
    DumpTensor *t = &d->t[idx];
    if (t->skip) return;
    size_t row = tap->ndim == 0 ? 1 : tap->ndim == 1 ? (size_t)tap->shape[0] : (size_t)tap->shape[0] * tap->shape[1];
    if (t->state || tap->ndim != t->ndim || row != t->row || tap->is_int != t->is_int) {
        tap_fail(d, "--dump: tensor %s at position %d has %zu values per position, the first position had %zu",
                 t->name, tap->pos, row, t->row);
        return;
    }
    if (tap->pos != (int)t->rows || tap->pos >= d->T) {   /* rows of one tap arrive in position order */
        tap_fail(d, "--dump: tensor %s: position %d arrived after %zu rows (expected position %zu of 0..%d)",
                 t->name, tap->pos, t->rows, t->rows, d->T - 1);
        return;
    }
    size_t bytes = t->row * 4;
    int fd = d->safetensors ? d->fd : npy_fd(d, t);
    uint64_t off = d->safetensors ? 8 + d->header_room + t->offset + (uint64_t)tap->pos * bytes
                                  : t->offset + (uint64_t)tap->pos * bytes;
    if (fd < 0) return;
    if (write_at(fd, tap->data, bytes, off) != 0) {
        tap_fail(d, "cannot write tensor %s (position %d) to %s: %s\n  hint: check the disk space", t->name, tap->pos,
                 d->path, strerror(errno));
        return;
    }
    stats_add(t, tap->data, t->row);
    t->rows++;
}

/* Writes a whole tensor (a state tensor after the run, or a vision tensor) at its place; 0 or -1 (tap_fail). */
static int write_whole(Dump *d, DumpTensor *t, const void *data, size_t bytes) {
    if (d->safetensors) {
        if (write_at(d->fd, data, bytes, 8 + d->header_room + t->offset) != 0) {
            tap_fail(d, "cannot write tensor %s to %s: %s\n  hint: check the disk space", t->name, d->path,
                     strerror(errno));
            return -1;
        }
        return 0;
    }
    char path[4400], header[256];
    npy_path(d, t, path, sizeof path);
    int len = npy_header(d, t, header);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int ok = fd >= 0 && write_at(fd, header, (size_t)len, 0) == 0 && write_at(fd, data, bytes, (uint64_t)len) == 0;
    int e = errno;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (!ok) {
        tap_fail(d, "cannot write %s: %s\n  hint: check the disk space and that the folder is writable", path,
                 strerror(e));
        return -1;
    }
    return 0;
}

void dump_state_tap(void *ctx, const ZayaTap *tap) {
    Dump *d = ctx;
    if (d->err[0]) return;
    int idx = find(d, tap);
    if (idx < 0) {
        tap_fail(d, "--dump: state tensor %s (layer %d) was not produced after the first position\n"
                 "  hint: the tap list changed (zaya.c)", tap->name, tap->layer);
        return;
    }
    DumpTensor *t = &d->t[idx];
    if (t->skip) return;
    if (!t->state || t->vision || t->rows || tap->ndim != t->ndim || tap->is_int != t->is_int) {
        tap_fail(d, "--dump: state tensor %s arrived twice or with another shape", t->name);
        return;
    }
    t->shape[0] = tap->shape[0];
    t->shape[1] = tap->shape[1];
    t->row = tap->ndim == 0 ? 1 : tap->ndim == 1 ? (size_t)tap->shape[0] : (size_t)tap->shape[0] * tap->shape[1];
    if (d->safetensors) {
        t->offset = d->end;
        d->end += t->row * 4;
    }
    if (write_whole(d, t, tap->data, t->row * 4) != 0) return;
    stats_add(t, tap->data, t->row);
    t->rows = 1;
}

void dump_vision_tap(void *ctx, const char *name, const float *x, int rows, int cols) {
    Dump *d = ctx;
    if (d->err[0]) return;
    const ZayaTap tap = {name, -1, -1, 0, 2, {rows, cols}, x, 0};
    if (d->T || find(d, &tap) >= 0) {
        tap_fail(d, "--dump: the vision tensor %s arrived %s\n  hint: one --image per run; the tower runs before the "
                 "decoder (dump.c)", name, d->T ? "after the files were laid out" : "twice");
        return;
    }
    learn(d, &tap, 1);
    if (d->err[0]) return;
    DumpTensor *t = &d->t[d->n - 1];
    t->vision = 1;
    if (t->skip) return;
    const size_t bytes = t->row * 4;
    if (d->safetensors) {   /* the data region starts behind the header, sized in dump_plan: kept until then */
        t->held = malloc(bytes + 1);
        if (!t->held) { tap_fail(d, "out of memory in --dump (vision tensor %s, %zu bytes)", name, bytes); return; }
        memcpy(t->held, x, bytes);
    } else if (write_whole(d, t, x, bytes) != 0) {
        return;
    }
    stats_add(t, x, t->row);
    t->rows = 1;
}

const char *dump_error(const Dump *d) { return d->err[0] ? d->err : NULL; }

int dump_finish(Dump *d, char *err, size_t errlen) {
    if (d->err[0]) return zaya_fail(err, errlen, "%s", d->err);
    for (int i = 0; i < d->n; i++) {
        const DumpTensor *t = &d->t[i];
        if (t->skip) continue;
        if (t->state ? t->rows != 1 : t->rows != (size_t)d->T)
            return zaya_fail(err, errlen, "--dump: tensor %s received %zu of its %d rows; the dump is incomplete\n"
                             "  hint: a tap stopped arriving (zaya.c changed?); compare with --list-taps",
                             t->name, t->rows, t->state ? 1 : d->T);
    }
    if (!d->safetensors) {
        for (int i = 0; i < d->n; i++) {
            DumpTensor *t = &d->t[i];
            if (t->fd >= 0) {
                int bad = close(t->fd) != 0;
                t->fd = -1;
                if (bad) return zaya_fail(err, errlen, "cannot write tensor %s in %s: %s\n  hint: check the disk space", t->name, d->path, strerror(errno));
            }
        }
        return write_index_json(d, err, errlen);
    }
    size_t len;
    char *h = st_header(d, 0, &len);
    if (!h) return zaya_fail(err, errlen, "out of memory in --dump");
    if (len > d->header_room) {
        free(h);
        return zaya_fail(err, errlen, "--dump: the safetensors header needs %zu bytes, %llu were reserved (a bug in dump.c)",
                         len, (unsigned long long)d->header_room);
    }
    char *room = malloc(d->header_room);
    if (!room) { free(h); return zaya_fail(err, errlen, "out of memory in --dump"); }
    memcpy(room, h, len);
    memset(room + len, ' ', d->header_room - len);   /* the format allows trailing spaces in the header */
    free(h);
    unsigned char n8[8];
    for (int k = 0; k < 8; k++) n8[k] = (unsigned char)(d->header_room >> (8 * k));
    /* the header, then its length last: until then the first 8 bytes are 0 and the file reads as incomplete */
    int ok = ftruncate(d->fd, (off_t)(8 + d->header_room + d->end)) == 0 && write_at(d->fd, room, d->header_room, 8) == 0 &&
             write_at(d->fd, n8, 8, 0) == 0;
    free(room);
    int e = errno;
    if (close(d->fd) != 0 && ok) { ok = 0; e = errno; }
    d->fd = -1;
    if (!ok) return zaya_fail(err, errlen, "cannot write %s: %s\n  hint: check the disk space", d->path, strerror(e));
    return 0;
}

void dump_free(Dump *d) {
    for (int i = 0; i < d->n; i++) {
        if (d->t[i].fd >= 0) close(d->t[i].fd);
        free(d->t[i].held);
    }
    if (d->fd >= 0) close(d->fd);
    free(d->t);
    free(d->hash);
    if (d->has_filter) regfree(&d->filter);
    memset(d, 0, sizeof *d);
    d->fd = -1;
}
