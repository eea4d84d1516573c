// The schedule of the native tier's row kernels over torch's intra-op threads (drive): whole
// rows one thread each, rows split between all the threads together, or few long rows in
// two phases (docs/native.md section 2). It knows nothing of what the kernels compute: they
// come as partial / finish / write callables.
#pragma once
#include <ATen/Parallel.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

namespace eb {

// One core's L2 in bytes (the OS's figure; 1 MiB where it gives none).
inline int64_t l2_bytes() {
  static const int64_t b = [] {
    long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return v > 0 ? int64_t(v) : int64_t(1) << 20;
  }();
  return b;
}

// How drive spreads rows over threads: s segments per row (1: whole rows, one thread each),
// and whether the threads take each row together (see drive). `bytes`: what one element
// costs the data a row's second sweep reads again (x and y, or y and g, ...).
struct Plan {
  int64_t s;
  bool together;
};

inline Plan plan(int64_t rows, int64_t n, int64_t bytes) {
  const int64_t threads = at::get_num_threads();
  constexpr int64_t MIN_SEGMENT = 1 << 15;
  if (threads <= 1) return {1, false};
#ifdef _OPENMP
  const int64_t room = l2_bytes() * 3 / 4;  // beside the output's lines and the stack
  if (n / threads >= MIN_SEGMENT && n * bytes > room && n * bytes / threads <= room)
    return {threads, true};
#endif
  if (rows % threads == 0 || rows >= 4 * threads || n < 2 * MIN_SEGMENT) return {1, false};
  int64_t s = (2 * threads + rows - 1) / rows;
  while (s > 1 && n / s < MIN_SEGMENT) --s;
  return {s, false};
}

// The kernels' scratch, left uninitialized: every kernel writes what it reads back (a
// zeroed vector cost a full write of a buffer up to twice the input's size per call).
struct Scratch : std::unique_ptr<double[]> {
  explicit Scratch(int64_t count) : std::unique_ptr<double[]>(count ? new double[count] : nullptr) {}
};

// Segment length for n split s ways (drive's), for sizing scratch.
inline int64_t segment_length(int64_t n, int64_t s) { return s == 1 ? n : ((n + s - 1) / s + 63) / 64 * 64; }

// Run partial(row, i0, i1, item, scratch) over every segment of plan p, finish(row, first, count) per
// row (serially: a few flops a row), then write(row, i0, i1, item, scratch) over every
// segment (item = row * segments + segment). Each segment gets `per` doubles of scratch
// that its write sees again. Three schedules:
// - whole rows, one thread each, a row finished while it is still in its core's cache;
// - rows too long for one core's L2 but not for all the cores' together: the threads take
//   the rows one after another, each row split between them and the threads meeting between
//   its sweeps, so that the second sweep reads the row from L2 instead of memory;
// - a few long rows (fewer than the threads): all segments' partials, then all writes.
template <class Partial, class PartialF, class FinishF, class WriteF>
void drive(int64_t rows, int64_t n, const Plan& p, int64_t per, PartialF partial,
           FinishF finish, WriteF write) {
  const int64_t s = p.s;
  if (s == 1) {
    const int64_t grain = std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(n, 1));
    at::parallel_for(0, rows, grain, [&](int64_t b, int64_t e) {
      Scratch scratch(per);  // one row's worth, reused along the chunk
      for (int64_t r = b; r < e; ++r) {
        Partial q = partial(r, 0, n, r, scratch.get());
        finish(r, &q, 1);
        write(r, 0, n, r, scratch.get());
      }
    });
    return;
  }
  const int64_t seg = segment_length(n, s);
  auto bounds = [&](int64_t item, int64_t& i0, int64_t& i1) {
    i0 = std::min(n, (item % s) * seg);
    i1 = std::min(n, i0 + seg);
  };
#ifdef _OPENMP
  if (p.together) {
    std::vector<Partial> parts(s);
    Scratch scratch(per * s);
#pragma omp parallel num_threads(int(s))
    {
      // a smaller team than asked (a nested call) takes several segments a thread
      const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = t; k < s; k += team) {
          int64_t i0, i1;
          bounds(k, i0, i1);
          parts[k] = partial(r, i0, i1, r * s + k, scratch.get() + k * per);
        }
#pragma omp barrier
        if (t == 0) finish(r, parts.data(), s);
#pragma omp barrier
        for (int64_t k = t; k < s; k += team) {
          int64_t i0, i1;
          bounds(k, i0, i1);
          write(r, i0, i1, r * s + k, scratch.get() + k * per);
        }
      }
    }
    return;
  }
#endif
  std::vector<Partial> parts(rows * s);
  Scratch scratch(per * rows * s);
  at::parallel_for(0, rows * s, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t i0, i1;
      bounds(it, i0, i1);
      parts[it] = partial(it / s, i0, i1, it, scratch.get() + it * per);
    }
  });
  for (int64_t r = 0; r < rows; ++r) finish(r, &parts[r * s], s);
  at::parallel_for(0, rows * s, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      int64_t i0, i1;
      bounds(it, i0, i1);
      write(it / s, i0, i1, it, scratch.get() + it * per);
    }
  });
}

}  // namespace eb
