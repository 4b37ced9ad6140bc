// PyTorch's C++ side (ATen) of `benches/peers/run.sh`: the work `eagervm bench` measures.
//
//   mlp         the training step of `eagervm run mlp` (src/programs/mlp.rs): the same 24 ops,
//               the same hand-written backward pass, at 64x8x32 and 1024x1024x1024; per step,
//               the loss read at the end and read every step (`item`)
//   chain       10^5 tiny adds `x = x + 1` on a one-element tensor, then one read (W8), and
//               the in-place form `x.add_(1)`
//   round trip  one add, then `item` (W9)
//
// One thread (`at::set_num_threads(1)`) unless `--threads N`. Each figure is the median of
// `--reps` repetitions; one JSON object per line on standard output. Built by build_aten.sh.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Figure {
  double median, lo, hi;
};

Figure median_of(int reps, const std::function<double()>& f) {
  std::vector<double> v;
  for (int i = 0; i < reps; i++) v.push_back(f());
  std::sort(v.begin(), v.end());
  size_t k = v.size();
  double m = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
  return {m, v.front(), v.back()};
}

struct Mlp {
  at::Tensor x, y, w1, b1, w2, b2;
  double inv_n, lr = 0.05;

  Mlp(int64_t n, int64_t d, int64_t h) {
    at::manual_seed(1);
    auto u = [](at::IntArrayRef s, double scale) { return (at::rand(s) * 2 - 1) * scale; };
    x = u({n, d}, 1.0);
    y = u({n, 1}, 1.0);
    w1 = u({d, h}, std::sqrt(3.0 / d));
    w2 = u({h, 1}, std::sqrt(3.0 / h));
    b1 = at::zeros({h});
    b2 = at::zeros({1});
    inv_n = 1.0 / n;
  }

  // One step of programs::mlp, op for op; returns the loss.
  at::Tensor step() {
    auto z = at::matmul(x, w1) + b1;
    auto a = at::relu(z);
    auto p = at::matmul(a, w2) + b2;
    auto diff = p - y;
    auto loss = (diff * diff).sum() * inv_n;
    auto dp = diff * (2.0 * inv_n);
    auto dw2 = at::matmul(a.t(), dp);
    auto db2 = dp.sum(0);
    auto dz = at::where(z > 0, at::matmul(dp, w2.t()), at::zeros({}, z.options()));
    auto dw1 = at::matmul(x.t(), dz);
    auto db1 = dz.sum(0);
    w1 = w1 - dw1 * lr;
    b1 = b1 - db1 * lr;
    w2 = w2 - dw2 * lr;
    b2 = b2 - db2 * lr;
    return loss;
  }
};

double time_steps(int64_t n, int64_t d, int64_t h, int steps, bool read_each) {
  Mlp m(n, d, h);
  auto t0 = Clock::now();
  auto loss = m.step();
  for (int i = 1; i < steps; i++) {
    if (read_each) (void)loss.item<float>();
    loss = m.step();
  }
  (void)loss.item<float>();
  return since(t0) * 1e6 / steps;
}

double chain(long n, bool in_place) {
  auto x = at::zeros({1});
  auto t0 = Clock::now();
  if (in_place) {
    for (long i = 0; i < n; i++) x.add_(1.0);
  } else {
    for (long i = 0; i < n; i++) x = x + 1.0;
  }
  float got = x.item<float>();
  double ns = since(t0) * 1e9 / n;
  if (got != static_cast<float>(std::min(n, 1L << 24))) {
    std::fprintf(stderr, "chain: got %f after %ld adds\n", got, n);
    std::exit(1);
  }
  return ns;
}

double round_trip(long n) {
  auto x = at::zeros({1});
  auto t0 = Clock::now();
  for (long i = 0; i < n; i++) {
    x = x + 1.0;
    if (x.item<float>() != static_cast<float>(i + 1)) {
      std::fprintf(stderr, "round trip: wrong value at %ld\n", i);
      std::exit(1);
    }
  }
  return since(t0) * 1e9 / n;
}

long arg(int argc, char** argv, const char* name, long dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (!std::strcmp(argv[i], name)) {
      long v = std::strtol(argv[i + 1], nullptr, 10);
      if (v < 1) {
        std::fprintf(stderr, "%s must be at least 1\n", name);
        std::exit(2);
      }
      return v;
    }
  return dflt;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(arg(argc, argv, "--threads", 1));
  int reps = static_cast<int>(arg(argc, argv, "--reps", 3));
  int steps = static_cast<int>(arg(argc, argv, "--steps", 2000));
  int large_steps = static_cast<int>(arg(argc, argv, "--large-steps", 10));
  long chain_n = arg(argc, argv, "--chain", 100000);
  long trips = arg(argc, argv, "--round-trips", 10000);
  at::set_num_threads(threads);
  char base[160];
  std::snprintf(base, sizeof base, "{\"peer\": \"torch-aten\", \"device\": \"cpu\", \"threads\": %d", at::get_num_threads());

  struct Shape {
    int64_t n, d, h;
    int steps;
  };
  for (Shape s : {Shape{64, 8, 32, steps}, Shape{1024, 1024, 1024, large_steps}}) {
    time_steps(s.n, s.d, s.h, std::max(2, s.steps / 10), false);
    auto plain = median_of(reps, [&] { return time_steps(s.n, s.d, s.h, s.steps, false); });
    auto read = median_of(reps, [&] { return time_steps(s.n, s.d, s.h, s.steps, true); });
    std::printf(
        "%s, \"work\": \"mlp\", \"shape\": \"%ldx%ldx%ld\", \"mode\": \"eager\", \"steps\": %d, "
        "\"us_per_step\": %.3f, \"us_per_step_loss_read\": %.3f, \"us_range\": [%.3f, %.3f]}\n",
        base, (long)s.n, (long)s.d, (long)s.h, s.steps, plain.median, read.median, plain.lo, plain.hi);
    std::fflush(stdout);
  }
  for (bool in_place : {false, true}) {
    chain(std::max(1L, chain_n / 10), in_place);
    auto f = median_of(reps, [&] { return chain(chain_n, in_place); });
    std::printf("%s, \"work\": \"chain\", \"mode\": \"%s\", \"ops\": %ld, \"ns_per_op\": %.3f, \"ns_range\": [%.3f, %.3f]}\n",
                base, in_place ? "in place" : "x = x + 1", chain_n, f.median, f.lo, f.hi);
  }
  round_trip(std::max(1L, trips / 10));
  auto f = median_of(reps, [&] { return round_trip(trips); });
  std::printf("%s, \"work\": \"round trip\", \"ops\": %ld, \"ns_per_op\": %.3f, \"ns_range\": [%.3f, %.3f]}\n", base,
              trips, f.median, f.lo, f.hi);
  return 0;
}
