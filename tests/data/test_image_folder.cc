// ImageFolder over temporary trees, through the DataLoader with workers, and the shapes writer.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "data/data.h"
#include "helpers.h"
#include "tests/common/tensors.h"

using namespace accel;
using namespace accel::data;
using namespace accel::data::testing;
using namespace accel::data::transforms;
using accel::test::value_at;

namespace {

Tensor solid(int64_t h, int64_t w, uint8_t v) { return full({h, w, 3}, int64_t(v), kUInt8); }

}  // namespace

TEST_CASE("ImageFolder: classes, class_to_idx and samples in torchvision's order") {
  TempDir d;
  namespace fs = std::filesystem;
  fs::create_directories(d.file("root/dog/sub"));
  fs::create_directories(d.file("root/cat"));
  fs::create_directories(d.file("root/.hidden_class"));
  write_png(solid(4, 5, 10), d.file("root/dog/b.PNG"));
  write_jpeg(solid(4, 5, 20), d.file("root/dog/a.Jpeg"));
  write_png(solid(4, 5, 30), d.file("root/dog/sub/c.png"));
  write_png(solid(4, 5, 40), d.file("root/cat/z.jpg.png"));
  write_png(solid(4, 5, 50), d.file("root/.hidden_class/h.png"));
  write_file(d.file("root/cat/notes.txt"), "not an image");
  write_file(d.file("root/README"), "a file at the top is not a class");
  // A link cycle inside a class: walked once, no infinite recursion.
  fs::create_directory_symlink("..", d.file("root/dog/sub/up"));

  ImageFolder ds(d.file("root"));
  CHECK(ds.classes() == std::vector<std::string>{".hidden_class", "cat", "dog"});
  CHECK(ds.class_to_idx().at("dog") == 2);
  REQUIRE(ds.size() == 5);
  const auto& s = ds.samples();
  // torchvision: folders by path ("root/dog" < "root/dog/sub"), files sorted within each.
  CHECK(s[0].first == d.file("root/.hidden_class/h.png"));
  CHECK(s[1].first == d.file("root/cat/z.jpg.png"));
  CHECK(s[2].first == d.file("root/dog/a.Jpeg"));
  CHECK(s[3].first == d.file("root/dog/b.PNG"));
  CHECK(s[4].first == d.file("root/dog/sub/c.png"));
  CHECK(ds.targets() == std::vector<int64_t>{0, 1, 2, 2, 2});
  Example e = ds.get(3);
  CHECK(e["image"].sizes() == Shape{4, 5, 3});
  CHECK(value_at(e["image"], {0, 0, 0}) == 10);
  CHECK(e["label"].dim() == 0);
  CHECK(e["label"].item<int64_t>() == 2);
  CHECK_THROWS_AS(ds.get(5), IndexError);
}

