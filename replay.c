/* replay.c - ./zaya MODEL --replay PORT_DUMP --dump OUT: each layer recomputed from a port's own input.
 *
 * A port's dump (the same names as --dump, docs/compare.md) holds its residual stream at every layer
 * boundary: model.layers.{i}.post_mlp_residual_scale, the output of layer i and the input of layer
 * i+1. Replaying runs layer i alone on the port's input to it (zaya_replay_layer), over all positions
 * so that the KV cache, conv state and delayed value build up as in a whole run, and reports every
 * tap of the layer; compare.py --local then sets the port's output of each layer beside zaya.c's
 * recomputation from the same input: what differs was introduced by that layer. The router's EDA
 * state crosses layers: it is the port's model.layers.{i-1}.mlp.gate:router_state where the dump has
 * it, else zaya.c's own from its replay of layer i-1 (said so in the log and in index.json).
 */
#define _POSIX_C_SOURCE 200809L
#include "replay.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A little-endian float32 .npy [T, cols] of the port's dump: NULL if the file does not exist, else
 * the values, or NULL with err set when it is not such a file. */
static float *read_port_tensor(const char *dir, const char *name, int T, int cols, char *err, size_t errlen) {
    char path[4096], head[1024], file[512];
    snprintf(file, sizeof file, "%s.npy", name);
    for (char *p = file; *p; p++) if (*p == ':') *p = '~';
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char pre[12];
    size_t hlen = 0;
    int ok = fread(pre, 1, 10, f) == 10 && !memcmp(pre, "\x93NUMPY", 6);
    if (ok && pre[6] == 1) hlen = pre[8] | (size_t)pre[9] << 8;
    else if (ok && (pre[6] == 2 || pre[6] == 3) && fread(pre + 10, 1, 2, f) == 2)
        hlen = pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    ok = ok && hlen > 0 && hlen < sizeof head && fread(head, 1, hlen, f) == hlen;
    long dims[3] = {-1, 1, 1};
    int nd = 0;
    if (ok) {
        head[hlen] = 0;
        const char *sh = strstr(head, "'shape': (");
        for (const char *p = sh ? sh + 10 : NULL; p && nd < 3 && *p != ')';) {   /* "(38, 16)" or "(38,)" */
            char *end;
            dims[nd] = strtol(p, &end, 10);
            if (end == p) break;
            nd++;
            p = end + (*end == ',') + (end[*end == ','] == ' ');
        }
        ok = nd >= 1 && nd <= 2 && strstr(head, "'<f4'") && strstr(head, "'fortran_order': False");
    }
    const long rows = dims[0], n_cols = nd == 2 ? dims[1] : 1;
    if (!ok || rows != T || n_cols != cols) {
        fclose(f);
        zaya_fail(err, errlen, "replay: %s is not a float32 [%d, %d] array (the port's %s)\n  expected: a C-order <f4 .npy of %d "
                  "positions x %d values\n  found: %s\n  hint: dump the tensor as the port computes it, token-major (docs/compare.md)",
                  path, T, cols, name, T, cols, ok ? "another shape" : "not such a .npy file");
        return NULL;
    }
    float *x = malloc(sizeof(float) * (size_t)T * cols + 1);
    if (!x || fread(x, sizeof(float), (size_t)T * cols, f) != (size_t)T * cols) {
        free(x);
        fclose(f);
        zaya_fail(err, errlen, "replay: %s is cut short (expected %d x %d float32 values)\n  hint: the port's dump is incomplete",
                  path, T, cols);
        return NULL;
    }
    fclose(f);
    return x;
}

