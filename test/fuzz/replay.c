/* replay.c - runs fuzz inputs through a fuzz target's LLVMFuzzerTestOneInput without libFuzzer, so
 * the regression files and seed corpora are checked with plain gcc (+ ASan/UBSan) by `make test`.
 *
 *   gcc -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -std=c11 -I. \
 *       test/fuzz/replay.c test/fuzz/fuzz_blob.c zaya.c blob.c kernels.c tokenizer.c trace.c -pthread -lm -o build/replay_blob
 *   build/replay_blob test/fuzz/regressions/fuzz_blob build/fuzz_blob_seeds
 *
 * Arguments are files or folders (every regular file inside, not recursive). Prints one line per
 * input ("ok NAME") and a total; a crash or a sanitizer report ends the process, naming the input on
 * the line before. Exit status 0 when every input ran, 2 when an argument could not be read.
 */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); return -1; }
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: out of memory reading %s\n", path); return -1; }
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    printf("ok %s\n", path);
    fflush(stdout);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    int bad = 0, count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) { fprintf(stderr, "replay: %s not found\n", argv[i]); bad = 1; continue; }
        if (!S_ISDIR(st.st_mode)) { bad |= run_file(argv[i]) != 0; count++; continue; }
        DIR *d = opendir(argv[i]);
        if (!d) { fprintf(stderr, "replay: cannot read folder %s\n", argv[i]); bad = 1; continue; }
        char **names = NULL;
        size_t n = 0;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            char **nn = realloc(names, (n + 1) * sizeof *names);
            if (!nn) abort();
            names = nn;
            names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
            if (!names[n]) abort();
            sprintf(names[n], "%s/%s", argv[i], e->d_name);
            n++;
        }
        closedir(d);
        qsort(names, n, sizeof *names, cmp_str);   /* a fixed order: failures reproduce */
        for (size_t k = 0; k < n; k++) {
            if (stat(names[k], &st) == 0 && S_ISREG(st.st_mode)) { bad |= run_file(names[k]) != 0; count++; }
            free(names[k]);
        }
        free(names);
    }
    printf("replayed %d inputs\n", count);
    return bad ? 2 : 0;
}
