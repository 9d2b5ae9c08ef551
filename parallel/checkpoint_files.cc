#include "parallel/checkpoint_files.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/file_io.h"

namespace accel::dist {

void fsync_path(const std::string& path) {
  file_io::Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  ACCEL_CHECK(fd, IoError, "checkpoint", "cannot open '", path,
              "' to fsync: ", std::strerror(errno));
  struct stat st {};
  ACCEL_CHECK(::fstat(fd.get(), &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode)), IoError,
              "checkpoint", "'", path, "' is ", file_io::file_kind(st.st_mode),
              ", not a file or folder of a checkpoint");
  file_io::fsync_fd(fd.get(), path, "checkpoint");
}

}  // namespace accel::dist
