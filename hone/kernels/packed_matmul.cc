// The decode step's matrix products on the CPU: y[M, N] = x[M, K] @ w[K, N] for a few rows
// (the batch), with w stored in column panels.
//
// A decode step multiplies a handful of rows by every weight matrix of the model, so its time is
// the time to stream the weights from memory. XLA:CPU's kernels for these shapes read a
// row-major [K, N] matrix with a stride of N floats between the rows they touch, and reach about
// half of what the machine streams. Here the weights are stored once per generate call in
// panels (hone/kernels/packed.py): panel p holds columns [p*BW, (p+1)*BW) of every row k,
// contiguous, [P, K, BW], so each panel is one sequential read.
//
// Each tile keeps R x C accumulator registers (R rows of x, C vectors of BW/C columns), loads the
// panel's C vectors of row k once and multiplies them by R broadcast values of x: 7 loads for 12
// fused multiply-adds with R = 4, C = 3. The tiles of one panel reuse it from cache for the rows
// past the first four. Panels are shared out to XLA's intra-op thread pool.
//
// Weights are float32 or bfloat16 (widened to float32 in registers: a shift of the 16 bits);
// x is float32 or bfloat16 (widened once per call); sums are float32, y is float32.
//
// hone_packed_gated is the gated MLP's two products in one call, act(x @ Wgate) * (x @ Wup), over
// gate and up panels packed in pairs: each pair is combined while its tiles are still in cache,
// instead of two products and an elementwise pass over their outputs.
//
// Built by hone/kernels/compiler.py with -march=native for the machine it runs on.

#include <cstring>
#include <string>
#include <vector>

#include "common.h"

namespace {

using namespace hone;  // NOLINT: Vec, Load, Fma, ParallelFor, ...

constexpr int kRows = 4;    // R: rows of x per tile
constexpr int kVecs = 3;    // C: vectors of columns per tile
constexpr int kWidth = kVecs * kLanes;  // BW: columns per panel

// y[0:R, 0:cols] (row stride ldy) = x[0:R, :] (row stride K) @ panel [K, BW].
// Not inlined: inlined into the thread pool's task, GCC 12 compiled a loop 2x slower.
template <int R, typename W>
__attribute__((noinline)) void Tile(const float* x, const W* panel, int64_t K, float* y,
                                    int64_t ldy, int64_t cols, const char* ahead,
                                    int64_t ahead_step) {
  Vec acc[R][kVecs];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kVecs; ++c) acc[r][c] = Zero();
  const W* w = panel;
  for (int64_t k = 0; k < K; ++k, w += kWidth, ahead += ahead_step) {
    for (int64_t o = 0; o < ahead_step; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T1);
    Vec wv[kVecs];
    for (int c = 0; c < kVecs; ++c) {
      wv[c] = Load(w + c * kLanes);
      HONE_IN_REGISTER(wv[c]);
    }
    for (int r = 0; r < R; ++r) {
      Vec xb = Broadcast(x[r * K + k]);
      for (int c = 0; c < kVecs; ++c) acc[r][c] = Fma(xb, wv[c], acc[r][c]);
    }
  }
  if (cols == kWidth) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < kVecs; ++c) Store(y + r * ldy + c * kLanes, acc[r][c]);
    return;
  }
  alignas(64) float tmp[kWidth];  // the last panel of a matrix whose N is not a multiple of BW
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < kVecs; ++c) Store(tmp + c * kLanes, acc[r][c]);
    std::memcpy(y + r * ldy, tmp, cols * sizeof(float));
  }
}

