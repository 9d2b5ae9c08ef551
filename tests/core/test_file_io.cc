// core/file_io: Note [safe file access] against planted links, FIFOs, devices, hard links,
// world-writable folders and links of other users. Each hostile entry is made here, in a
// temporary folder; reads that could block run in a child with a deadline.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "core/file_io.h"
#include "tests/common/child_process.h"
#include "tests/common/util.h"
#include "tests/common/check.h"

namespace fs = std::filesystem;
using namespace accel;
using accel::test::contains;
using accel::test::expect_error;
using accel::test::expect_error_child;
using accel::test::read_file;
using accel::test::TempDir;
using accel::test::write_file;

TEST_CASE("file_io: an atomic write replaces a link at its name and never follows one") {
  TempDir d;
  write_file(d / "outside", "precious");
  fs::create_directory(d / "job");
  // A link at the target name: replaced by the new file, the file it named untouched.
  fs::create_symlink(d / "outside", d / "job/latest");
  // Links at the names the old code used for its temporaries.
  fs::create_symlink(d / "outside", d / "job/latest.tmp");
  file_io::write_file_atomic(d / "job/latest", "checkpoint_3\n", "test");
  CHECK(read_file(d / "outside") == "precious");
  CHECK(fs::is_regular_file(fs::symlink_status(d / "job/latest")));
  CHECK(read_file(d / "job/latest") == "checkpoint_3\n");
  CHECK(fs::is_symlink(d / "job/latest.tmp"));  // not ours to touch
  // An uncommitted file leaves nothing behind and the target as it was.
  {
    file_io::AtomicFile f(d / "job/latest", "test");
    f.write("half");
  }
  CHECK(read_file(d / "job/latest") == "checkpoint_3\n");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(d / "job")) entries += e.path().filename() != "";
  CHECK(entries == 2);  // latest, latest.tmp
  // Missing folders are created only when asked.
  CHECK(contains(
      expect_error<IoError>([&] { file_io::write_file_atomic(d / "new/a/f", "x", "test"); }),
      "cannot open the folder"));
  file_io::write_file_atomic(d / "new/a/f", "x", "test", true, /*create_dirs=*/true);
  CHECK(read_file(d / "new/a/f") == "x");
}

TEST_CASE("file_io: folders anyone can rewrite are refused, sticky ones are not") {
  TempDir d;
  fs::create_directories(d / "open/run");
  chmod((d / "open").c_str(), 0777);  // world-writable, no sticky bit
  const std::string msg =
      expect_error<IoError>([&] { file_io::write_file_atomic(d / "open/run/f", "x", "test"); });
  CHECK(contains(msg, "[test] '" + d / "open" + "'"));
  CHECK(contains(msg, "world-writable without the sticky bit"));
  CHECK(!fs::exists(d / "open/run/f"));
  chmod((d / "open").c_str(), 01777);  // as /tmp
  file_io::write_file_atomic(d / "open/run/f", "x", "test");
  CHECK(read_file(d / "open/run/f") == "x");
}

TEST_CASE("file_io: links on the way are followed only when they are ours or root's") {
  TempDir d;
  fs::create_directories(d / "real/sub");
  fs::create_directory_symlink(d / "real", d / "mine");
  file_io::write_file_atomic(d / "mine/sub/f", "x", "test");  // our own link: followed
  CHECK(read_file(d / "real/sub/f") == "x");
  file_io::write_file_atomic(d / "mine/../real/sub/g", "y", "test");
  CHECK(read_file(d / "real/sub/g") == "y");
  if (geteuid() != 0) {
    MESSAGE("not root: cannot give a link to another user; that half is skipped");
    return;
  }
  // A link another user planted (uid 65534, nobody): refused, whoever runs the job.
  fs::create_directory_symlink(d / "real", d / "planted");
  REQUIRE(lchown((d / "planted").c_str(), 65534, 65534) == 0);
  const std::string msg =
      expect_error<IoError>([&] { file_io::write_file_atomic(d / "planted/sub/f", "z", "test"); });
  CHECK(contains(msg, "belongs to uid 65534"));
  CHECK(read_file(d / "real/sub/f") == "x");
  CHECK(
      contains(expect_error<IoError>([&] { file_io::open_dir(d / "planted/sub", false, "test"); }),
               "symbolic link"));
  // In a sticky world-writable folder (as /tmp) a link of the folder's owner is trusted too.
  fs::create_directory(d / "shared");
  chmod((d / "shared").c_str(), 01777);
  REQUIRE(chown((d / "shared").c_str(), 65534, 65534) == 0);
  fs::create_directory_symlink(d / "real", d / "shared/owners");
  REQUIRE(lchown((d / "shared/owners").c_str(), 65534, 65534) == 0);
  file_io::write_file_atomic(d / "shared/owners/sub/h", "h", "test");
  CHECK(read_file(d / "real/sub/h") == "h");
}

