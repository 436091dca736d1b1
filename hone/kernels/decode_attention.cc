// One decode step's attention on the CPU: every row's single query per head against that row's
// KV cache, in one call per layer.
//
// Written with XLA's own operations, this step is a handful of small fusions per layer (scores,
// mask, softmax, weighted sum, and a loop over cache blocks when the cache is long) that cost
// more in dispatch and intermediate arrays than in arithmetic: about a fifth of a SmolLM2-135M
// decode step at batch 8, a sixth at batch 32. Here each (row, kv head) is one task that reads
// its keys and values once, from memory laid out [B, K, S, H] (each head's keys contiguous),
// while prefetching the next task's: a step's caches do not fit in the CPU's caches.
//
// The numbers are those of Attention.attend_step (hone/models/attention.py): float32 scores
// q.k * scale, optional tanh soft-capping, masked slots set to float32's lowest value, a softmax
// with the maximum subtracted, and the probability-weighted sum of values divided by the
// probabilities' sum; only the order of float32 sums differs. Slots at or past `used` are not
// read (a decode step costs what the sequence so far holds, not what the cache could hold).
//
// Keys and values are float32 or bfloat16 (widened in registers); q and the output are float32.

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace {

using namespace hone;  // NOLINT: Vec, Load, Fma, Exp, ParallelFor, ...

constexpr float kMasked = -3.4028234663852886e38f;  // float32's lowest, attention.py's _MASKED

inline float Widen(float v) { return v; }
inline float Widen(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// q[0:H] . k[0:H] in float32.
template <typename T>
float Dot(const float* q, const T* k, int64_t H) {
  int64_t h = 0;
  float sum = 0.0f;
  if (H >= kLanes) {
    Vec a0 = Zero(), a1 = Zero();
    for (; h + 2 * kLanes <= H; h += 2 * kLanes) {
      a0 = Fma(Load(q + h), Load(k + h), a0);
      a1 = Fma(Load(q + h + kLanes), Load(k + h + kLanes), a1);
    }
    for (; h + kLanes <= H; h += kLanes) a0 = Fma(Load(q + h), Load(k + h), a0);
    sum = Sum(Add(a0, a1));
  }
  for (; h < H; ++h) sum += q[h] * Widen(k[h]);
  return sum;
}

// scores[j] = q[0:H] . k_j[0:H] for the 8 keys k_j = k + j*H; H a multiple of kLanes.
template <typename T>
void Dot8(const float* q, const T* k, int64_t H, float* scores) {
  Vec acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = Zero();
  for (int64_t h = 0; h < H; h += kLanes) {
    Vec qv = Load(q + h);
    for (int j = 0; j < 8; ++j) acc[j] = Fma(qv, Load(k + j * H + h), acc[j]);
  }
  _mm256_storeu_ps(scores, Sums8(acc));
}

// Where a task's slots are: slot s's H values at seg[s / len] + (s % len) * H, for s < count.
// A contiguous cache is one segment; a paged one has a segment per page.
template <typename T>
struct Slots {
  const T* const* seg;
  int64_t len, count;
};

// out[0:NV*kLanes] = sum over s < U of p[s] * v_s[0:NV*kLanes] (v_s: slot s of `v`, plus
// `off`). NV accumulators: 8 keep both multiply-add units busy through the adds' latency.
template <int NV, typename T>
void WeightedVecs(const float* p, const Slots<T>& v, int64_t U, int64_t H, int64_t off,
                  float* out) {
  Vec acc[NV];
  for (int c = 0; c < NV; ++c) acc[c] = Zero();
  for (int64_t j = 0, start = 0; start < U; ++j, start += v.len) {
    const T* base = v.seg[j] + off;
    const int64_t n = std::min(v.len, U - start);
    for (int64_t s = 0; s < n; ++s) {
      Vec ps = Broadcast(p[start + s]);
      for (int c = 0; c < NV; ++c) acc[c] = Fma(ps, Load(base + s * H + c * kLanes), acc[c]);
    }
  }
  for (int c = 0; c < NV; ++c) Store(out + c * kLanes, acc[c]);
}

template <typename T>
void Weighted(const float* p, const Slots<T>& v, int64_t U, int64_t H, float* out) {
  int64_t h = 0;
  for (; h + 8 * kLanes <= H; h += 8 * kLanes) WeightedVecs<8>(p, v, U, H, h, out + h);
  for (; h + 4 * kLanes <= H; h += 4 * kLanes) WeightedVecs<4>(p, v, U, H, h, out + h);
  for (; h + kLanes <= H; h += kLanes) WeightedVecs<1>(p, v, U, H, h, out + h);
  for (; h < H; ++h) {
    float a = 0.0f;
    for (int64_t j = 0, start = 0; start < U; ++j, start += v.len) {
      const int64_t n = std::min(v.len, U - start);
      for (int64_t s = 0; s < n; ++s) a += p[start + s] * Widen(v.seg[j][s * H + h]);
    }
    out[h] = a;
  }
}

struct Shape {
  int64_t B, N, K, S, H, U;
  float scale, softcap;
};

// Issues prefetches (into L2) for a task's keys, then its values, a few 64-byte lines a call,
// in order, segment by segment (so the cache is read at the rate of many outstanding loads
// rather than one stream per core).
template <typename T>
class Prefetcher {
 public:
  Prefetcher(const Slots<T>* keys, const Slots<T>* values, int64_t H)
      : parts_{keys, values}, row_(H * static_cast<int64_t>(sizeof(T))) {
    Enter();
  }
  int64_t Lines() const {
    return parts_[0] == nullptr ? 0 : 2 * ((parts_[0]->count * row_ + 63) / 64);
  }
  void Issue(int64_t n) {
    while (n > 0 && base_ != nullptr) {
      const int64_t k = std::min(n, lines_ - line_);
      for (int64_t i = line_; i < line_ + k; ++i) _mm_prefetch(base_ + i * 64, _MM_HINT_T1);
      line_ += k;
      n -= k;
      if (line_ == lines_) {
        if (++seg_ * parts_[part_]->len >= parts_[part_]->count) seg_ = 0, ++part_;
        Enter();
      }
    }
  }

 private:
  void Enter() {  // the segment at (part_, seg_): its first byte and its lines
    line_ = 0;
    base_ = nullptr;
    if (part_ >= 2 || parts_[part_] == nullptr) return;
    const Slots<T>& p = *parts_[part_];
    base_ = reinterpret_cast<const char*>(p.seg[seg_]);
    lines_ = (std::min(p.len, p.count - seg_ * p.len) * row_ + 63) / 64;
  }
  const Slots<T>* parts_[2];
  const char* base_ = nullptr;
  int64_t row_, part_ = 0, seg_ = 0, line_ = 0, lines_ = 0;
};

// The G = N / K query heads of kv head `kh` of row `b`. scratch: G x U rounded up to whole
// vectors. next: the next task's keys and values, prefetched while this one computes.
// keys / values: the task's first U slots; keep: their mask; qh: the G heads' queries, H
// apart; outs: the G heads' outputs, H apart.
template <typename T>
void Heads(const Shape& d, const float* qh, const Slots<T>& keys, const Slots<T>& values,
           const bool* keep, float* outs, float* scratch, Prefetcher<T>& next) {
  const int64_t G = d.N / d.K, U = d.U, H = d.H;
  const int64_t padded = (U + kLanes - 1) / kLanes * kLanes;
  // Scores of every head, blocks of 8 keys outermost: each key is read from memory once.
  // Blocks do not straddle segments; a segment's last few keys go one at a time.
  const int64_t blocks = U / 8, per_block = blocks ? (next.Lines() + blocks - 1) / blocks : 0;
  for (int64_t j = 0, start = 0; start < U; ++j, start += keys.len) {
    const T* base = keys.seg[j];
    const int64_t end = std::min(U, start + keys.len);
    int64_t s = start;
    if (H % kLanes == 0) {  // eight keys at a time, no horizontal sum per key
      for (; s + 8 <= end; s += 8) {
        for (int64_t g = 0; g < G; ++g)
          Dot8(qh + g * H, base + (s - start) * H, H, scratch + g * padded + s);
        next.Issue(per_block);
      }
    }
    for (; s < end; ++s)
      for (int64_t g = 0; g < G; ++g)
        scratch[g * padded + s] = Dot(qh + g * H, base + (s - start) * H, H);
  }
  for (int64_t g = 0; g < G; ++g) {
    float* p = scratch + g * padded;
    float top = kMasked;
    for (int64_t s = 0; s < U; ++s) {
      float x = kMasked;
      if (keep[s]) {
        x = p[s] * d.scale;
        if (d.softcap > 0.0f) x = d.softcap * std::tanh(x / d.softcap);
      }
      p[s] = x;
      top = std::max(top, x);
    }
    for (int64_t s = U; s < padded; ++s) p[s] = kMasked;
    // Every slot masked (a row of batch padding): all weights equal, as in the XLA softmax.
    Vec norm = Zero(), shift = Broadcast(top);
    for (int64_t s = 0; s < padded; s += kLanes) {
      Vec e = Exp(Sub(Load(p + s), shift));
      Store(p + s, e);
      norm = Add(norm, e);
    }
    float* o = outs + g * H;
    Weighted(p, values, U, H, o);
    const float total = Sum(norm) - static_cast<float>(padded - U) * (top == kMasked);
    for (int64_t h = 0; h < H; ++h) o[h] /= total;
  }
}

ffi::Error Invalid(const std::string& what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "hone_decode_attention: " + what);
}

// Every task of a call, in contiguous runs over the pool's threads (one thread for a call of a
// few microseconds).
template <typename F>
void Spread(ffi::ThreadPool& pool, const Shape& d, int64_t tasks, F run) {
  // Under ~32 Ki multiply-adds the whole call is a few microseconds: one thread.
  if (d.B * d.N * d.U * d.H < (int64_t{1} << 15)) {
    run(0, tasks);
  } else {
    const int64_t runs = std::min<int64_t>(tasks, 4 * std::max<int64_t>(1, pool.num_threads()));
    ParallelFor(pool, runs, [&](int64_t r) { run(r * tasks / runs, (r + 1) * tasks / runs); });
  }
}

template <typename T>
void Run(ffi::ThreadPool& pool, const Shape& d, const float* q, const void* k, const void* v,
         const bool* mask, float* out) {
  const T* kc = static_cast<const T*>(k);
  const T* vc = static_cast<const T*>(v);
  const int64_t padded = (d.U + kLanes - 1) / kLanes * kLanes;
  const int64_t tasks = d.B * d.K, G = d.N / d.K;
  // Tasks go out in contiguous runs, so the next task a thread prefetches is its own; several
  // runs per thread, so a thread the pool wakes late takes fewer.
  auto run = [&](int64_t first, int64_t end) {
    std::vector<float> scratch(G * padded);
    for (int64_t t = first; t < end; ++t) {  // t = b * K + kh
      const T* kt = kc + t * d.S * d.H;
      const T* vt = vc + t * d.S * d.H;
      const T* kn = kt + d.S * d.H;
      const T* vn = vt + d.S * d.H;
      const Slots<T> keys{&kt, d.S, d.U}, values{&vt, d.S, d.U};
      const Slots<T> next_keys{&kn, d.S, d.U}, next_values{&vn, d.S, d.U};
      Prefetcher<T> next(t + 1 < end ? &next_keys : nullptr, &next_values, d.H);
      const int64_t b = t / d.K, heads = (b * d.N + (t % d.K) * G) * d.H;
      Heads(d, q + heads, keys, values, mask + b * d.S, out + heads, scratch.data(), next);
    }
  };
  Spread(pool, d, tasks, run);
}

// The same over a page pool [K, P, page, H] (hone/sampling/paged.py; the layout of the Pallas
// paged-attention kernels): row b's slot s is in page table[b, s / page] at offset s % page,
// and the computation reads the pages where they are. A row reads only as far as it sees: up
// to its last visible slot (below `used`), rounded up to eight slots, so in a batch of long
// and short sequences each costs its own length, not the longest one's, and the slots read
// (hence the order of the sums) depend on the row alone, not on the other rows of the batch.
// Slots past the last visible one are masked; a row that sees nothing (an idle slot) reads
// eight, and its output, their mean, is never used.
template <typename T>
class PagedTask {
 public:
  PagedTask(const Shape& d, int64_t page) : page_(page), k_(d.S / page + 1), v_(d.S / page + 1) {}
  // Task t = b * K + kh: how far its row sees and where its slots are.
  void Set(const Shape& d, int64_t t, const T* kc, const T* vc, int64_t pool_pages,
           const int32_t* table, int64_t pages, const bool* mask) {
    const int64_t b = t / d.K, kh = t % d.K;
    row_ = mask + b * d.S;
    seen_ = d.U;
    while (seen_ > 0 && !row_[seen_ - 1]) --seen_;
    u_ = std::min<int64_t>(std::max<int64_t>((seen_ + 7) / 8 * 8, 8), d.S);
    for (int64_t j = 0; j * page_ < u_; ++j) {
      const int64_t from = (kh * pool_pages + table[b * pages + j]) * page_ * d.H;
      k_[j] = kc + from;
      v_[j] = vc + from;
    }
  }
  // The mask over the U slots it reads, into keep: none visible past the last visible one.
  void Keep(char* keep) const {
    for (int64_t s = 0; s < u_; ++s) keep[s] = s < seen_ && row_[s];
  }
  int64_t U() const { return u_; }
  Slots<T> Keys() const { return {k_.data(), page_, u_}; }
  Slots<T> Values() const { return {v_.data(), page_, u_}; }

 private:
  int64_t page_, seen_ = 0, u_ = 0;
  const bool* row_ = nullptr;
  std::vector<const T*> k_, v_;
};

template <typename T>
void RunPaged(ffi::ThreadPool& pool, const Shape& d, int64_t pool_pages, int64_t pages,
              int64_t page, const float* q, const void* k, const void* v, const int32_t* table,
              const bool* mask, float* out) {
  const T* kc = static_cast<const T*>(k);
  const T* vc = static_cast<const T*>(v);
  const int64_t room = (d.S + 7) / 8 * 8 + kLanes;  // the most slots a row reads, padded
  const int64_t tasks = d.B * d.K, G = d.N / d.K;
  auto run = [&](int64_t first, int64_t end) {
    std::vector<float> scratch(G * room);
    std::vector<char> keep(room);
    PagedTask<T> now(d, page), next(d, page);
    if (first < end) now.Set(d, first, kc, vc, pool_pages, table, pages, mask);
    for (int64_t t = first; t < end; ++t) {
      const int64_t b = t / d.K, heads = (b * d.N + (t % d.K) * G) * d.H;
      const Slots<T> keys = now.Keys(), values = now.Values();
      Slots<T> next_keys{}, next_values{};
      if (t + 1 < end) {
        next.Set(d, t + 1, kc, vc, pool_pages, table, pages, mask);
        next_keys = next.Keys();
        next_values = next.Values();
      }
      Prefetcher<T> ahead(t + 1 < end ? &next_keys : nullptr, &next_values, d.H);
      now.Keep(keep.data());
      Shape e = d;
      e.U = now.U();
      Heads(e, q + heads, keys, values, reinterpret_cast<const bool*>(keep.data()),
            out + heads, scratch.data(), ahead);
      std::swap(now, next);  // the next task's slots, found once
    }
  };
  Spread(pool, d, tasks, run);
}


std::string Dims(ffi::Span<const int64_t> d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// The checks both entry points share: v has k's shape and type, out has q's; "" when they hold.
std::string SameShapes(ffi::Span<const int64_t> kd, ffi::Span<const int64_t> vd,
                       ffi::DataType kt, ffi::DataType vt, ffi::Span<const int64_t> od,
                       const Shape& d) {
  if (vd.size() != 4 || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3] ||
      vt != kt)
    return "v must have k's shape and type; got v " + Dims(vd) + ", k " + Dims(kd);
  if (od.size() != 3 || od[0] != d.B || od[1] != d.N || od[2] != d.H)
    return "out must be q's shape";
  return "";
}

ffi::Error DecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::DataType::F32> q,
                           ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::Buffer<ffi::DataType::PRED> mask,
                           ffi::Buffer<ffi::DataType::S32> used,
                           ffi::Result<ffi::Buffer<ffi::DataType::F32>> out, float scale,
                           float softcap) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto md = mask.dimensions(), od = out->dimensions();
  if (qd.size() != 3 || kd.size() != 4 || md.size() != 2 || used.element_count() != 1)
    return Invalid("expects q [B, N, H], k and v [B, K, S, H], mask [B, S] and a scalar used; "
                   "got q " + Dims(qd) + ", k " + Dims(kd) + ", mask " + Dims(md));
  Shape d{qd[0], qd[1], kd[1], kd[2], qd[2], 0, scale, softcap};
  if (kd[0] != d.B || kd[3] != d.H || d.K <= 0 || d.N % d.K != 0)
    return Invalid("k " + Dims(kd) + " does not fit q " + Dims(qd));
  if (std::string bad = SameShapes(kd, vd, k.element_type(), v.element_type(), od, d); !bad.empty())
    return Invalid(bad);
  if (md[0] != d.B || md[1] != d.S) return Invalid("mask must be [B, S], got " + Dims(md));
  d.U = std::min<int64_t>(std::max<int32_t>(used.typed_data()[0], 1), d.S);
  if (d.B == 0 || d.N == 0 || d.H == 0 || d.S == 0) return ffi::Error::Success();
  const bool* m = mask.typed_data();
  if (k.element_type() == ffi::DataType::F32) {
    Run<float>(pool, d, q.typed_data(), k.untyped_data(), v.untyped_data(), m,
               out->typed_data());
  } else if (k.element_type() == ffi::DataType::BF16) {
    Run<uint16_t>(pool, d, q.typed_data(), k.untyped_data(), v.untyped_data(), m,
                  out->typed_data());
  } else {
    return Invalid("k and v must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

ffi::Error PagedDecodeAttention(ffi::ThreadPool pool, ffi::Buffer<ffi::DataType::F32> q,
                                ffi::AnyBuffer k, ffi::AnyBuffer v,
                                ffi::Buffer<ffi::DataType::S32> table,
                                ffi::Buffer<ffi::DataType::PRED> mask,
                                ffi::Buffer<ffi::DataType::S32> used,
                                ffi::Result<ffi::Buffer<ffi::DataType::F32>> out, float scale,
                                float softcap) {
  auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions();
  auto td = table.dimensions(), md = mask.dimensions(), od = out->dimensions();
  if (qd.size() != 3 || kd.size() != 4 || td.size() != 2 || md.size() != 2 ||
      used.element_count() != 1)
    return Invalid("expects q [B, N, H], k and v pools [K, P, page, H], table [B, n], mask "
                   "[B, n x page] and a scalar used; got q " + Dims(qd) + ", k " + Dims(kd) +
                   ", table " + Dims(td) + ", mask " + Dims(md));
  const int64_t pages = td[1], page = kd[2];
  Shape d{qd[0], qd[1], kd[0], pages * page, qd[2], 0, scale, softcap};
  if (td[0] != d.B || kd[3] != d.H || d.K <= 0 || d.N % d.K != 0)
    return Invalid("k " + Dims(kd) + " and table " + Dims(td) + " do not fit q " + Dims(qd));
  if (std::string bad = SameShapes(kd, vd, k.element_type(), v.element_type(), od, d); !bad.empty())
    return Invalid(bad);
  if (md[0] != d.B || md[1] != d.S) return Invalid("mask must be [B, n x page], got " + Dims(md));
  d.U = std::min<int64_t>(std::max<int32_t>(used.typed_data()[0], 1), d.S);
  if (d.B == 0 || d.N == 0 || d.H == 0 || d.S == 0) return ffi::Error::Success();
  const int32_t* tab = table.typed_data();
  for (int64_t i = 0; i < d.B * pages; ++i)
    if (tab[i] < 0 || tab[i] >= kd[1]) return Invalid("a page index is outside the pool");
  if (k.element_type() == ffi::DataType::F32) {
    RunPaged<float>(pool, d, kd[1], pages, page, q.typed_data(), k.untyped_data(),
                    v.untyped_data(), tab, mask.typed_data(), out->typed_data());
  } else if (k.element_type() == ffi::DataType::BF16) {
    RunPaged<uint16_t>(pool, d, kd[1], pages, page, q.typed_data(), k.untyped_data(),
                       v.untyped_data(), tab, mask.typed_data(), out->typed_data());
  } else {
    return Invalid("k and v must be float32 or bfloat16");
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(HoneDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::DataType::PRED>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HonePagedDecodeAttention, PagedDecodeAttention,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::DataType::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Arg<ffi::Buffer<ffi::DataType::PRED>>()
                                  .Arg<ffi::Buffer<ffi::DataType::S32>>()
                                  .Ret<ffi::Buffer<ffi::DataType::F32>>()
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap"));
