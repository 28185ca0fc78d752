/* fuzz_blob.c - libFuzzer target for the blob loader (zaya_load) and a forward pass on what it accepts.
 *
 * The input is a whole model file. Before loading, the header CRC and the file-size field are fixed up
 * (so mutations reach the checks behind them) unless header byte 72 (reserved, never read by the
 * loader) says otherwise: bit 0 set = keep the CRC as mutated, bit 1 set = keep the size field.
 * The bytes go to an in-memory file (memfd) that zaya_load opens by its /proc path; a blob that loads
 * (with ZAYA_LOAD_VERIFY on odd sizes) runs a prompt of 3 tokens in one batch, then 2 decode steps and
 * a context overflow, and its tokenizer section (if any) encodes and decodes a short text.
 *
 * Build with clang (libFuzzer), from the repo root:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 -I. \
 *       test/fuzz/fuzz_blob.c zaya.c blob.c kernels.c tokenizer.c trace.c -pthread -lm -o build/fuzz_blob
 * Without clang, test/fuzz/replay.c runs the same entry point over files (see test/fuzz/README.md).
 */
#define _GNU_SOURCE
#include "zaya.h"
#include "tokenizer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uint32_t crc32_bytes(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = crc & 1 ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
}

static void fix_header(unsigned char *b, size_t size) {
    if (size < 1024) return;
    unsigned char control = b[72];
    if (!(control & 2)) {
        uint64_t s = size;
        memcpy(b + 16, &s, 8);
    }
    if (!(control & 1)) {
        uint32_t n;
        memcpy(&n, b + 32, 4);
        size_t room = (size - 1024) / 192;
        if (n > room) n = (uint32_t)room;
        uint32_t zero = 0, crc = crc32_bytes(0, b, 12);
        crc = crc32_bytes(crc, (const unsigned char *)&zero, 4);
        crc = crc32_bytes(crc, b + 16, 1024 - 16 + (size_t)n * 192);
        memcpy(b + 12, &crc, 4);
    }
}

static void run_model(const ZayaModel *m) {
    char err[512];
    ZayaState s;
    int ctx = m->config.max_position < 6 ? m->config.max_position : 6;
    if (zaya_state_init(&s, m, ctx, 1, err, sizeof err) != 0) return;
    int prompt[3] = {m->config.bos_id, 0, m->config.vocab_size - 1};
    int n = ctx < 3 ? ctx : 3;
    if (zaya_forward(m, &s, prompt, n, err, sizeof err) == 0) {
        for (int i = 0; i < 2; i++) {
            const int id = (i * 7) % m->config.vocab_size;
            if (zaya_forward(m, &s, &id, 1, err, sizeof err) != 0) break;
        }
        const int zero = 0;
        while (zaya_forward(m, &s, &zero, 1, err, sizeof err) == 0) {}   /* up to the full context: must refuse, not overflow */
    }
    const int bad[2] = {-1, m->config.vocab_size};                /* bad ids are refused */
    zaya_forward(m, &s, &bad[0], 1, err, sizeof err);
    zaya_forward(m, &s, &bad[1], 1, err, sizeof err);
    zaya_state_free(&s);
    if (m->tokenizer) {
        static const char text[] = "Hello, world! \xe2\x96\x81 <bos> \xff\xfe 123";
        int *ids = NULL;
        size_t nid = 0, len = 0;
        if (zaya_tok_encode(m->tokenizer, text, sizeof text - 1, 1, &ids, &nid) == 0) {
            char *out = zaya_tok_decode(m->tokenizer, ids, nid, 0, &len);
            free(out);
            free(ids);
        }
    }
}

/* Byte mutations spread over a whole blob mostly hit tensor data; half of the time the mutation is
 * confined to the header or to one directory entry, so every field gets its share. (LLVMFuzzerMutate
 * is libFuzzer's; weak, so replay.c links without it and never calls this.) */
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size) __attribute__((weak));
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    if (size >= 1024 + 192 && (seed & 1)) {
        size_t entries = (size - 1024) / 192, off = 0, len = 1024;
        if (seed & 2) {
            uint32_t n;
            memcpy(&n, data + 32, 4);
            if (n > 0 && n < entries) entries = n;
            off = 1024 + (size_t)((seed >> 2) % entries) * 192;
            len = 192;
        }
        unsigned char region[1024];
        memcpy(region, data + off, len);
        size_t got = LLVMFuzzerMutate(region, len, len);   /* may shrink: the tail keeps its old bytes */
        memcpy(data + off, region, got);
        return size;
    }
    return LLVMFuzzerMutate(data, size, max_size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1u << 22)) return 0;
    int fd = memfd_create("fuzz_blob", 0);
    if (fd < 0) abort();
    unsigned char *b = malloc(size ? size : 1);
    if (!b) abort();
    memcpy(b, data, size);
    fix_header(b, size);
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, b + done, size - done);
        if (w <= 0) abort();
        done += (size_t)w;
    }
    free(b);
    char path[64], err[1024];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ZayaModel m;
    if (zaya_load(&m, path, size % 2 ? ZAYA_LOAD_VERIFY : 0, err, sizeof err) == 0) {
        run_model(&m);
        zaya_free(&m);
    } else if (err[0] == 0) {
        abort();   /* a failure must always say why */
    }
    close(fd);
    return 0;
}