// One panel times every row of x. The first tile reads the panel from memory; with three tiles
// or more (9+ rows), while the later tiles reuse it from cache they prefetch the next panel into
// L2, a share each, so the next panel's first tile does not wait on memory: without it the
// product is a memory-bound pass followed by compute-bound passes (1.3x slower at 32 rows).
// With two tiles the second has too little time to fetch a whole panel: that was slower.
template <typename W>
void Panel(const float* x, int64_t M, const W* panel, int64_t K, float* y, int64_t N,
           int64_t cols, const W* next) {
  const int64_t tiles = (M + kRows - 1) / kRows;
  const int64_t bytes = K * kWidth * static_cast<int64_t>(sizeof(W));
  // Bytes of the next panel each later tile prefetches per row k of this one (0: none).
  const int64_t step = tiles > 2 ? (bytes + (tiles - 1) * K - 1) / ((tiles - 1) * K) : 0;
  const char* ahead = reinterpret_cast<const char*>(next);
  int64_t r = 0;
  for (int64_t t = 0; r < M; ++t, r += kRows) {
    // The first tile prefetches nothing (it points at its own panel, with step 0).
    const char* from = t == 0 ? reinterpret_cast<const char*>(panel) : ahead + (t - 1) * step * K;
    const int64_t by = t == 0 ? 0 : step;
    switch (std::min<int64_t>(kRows, M - r)) {
      case 4: Tile<4>(x + r * K, panel, K, y + r * N, N, cols, from, by); break;
      case 3: Tile<3>(x + r * K, panel, K, y + r * N, N, cols, from, by); break;
      case 2: Tile<2>(x + r * K, panel, K, y + r * N, N, cols, from, by); break;
      default: Tile<1>(x + r * K, panel, K, y + r * N, N, cols, from, by); break;
    }
  }
}

ffi::Error Invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "hone_packed_matmul: " + what);
}

template <typename W>
void Run(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* w, int64_t panels,
         float* y, int64_t N) {
  // A few panels per task: enough tasks to even out the threads, few enough to cost nothing. A
  // small matrix (under 256 Ki weights: 1 MiB of float32) is one task: waking a thread for it
  // costs more than it saves.
  int64_t per = std::max<int64_t>(1, panels / (8 * std::max<int64_t>(1, pool.num_threads())));
  if (panels * K * kWidth < (int64_t{1} << 18)) per = panels;
  int64_t tasks = (panels + per - 1) / per;
  ParallelFor(pool, tasks, [&](int64_t t) {
    for (int64_t p = t * per; p < std::min(panels, (t + 1) * per); ++p) {
      int64_t cols = std::min<int64_t>(kWidth, N - p * kWidth);
      // The last panel prefetches itself again (a prefetch past the weights' end, from the
      // rounding up of its share, cannot fault: prefetches never do).
      const W* next = w + std::min(p + 1, panels - 1) * K * kWidth;
      Panel(x, M, w + p * K * kWidth, K, y + p * kWidth, N, cols, next);
    }
  });
}

// act(g) * u over one row's columns of a gated MLP: silu (0) or tanh-approximated gelu (1).
inline Vec Activate(Vec g, int activation) {
  const Vec one = Broadcast(1.0f);
  if (activation == 0) return Div(g, Add(one, Exp(Sub(Zero(), g))));  // g * sigmoid(g)
  // 0.5 g (1 + tanh(z)), z = sqrt(2 / pi) (g + 0.044715 g^3); tanh(z) = 1 - 2 / (e^2z + 1).
  Vec z = Mul(Broadcast(0.7978845608028654f),
              Fma(Mul(Broadcast(0.044715f), Mul(g, g)), g, g));
  Vec t = Sub(one, Div(Broadcast(2.0f), Add(Exp(Add(z, z)), one)));
  return Mul(Mul(Broadcast(0.5f), g), Add(one, t));
}

void GateRow(float* y, const float* up, int64_t cols, int activation) {
  int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes)
    Store(y + c, Mul(Activate(Load(y + c), activation), Load(up + c)));
  if (c < cols) {  // the last panel's columns past F: through a zero-padded vector
    alignas(64) float g[kLanes] = {}, u[kLanes] = {};
    std::memcpy(g, y + c, (cols - c) * sizeof(float));
    std::memcpy(u, up + c, (cols - c) * sizeof(float));
    Store(g, Mul(Activate(Load(g), activation), Load(u)));
    std::memcpy(y + c, g, (cols - c) * sizeof(float));
  }
}

// y[M, F] = act(x @ Wgate) * (x @ Wup), the panels in pairs [gate p, up p] (packed.py's
// pack_pair): the up half goes to a scratch tile and the pair is combined while still in cache.
template <typename W>
void RunGated(ffi::ThreadPool& pool, const float* x, int64_t M, int64_t K, const W* w,
              int64_t pairs, float* y, int64_t F, int activation) {
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  int64_t per = std::max<int64_t>(1, pairs / (8 * threads));
  if (2 * pairs * K * kWidth < (int64_t{1} << 18)) per = pairs;
  const int64_t stride = K * kWidth;
  ParallelFor(pool, (pairs + per - 1) / per, [&](int64_t t) {
    std::vector<float> up(M * kWidth);
    for (int64_t p = t * per; p < std::min(pairs, (t + 1) * per); ++p) {
      const int64_t cols = std::min<int64_t>(kWidth, F - p * kWidth);
      const W* gate = w + 2 * p * stride;
      const W* after = w + std::min(2 * p + 2, 2 * pairs - 1) * stride;
      Panel(x, M, gate, K, y + p * kWidth, F, cols, gate + stride);
      Panel(x, M, gate + stride, K, up.data(), kWidth, kWidth, after);
      for (int64_t r = 0; r < M; ++r)
        GateRow(y + r * F + p * kWidth, up.data() + r * kWidth, cols, activation);
    }
  });
}

