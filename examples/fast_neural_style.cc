// fast_neural_style: pytorch/examples fast_neural_style/neural_style/neural_style.py. `train`
// fits a TransformerNet to one style image over an ImageFolder of content images with VGG16
// perceptual losses (content weight 1e5 at relu2_2, style weight 1e10 on the Gram matrices of
// relu1_2 / relu2_2 / relu3_3 / relu4_3), Adam lr 1e-3, and saves it as a torch.save state dict;
// `eval` stylizes an image with a saved model. The model, the loss network, the step, train()
// and stylize(): examples/fast_neural_style.h.
//
//   build/examples/fast_neural_style train --dataset DIR --style-image FILE --save-model-dir DIR
//       --vgg-weights vgg16.pth [--epochs 2] [--batch-size 4] [--image-size 256]
//       [--style-size N] [--checkpoint-model-dir DIR] [--checkpoint-interval 2000] [--seed 42]
//       [--content-weight 1e5] [--style-weight 1e10] [--lr 1e-3] [--log-interval 500]
//   build/examples/fast_neural_style eval --content-image FILE --model FILE --output-image FILE
//       [--content-scale X]
//   build/examples/fast_neural_style stand-in --out DIR [--images 2000]
//       (ours: Fashion-MNIST as an ImageFolder, a mosaic style image and random VGG16 weights)
#include <cstdio>
#include <string>

#include "examples/common.h"
#include "examples/fast_neural_style.h"

int main(int argc, char** argv) {
  using namespace accel;
  using namespace accel::examples;
  namespace fns = accel::examples::fast_neural_style;
  int threads = 0;
  fns::TrainArgs targs;
  fns::EvalArgs eargs;
  fns::StandInArgs sargs;
  int64_t style_size = 0;
  double content_scale = 0;

  CLI::App app("parser for fast-neural-style", "fast_neural_style");
  app.fallthrough();
  app.require_subcommand(0, 1);
  app.add_option("--threads", threads, "OpenMP threads (0: default)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);

  CLI::App* train = app.add_subcommand("train", "parser for training arguments");
  train->add_option("--epochs", targs.epochs, "number of training epochs, default is 2")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train->add_option("--batch-size", targs.batch_size, "batch size for training, default is 4")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--dataset", targs.dataset,
                   "path to training dataset, the path should point to a folder containing "
                   "another folder with all the training images")
      ->required();
  train->add_option("--style-image", targs.style_image, "path to style-image")
      ->capture_default_str();
  train
      ->add_option("--save-model-dir", targs.save_model_dir,
                   "path to folder where trained model will be saved.")
      ->required();
  train->add_option("--checkpoint-model-dir", targs.checkpoint_model_dir,
                    "path to folder where checkpoints of trained models will be saved");
  train
      ->add_option("--image-size", targs.image_size,
                   "size of training images, default is 256 X 256")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI::Option* style_size_opt =
      train
          ->add_option("--style-size", style_size,
                       "size of style-image, default is the original size of style image")
          ->check(CLI::PositiveNumber);
  train->add_option("--seed", targs.seed, "random seed for training")->capture_default_str();
  train
      ->add_option("--content-weight", targs.content_weight,
                   "weight for content-loss, default is 1e5")
      ->capture_default_str();
  train->add_option("--style-weight", targs.style_weight, "weight for style-loss, default is 1e10")
      ->capture_default_str();
  train->add_option("--lr", targs.lr, "learning rate, default is 1e-3")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--log-interval", targs.log_interval,
                   "number of images after which the training loss is logged, default is 500")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--checkpoint-interval", targs.checkpoint_interval,
                   "number of batches after which a checkpoint of the trained model will be "
                   "created")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  train
      ->add_option("--vgg-weights", targs.vgg_weights,
                   "torchvision vgg16 state dict (.pth, e.g. vgg16-397923af.pth; the original "
                   "downloads it)")
      ->required();

  CLI::App* eval = app.add_subcommand("eval", "parser for evaluation/stylizing arguments");
  eval->add_option("--content-image", eargs.content_image,
                   "path to content image you want to stylize")
      ->required();
  CLI::Option* content_scale_opt = eval->add_option("--content-scale", content_scale,
                                                    "factor for scaling down the content image")
                                       ->check(CLI::PositiveNumber);
  eval->add_option("--output-image", eargs.output_image, "path for saving the output image")
      ->required();
  eval->add_option("--model", eargs.model,
                   "saved model to be used for stylizing the image (a state dict: .pth / .model)")
      ->required();

  CLI::App* stand_in = app.add_subcommand(
      "stand-in",
      "write stand-in data: Fashion-MNIST as an ImageFolder (OUT/fashion), a style image "
      "(OUT/mosaic.png) and random VGG16 weights (OUT/vgg16_random.pth)");
  stand_in->add_option("--out", sargs.out, "folder to write into")->required();
  stand_in->add_option("--images", sargs.images, "Fashion-MNIST training images to write")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  stand_in->add_option("--data-dir", sargs.fashion_dir, "Fashion-MNIST idx files")
      ->capture_default_str();
  stand_in->add_option("--seed", sargs.seed, "seed of the style image and the VGG16 weights")
      ->capture_default_str();

  return run_example(app, argc, argv, [&] {
    if (threads > 0) omp_set_num_threads(threads);
    if (*train) {
      if (style_size_opt->count() > 0) targs.style_size = style_size;
      fns::train(targs);
    } else if (*eval) {
      if (content_scale_opt->count() > 0) eargs.content_scale = content_scale;
      fns::stylize(eargs);
    } else if (*stand_in) {
      fns::write_stand_in(sargs);
    } else {
      std::printf("ERROR: specify either train or eval\n");
      return 1;
    }
    return 0;
  });
}
