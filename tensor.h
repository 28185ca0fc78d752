/* tensor.h - what every file of zaya.c shares: the blob's dtypes, a weight matrix in any of them,
 * the int8 storage order, the CRC-32 and the error convention. The bottom of the include graph:
 * zaya.h, kernels.h, blob.c and quantize.c (the exporter's int8 helper) include it; it includes
 * only libc headers.
 */
#ifndef ZAYA_TENSOR_H
#define ZAYA_TENSOR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Tensor dtypes in the blob. Q8 = symmetric int8 in groups of `group_size` consecutive weights
 * along a row, one float32 scale per group (w = q * scale), values first then scales.
 * FP8 and MXFP4 (format version 2, expert tensors only; docs/quantized-experts.md):
 *   FP8   = E4M3FN bytes, one float32 scale per row: w = round_to(scale_dtype, e4m3(q) * scale);
 *   MXFP4 = two E2M1 values per byte (even column in the low nibble), one E8M0 byte e per 32
 *           values of a row: w = e2m1(q) * 2^(e - 127).
 * ZAYA_F16 is not a tensor dtype: only an FP8 scale dtype (ZayaMatrix.scale_dtype). */
enum { ZAYA_F32 = 0, ZAYA_BF16 = 1, ZAYA_Q8 = 2, ZAYA_FP8 = 3, ZAYA_MXFP4 = 4, ZAYA_F16 = 5 };

/* Rows per group of interleaved int8 rows (ZayaMatrix.interleaved_rows; kernels.c): pairs. */
#define ZAYA_Q8_INTERLEAVE 2

/* A weight matrix [rows, cols] (PyTorch [out, in]) in any blob dtype. */
typedef struct {
    int dtype;             /* ZAYA_F32, ZAYA_BF16, ZAYA_Q8, ZAYA_FP8 or ZAYA_MXFP4 */
    int rows, cols;
    int group_size;        /* Q8: its group size; MXFP4: 32 (values per E8M0 byte); else 0 */
    const void *data;      /* rows*cols values, row-major (MXFP4: rows*cols/2 bytes) */
    const float *scales;   /* Q8: rows*cols/group_size scales; FP8: rows scales, one per row */
    int interleaved_rows;  /* Q8 only: rows [0, interleaved_rows) are stored in groups of
                            * ZAYA_Q8_INTERLEAVE rows whose 64-byte chunks alternate (needs cols % 64
                            * == 0; zaya_load with ZAYA_LOAD_HUGEPAGES does this in its copy when built
                            * with the AVX-512 VNNI kernels, docs/blob-format.md); 0 = rows as in the blob */
    const uint8_t *exponents;   /* MXFP4 only: rows*cols/32 E8M0 bytes, row-major */
    int scale_dtype;       /* FP8 only: what each e4m3(q) * scale is rounded to: ZAYA_F32, ZAYA_BF16 or ZAYA_F16 */
    int ggml_type;         /* exported from a GGUF: 1 + the ggml type (ggml.h) of the tensor it was read from; else 0 */
} ZayaMatrix;

/* Where value i (0..cols-1) of an int8 row is stored: each block of 8 groups is interleaved so
 * that value j of group k sits at (j/2)*16 + 2k + j%2 (docs/blob-format.md); the tail of a row
 * that is not a whole block, and odd group sizes, are stored in order. quantize.c writes this
 * order, kernels.c reads it. */
static inline size_t zaya_q8_position(int i, int cols, int group) {
    const int block = 8 * group;
    if (group % 2 || i >= cols / block * block) return (size_t)i;   /* odd groups and the tail: unpermuted */
    const int b = i / block, k = (i % block) / group, j = i % group;
    return (size_t)b * block + (size_t)(j / 2) * 16 + 2 * k + j % 2;
}

/* float32 to the nearest bfloat16 (ties to even; inf stays inf, NaN stays NaN), as a float32: what
 * torch's .to(torch.bfloat16) keeps of a value. */
static inline float zaya_round_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    if ((b & 0x7fffffffu) > 0x7f800000u) return f;
    b = (b + 0x7fffu + ((b >> 16) & 1)) & 0xffff0000u;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* CRC-32 (IEEE, as Python's zlib.crc32) of n bytes, continuing crc (0 to start). The 256-entry
 * table is rebuilt on each call: small beside a tensor's bytes, the unit it is called on. */
static inline uint32_t zaya_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* Formats an error message into err and returns -1, so failures read `return zaya_fail(err, n, ...)`
 * (the library's convention: what was wrong, where, expected vs found, a hint; nothing printed). */
static inline int zaya_fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

#endif /* ZAYA_TENSOR_H */