// Checks x [M, K], panels w [P, K, BW] and y [M, N] (N within the last of `per` panels per
// output block) and widens a bfloat16 x into `widened`. Returns x as float32 via *xf.
ffi::Error Operands(ffi::AnyBuffer& x, ffi::AnyBuffer& w, ffi::AnyBuffer& y, int64_t per,
                    const float** xf, std::vector<float>& widened) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto yd = y.dimensions();
  if (xd.size() != 2 || wd.size() != 3 || yd.size() != 2)
    return Invalid("expects x [M, K], w [P, K, BW] and y [M, N]");
  const int64_t M = xd[0], K = xd[1], blocks = wd[0] / per, N = yd[1];
  if (wd[1] != K || wd[2] != kWidth || wd[0] % per != 0)
    return Invalid("w must be packed as [P, " + std::to_string(K) + ", " +
                   std::to_string(kWidth) + "], got [" + std::to_string(wd[0]) + ", " +
                   std::to_string(wd[1]) + ", " + std::to_string(wd[2]) + "]");
  if (yd[0] != M || blocks * kWidth < N || (blocks - 1) * kWidth >= N)
    return Invalid("y's shape does not match x and w");
  if (y.element_type() != ffi::DataType::F32) return Invalid("y must be float32");
  if (w.element_type() != ffi::DataType::F32 && w.element_type() != ffi::DataType::BF16)
    return Invalid("w must be float32 or bfloat16");
  if (x.element_type() == ffi::DataType::F32) {
    *xf = static_cast<const float*>(x.untyped_data());
  } else if (x.element_type() == ffi::DataType::BF16) {
    const uint16_t* xh = static_cast<const uint16_t*>(x.untyped_data());
    widened.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) {
      uint32_t bits = static_cast<uint32_t>(xh[i]) << 16;
      std::memcpy(&widened[i], &bits, sizeof(float));
    }
    *xf = widened.data();
  } else {
    return Invalid("x must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                        ffi::Result<ffi::AnyBuffer> y) {
  const float* xf = nullptr;
  std::vector<float> widened;
  ffi::Error error = Operands(x, w, *y, 1, &xf, widened);
  if (error.failure()) return error;
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], N = y->dimensions()[1];
  float* yf = static_cast<float*>(y->untyped_data());
  if (w.element_type() == ffi::DataType::F32)
    Run(pool, xf, M, K, static_cast<const float*>(w.untyped_data()), w.dimensions()[0], yf, N);
  else
    Run(pool, xf, M, K, static_cast<const uint16_t*>(w.untyped_data()), w.dimensions()[0], yf,
        N);
  return ffi::Error::Success();
}

ffi::Error PackedGated(ffi::ThreadPool pool, ffi::AnyBuffer x, ffi::AnyBuffer w,
                       ffi::Result<ffi::AnyBuffer> y, int32_t activation) {
  if (activation != 0 && activation != 1)
    return Invalid("activation must be 0 (silu) or 1 (gelu_tanh)");
  const float* xf = nullptr;
  std::vector<float> widened;
  ffi::Error error = Operands(x, w, *y, 2, &xf, widened);
  if (error.failure()) return error;
  const int64_t M = x.dimensions()[0], K = x.dimensions()[1], F = y->dimensions()[1];
  const int64_t pairs = w.dimensions()[0] / 2;
  float* yf = static_cast<float*>(y->untyped_data());
  if (w.element_type() == ffi::DataType::F32)
    RunGated(pool, xf, M, K, static_cast<const float*>(w.untyped_data()), pairs, yf, F,
             activation);
  else
    RunGated(pool, xf, M, K, static_cast<const uint16_t*>(w.untyped_data()), pairs, yf, F,
             activation);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HonePackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(HonePackedGated, PackedGated,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int32_t>("activation"));

extern "C" int hone_panel_width() { return kWidth; }
