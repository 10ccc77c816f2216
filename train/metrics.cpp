#include "tapeformer/train/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "tapeformer/core/error.h"
#include "tapeformer/core/numbers.h"

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

StatusLine::StatusLine(bool shown) : tty_(::isatty(STDERR_FILENO) == 1), shown_(shown) {}

void StatusLine::show(const std::string& text) {
  if (!shown_) return;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    open_ = true;
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
  std::fflush(stderr);
}

void StatusLine::note(const std::string& line) {
  if (!shown_) return;
  if (open_) std::fprintf(stderr, "\r\033[K");
  std::fprintf(stderr, "%s\n", line.c_str());
  open_ = false;
  std::fflush(stderr);
}

void StatusLine::close() {
  if (open_) std::fprintf(stderr, "\n");
  open_ = false;
}

Progress::Progress(int64_t total, bool shown) : total_(total), line_(shown) {}

void Progress::update(int64_t step, double loss, double tokens_per_s, double seconds_per_step) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %.4f | %.0f tok/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, tokens_per_s,
                duration(seconds_per_step * static_cast<double>(total_ - step)).c_str());
  line_.show(buf);
}

void Progress::note(const std::string& line) { line_.note(line); }

void Progress::finish() { line_.close(); }

namespace {
thread_local ProgressScope* t_scope = nullptr;  // the innermost open on this thread

constexpr double kDefaultDelayS = 2;   // TAPEFORMER_PROGRESS_DELAY unset
constexpr double kTtyEveryS = 0.1;     // a terminal's line rewritten at most this often
constexpr double kLogEveryS = 5;       // a log line at most this often, and only at a new tenth
constexpr double kJudgeAfterS = 0.25;  // work's pace is judged (shown early if slow) after this long

double progress_delay() {
  const char* s = std::getenv("TAPEFORMER_PROGRESS_DELAY");
  if (s == nullptr) return kDefaultDelayS;
  const double v = number_error<double>(s).empty() ? parse_number<double>(s, "") : -1;
  TAPEFORMER_CHECK(v >= 0 && v <= 1e9, "TAPEFORMER_PROGRESS_DELAY: expected seconds in [0, 1e9] (0: show all work's "
                   "progress), got '", s, "'");
  return v;
}

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A time taken: tenths of a second below a minute, else as duration().
std::string took(double s) {
  if (!std::isfinite(s) || s < 0 || s >= 59.95) return duration(s);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}
}  // namespace

std::string grouped(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -static_cast<uint64_t>(n) : static_cast<uint64_t>(n));
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

ProgressScope::ProgressScope(std::string who) : who_(std::move(who)), delay_s_(progress_delay()), outer_(t_scope) {
  t_scope = this;
}

ProgressScope::~ProgressScope() { t_scope = outer_; }

ProgressScope* ProgressScope::current() { return t_scope; }

WorkProgress::WorkProgress(std::string start, int64_t total, std::string unit)
    : scope_(ProgressScope::current()),
      start_(std::move(start)),
      unit_(std::move(unit)),
      total_(total),
      line_(scope_ != nullptr),
      began_(Clock::now()),
      last_line_(began_) {
  // No pace to judge yet: shown at once only when all work is, or the command already speaks.
  if (scope_ != nullptr && (scope_->delay_s_ <= 0 || scope_->spoken_)) start_showing();
}

void WorkProgress::start_showing() {
  showing_ = true;
  scope_->spoken_ = true;
  last_line_ = Clock::now();
  line_.note(scope_->who_ + ": " + start_);
}

std::string WorkProgress::counts() const {
  std::string s = grouped(done_);
  if (total_ > 0) s += "/" + grouped(total_);
  return unit_.empty() ? s : s + " " + unit_;
}

void WorkProgress::update(int64_t done, const std::string& detail) {
  if (scope_ == nullptr || finished_) return;
  done_ = done;
  const Clock::time_point now = Clock::now();
  const double elapsed = seconds(now - began_);
  const int64_t tenth = total_ > 0 ? std::min<int64_t>(10, 10 * done / total_) : 0;
  if (!showing_) {
    // Quick work stays quiet: shown once it has taken the delay, or once its
    // pace over kJudgeAfterS (past the first units' warm-up) says it will.
    const double expected = total_ > 0 && elapsed >= kJudgeAfterS
                                ? elapsed * static_cast<double>(total_) / static_cast<double>(std::max<int64_t>(1, done))
                                : elapsed;
    if (elapsed < scope_->delay_s_ && expected < scope_->delay_s_) return;
    start_showing();  // and this update's line at once
  } else {
    // A terminal's line from the first update on; a log's at a new tenth, not within kLogEveryS of the last.
    const double since = seconds(now - last_line_);
    if (line_.tty() ? (updated_ && since < kTtyEveryS) : (tenth <= last_tenth_ || since < kLogEveryS)) return;
  }
  updated_ = true;
  last_line_ = now;
  last_tenth_ = tenth;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0;
  char buf[160];
  std::string text = scope_->who_ + ": " + counts();
  if (total_ > 0) {
    std::snprintf(buf, sizeof buf, " (%d%%)", static_cast<int>(100 * done / total_));
    text += buf;
  }
  if (rate > 0) {
    std::snprintf(buf, sizeof buf, rate < 100 ? " | %.1f %s/s" : " | %.0f %s/s", rate,
                  unit_.empty() ? "units" : unit_.c_str());
    text += buf;
    if (total_ > 0 && done < total_)
      text += " | ETA " + duration(static_cast<double>(total_ - done) / rate);
  }
  if (!detail.empty()) text += " | " + detail;
  line_.show(text);
}

void WorkProgress::done(const std::string& detail) {
  if (scope_ == nullptr || finished_) return;
  finished_ = true;
  const double elapsed = seconds(Clock::now() - began_);
  if (!showing_ && elapsed < scope_->delay_s_) return;  // quick work: nothing to say
  if (!showing_) start_showing();                         // long after its last update (or it has none)
  std::string text = scope_->who_ + ": done";
  if (done_ > 0 || total_ > 0) text += ", " + grouped(done_) + (unit_.empty() ? "" : " " + unit_);
  text += " in " + took(elapsed);
  if (!detail.empty()) text += ", " + detail;
  line_.note(text);
}

const char* const kNoLayerFigures =
    "the model's layers logged no figures here (layers that adapt their depth log them only while they adapt: "
    "an early-exit model once `tapeformer calibrate` has set its threshold, a Universal Transformer always)";

}  // namespace tapeformer
