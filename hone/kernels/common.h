// What hone's CPU kernels share: the SIMD vector of the build's instruction set (AVX-512 or
// AVX2 + FMA), a vectorized exp, and the loop that shares work out to XLA's intra-op threads.

#ifndef HONE_KERNELS_COMMON_H_
#define HONE_KERNELS_COMMON_H_

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "xla/ffi/api/ffi.h"

namespace hone {

namespace ffi = xla::ffi;

#ifdef __AVX512F__
constexpr int kLanes = 16;
using Vec = __m512;
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Broadcast(float a) { return _mm512_set1_ps(a); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec Load(const uint16_t* p) {
  __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// Keeps a loaded vector in a register: without it the compiler folds the load into every
// multiply-add that uses it, which reads the panel R times and makes the loop load-bound.
#define HONE_IN_REGISTER(v) asm volatile("" : "+v"(v))
inline Vec Add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec Div(Vec a, Vec b) { return _mm512_div_ps(a, b); }
inline float Sum(Vec v) { return _mm512_reduce_add_ps(v); }
// The sums of 8 vectors, one per lane of the result (lane j: the sum of v[j]'s lanes).
inline __m256 Sums8(const Vec* v) {
  __m256 half[8];
  for (int j = 0; j < 8; ++j)
    half[j] = _mm256_add_ps(_mm512_castps512_ps256(v[j]), _mm256_castpd_ps(
        _mm512_extractf64x4_pd(_mm512_castps_pd(v[j]), 1)));
  __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(half[0], half[1]), _mm256_hadd_ps(half[2], half[3]));
  __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(half[4], half[5]), _mm256_hadd_ps(half[6], half[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
// e^x to float32 precision (Cephes' expf: 2^n times a degree-6 polynomial of the remainder);
// 0 below -87.33 (where float32's e^x leaves the normal range), x is clamped at 88 above.
inline Vec Exp(Vec x) {
  __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)),
                    _mm512_set1_ps(-87.3365478515625f));
  Vec n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  Vec y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~under),
                             _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}
#else
constexpr int kLanes = 8;
using Vec = __m256;
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Broadcast(float a) { return _mm256_set1_ps(a); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec Load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec Load(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline Vec Add(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec Mul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec Div(Vec a, Vec b) { return _mm256_div_ps(a, b); }
inline float Sum(Vec v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
// The sums of 8 vectors, one per lane of the result (lane j: the sum of v[j]'s lanes).
inline __m256 Sums8(const Vec* v) {
  __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
// e^x to float32 precision (Cephes' expf: 2^n times a degree-6 polynomial of the remainder);
// 0 below -87.33 (where float32's e^x leaves the normal range), x is clamped at 88 above.
inline Vec Exp(Vec x) {
  Vec under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)),
                    _mm256_set1_ps(-87.3365478515625f));
  Vec n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  Vec r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  Vec p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  Vec y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#define HONE_IN_REGISTER(v) asm volatile("" : "+x"(v))
#endif

// Runs body(i) for i in [0, n) on the caller and the pool's threads. Workers claim indices from a
// shared counter, so a worker the pool starts late finds nothing left and returns at once; the
// caller returns only when every claimed index is done (body outlives every call of it).
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t n, const F& body) {
  int64_t threads = std::min<int64_t>(pool.num_threads(), n);
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct Shared {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto shared = std::make_shared<Shared>();
  const F* fn = &body;
  auto work = [shared, n, fn]() {
    for (int64_t i; (i = shared->next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      (*fn)(i);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t t = 1; t < threads; ++t) pool.Schedule(decltype(work)(work));
  work();
  while (shared->done.load(std::memory_order_acquire) < n) _mm_pause();
}

}  // namespace hone

#endif  // HONE_KERNELS_COMMON_H_
