// Sampled images as a PNG: a grid of grey images, each a record of pixel
// letters (scripts/digits.py writes images so: "a" is level 0, blank, and
// the levels go up letter by letter to full ink).
//
//   std::vector<std::string> records = ...;            // 64 letters each for 8 x 8
//   write_image_grid("digits.png", records, /*width=*/8, /*top=*/'q');
//
// The PNG is encoded by libpng (Debian's libpng-dev, its simplified write
// API) and written atomically.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tapeformer {

// Records of width * height pixel letters from 'a' (blank) to `top` (full
// ink), drawn 8 screen pixels per image pixel with a 2-pixel gap, in rows of
// ceil(sqrt(n)) images. A character outside ['a', top] is drawn as blank;
// returns how many there were. Error when a record has another length.
int64_t write_image_grid(const std::string& path, const std::vector<std::string>& records, int64_t width, char top);

// An 8-bit grey image (rows of `width` bytes, 0 = black) as PNG bytes.
std::string encode_png_gray(const std::vector<uint8_t>& pixels, int64_t width, int64_t height);

}  // namespace tapeformer
