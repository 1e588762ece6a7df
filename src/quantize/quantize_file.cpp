// `step35 quantize`'s file conversion: reads a GGUF (any supported tensor types, split
// files too), picks every tensor's output type with the recipe (quantize.cpp), and streams
// the new file: the header first (all sizes are known from the recipe), then each tensor
// converted one slab of rows at a time on a thread pool, so memory stays at a few slabs
// whatever the model size.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <system_error>

#include "gguf/gguf.h"
#include "exec/clock.h"
#include "gguf/gguf_writer.h"
#include "quantize/quantize.h"
#include "exec/thread_pool.h"
#include "tensor/quants.h"
#include "tensor/quants_kquant_encode.h"

namespace step35 {

namespace {

// Output bytes converted per slab (the slab's output buffer; inputs are read in place
// from the mapping, one F32 row per thread).
constexpr uint64_t kSlabOutputBytes = 32ull << 20;
// llama.cpp's GGML_QNT_VERSION, written to general.quantization_version.
constexpr uint32_t kQuantizationVersion = 2;


std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string shape_text(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
  return s + "]";
}

double mib(uint64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// Refuses to overwrite any part of the input (which is mapped and being read).
void check_output_is_not_input(const gguf::File& in, const std::string& out_path) {
  std::error_code ec;
  if (!std::filesystem::exists(out_path, ec)) return;
  for (size_t i = 0; i < in.n_files(); ++i) {
    const std::string part = in.part_path(i);
    if (part.empty()) continue;
    if (std::filesystem::equivalent(part, out_path, ec) && !ec)
      throw std::runtime_error("output file " + out_path + " is the input file " + part +
                               " (write the quantized model to a new file)");
  }
}

// Converts one tensor (rows of ne[0] elements) from `from` to `to`, writing it to out.
// The input's pages of a range once it has been read are given back
// (gguf::File::release_pages): a 100+ GB model then does not crowd the page cache into
// looking like resident memory.
void convert_tensor(const gguf::File& in, const gguf::TensorInfo& t, DType from, DType to, ThreadPool& pool,
                    gguf::OutputFile& out) {
  const int64_t n_per_row = t.ne[0];
  const int64_t n_rows = t.n_elements() / n_per_row;
  const size_t src_row = *row_bytes(from, n_per_row);
  const size_t dst_row = *row_bytes(to, n_per_row);
  const int64_t rows_per_slab = std::max<int64_t>(1, std::min<int64_t>(n_rows, int64_t(kSlabOutputBytes / dst_row)));

  std::vector<uint8_t> slab(size_t(rows_per_slab) * dst_row);
  std::vector<std::vector<float>> row_f32(size_t(pool.n_threads()), std::vector<float>(size_t(n_per_row)));
  for (int64_t first = 0; first < n_rows; first += rows_per_slab) {
    const int64_t rows = std::min(rows_per_slab, n_rows - first);
    // Rows with a NaN/Inf are reported (the lowest index) instead of encoded: the
    // encoders' searches would produce meaningless scales from them.
    std::atomic<int64_t> bad_row{-1};
    std::atomic<bool> unsupported{false};
    pool.parallel_for(rows, [&](int64_t begin, int64_t end, int thread) {
      float* x = row_f32[size_t(thread)].data();
      for (int64_t r = begin; r < end; ++r) {
        dequantize_row_ref(from, t.data + size_t(first + r) * src_row, x, n_per_row);
        bool finite = true;
        for (int64_t j = 0; j < n_per_row; ++j) finite &= std::isfinite(x[j]);
        if (!finite) {
          int64_t seen = bad_row.load();
          while ((seen < 0 || first + r < seen) && !bad_row.compare_exchange_weak(seen, first + r)) {
          }
          continue;
        }
        if (!quantize_row_fast(to, x, slab.data() + size_t(r) * dst_row, n_per_row)) unsupported = true;
      }
    });
    if (unsupported) throw std::logic_error(std::string("quantize: no encoder for ") + dtype_name(to));
    if (bad_row.load() >= 0)
      throw std::runtime_error("tensor " + t.name + " row " + std::to_string(bad_row.load()) +
                               " holds a NaN or infinite value: the input model is damaged");
    out.write(slab.data(), size_t(rows) * dst_row);
    in.release_pages(t.data + size_t(first) * src_row, size_t(rows) * src_row);
  }
}

void copy_tensor(const gguf::File& in, const gguf::TensorInfo& t, gguf::OutputFile& out) {
  constexpr uint64_t chunk = 64ull << 20;
  for (uint64_t off = 0; off < t.nbytes; off += chunk) {
    const uint64_t n = std::min(chunk, t.nbytes - off);
    out.write(t.data + off, size_t(n));
    in.release_pages(t.data + off, size_t(n));
  }
}

// The recipe's view of the input's tensors.
std::vector<TensorDesc> describe_tensors(const gguf::File& in) {
  std::vector<TensorDesc> descs;
  descs.reserve(in.tensors().size());
  for (const gguf::TensorInfo& t : in.tensors()) {
    TensorDesc d;
    d.name = t.name;
    d.type = DType(t.type);  // the reader accepts only types dtype_info knows
    for (int k = 0; k < 4; ++k) d.ne[k] = t.ne[k];
    descs.push_back(std::move(d));
  }
  return descs;
}

// Warns (through `log`) about the tensors that are quantized already and get another
// type, and returns how many there are.
size_t report_requantized(const std::vector<TensorDesc>& descs, const std::vector<TensorChoice>& choices,
                          const std::function<void(const std::string&)>& log) {
  size_t n_requantized = 0;
  std::map<std::string, size_t> requantized_from;
  for (size_t i = 0; i < descs.size(); ++i) {
    if (choices[i].type == descs[i].type) continue;
    if (dtype_info(descs[i].type).block_elems > 1) {
      ++requantized_from[dtype_name(descs[i].type)];
      ++n_requantized;
    }
  }
  if (n_requantized > 0) {
    std::string from;
    for (const auto& [name, n] : requantized_from) from += (from.empty() ? "" : ", ") + std::to_string(n) + " " + name;
    log("warning: " + std::to_string(n_requantized) + " tensors are already quantized (" + from +
        "): they are dequantized and quantized again, which loses more precision than quantizing "
        "the F32/F16/BF16 original");
  }
  return n_requantized;
}

// The output's header: everything but the split keys, plus the two keys llama-quantize
// sets, and every tensor with its new type.
void describe_output(const gguf::File& in, const std::vector<TensorChoice>& choices, FileType type, gguf::Writer& w) {
  for (const auto& [key, value] : in.metadata()) {
    if (key == "split.no" || key == "split.count" || key == "split.tensors.count") continue;
    w.set(key, value);
  }
  w.set_u32("general.quantization_version", kQuantizationVersion);
  w.set_u32("general.file_type", uint32_t(type));
  for (size_t i = 0; i < choices.size(); ++i) {
    const gguf::TensorInfo& t = in.tensors()[i];
    w.add_tensor_info(t.name, uint32_t(choices[i].type), std::vector<int64_t>(t.ne, t.ne + t.n_dims));
  }
}

void add_to_summary(const gguf::TensorInfo& t, DType to, uint64_t out_bytes, QuantizeSummary& sum) {
  auto& per = sum.by_type[dtype_name(to)];
  per.tensors++;
  per.bytes += out_bytes;
  per.elements += uint64_t(t.n_elements());
  sum.n_elements += uint64_t(t.n_elements());
  sum.input_bytes += t.nbytes;
  sum.output_bytes += out_bytes;
}

}  // namespace

QuantizeSummary quantize_gguf(const std::string& in_path, const std::string& out_path, const QuantizeOptions& opts) {
  const double t0 = steady_seconds();
  auto log = [&](const std::string& line) {
    if (opts.log) opts.log(line);
  };
  if (opts.n_threads < 1) throw std::invalid_argument("quantize: n_threads must be >= 1");
  const DType base = file_type_base(opts.type);  // validates opts.type

  std::unique_ptr<gguf::File> in = gguf::File::open(in_path);
  check_output_is_not_input(*in, out_path);
  const QuantizeModelInfo info = quantize_model_info(*in);
  const std::vector<TensorDesc> descs = describe_tensors(*in);
  const std::vector<TensorChoice> choices = choose_tensor_types(descs, info, opts.type);

  QuantizeSummary sum;
  sum.n_tensors = descs.size();
  sum.n_requantized = report_requantized(descs, choices, log);
  gguf::Writer w(in->alignment());
  describe_output(*in, choices, opts.type, w);

  log(format("quantizing %s (%zu tensors, %zu file%s) to %s (base type %s) with %d thread%s", in_path.c_str(),
             descs.size(), in->n_files(), in->n_files() > 1 ? "s" : "", file_type_name(opts.type), dtype_name(base),
             opts.n_threads, opts.n_threads > 1 ? "s" : ""));
  gguf::OutputFile out(out_path);
  const std::vector<uint8_t> header = w.header_bytes();
  out.write(header.data(), header.size());

  ThreadPool pool(opts.n_threads);
  for (size_t i = 0; i < descs.size(); ++i) {
    const gguf::TensorInfo& t = in->tensors()[i];
    const DType from = descs[i].type, to = choices[i].type;
    const double ts = steady_seconds();
    const uint64_t out_bytes = uint64_t(*row_bytes(to, t.ne[0])) * uint64_t(t.n_elements() / t.ne[0]);
    if (from == to) {
      copy_tensor(*in, t, out);
    } else {
      convert_tensor(*in, t, from, to, pool, out);
      ++sum.n_quantized;
    }
    out.write_zeros(w.padding_after(out_bytes));
    if (choices[i].fallback) ++sum.n_fallback;
    add_to_summary(t, to, out_bytes, sum);
    log(format("[%4zu/%4zu] %-40s %-20s %-5s -> %-5s %9.2f MiB -> %8.2f MiB  %6.2f s%s%s", i + 1, descs.size(),
               t.name.c_str(), shape_text(t).c_str(), dtype_name(from), dtype_name(to), mib(t.nbytes), mib(out_bytes),
               steady_seconds() - ts, choices[i].fallback ? "  fallback: " : "", choices[i].note.c_str()));
  }
  sum.output_file_bytes = out.written();
  out.commit();
  sum.seconds = steady_seconds() - t0;
  return sum;
}

}  // namespace step35