/* The port's dump's index.json, whole (malloc'd, NUL-terminated; path gets its name), or NULL with err. */
static char *read_index(const char *dir, char *path, size_t pathlen, char *err, size_t errlen) {
    snprintf(path, pathlen, "%s/index.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        zaya_fail(err, errlen, "replay: cannot open %s\n  hint: --replay takes a dump folder (./zaya --dump, "
                  "tools/golden_hf.py or a port's own, docs/compare.md)", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    size_t got = text ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!text || got != (size_t)size) {
        free(text);
        zaya_fail(err, errlen, "replay: cannot read %s", path);
        return NULL;
    }
    text[size] = 0;
    return text;
}

/* The ids of the port's dump: index.json's "tokens" list. Returns the count, or -1 with err. */
static int read_port_tokens(const char *text, const char *path, int **ids, char *err, size_t errlen) {
    const char *p = strstr(text, "\"tokens\"");
    p = p ? strchr(p, '[') : NULL;
    int n = 0, cap = 64;
    *ids = malloc(sizeof(int) * (size_t)cap);
    while (p && *ids && *p && *p != ']') {
        p++;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (*p == ']') break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) { p = NULL; break; }
        if (n == cap) *ids = realloc(*ids, sizeof(int) * (size_t)(cap *= 2));
        if (*ids) (*ids)[n++] = (int)v;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
        if (*p != ',' && *p != ']') p = NULL;
    }
    if (!p || !*ids || n == 0) {
        free(*ids);
        *ids = NULL;
        return zaya_fail(err, errlen, "replay: %s has no \"tokens\": [ids...] list\n  hint: the dump's index.json names the "
                         "ids it ran (docs/compare.md)", path);
    }
    return n;
}

/* ZAYA1-VL: index.json's "image_positions": [[first, end], ...] into image[T]. Returns the number of image
 * positions, 0 when the field is absent, or -1 with err when it is malformed. */
static int read_image_positions(const char *text, const char *path, int T, unsigned char *image, char *err,
                                size_t errlen) {
    const char *p = strstr(text, "\"image_positions\"");
    int n = 0, ok = 1;
    if (p) {
        p = strchr(p, '[');
        ok = p != NULL;
        for (p = p ? p + 1 : NULL; ok && p;) {   /* [[2, 37], [40, 45]] */
            while (*p == ' ' || *p == '\n' || *p == ',') p++;
            if (*p == ']') break;
            char *end;
            long a = *p == '[' ? strtol(p + 1, &end, 10) : -1;
            p = a >= 0 ? strchr(end, ',') : NULL;
            long b = p ? strtol(p + 1, &end, 10) : -1;
            p = b >= 0 ? strchr(end, ']') : NULL;
            ok = p && a <= b && b <= T;
            for (long t = a; ok && t < b; t++) n += !image[t], image[t] = 1;
            if (p) p++;
        }
    }
    if (!ok)
        return zaya_fail(err, errlen, "replay: %s: image_positions is not a list of [first, end) ranges within the %d "
                         "positions\n  expected: e.g. \"image_positions\": [[2, 37]] (docs/golden-formats.md)", path,
                         T);
    return n;
}

/* Whether the port's dump has a tensor of this name (its .npy file). */
static int port_has(const char *dir, const char *name) {
    char path[4096], file[512];
    snprintf(file, sizeof file, "%s.npy", name);
    for (char *p = file; *p; p++) if (*p == ':') *p = '~';
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* Whether the port's dump has the final norm or logits (full, or a logits:topK file). */
static int port_has_final(const char *dir) {
    if (port_has(dir, "model.norm") || port_has(dir, "logits")) return 1;
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && !found && (e = readdir(d));) found = !strncmp(e->d_name, "logits~top", 10);
    if (d) closedir(d);
    return found;
}

