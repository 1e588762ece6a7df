#include "vision/step3vl_preprocess.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "gguf/gguf.h"

namespace step35::vision {

Step3vlConfig step3vl_config(const gguf::File& f) {
  Step3vlConfig c;
  c.image_size = int32_t(f.get_u32("clip.vision.image_size"));
  c.patch_size = int32_t(f.get_u32("clip.vision.patch_size"));
  c.preproc_image_size = int32_t(f.opt_u32("clip.vision.preproc_image_size").value_or(uint32_t(c.image_size)));
  c.merge = int32_t(f.opt_u32("clip.vision.projector.scale_factor").value_or(4));
  const std::vector<float> mean = f.get_f32_per_layer("clip.vision.image_mean", 3);
  const std::vector<float> sd = f.get_f32_per_layer("clip.vision.image_std", 3);
  for (int ch = 0; ch < 3; ++ch) {
    c.mean[ch] = mean[size_t(ch)];
    c.std[ch] = sd[size_t(ch)];
    if (!(c.std[ch] > 0.0f)) throw std::invalid_argument(f.path() + ": clip.vision.image_std must be positive");
  }
  const int32_t unit = c.patch_size * c.merge;
  if (c.patch_size <= 0 || c.merge <= 0 || c.image_size <= 0 || c.image_size % unit != 0 || c.slice_size % unit != 0)
    throw std::invalid_argument(f.path() + ": image_size " + std::to_string(c.image_size) + " and slice size " +
                                std::to_string(c.slice_size) + " must be multiples of patch_size x scale_factor (" +
                                std::to_string(unit) + ")");
  if (c.preproc_image_size <= 0 || c.preproc_image_size > (1 << 15))
    throw std::invalid_argument(f.path() + ": clip.vision.preproc_image_size is out of range");
  return c;
}

namespace {

// Slices along one side of `len` pixels: the window count and their starts (the last one
// moved back to end at the edge).
std::vector<int32_t> window_starts(int32_t len, int32_t window) {
  const int32_t n = len <= window ? 1 : int32_t(std::ceil(float(len - window) / float(window) + 1.0f));
  std::vector<int32_t> starts;
  for (int32_t i = 0; i < n; ++i) starts.push_back(std::max(0, std::min(i * window, len - window)));
  return starts;
}

// A side resized to whole windows: a remainder over a fifth of a window rounds up.
int32_t whole_windows(int32_t len, int32_t window) {
  const float ratio = float(len) / float(window);
  if (ratio < 1.0f) return len;
  const float whole = std::floor(ratio);
  return int32_t(whole + (ratio - whole > 0.2f ? 1.0f : 0.0f)) * window;
}

}  // namespace

Step3vlPlan plan_step3vl(int32_t nx, int32_t ny, const Step3vlConfig& cfg) {
  if (nx <= 0 || ny <= 0) throw ImageError("the image has no pixels");
  Step3vlPlan p;
  p.src_nx = nx, p.src_ny = ny;
  // 1. A thin strip is pasted top-left on a black square first.
  const float aspect = float(nx) / float(ny);
  if (std::min(nx, ny) < 32 && (aspect > 4.0f || aspect < 0.25f)) {
    p.pasted_on_square = true;
    p.square_side = std::max(nx, ny);
    nx = ny = p.square_side;
  }
  // 2. The longest side limit.
  if (std::max(nx, ny) > cfg.preproc_image_size) {
    const float scale = float(cfg.preproc_image_size) / float(std::max(nx, ny));
    nx = std::max(1, int32_t(std::floor(float(nx) * scale)));
    ny = std::max(1, int32_t(std::floor(float(ny) * scale)));
  }
  p.nx = nx, p.ny = ny;
  // 3. The window: none for a picture the overview shows whole and not too elongated.
  const int32_t longer = std::max(nx, ny), shorter = std::min(nx, ny);
  const float elongation = float(longer) / float(shorter);
  if (longer <= cfg.image_size)
    p.window = elongation > 1.5f ? shorter : 0;
  else
    p.window = elongation > 4.0f ? std::min(shorter, cfg.slice_size) : cfg.slice_size;
  p.slice_tokens_side = cfg.tokens_per_side(cfg.slice_size);
  p.overview_tokens_side = cfg.tokens_per_side(cfg.image_size);
  if (p.window == 0) return p;
  // 4-5. Whole windows per side, then the grid of window crops, row-major.
  p.crop_nx = whole_windows(nx, p.window);
  p.crop_ny = whole_windows(ny, p.window);
  const std::vector<int32_t> xs = window_starts(p.crop_nx, p.window), ys = window_starts(p.crop_ny, p.window);
  p.grid_cols = int32_t(xs.size()), p.grid_rows = int32_t(ys.size());
  for (int32_t r = 0; r < p.grid_rows; ++r)
    for (int32_t c = 0; c < p.grid_cols; ++c) p.slices.push_back({xs[size_t(c)], ys[size_t(r)], r, c});
  return p;
}

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

// Pillow's coefficients for one axis: per output pixel the first input pixel, the count, and
// the fixed-point weights (ksize per output pixel).
struct AxisWeights {
  int32_t ksize = 0;
  std::vector<int32_t> first, count, weights;
};

AxisWeights bilinear_weights(int32_t in_size, int32_t out_size) {
  const double scale = double(in_size) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle filter's support is 1
  AxisWeights a;
  a.ksize = int32_t(std::ceil(support)) * 2 + 1;
  a.first.resize(size_t(out_size));
  a.count.resize(size_t(out_size));
  a.weights.assign(size_t(out_size) * size_t(a.ksize), 0);
  std::vector<double> k(size_t(a.ksize));
  for (int32_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int32_t xmin = int32_t(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int32_t xmax = int32_t(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int32_t x = 0; x < xmax; ++x) {
      const double t = std::fabs((x + xmin - center + 0.5) * ss);
      const double w = t < 1.0 ? 1.0 - t : 0.0;
      k[size_t(x)] = w;
      ww += w;
    }
    for (int32_t x = 0; x < xmax; ++x) {
      const double w = ww != 0.0 ? k[size_t(x)] / ww : k[size_t(x)];
      a.weights[size_t(xx) * size_t(a.ksize) + size_t(x)] =
          int32_t(w < 0 ? -0.5 + w * (1 << kPrecisionBits) : 0.5 + w * (1 << kPrecisionBits));
    }
    a.first[size_t(xx)] = xmin;
    a.count[size_t(xx)] = xmax;
  }
  return a;
}

uint8_t clip8(int32_t v) {
  v >>= kPrecisionBits;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

RgbImage resize_bilinear_u8(const RgbImage& img, int32_t nx, int32_t ny) {
  if (img.nx == nx && img.ny == ny) return img;
  // Horizontal pass first (into nx x img.ny), then vertical, as Pillow.
  const AxisWeights h = bilinear_weights(img.nx, nx), v = bilinear_weights(img.ny, ny);
  RgbImage mid;
  mid.nx = nx, mid.ny = img.ny;
  mid.rgb.resize(size_t(nx) * size_t(img.ny) * 3);
  for (int32_t y = 0; y < img.ny; ++y)
    for (int32_t x = 0; x < nx; ++x) {
      const int32_t* k = &h.weights[size_t(x) * size_t(h.ksize)];
      for (int c = 0; c < 3; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int32_t i = 0; i < h.count[size_t(x)]; ++i) ss += int32_t(img.at(h.first[size_t(x)] + i, y)[c]) * k[i];
        mid.at(x, y)[c] = clip8(ss);
      }
    }
  RgbImage out;
  out.nx = nx, out.ny = ny;
  out.rgb.resize(size_t(nx) * size_t(ny) * 3);
  for (int32_t y = 0; y < ny; ++y) {
    const int32_t* k = &v.weights[size_t(y) * size_t(v.ksize)];
    for (int32_t x = 0; x < nx; ++x)
      for (int c = 0; c < 3; ++c) {
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int32_t i = 0; i < v.count[size_t(y)]; ++i) ss += int32_t(mid.at(x, v.first[size_t(y)] + i)[c]) * k[i];
        out.at(x, y)[c] = clip8(ss);
      }
  }
  return out;
}

namespace {

// A square chunk of `side` pixels sampled bilinearly from `img` (half-pixel centres,
// neighbours clamped to the edge, no antialiasing), each neighbour normalised first.
PreparedChunk sample_normalised(const RgbImage& img, int32_t side, const Step3vlConfig& cfg) {
  PreparedChunk ch;
  ch.side = side;
  ch.pixels.resize(size_t(3) * size_t(side) * size_t(side));
  auto norm = [&](int32_t x, int32_t y, int c) {
    return (float(img.at(x, y)[c]) / 255.0f - cfg.mean[c]) / cfg.std[c];
  };
  const float sx = float(img.nx) / float(side), sy = float(img.ny) / float(side);
  for (int32_t y = 0; y < side; ++y) {
    const float fy = (float(y) + 0.5f) * sy - 0.5f;
    const int32_t y0 = int32_t(std::floor(fy));
    const float dy = fy - float(y0);
    const int32_t ya = std::clamp(y0, 0, img.ny - 1), yb = std::clamp(y0 + 1, 0, img.ny - 1);
    for (int32_t x = 0; x < side; ++x) {
      const float fx = (float(x) + 0.5f) * sx - 0.5f;
      const int32_t x0 = int32_t(std::floor(fx));
      const float dx = fx - float(x0);
      const int32_t xa = std::clamp(x0, 0, img.nx - 1), xb = std::clamp(x0 + 1, 0, img.nx - 1);
      for (int c = 0; c < 3; ++c) {
        // a + (b - a) t, not a (1 - t) + b t: llama.cpp's rounding (every goldens' sample is
        // bit-exact this way; the other form misses 57 of them by an ulp).
        const float a = norm(xa, ya, c), b = norm(xb, ya, c), d = norm(xa, yb, c), e = norm(xb, yb, c);
        const float top = a + (b - a) * dx, bottom = d + (e - d) * dx;
        ch.pixels[(size_t(c) * size_t(side) + size_t(y)) * size_t(side) + size_t(x)] = top + (bottom - top) * dy;
      }
    }
  }
  return ch;
}

PreparedChunk normalised(const RgbImage& img, const Step3vlConfig& cfg) {
  PreparedChunk ch;
  ch.side = img.nx;
  ch.pixels.resize(size_t(3) * size_t(img.nx) * size_t(img.ny));
  for (int c = 0; c < 3; ++c)
    for (int32_t y = 0; y < img.ny; ++y)
      for (int32_t x = 0; x < img.nx; ++x)
        ch.pixels[(size_t(c) * size_t(img.ny) + size_t(y)) * size_t(img.nx) + size_t(x)] =
            (float(img.at(x, y)[c]) / 255.0f - cfg.mean[c]) / cfg.std[c];
  return ch;
}

}  // namespace

std::vector<PreparedChunk> prepare_step3vl(const RgbImage& src, const Step3vlPlan& plan, const Step3vlConfig& cfg) {
  if (src.nx != plan.src_nx || src.ny != plan.src_ny) throw std::invalid_argument("prepare_step3vl: the plan is for another picture");
  RgbImage img = src;
  if (plan.pasted_on_square) {
    img.nx = img.ny = plan.square_side;
    img.rgb.assign(size_t(plan.square_side) * size_t(plan.square_side) * 3, 0);
    for (int32_t y = 0; y < src.ny; ++y) std::copy_n(src.at(0, y), size_t(src.nx) * 3, img.at(0, y));
  }
  img = resize_bilinear_u8(img, plan.nx, plan.ny);
  std::vector<PreparedChunk> chunks;
  if (!plan.slices.empty()) {
    const RgbImage crop_src = resize_bilinear_u8(img, plan.crop_nx, plan.crop_ny);
    for (const SliceCrop& s : plan.slices) {
      RgbImage crop;
      crop.nx = crop.ny = plan.window;
      crop.rgb.assign(size_t(plan.window) * size_t(plan.window) * 3, 0);  // black outside the picture
      for (int32_t y = 0; y < plan.window && s.y0 + y < crop_src.ny; ++y) {
        const int32_t w = std::min(plan.window, crop_src.nx - s.x0);
        if (w > 0) std::copy_n(crop_src.at(s.x0, s.y0 + y), size_t(w) * 3, crop.at(0, y));
      }
      PreparedChunk ch = plan.window == cfg.slice_size ? normalised(crop, cfg) : sample_normalised(crop, cfg.slice_size, cfg);
      ch.tokens_side = plan.slice_tokens_side;
      ch.row = s.row, ch.col = s.col;
      chunks.push_back(std::move(ch));
    }
  }
  PreparedChunk overview = sample_normalised(img, cfg.image_size, cfg);
  overview.tokens_side = plan.overview_tokens_side;
  overview.overview = true;
  chunks.push_back(std::move(overview));
  return chunks;
}

std::vector<LayoutPiece> step3vl_layout(const Step3vlPlan& plan) {
  std::vector<LayoutPiece> pieces;
  auto text = [&](const char* t) {
    if (!pieces.empty() && pieces.back().chunk < 0) pieces.back().text += t;
    else pieces.push_back({t, -1});
  };
  int32_t chunk = 0;
  for (int32_t r = 0; r < plan.grid_rows; ++r) {
    for (int32_t c = 0; c < plan.grid_cols; ++c) {
      text("<patch_start>");
      pieces.push_back({"", chunk++});
      text("<patch_end>");
    }
    if (r + 1 < plan.grid_rows) text("<patch_newline>");
  }
  text("<im_start>");
  pieces.push_back({"", chunk});
  text("<im_end>");
  return pieces;
}

}  // namespace step35::vision
