/* quantize.c - the int8 (Q8_0-style) quantizer that export_weights.py drives, one tensor per run.
 *
 *   zaya-quantize f32|bf16 GROUP ROWLEN OUT_FILE OFFSET NUMEL  < raw little-endian values
 *
 * Reads NUMEL values (rows of ROWLEN) from standard input, splits each row into groups of GROUP
 * consecutive values, and writes at byte OFFSET of OUT_FILE the blob's int8 layout
 * (docs/blob-format.md): the int8 values, zero padding to a multiple of 64 bytes, then one float32
 * scale per group, with
 *   scale = max|w| / 127,  q = round(w / scale)  (0 for an all-zero group).
 * Inside a row, every block of 8 groups is stored interleaved (zaya_q8_position() in tensor.h: value
 * j of group k at (j/2)*16 + 2k + j%2) so that the SIMD kernels sum 8 groups in 8 lanes at once.
 * Prints one line: "<crc32 of the written bytes> <max abs error> <sum sq error> <sum sq weights>".
 * Python alone would need hours for the 8.8 B weights of ZAYA1-8B; this takes seconds per GB.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tensor.h"   /* the one CRC-32 and int8 storage order of zaya.c */

static int die(const char *msg) {
    fprintf(stderr, "zaya-quantize: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 7) return die("usage: zaya-quantize f32|bf16 GROUP ROWLEN OUT_FILE OFFSET NUMEL < values");
    int bf16 = strcmp(argv[1], "bf16") == 0;
    if (!bf16 && strcmp(argv[1], "f32") != 0) return die("input dtype must be f32 or bf16");
    long group = strtol(argv[2], NULL, 10), cols = strtol(argv[3], NULL, 10);
    long long offset = strtoll(argv[5], NULL, 10), numel = strtoll(argv[6], NULL, 10);
    if (group < 1 || group > 4096 || cols < 1 || cols % group || offset < 0 || numel < 1 || numel % cols)
        return die("bad GROUP / ROWLEN / OFFSET / NUMEL (ROWLEN a multiple of GROUP, NUMEL of ROWLEN)");
    int fd = open(argv[4], O_WRONLY);
    if (fd < 0) return die(strerror(errno));

    const long long rows = numel / cols, chunk_rows = (1 << 20) / cols + 1, groups_per_row = cols / group;
    const size_t in_size = bf16 ? 2 : 4;
    unsigned char *in = malloc((size_t)(chunk_rows * cols) * in_size);
    int8_t *q = malloc((size_t)(chunk_rows * cols)), *row_q = malloc((size_t)cols);
    float *w = malloc(sizeof(float) * (size_t)group);
    float *scales = malloc(sizeof(float) * (size_t)(numel / group));
    if (!in || !q || !row_q || !w || !scales) return die("out of memory");
    double max_err = 0, sum_sq_err = 0, sum_sq = 0;
    uint32_t crc = 0;
    for (long long done = 0; done < rows;) {
        long long nr = rows - done < chunk_rows ? rows - done : chunk_rows;
        size_t want = (size_t)(nr * cols) * in_size;
        if (fread(in, 1, want, stdin) != want) return die("standard input ended early");
        for (long long r = 0; r < nr; r++) {
            for (long long g = 0; g < groups_per_row; g++) {
                float amax = 0.0f;
                for (long k = 0; k < group; k++) {
                    size_t i = (size_t)(r * cols + g * group + k);
                    if (bf16) { uint32_t b = (uint32_t)(in[2 * i] | in[2 * i + 1] << 8) << 16; memcpy(&w[k], &b, 4); }
                    else memcpy(&w[k], in + 4 * i, 4);
                    if (!isfinite(w[k])) return die("the tensor has a NaN or infinite value");
                    amax = fmaxf(amax, fabsf(w[k]));
                }
                float s = amax / 127.0f;
                scales[(done + r) * groups_per_row + g] = s;
                for (long k = 0; k < group; k++) {
                    int v = s > 0.0f ? (int)roundf(w[k] / s) : 0;
                    v = v > 127 ? 127 : v < -127 ? -127 : v;
                    row_q[g * group + k] = (int8_t)v;
                    double err = fabs((double)w[k] - (double)v * s);
                    max_err = err > max_err ? err : max_err;
                    sum_sq_err += err * err;
                    sum_sq += (double)w[k] * w[k];
                }
            }
            for (long i = 0; i < cols; i++) q[r * cols + zaya_q8_position((int)i, (int)cols, (int)group)] = row_q[i];
        }
        size_t nq = (size_t)(nr * cols);
        if (pwrite(fd, q, nq, offset + done * cols) != (ssize_t)nq) return die(strerror(errno));
        crc = zaya_crc32(crc, (unsigned char *)q, nq);
        done += nr;
    }
    long long pad = (numel + 63) / 64 * 64 - numel;
    unsigned char zeros[64] = {0};
    if (pad && pwrite(fd, zeros, (size_t)pad, offset + numel) != (ssize_t)pad) return die(strerror(errno));
    crc = zaya_crc32(crc, zeros, (size_t)pad);
    size_t ns = sizeof(float) * (size_t)(numel / group);
    if (pwrite(fd, scales, ns, offset + numel + pad) != (ssize_t)ns) return die(strerror(errno));
    crc = zaya_crc32(crc, (unsigned char *)scales, ns);
    if (close(fd) != 0) return die(strerror(errno));
    printf("%u %.9g %.17g %.17g\n", crc, max_err, sum_sq_err, sum_sq);
    free(in); free(q); free(row_q); free(w); free(scales);
    return 0;
}