int zaya_replay_open(const ZayaModel *m, const char *dir, ReplayInfo *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    err[0] = 0;
    char path[4096], *text = read_index(dir, path, sizeof path, err, errlen);
    if (!text) return -1;
    info->n_tokens = read_port_tokens(text, path, &info->tokens, err, errlen);
    if (info->n_tokens < 0) { free(text); return -1; }
    info->input_computed = !port_has(dir, "model:input_scaled");
    info->final_in_port = port_has_final(dir);
    if (m->vl) {   /* ZAYA1-VL: the image positions (the vision LoRA and the image mask run there) */
        info->image = calloc((size_t)info->n_tokens + 1, 1);
        info->n_image = info->image ? read_image_positions(text, path, info->n_tokens, info->image, err, errlen)
                                    : zaya_fail(err, errlen, "out of memory");
        if (info->n_image < 0) { free(text); return -1; }
        info->image_from_index = info->n_image > 0;
        for (int t = 0; !info->image_from_index && t < info->n_tokens; t++)
            info->n_image += info->image[t] = info->tokens[t] == m->image_token_id;
        if (!info->n_image) { free(info->image); info->image = NULL; }
    }
    free(text);
    for (int i = 1; i < m->config.num_layers; i++) {
        char name[160];
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate:router_state", i - 1);
        info->router_state_from_port[i] = (unsigned char)port_has(dir, name);
    }
    return 0;
}

int zaya_replay_run(const ZayaModel *m, ZayaState *s, const char *dir, const ReplayInfo *info, FILE *log, char *err,
                    size_t errlen) {
    const ZayaConfig *c = &m->config;
    const int H = c->hidden_size, R = c->router_hidden, L = c->num_layers, T = info->n_tokens;
    err[0] = 0;
    float *r = info->input_computed ? NULL : read_port_tensor(dir, "model:input_scaled", T, H, err, errlen);
    float *rho = calloc((size_t)T * R + 1, sizeof(float));
    if (!info->input_computed && !r) { free(rho); return -1; }
    if (!rho) { free(r); return zaya_fail(err, errlen, "out of memory"); }
    if (!r) {   /* layer 0's input from the ids: zaya.c's embedding and input scaling (not a replay tap) */
        float *features = NULL;   /* ZAYA1-VL: the image positions take the port's image features */
        if (info->image && !(features = read_port_tensor(dir, "model.visual", info->n_image, H, err, errlen))) {
            if (!err[0])
                zaya_fail(err, errlen, "replay: the port's dump has %d image positions but neither model:input_scaled "
                          "nor model.visual (the image features, [%d, %d])\n  hint: dump the decoder's input "
                          "(model:input_scaled) or the vision tower's output", info->n_image, info->n_image, H);
            free(rho);
            return -1;
        }
        ZayaTapFn tap = s->tap;
        s->tap = NULL;
        r = malloc(sizeof(float) * (size_t)T * H + 1);
        int rc = r ? 0 : zaya_fail(err, errlen, "out of memory");
        if (rc == 0 && features) rc = zaya_set_images(m, s, features, info->n_image, err, errlen);
        if (rc == 0) rc = zaya_embed(m, s, info->tokens, T, r, err, errlen);
        s->tap = tap;
        zaya_state_reset(s, m);
        free(features);
        if (rc != 0) { free(r); free(rho); return -1; }
    }
    s->image_mask = info->image;
    if (log && info->image)
        fprintf(log, "replay: %d image positions (from %s): the vision LoRA and the bidirectional image mask there\n",
                info->n_image, info->image_from_index ? "index.json's image_positions" : "the image token id");
    if (log) fprintf(log, "replay: %d positions of %s; layer 0 from %s\n", T, dir,
                     !info->input_computed ? "model:input_scaled" : info->image ? "zaya.c's embedding of the ids, the "
                     "port's model.visual at the image positions (the dump has no model:input_scaled)" :
                     "zaya.c's embedding of the ids (the dump has no model:input_scaled)");
    if (log && !info->final_in_port)
        fprintf(log, "replay: the dump has no model.norm or logits: the final norm and the LM head are not replayed\n");
    for (int i = 0; i <= (info->final_in_port ? L : L - 1); i++) {
        char name[160];
        if (i > 0) {   /* the port's output of layer i-1; its EDA state where the port has it, else ours (in rho) */
            snprintf(name, sizeof name, "model.layers.%d.post_mlp_residual_scale", i - 1);
            free(r);
            r = read_port_tensor(dir, name, T, H, err, errlen);
            if (!r) {
                if (!err[0]) zaya_fail(err, errlen, "replay: the port's dump has no %s (the input of %s %d)\n  hint: a port "
                                       "must dump its residual stream at every layer boundary (docs/compare.md)", name,
                                       i < L ? "layer" : "the final norm after layer", i < L ? i : i - 1);
                free(rho);
                return -1;
            }
            snprintf(name, sizeof name, "model.layers.%d.mlp.gate:router_state", i - 1);
            float *port_rho = i < L && info->router_state_from_port[i] ? read_port_tensor(dir, name, T, R, err, errlen) : NULL;
            if (!port_rho && err[0]) { free(r); free(rho); return -1; }
            if (port_rho) memcpy(rho, port_rho, sizeof(float) * (size_t)T * R);
            free(port_rho);
            if (log && i < L && !info->router_state_from_port[i])
                fprintf(log, "replay: layer %d: the dump has no %s; EDA uses zaya.c's replay of layer %d\n", i, name, i - 1);
        }
        zaya_state_reset(s, m);
        if (zaya_replay_layer(m, s, i, r, rho, T, err, errlen) != 0) {
            free(r), free(rho);
            s->image_mask = NULL;
            return -1;
        }
    }
    s->image_mask = NULL;
    free(r);
    free(rho);
    return 0;
}

