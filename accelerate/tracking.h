// Experiment trackers: where Accelerator::log() sends metrics. Only the main process logs.
//
//   JsonlTracker        <dir>/metrics.jsonl, one JSON object per log() call:
//                       {"step": 10, "loss": 0.25, "lr": 0.001}   (flushed per line)
//   TensorBoardTracker  <dir>/events.out.tfevents.<time>.<host>: TFRecord-framed Event protos
//                       with scalar summaries (simple_value), readable by TensorBoard.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/file_io.h"

namespace accel::dist {

using Metrics = std::map<std::string, double>;

class Tracker {
 public:
  virtual ~Tracker() = default;
  virtual const char* name() const = 0;
  // step < 0: no step recorded.
  virtual void log(const Metrics& metrics, int64_t step) = 0;
  // Hyperparameters of the run (strings), recorded once.
  virtual void store_init_configuration(const std::map<std::string, std::string>& /*config*/) {}
  virtual void finish() {}
};
using TrackerPtr = std::unique_ptr<Tracker>;

class JsonlTracker final : public Tracker {
 public:
  // Creates `dir` when needed and appends to dir/metrics.jsonl (a resumed run continues it); a
  // link, FIFO or another user's file there is an IoError (Note [safe file access]).
  explicit JsonlTracker(const std::string& dir, const std::string& file_name = "metrics.jsonl");
  const char* name() const override { return "jsonl"; }
  void log(const Metrics& metrics, int64_t step) override;
  // Writes one {"config": {...}} line.
  void store_init_configuration(const std::map<std::string, std::string>& config) override;
  void finish() override;
  const std::string& path() const { return path_; }

 private:
  void write_line(const std::string& line);
  std::string path_;
  file_io::Fd out_;
};

class TensorBoardTracker final : public Tracker {
 public:
  explicit TensorBoardTracker(const std::string& dir);
  const char* name() const override { return "tensorboard"; }
  void log(const Metrics& metrics, int64_t step) override;
  void finish() override;
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  file_io::Fd out_;
};

// "jsonl" / "tensorboard" (also "all" = both); ValueError for anything else.
TrackerPtr make_tracker(const std::string& name, const std::string& dir);

// CRC-32C (Castagnoli) and TFRecord's masked form; exposed for tests.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace accel::dist
