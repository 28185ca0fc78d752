/* dump.h - --dump: every tap of a prompt run written to disk as it arrives (docs/golden-formats.md).
 *
 * Two forms, the same tensors, names, shapes and bytes:
 *   --dump DIR                one NumPy .npy file per tensor + index.json (docs/compare.md)
 *   --dump FILE.safetensors   one safetensors file; __metadata__ holds what index.json holds
 * Streaming: a short run of the first token learns every tap's name and row shape (dump_learn), the
 * files are laid out for the prompt's T positions (dump_plan), and each row is written at its place
 * as the model produces it (dump_tap), so memory does not grow with T. What marks a dump complete is
 * written last (index.json; the safetensors header and its length), so an interrupted run leaves a
 * dump that compare.py reports as incomplete.
 *
 * Functions return 0, or -1 with a message in err (what, where, expected vs found, a hint). The tap
 * callbacks cannot return one: they record the first error, ignore later rows, and dump_error()
 * returns it (the caller checks after each zaya_forward()).
 */
#ifndef ZAYA_DUMP_H
#define ZAYA_DUMP_H

#include "zaya.h"
#include <regex.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    char name[160];          /* full name: model.layers.{i}.NAME, or NAME at model level */
    int base, layer;         /* name + base is the tap's own name; its layer (-1 = model level) */
    int is_int, ndim, shape[2];   /* of one row; state tensors: the full shape (after the run) */
    size_t row;              /* values per position (state tensors: all values) */
    int state;               /* 1 = written once, whole: after the last position (zaya_state_taps), or a vision tap */
    int vision;              /* 1 = a ZAYA1-VL vision tower tensor (dump_vision_tap): [rows, cols], first */
    float *held;             /* safetensors: a vision tensor's values until dump_plan places them */
    int skip;                /* 1 = left out by --dump-filter */
    size_t rows;             /* positions written so far (state tensors: 1 once written) */
    uint64_t offset;         /* npy: data start in its file; safetensors: data_offsets begin */
    int fd;                  /* npy: the open file, or -1 */
    size_t nan, inf, fin;    /* stats over the values written so far (index.json) */
    double mn, mx, sum, ss;
} DumpTensor;

typedef struct {
    DumpTensor *t;
    int n, cap, cursor;
    int *hash;               /* open addressing over (tap_name, layer) -> index, size hash_cap */
    int hash_cap;
    regex_t filter;
    int has_filter;
    int safetensors;         /* 0: a folder of .npy files; 1: one .safetensors file */
    char path[4096];
    int fd;                  /* safetensors: the file */
    uint64_t header_room;    /* safetensors: N, the bytes reserved for the JSON header */
    uint64_t end;            /* safetensors: bytes of the data buffer laid out so far */
    int T;                   /* positions of the run */
    const ZayaModel *m;      /* for the index: the model, its path, the skip mode, the prompt */
    const char *model_path;
    int skip_mode;
    const int *tokens;
    int precision;           /* ZAYA_PRECISION_*: recorded in the index unless fp32 */
    int placement;           /* ZAYA_BF16_* flags, recorded with the precision */
    const char *replay_json; /* a replay's "replay" object (JSON text), or NULL */
    const unsigned char *image_mask;   /* ZAYA1-VL: [T] 1 at the positions that take image features, or NULL */
    const char *image_json;  /* ZAYA1-VL: the "images" list (JSON text: file, size, grid, positions), or NULL */
    char err[1024];          /* the first error of a tap callback ("" = none) */
} Dump;

/* Prepares a dump at `path`: a name ending in ".safetensors" is the one-file form (the file is
 * created now), anything else a folder (created if missing; a stale index.json is removed). filter:
 * a POSIX extended regex on the names, or NULL. */
int dump_open(Dump *d, const char *path, const char *filter, char *err, size_t errlen);

/* Tap callbacks of the learning run: every tap name and row shape of one position, in order. */
void dump_learn(void *ctx, const ZayaTap *tap);
void dump_learn_state(void *ctx, const ZayaTap *tap);

/* Lays the files out for T positions and creates them (npy headers now; the safetensors data region
 * is reserved behind room for the header). The index fields are kept for dump_finish. */
int dump_plan(Dump *d, int T, const ZayaModel *m, const char *model_path, int skip_mode, const int *tokens,
              char *err, size_t errlen);

/* ZAYA1-VL (a ZayaVisionTapFn, vision.h): one vision tower tensor of --image, [rows, cols] floats in the row
 * order HF holds it, given before dump_plan; written whole under its HF name (model.visual.*), before the
 * decoder's tensors in execution order (the folder: at once; safetensors: kept until dump_plan places it). */
void dump_vision_tap(void *ctx, const char *name, const float *x, int rows, int cols);

/* Tap callbacks of the real run: each row written at its place; state tensors after the run. */
void dump_tap(void *ctx, const ZayaTap *tap);
void dump_state_tap(void *ctx, const ZayaTap *tap);

/* The first error a tap callback met, or NULL. */
const char *dump_error(const Dump *d);

/* Checks that every row arrived, then writes what marks the dump complete: index.json, or the
 * safetensors header and then its length (the file's first 8 bytes). */
int dump_finish(Dump *d, char *err, size_t errlen);

/* Closes files and frees memory (also after an error). */
void dump_free(Dump *d);

#endif
