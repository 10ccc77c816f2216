#include "tapeformer/commands/image.h"

#include <png.h>

#include <cmath>

#include "tapeformer/core/error.h"
#include "tapeformer/core/files.h"

namespace tapeformer {

std::string encode_png_gray(const std::vector<uint8_t>& pixels, int64_t width, int64_t height) {
  TAPEFORMER_CHECK(width >= 1 && height >= 1 && static_cast<int64_t>(pixels.size()) == width * height,
                   "encode_png_gray: ", pixels.size(), " pixels for a ", width, " x ", height, " image");
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = PNG_FORMAT_GRAY;
  png_alloc_size_t bytes = 0;  // first the size, then the bytes
  TAPEFORMER_CHECK(png_image_write_to_memory(&image, nullptr, &bytes, 0, pixels.data(), 0, nullptr) != 0,
                   "encode_png_gray: libpng: ", image.message);
  std::string out(bytes, '\0');
  TAPEFORMER_CHECK(png_image_write_to_memory(&image, out.data(), &bytes, 0, pixels.data(), 0, nullptr) != 0,
                   "encode_png_gray: libpng: ", image.message);
  out.resize(bytes);
  return out;
}

int64_t write_image_grid(const std::string& path, const std::vector<std::string>& records, int64_t width, char top) {
  TAPEFORMER_CHECK(!records.empty() && width >= 1 && top > 'a', "image grid: ", records.size(), " images of width ",
                   width, ", letters a to ", top);
  const int64_t size = static_cast<int64_t>(records[0].size()), height = size / width;
  for (const std::string& r : records)
    TAPEFORMER_CHECK(static_cast<int64_t>(r.size()) == size && size % width == 0 && height >= 1, "image grid: a record of ",
                     r.size(), " pixels, not the ", height, " rows of ", width, " of the others");
  constexpr int64_t kScale = 8, kGap = 2;
  const auto n = static_cast<int64_t>(records.size());
  const auto columns = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  const int64_t rows = (n + columns - 1) / columns;
  const int64_t W = columns * (width * kScale + kGap) + kGap, H = rows * (height * kScale + kGap) + kGap;
  std::vector<uint8_t> canvas(static_cast<size_t>(W * H), 160);  // grey gaps
  int64_t outside = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t x0 = kGap + k % columns * (width * kScale + kGap), y0 = kGap + k / columns * (height * kScale + kGap);
    for (int64_t p = 0; p < size; ++p) {
      const char c = records[static_cast<size_t>(k)][static_cast<size_t>(p)];
      const bool letter = c >= 'a' && c <= top;
      outside += !letter;
      const double ink = letter ? static_cast<double>(c - 'a') / static_cast<double>(top - 'a') : 0.0;
      const auto grey = static_cast<uint8_t>(std::lround(255.0 * (1.0 - ink)));
      for (int64_t dy = 0; dy < kScale; ++dy)
        for (int64_t dx = 0; dx < kScale; ++dx)
          canvas[static_cast<size_t>((y0 + p / width * kScale + dy) * W + x0 + p % width * kScale + dx)] = grey;
    }
  }
  write_file_atomic(path, encode_png_gray(canvas, W, H));
  return outside;
}

}  // namespace tapeformer