TEST_CASE("ImageFolder: empty classes, no classes, FIFOs and dangling links are IoErrors") {
  TempDir d;
  namespace fs = std::filesystem;
  fs::create_directories(d.file("root/a"));
  fs::create_directories(d.file("root/empty"));
  write_png(solid(2, 2, 1), d.file("root/a/x.png"));
  try {
    ImageFolder ds(d.file("root"));
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("empty") != std::string::npos);
  }
  ImageFolderOptions o;
  o.allow_empty = true;
  CHECK(ImageFolder(d.file("root"), TransformPtr{}, o).size() == 1);
  fs::create_directories(d.file("none"));
  CHECK_THROWS_AS(ImageFolder(d.file("none")), IoError);
  CHECK_THROWS_AS(ImageFolder(d.file("missing")), IoError);
  // A FIFO with an image name would hang a worker's read: refused at the scan.
  REQUIRE(::mkfifo(d.file("root/a/pipe.png").c_str(), 0600) == 0);
  try {
    ImageFolder ds(d.file("root"), TransformPtr{}, o);
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("pipe.png") != std::string::npos);
  }
  ::unlink(d.file("root/a/pipe.png").c_str());
  fs::create_symlink(d.file("nowhere.png"), d.file("root/a/dangling.png"));
  CHECK_THROWS_AS(ImageFolder(d.file("root"), TransformPtr{}, o), IoError);
  ::unlink(d.file("root/a/dangling.png").c_str());
  // A link to an image elsewhere is followed (data sets are often links), as a folder link is.
  write_png(solid(2, 2, 7), d.file("elsewhere.png"));
  fs::create_symlink(d.file("elsewhere.png"), d.file("root/a/linked.png"));
  fs::create_directory_symlink(d.file("root/a"), d.file("root/b_link"));
  ImageFolder ds(d.file("root"), TransformPtr{}, o);
  CHECK(ds.classes() == std::vector<std::string>{"a", "b_link", "empty"});
  CHECK(ds.size() == 4);  // a/{linked, x}, b_link/{linked, x}
  CHECK(value_at(ds.get(0)["image"], {0, 0, 0}) == 7);
  // A corrupt image fails in get() with the file named.
  write_file(d.file("root/a/y.png"), "\x89PNG\r\n\x1a\n garbage");
  ImageFolder bad(d.file("root"), TransformPtr{}, o);
  try {
    bad.get(2);
    FAIL("expected an IoError");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("y.png") != std::string::npos);
  }
}

TEST_CASE(
    "ImageFolder + DataLoader: transforms run in workers, same batches for any worker count") {
  TempDir d;
  ShapesOptions so;
  so.per_class = 5;
  so.size = 24;
  so.seed = 3;
  const auto classes = write_shapes_folder(d.file("shapes"), so);
  CHECK(classes == std::vector<std::string>{"circle", "square", "triangle", "cross"});
  auto tf = Compose({RandomResizedCrop(16, {0.5, 1.0}), RandomHorizontalFlip(), ToTensor(),
                     Normalize({0.5, 0.5, 0.5}, {0.5, 0.5, 0.5})});
  // The transform records which threads ran it.
  auto main_id = std::this_thread::get_id();
  std::atomic<int> on_main{0}, calls{0};
  auto spy = Compose({Lambda([&](const Tensor& x) {
                        calls++;
                        if (std::this_thread::get_id() == main_id) on_main++;
                        return x;
                      }),
                      tf});
  auto ds = std::make_shared<ImageFolder>(d.file("shapes"), spy);
  CHECK(ds->classes() == std::vector<std::string>{"circle", "cross", "square", "triangle"});
  REQUIRE(ds->size() == 20);
  auto run = [&](int workers) {
    DataLoaderOptions o;
    o.batch_size = 6;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = workers;
    o.rank = 0;
    o.world_size = 1;
    DataLoader loader(ds, o);
    std::vector<Batch> out;
    for (auto& b : loader) out.push_back(b);
    return out;
  };
  const auto a = run(0);
  on_main = 0;
  calls = 0;
  const auto b = run(2);
  CHECK(calls.load() == 20);
  CHECK(on_main.load() == 0);  // every transform ran on a worker thread
  REQUIRE(a.size() == b.size());
  REQUIRE(a.size() == 4);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i]["image"].sizes() == Shape{a[i].size(), 3, 16, 16});
    CHECK(a[i]["image"].dtype() == kFloat32);
    CHECK(a[i]["label"].dtype() == kInt64);
    CHECK(a[i]["image"].equal(b[i]["image"]));
    CHECK(a[i]["label"].equal(b[i]["label"]));
  }
  // The same seed writes the same files; another seed other ones.
  TempDir d2;
  write_shapes_folder(d2.file("s"), so);
  CHECK(
      read_image(d.file("shapes/circle/0003.png")).equal(read_image(d2.file("s/circle/0003.png"))));
  so.seed = 4;
  write_shapes_folder(d2.file("t"), so);
  CHECK(!read_image(d.file("shapes/circle/0003.png"))
             .equal(read_image(d2.file("t/circle/0003.png"))));
}
