/* test_image.c - image.c's decoding and preprocessing on one file: writes the pixel values as raw float32
 * and prints "GRID_H GRID_W WIDTH HEIGHT" (test/test_image.py compares them with the official processor's).
 *
 *   build/test_image IMAGE OUT.f32 [--rgb OUT.rgb]   (--rgb: the decoded pixels instead, 8-bit RGB)
 */
#include "../image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && !strcmp(argv[3], "--rgb"))) {
        fprintf(stderr, "usage: test_image IMAGE OUT.f32 [--rgb]\n");
        return 2;
    }
    char err[1024];
    ZayaImage img;
    if (zaya_image_read(argv[1], &img, err, sizeof err) != 0) { fprintf(stderr, "zaya: error: %s\n", err); return 1; }
    FILE *f = fopen(argv[2], "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    if (argc == 4) {
        fwrite(img.rgb, 1, (size_t)img.width * img.height * 3, f);
        printf("0 0 %d %d\n", img.width, img.height);
    } else {
        ZayaVisionConfig c = {0};
        c.in_channels = 3, c.patch_size = 14, c.temporal_patch_size = 1, c.spatial_merge_size = 2;
        float *pixels;
        int gh, gw;
        if (zaya_image_pixels(&img, &c, &pixels, &gh, &gw, err, sizeof err) != 0) {
            fprintf(stderr, "zaya: error: %s\n", err);
            return 1;
        }
        fwrite(pixels, sizeof(float), (size_t)gh * gw * 3 * 14 * 14, f);
        printf("%d %d %d %d\n", gh, gw, img.width, img.height);
        free(pixels);
    }
    fclose(f);
    free(img.rgb);
    return 0;
}
