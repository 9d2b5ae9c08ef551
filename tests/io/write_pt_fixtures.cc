// Writes the accel_*.pt fixtures (pt_content.h) into a folder; make_torch_fixtures.py runs it and
// checks each file in PyTorch before they are committed. --resave reads a state dict with load_pt
// and writes it with save_pt (make_torch_fixtures.py --big: a file over 4 GiB).
//
//   io_write_pt_fixtures <folder>
//   io_write_pt_fixtures --resave <in.pt> <out.pt>
#include <cstdio>
#include <exception>
#include <string>

#include "tests/io/pt_content.h"

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--resave") {
    try {
      accel::io::save_pt(argv[3], accel::io::load_pt(argv[2]));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 1;
    }
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <folder> | --resave <in.pt> <out.pt>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    accel::io::save_pt(dir + "/accel_state.pt", pt_content::state());
    accel::io::save_pt(dir + "/accel_tree.pt", pt_content::tree());
    accel::io::detail::save_pt_with(dir + "/accel_zip64.pt",
                                    accel::io::to_pt_value(pt_content::state()),
                                    pt_content::kZip64Threshold);
    accel::io::save_pt(dir + "/accel_adam.pt", pt_content::adam_run());
    accel::io::save_pt(dir + "/accel_sgd.pt", pt_content::sgd_run());
    accel::io::save_pt(dir + "/accel_adamw.pt", pt_content::adamw_run());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
