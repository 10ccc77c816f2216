// The Image Transformer's local attention (Parmar et al. 2018 §3.2) as two
// sparse patterns over an image read in raster order, one record per
// window: position 0 holds a start token and position t the pixel t - 1,
// so query t predicts pixel t and key j shows pixel j - 1.
//
//   "image_1d"  query blocks of l_q pixels; a query sees the start token and
//               the pixels from l_m before its block's first up to the one
//               before it (the block and its memory)
//   "image_2d"  the W-wide image in query blocks of h_q x w_q pixels; a query
//               sees the start token and the earlier pixels of its memory
//               block: its query block's rows and h_m rows above, its
//               columns and w_m columns on each side
//
// l_q = model.image_query, l_m = model.image_memory; W = model.image_width,
// h_q x w_q = model.image_block_rows x model.image_block_cols, h_m, w_m =
// model.image_memory_rows, model.image_memory_cols. Both are causal (a key
// is never later than its query), and a 2-D query block covering the image
// sees every earlier pixel: full attention. Unlike the paper's 2-D scheme,
// pixels keep the image's raster order (the paper orders them block by
// block), so one data file and one generation order serve 1-D, 2-D and full
// attention alike.
#include <algorithm>

#include "tapeformer/core/error.h"
#include "tapeformer/layers/attention/sparse.h"

namespace tapeformer {
namespace {

class ImageLocal1d : public SparsePattern {
 public:
  ImageLocal1d(int64_t query, int64_t memory) : lq_(query), lm_(memory) {}
  // Pixel j - 1 in [first - l_m, i - 1], first = the first pixel of i's block.
  bool sees(int64_t i, int64_t j) const override { return j <= i && (j == 0 || j - 1 >= i / lq_ * lq_ - lm_); }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({0, 1});
    r.push_back({i0 / lq_ * lq_ - lm_ + 1, i1});
  }

 private:
  int64_t lq_, lm_;
};

class ImageLocal2d : public SparsePattern {
 public:
  ImageLocal2d(int64_t width, int64_t rows, int64_t cols, int64_t memory_rows, int64_t memory_cols)
      : w_(width), hq_(rows), wq_(cols), hm_(memory_rows), wm_(memory_cols) {}
  bool sees(int64_t i, int64_t j) const override {
    if (j > i) return false;
    if (j == 0) return true;
    const int64_t p = j - 1, row = i / w_ / hq_ * hq_, col = i % w_ / wq_ * wq_;  // the query block's corner
    const int64_t pr = p / w_, pc = p % w_;
    return pr >= row - hm_ && pr < row + hq_ && pc >= col - wm_ && pc < col + wq_ + wm_;
  }
  void candidates(int64_t i0, int64_t i1, std::vector<std::pair<int64_t, int64_t>>& r) const override {
    r.push_back({0, 1});
    r.push_back({(i0 / w_ / hq_ * hq_ - hm_) * w_ + 1, i1});  // from the memory block's top row
  }

 private:
  int64_t w_, hq_, wq_, hm_, wm_;
};

}  // namespace

SparsePatternKind image_1d_pattern_kind() {
  return {"image_1d",
          "the Image Transformer's 1-D local attention (Parmar et al. 2018): query blocks of model.image_query pixels "
          "in raster order, each seeing its block and the model.image_memory pixels before it",
          {{"image_query", int64_t{16}, "image_1d: l_q, pixels per query block", int64_t{4}},
           {"image_memory", int64_t{16}, "image_1d: l_m, pixels before a query block it also sees", int64_t{4}}},
          [](const ModelConfig& c) -> std::shared_ptr<const SparsePattern> {
            return std::make_shared<ImageLocal1d>(positive_option(c, "image_query", 1), positive_option(c, "image_memory", 0));
          }};
}

SparsePatternKind image_2d_pattern_kind() {
  return {"image_2d",
          "the Image Transformer's 2-D local attention (Parmar et al. 2018): a model.image_width-wide image in query "
          "blocks of model.image_block_rows x model.image_block_cols pixels, each seeing the earlier pixels of its "
          "block widened by model.image_memory_rows above and model.image_memory_cols on each side",
          {{"image_width", int64_t{8}, "image_2d: W, pixels per image row", int64_t{4}},
           {"image_block_rows", int64_t{2}, "image_2d: h_q, rows of a query block", int64_t{2}},
           {"image_block_cols", int64_t{4}, "image_2d: w_q, columns of a query block", int64_t{2}},
           {"image_memory_rows", int64_t{2}, "image_2d: h_m, rows above a query block it also sees", int64_t{1}},
           {"image_memory_cols", int64_t{2}, "image_2d: w_m, columns on each side of a query block it also sees",
            int64_t{1}}},
          [](const ModelConfig& c) -> std::shared_ptr<const SparsePattern> {
            return std::make_shared<ImageLocal2d>(positive_option(c, "image_width", 1), positive_option(c, "image_block_rows", 1),
                                                  positive_option(c, "image_block_cols", 1),
                                                  positive_option(c, "image_memory_rows", 0),
                                                  positive_option(c, "image_memory_cols", 0));
          }};
}

}  // namespace tapeformer
