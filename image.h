/* image.h - images in for ZAYA1-VL: PPM and PNG files decoded (no libraries), and the image processor's
 * preprocessing (transformers' Qwen2VLImageProcessorPil: smart resize, PIL's BICUBIC resampling,
 * rescale, normalize, patches), so that ./zaya --image gives the official pixel values bit for bit.
 * docs/architecture.md "Images in".
 */
#ifndef ZAYA_IMAGE_H
#define ZAYA_IMAGE_H

#include "vision.h"
#include <stddef.h>
#include <stdint.h>

/* An 8-bit RGB image, row-major, 3 bytes a pixel. */
typedef struct {
    int width, height;
    uint8_t *rgb;
} ZayaImage;

/* Reads a PPM (P6 or P3, maxval 255) or PNG (8-bit gray, gray + alpha, RGB, RGBA or palette; alpha is
 * dropped, as PIL's convert("RGB")) file. Returns 0, or -1 + err (what, where, a hint) for anything else;
 * a truncated or corrupt file is refused, never read as a smaller image. Free img->rgb with free(). */
int zaya_image_read(const char *path, ZayaImage *img, char *err, size_t errlen);

/* HF qwen2_vl smart_resize: the size nearest (h, w) whose sides are multiples of factor and whose area is
 * within [min_pixels, max_pixels]. Returns 0, or -1 + err when the aspect ratio is over 200. */
int zaya_smart_resize(int height, int width, int factor, int min_pixels, int max_pixels, int *out_h, int *out_w,
                      char *err, size_t errlen);

/* PIL Image.resize(..., BICUBIC) on 8-bit RGB (Pillow 13's Resample.c: a = -0.5, support 2 times the scale
 * when shrinking, 22-bit fixed-point coefficients, two passes each rounded to 8 bits: horizontal then vertical,
 * or vertical first when the height shrinks by more than twice the width's change).
 * in [h, w, 3] -> out [out_h, out_w, 3]. Returns 0, or -1 when out of memory. */
int zaya_resize_bicubic(const uint8_t *in, int w, int h, uint8_t *out, int out_w, int out_h);

/* The processor's defaults (Qwen2VLImageProcessor): min_pixels 56*56, max_pixels 28*28*1280. */
#define ZAYA_IMAGE_MIN_PIXELS (56 * 56)
#define ZAYA_IMAGE_MAX_PIXELS (28 * 28 * 1280)

/* HF Qwen2VLImageProcessorPil on one image: smart resize to multiples of patch x merge, BICUBIC, x/255,
 * (x - mean) / std with the CLIP mean and std, then the patches in the vision tower's order -> *pixels
 * [grid_h * grid_w, C*T*P*P] (malloc'ed; free it). Returns 0, or -1 + err. */
int zaya_image_pixels(const ZayaImage *img, const ZayaVisionConfig *c, float **pixels, int *grid_h, int *grid_w,
                      char *err, size_t errlen);

#endif /* ZAYA_IMAGE_H */
