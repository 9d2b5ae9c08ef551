// dcgan: pytorch/examples dcgan/main.py on Fashion-MNIST resized to 64x64 (bilinear, then
// Normalize(0.5, 0.5): the original's `--dataset mnist` path): DCGAN generator and discriminator,
// BCELoss, Adam(lr 2e-4, betas (0.5, 0.999)); every 100 iterations real_samples.png and
// fake_samples_epoch_NNN.png (64 images from a fixed noise) in --outf, through data::save_image
// (normalize=True); netG_epoch_N / netD_epoch_N.safetensors after every epoch. The model and the
// step: examples/dcgan.h.
//
//   build/examples/dcgan [--niter 25] [--batchSize 64] [--nz 100] [--ngf 64] [--ndf 64]
//       [--outf DIR] [--max-batches N]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "examples/common.h"
#include "examples/dcgan.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  std::string dataroot = data::kFashionMnistDir, outf = ".", netG_path, netD_path;
  int64_t batchSize = 64, imageSize = 64, nz = 100, ngf = 64, ndf = 64, max_batches = 0;
  int niter = 25, threads = 0;
  double lr = 0.0002, beta1 = 0.5;
  uint64_t manualSeed = 999;
  bool dry_run = false;
  CLI::App app("PyTorch's DCGAN example on Fashion-MNIST (64x64)", "dcgan");
  app.add_option("--dataroot", dataroot, "path to the Fashion-MNIST files")->capture_default_str();
  app.add_option("--batchSize", batchSize, "input batch size")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--imageSize", imageSize, "the height / width of the input image to network")
      ->capture_default_str()
      ->check(CLI::IsMember({64}));
  app.add_option("--nz", nz, "size of the latent z vector")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ngf", ngf, "generator width")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--ndf", ndf, "discriminator width")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--niter", niter, "number of epochs to train for")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--beta1", beta1, "beta1 for adam")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--dry-run", dry_run, "check a single training cycle works");
  app.add_option("--netG", netG_path, "path to netG (to continue training)");
  app.add_option("--netD", netD_path, "path to netD (to continue training)");
  app.add_option("--outf", outf, "folder to output images and model checkpoints")
      ->capture_default_str();
  app.add_option("--manualSeed", manualSeed, "manual seed")->capture_default_str();
  app.add_option("--max-batches", max_batches, "iterations per epoch (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads, "OpenMP threads (0: default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    std::filesystem::create_directories(outf);
    std::printf("Random Seed: %llu\n", static_cast<unsigned long long>(manualSeed));
    manual_seed(manualSeed);
    const int64_t nc = 1;

    data::MnistOptions mo;
    mo.channel = true;  // (N, 1, 28, 28) in [0, 1]; resized per batch (64x64 floats of the whole
                        // set would be 1 GB)
    data::DataLoaderOptions lo;
    lo.batch_size = batchSize;
    lo.shuffle = true;
    lo.seed = manualSeed;
    data::DataLoader dataloader(data::load_mnist(dataroot, mo), lo);

    auto netG = std::make_shared<dcgan::Generator>(nz, ngf, nc);
    netG->apply(dcgan::weights_init);
    if (!netG_path.empty()) netG->load(netG_path);
    auto netD = std::make_shared<dcgan::Discriminator>(ndf, nc);
    netD->apply(dcgan::weights_init);
    if (!netD_path.empty()) netD->load(netD_path);
    std::printf("Generator: %lld parameters, Discriminator: %lld parameters\n",
                static_cast<long long>(netG->num_parameters()),
                static_cast<long long>(netD->num_parameters()));

    const Tensor fixed_noise = randn({batchSize, nz, 1, 1});
    // setup optimizer
    optim::AdamOptions ao;
    ao.lr(lr);
    ao.betas({beta1, 0.999});
    optim::Adam optimizerD(netD->parameters(), ao);
    optim::Adam optimizerG(netG->parameters(), ao);

    const int64_t n_batches =
        max_batches > 0 ? std::min(max_batches, dataloader.size()) : dataloader.size();
    double step_secs = 0;
    int64_t steps = 0;
    for (int epoch = 0; epoch < niter; ++epoch) {
      dataloader.set_epoch(epoch);
      int64_t i = 0;
      for (auto& batch : dataloader) {
        if (i >= n_batches) break;
        const auto t0 = std::chrono::steady_clock::now();
        const Tensor real_cpu = dcgan::to_dcgan_images(batch[0]);
        const Tensor noise = randn({real_cpu.size(0), nz, 1, 1});
        const dcgan::StepResult r =
            dcgan::train_step(*netG, *netD, optimizerG, optimizerD, real_cpu, noise);
        step_secs += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++steps;
        std::printf(
            "[%d/%d][%lld/%lld] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f  "
            "[%.0f ms/step]\n",
            epoch, niter, static_cast<long long>(i), static_cast<long long>(n_batches), r.errD,
            r.errG, r.D_x, r.D_G_z1, r.D_G_z2, 1000 * step_secs / double(steps));
        std::fflush(stdout);
        if (i % 100 == 0 || i == n_batches - 1) {
          data::save_image(real_cpu, outf + "/real_samples.png", 8, 2, /*normalize=*/true);
          NoGradGuard ng;
          const Tensor fake = netG->forward(fixed_noise);
          char name[64];
          std::snprintf(name, sizeof name, "/fake_samples_epoch_%03d.png", epoch);
          data::save_image(fake, outf + name, 8, 2, /*normalize=*/true);
        }
        ++i;
        if (dry_run) break;
      }
      // do checkpointing
      netG->save(outf + "/netG_epoch_" + std::to_string(epoch) + ".safetensors");
      netD->save(outf + "/netD_epoch_" + std::to_string(epoch) + ".safetensors");
      if (dry_run) break;
    }
    return 0;
  });
}
