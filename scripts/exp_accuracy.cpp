// The native exponential's error in ulps against expl (long double) on 2,000,000 evenly
// spaced arguments over each format's working range, [-104, 0] in fp32 and [-745, 0] in
// fp64, subnormal results included (docs/native.md section 3). One instruction set a build:
//
//   c++ -O2 -std=c++17 -march=native -DEB_VEC_BYTES=64 -I kernels/cpp scripts/exp_accuracy.cpp -o /tmp/exp512 && /tmp/exp512
//   c++ -O2 -std=c++17 -DEB_VEC_BYTES=16 -I kernels/cpp scripts/exp_accuracy.cpp -o /tmp/exp128 && /tmp/exp128
#include <math.h>
#include <stdio.h>

#define EB_NS eb
#include "simd.h"

template <typename C> double ulp_error(C got, long double want) {
  if (want == 0) return got == 0 ? 0 : INFINITY;
  int e;
  frexpl(want, &e);  // want = f 2^e, f in [0.5, 1)
  const int mant = sizeof(C) == 4 ? 24 : 53, emin = sizeof(C) == 4 ? -125 : -1021;
  const long double ulp = ldexpl(1.0L, (e < emin ? emin : e) - mant);
  return double(fabsl((long double)got - want) / ulp);
}

template <typename C> void worst(double lo) {
  constexpr int W = eb::width<C>();
  const long n = 2000000;
  const int prescale = eb::ExpConst<C>::PRESCALE;
  double w = 0, at = 0;
  for (long i = 0; i < n; i += W) {
    eb::vec<C> z;
    for (int k = 0; k < W; ++k) z[k] = C(lo * double(i + k) / double(n - 1));
    eb::vec<C> r = eb::vexp_scaled<C>(z);
    for (int k = 0; k < W; ++k) {
      // the kernels' final multiply by 2^-PRESCALE / D rounds once: here, to C alone
      const C got = C(ldexpl((long double)r[k], -prescale));
      const double e = ulp_error<C>(got, expl((long double)z[k]));
      if (e > w) w = e, at = double(z[k]);
    }
  }
  printf("%d-byte vectors, %s: worst %.3f ulp (at %.9g)\n", EB_VEC_BYTES,
         sizeof(C) == 4 ? "fp32" : "fp64", w, at);
}

int main() {
  worst<float>(-104.0);
  worst<double>(-745.0);
  return 0;
}
