// Instruction-set detection (__builtin_cpu_supports) and the choice of the row kernels'
// table, apart from the torch binding (cpu.h).
#include "cpu.h"

#include <cstdlib>
#include <stdexcept>

namespace eb {
namespace {

bool cpu_has(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == "avx2")
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#endif
  return isa == "generic";
}

const Table* table_of(const std::string& isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == "avx512") return eb_avx512::table();
  if (isa == "avx2") return eb_avx2::table();
#endif
  return eb_generic::table();
}

void check(bool ok, const std::string& message) {
  if (!ok) throw std::runtime_error(message);
}

const Table*& current() {
  static const Table* t = [] {
    const char* forced = std::getenv("ELASTICBENCH_CPP_ISA");
    if (forced && *forced) {
      check(cpu_has(forced), std::string("ELASTICBENCH_CPP_ISA=") + forced +
                                 " is not available on this CPU (available: avx512, avx2, "
                                 "generic as supported)");
      return table_of(forced);
    }
    return table_of(isas().front());
  }();
  return t;
}

}  // namespace

std::vector<std::string> isas() {
  std::vector<std::string> out;
  for (const char* isa : {"avx512", "avx2", "generic"})
    if (cpu_has(isa)) out.push_back(isa);
  return out;
}

const Table* current_table() { return current(); }

void set_isa(const std::string& isa) {
  check(isa == "avx512" || isa == "avx2" || isa == "generic", "unknown instruction set " + isa);
  check(cpu_has(isa), "this CPU cannot run the " + isa + " kernels");
  current() = table_of(isa);
}

}  // namespace eb