TEST_CASE("file_io: files written in place refuse links, FIFOs, hard links and others' files") {
  TempDir d;
  write_file(d / "outside", "precious");
  fs::create_symlink(d / "outside", d / "stdout.log");
  CHECK(contains(expect_error<IoError>([&] {
                   file_io::create_file(d / "stdout.log", "test", file_io::CreateMode::kReplace);
                 }),
                 "is a symbolic link"));
  CHECK(contains(expect_error<IoError>([&] {
                   file_io::create_file(d / "stdout.log", "test", file_io::CreateMode::kAppend);
                 }),
                 "symbolic link"));
  CHECK(read_file(d / "outside") == "precious");
  REQUIRE(mkfifo((d / "fifo").c_str(), 0600) == 0);
  CHECK(expect_error_child<IoError>(
            [&] { file_io::create_file(d / "fifo", "test", file_io::CreateMode::kAppend); },
            "is a FIFO")
            .ok());
  CHECK(contains(expect_error<IoError>([&] {
                   file_io::create_file(d / "fifo", "test", file_io::CreateMode::kReplace);
                 }),
                 "is a FIFO"));
  // A hard link into another file: appending would write into that file.
  fs::create_hard_link(d / "outside", d / "metrics.jsonl");
  CHECK(contains(expect_error<IoError>([&] {
                   file_io::create_file(d / "metrics.jsonl", "test", file_io::CreateMode::kAppend);
                 }),
                 "several hard links"));
  // Replacing removes the name only: the other file keeps its bytes.
  {
    file_io::Fd f =
        file_io::create_file(d / "metrics.jsonl", "test", file_io::CreateMode::kReplace);
    REQUIRE(file_io::write_all(f.get(), "new\n", 4));
  }
  CHECK(read_file(d / "outside") == "precious");
  CHECK(read_file(d / "metrics.jsonl") == "new\n");
  {
    file_io::Fd f = file_io::create_file(d / "metrics.jsonl", "test", file_io::CreateMode::kAppend);
    REQUIRE(file_io::write_all(f.get(), "more\n", 5));
  }
  CHECK(read_file(d / "metrics.jsonl") == "new\nmore\n");
}

TEST_CASE("file_io: reads refuse FIFOs, devices and oversized files without blocking") {
  TempDir d;
  REQUIRE(mkfifo((d / "fifo").c_str(), 0600) == 0);
  // Opening a FIFO for reading blocks until a writer comes; the child has a deadline.
  const auto r = expect_error_child<IoError>([&] { file_io::read_file(d / "fifo", "test", 100); },
                                             "is a FIFO");
  CHECK_MESSAGE(!r.timed_out, "the read blocked on the FIFO");
  CHECK(r.ok());
  fs::create_symlink("/dev/zero", d / "zero");
  CHECK(contains(expect_error<IoError>([&] { file_io::read_file(d / "zero", "test", 100); }),
                 "is a character device, not a regular file"));
  CHECK(contains(expect_error<IoError>(
                     [&] { file_io::read_file(d / "zero", "test", 100, file_io::Links::kRefuse); }),
                 "is a symbolic link"));
  CHECK(contains(expect_error<IoError>([&] { file_io::read_file(d.path.string(), "test", 100); }),
                 "is a directory"));
  write_file(d / "big", std::string(101, 'x'));
  CHECK(contains(expect_error<IoError>([&] { file_io::read_file(d / "big", "test", 100); }),
                 "is 101 bytes, more than the 100 bytes"));
  CHECK(file_io::read_file(d / "big", "test", 101).size() == 101);
  // Links to regular files are followed unless refused.
  fs::create_symlink(d / "big", d / "link");
  CHECK(file_io::read_file(d / "link", "test", 200).size() == 101);
  CHECK(contains(expect_error<IoError>(
                     [&] { file_io::read_file(d / "link", "test", 200, file_io::Links::kRefuse); }),
                 "is a symbolic link"));
}

TEST_CASE("file_io: remove_tree removes links, never what they point to") {
  TempDir d;
  fs::create_directories(d / "keep/inner");
  write_file(d / "keep/inner/data", "precious");
  fs::create_directories(d / "victim/a/b");
  write_file(d / "victim/a/b/f", "x");
  fs::create_directory_symlink(d / "keep", d / "victim/a/link");
  fs::create_symlink(d / "keep/inner/data", d / "victim/file_link");
  file_io::remove_tree((d / "victim"), "test");
  CHECK(!fs::exists(fs::symlink_status(d / "victim")));
  CHECK(read_file(d / "keep/inner/data") == "precious");
  file_io::remove_tree((d / "absent"), "test");  // nothing to do
  // A link at the name itself: the link goes.
  fs::create_directory_symlink(d / "keep", d / "alias");
  file_io::remove_tree((d / "alias"), "test");
  CHECK(!fs::exists(fs::symlink_status(d / "alias")));
  CHECK(fs::exists(d / "keep/inner/data"));
}
