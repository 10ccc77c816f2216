#include "tapeformer/train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"

namespace tapeformer {

std::string json_number(double v, int digits) {
  if (!std::isfinite(v)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

std::string json_fixed(double v, int digits) {
  if (!std::isfinite(v)) return "null";
  char buf[400];  // a float's 39 integer digits, or a double's 309, and the decimals
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string MetricsRecord::to_json() const {
  nlohmann::ordered_json j;
  j["step"] = step;
  j["lr"] = lr;
  j["train_loss"] = train_loss;
  if (val_loss) j["val_loss"] = *val_loss;
  if (val_bpc) j["val_bpc"] = *val_bpc;
  j["grad_norm"] = grad_norm;
  j["tokens_per_s"] = tokens_per_s;
  j["elapsed_s"] = elapsed_s;
  for (const auto& [name, value] : extra) j[name] = value;
  if (!layers.empty()) {
    nlohmann::ordered_json l;
    for (const auto& [name, values] : layers) l[name] = values;
    j["layers"] = l;
  }
  return j.dump();
}

std::optional<MetricsRecord> MetricsRecord::parse(const std::string& line) {
  const auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);  // keys in written order
  if (!j.is_object()) return std::nullopt;
  auto number = [&](const char* key) -> std::optional<double> {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const auto it = j.find("step");
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  MetricsRecord r;
  r.step = it->get<int64_t>();
  r.lr = number("lr").value_or(0);
  r.train_loss = number("train_loss").value_or(0);
  r.val_loss = number("val_loss");
  r.val_bpc = number("val_bpc");
  r.grad_norm = number("grad_norm").value_or(0);
  r.tokens_per_s = number("tokens_per_s").value_or(0);
  r.elapsed_s = number("elapsed_s").value_or(0);
  static const char* known[] = {"step", "lr", "train_loss", "val_loss", "val_bpc", "grad_norm", "tokens_per_s", "elapsed_s"};
  for (const auto& [key, value] : j.items()) {
    if (key == "layers" && value.is_object()) {
      for (const auto& [name, list] : value.items()) {
        if (!list.is_array()) continue;
        std::vector<double> values;
        for (const auto& v : list) values.push_back(v.is_number() ? v.get<double>() : NAN);  // null: not finite
        r.layers.emplace_back(name, std::move(values));
      }
    } else if (value.is_number() && std::find(std::begin(known), std::end(known), key) == std::end(known)) {
      r.extra.emplace_back(key, value.get<double>());
    }
  }
  return r;
}

std::vector<MetricsRecord> read_metrics(const std::string& path) {
  std::ifstream in(path);
  std::vector<MetricsRecord> records;
  std::string line;
  while (std::getline(in, line))
    if (std::optional<MetricsRecord> r = MetricsRecord::parse(line)) records.push_back(std::move(*r));
  return records;
}

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  TAPEFORMER_CHECK(file_ != nullptr, "cannot open metrics file '", path, "': ", std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const MetricsRecord& r) {
  const std::string line = r.to_json() + "\n";
  TAPEFORMER_CHECK(std::fputs(line.c_str(), file_) >= 0 && std::fflush(file_) == 0,
                   "writing metrics file '", path_, "' failed: ", std::strerror(errno));
}

namespace {
std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", t / 3600, t % 3600 / 60);
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", t / 60, t % 60);
  else std::snprintf(buf, sizeof buf, "%lds", t);
  return buf;
}
}  // namespace

Progress::Progress(int64_t total, bool shown) : total_(total), tty_(::isatty(STDERR_FILENO) == 1), shown_(shown) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, double seconds_per_step) {
  if (!shown_) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | %.0f tok/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, tokens_per_s,
                duration(seconds_per_step * static_cast<double>(total_ - step)).c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", buf);
    line_open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", buf);
  }
  std::fflush(stderr);
}

void Progress::note(const std::string& line) {
  if (!shown_) return;
  if (line_open_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  line_open_ = false;
  std::fflush(stderr);
}

void Progress::finish() {
  if (line_open_) std::fprintf(stderr, "\n");
  line_open_ = false;
}

const char* const kNoLayerFigures =
    "the model's layers logged no figures here (layers that adapt their depth log them only while they adapt: "
    "an early-exit model once `tapeformer calibrate` has set its threshold, a Universal Transformer always)";

}  // namespace tapeformer
