// Single images for `nanotrain predict` and `eval --misclassified`: read PNG and Netpbm files, write PNG, and the
// few conversions that turn a picture into a model input (channel count, size, polarity).
//
// What is read (the format is chosen by the file's first bytes, never by its name):
//   PNG   through libpng: gray, gray+alpha, RGB, RGBA and palette images, bit depths 1, 2, 4, 8 and 16, interlaced
//         or not. Palettes expand to RGB, depths below 8 expand to 8 bits, 16-bit samples scale to 8 bits rounded to
//         nearest (v * 255 / 65535, as libpng's png_set_scale_16). Alpha (an alpha channel or a tRNS chunk) is
//         dropped, not composited over a background: the colour values are kept as stored. No gamma or colour
//         profile is applied. Gray and gray+alpha give 1 channel; RGB, RGBA and palette images give 3.
//         The file is read whole and must be whole: a bad CRC in a critical chunk, bad compressed data, or any
//         byte missing up to and including IEND is an error. Warnings (bad ancillary chunks) are ignored.
//   PGM   P5 (binary) and P2 (ASCII), 1 channel; PPM P6 (binary) and P3 (ASCII), 3 channels. Comments (# to the
//         end of the line) between header fields, and in an ASCII raster. maxval 1..255 uses one byte per sample
//         in binary files, 256..65535 two (big-endian). Every sample scales to 0..255 as
//         round(v * 255 / maxval) = (v * 255 + maxval / 2) / maxval in integers: identity for maxval 255, 15 -> 255
//         for maxval 15, round(v / 257) for maxval 65535. A sample above maxval is an error. Only the first image of
//         a file is read; bytes after it are ignored (Netpbm allows several images in one file).
// Images over 16384 pixels per side or 2^28 pixels in all are refused before anything is allocated for them.
//
// Layout: planar, pixels (channels, rows, cols) row-major, 8 bits per sample, as the engine's model input is laid
// out (NCHW); files hold interleaved samples, which the reader and writer transpose.
//
// Errors: anything wrong with a file is an nt::Error whose one-line message names the file and the fault
// ("image 'x.png': corrupt PNG (IDAT: CRC error)"); a wrong argument to a conversion is an nt::Error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nt::data {

inline constexpr int kMaxImageSide = 16384;                   // pixels per side
inline constexpr int64_t kMaxImagePixels = int64_t(1) << 28;  // rows * cols

// An 8-bit image, planar: pixels (channels, rows, cols) row-major, as the engine's model input is laid out.
struct Image {
  int channels = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};

// PNG, PGM (P2, P5) or PPM (P3, P6), chosen by the file's magic bytes: 1 channel (gray) or 3 (RGB).
Image read_image(const std::string& path);

// A PNG of `image` (1 channel: 8-bit gray, 3: 8-bit RGB; no alpha), written atomically (core/atomic_file.h).
void write_png(const std::string& path, const Image& image);

// 1 -> 3 replicates the gray value; 3 -> 1 is ITU-R BT.601 luma rounded to nearest, computed exactly in integers:
//   Y = (299 R + 587 G + 114 B + 500) / 1000      (0.299 R + 0.587 G + 0.114 B, halves rounded up)
// The same count returns the image unchanged; any other pair is an nt::Error.
Image to_channels(const Image& image, int channels);

// Bilinear resampling with half-pixel centres and no antialiasing, as torch.nn.functional.interpolate(mode=
// "bilinear", align_corners=False, antialias=False) and torchvision's resize(antialias=False). For each channel and
// output pixel (y, x), with H, W the input size and h, w the output size:
//   sy = max(0, (y + 0.5) * (H / h) - 0.5),   y0 = floor(sy),  y1 = min(y0 + 1, H - 1),  fy = sy - y0
//   sx = max(0, (x + 0.5) * (W / w) - 0.5),   x0 = floor(sx),  x1 = min(x0 + 1, W - 1),  fx = sx - x0
//   v  = (1 - fy) * ((1 - fx) * in[y0][x0] + fx * in[y0][x1]) + fy * ((1 - fx) * in[y1][x0] + fx * in[y1][x1])
//   out[y][x] = floor(v + 0.5)          (in double precision; v is a convex mix of samples, within [0, 255])
// The same size gives the input back exactly (sy = y, fy = 0). Downscaling by more than 2 skips input pixels
// (no antialias), as the reference does. rows and cols must be 1..16384 with rows * cols <= 2^28 (else nt::Error).
Image resize_bilinear(const Image& image, int rows, int cols);

// v -> 255 - v for every sample. MNIST digits are white on black; --invert is for dark-on-light scans.
void invert(Image& image);

}  // namespace nt::data