/* ZAYA1-VL: the first image's patch grid from index.json's "image_grid_thw": [1, h, w] (any spacing); 0, or -1
 * when absent. */
static int read_grid(const char *dir, int *gh, int *gw) {
    char path[4096], err[8];
    char *text = read_index(dir, path, sizeof path, err, sizeof err);
    const char *p = text ? strstr(text, "\"image_grid_thw\"") : NULL;
    p = p ? strchr(p, '[') : NULL;
    long v[3] = {0};
    for (int i = 0; p && i < 3; i++) {   /* [t, h, w] */
        char *end;
        v[i] = strtol(p + 1, &end, 10);
        p = end > p + 1 ? end + strspn(end, " \t\r\n") : NULL;
        if (p && *p != (i < 2 ? ',' : ']')) p = NULL;
    }
    free(text);
    return p && v[0] == 1 && v[1] > 0 && v[2] > 0 && v[1] <= 4096 && v[2] <= 4096 ? (*gh = (int)v[1], *gw = (int)v[2], 0)
                                                                                   : -1;
}

int zaya_replay_vision(const ZayaModel *m, int threads, const char *dir, ZayaVisionTapFn tap, void *tap_ctx, FILE *log,
                       char *err, size_t errlen) {
    err[0] = 0;
    int gh = 0, gw = 0, done = 0;
    if (!m->vl || !port_has(dir, "model.visual.patch_embed")) return 0;
    if (read_grid(dir, &gh, &gw) != 0) {
        if (log) fprintf(log, "replay: the dump has the vision tower but no images[0].image_grid_thw in index.json: the "
                         "tower is not replayed\n");
        return 0;
    }
    const int n = gh * gw, D = m->vision.config.hidden_size;
    for (int i = 0; i < m->vision.config.depth; i++) {
        char name[160];
        if (i == 0) snprintf(name, sizeof name, "model.visual.patch_embed");
        else snprintf(name, sizeof name, "model.visual.blocks.%d", i - 1);
        float *x = read_port_tensor(dir, name, n, D, err, errlen);
        if (!x && err[0]) return -1;
        if (!x) {
            if (log) fprintf(log, "replay: the dump has no %s: vision block %d is not replayed\n", name, i);
            continue;
        }
        int rc = zaya_vision_replay_block(&m->vision, threads, i, x, i == 0, gh, gw, tap, tap_ctx, err, errlen);
        free(x);
        if (rc != 0) return -1;
        done++;
    }
    if (log) fprintf(log, "replay: %d vision blocks, each from the port's input to it (a %d x %d patch grid)\n", done,
                     gh, gw);
    return done;
}
