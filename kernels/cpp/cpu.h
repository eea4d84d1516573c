// Which instruction sets this CPU runs, and the row kernels' table in use: the widest set's,
// or $ELASTICBENCH_CPP_ISA's, or the last set_isa's (docs/native.md section 2). No torch
// header is included here; a set that cannot run throws std::runtime_error.
#pragma once
#include <string>
#include <vector>

#include "table.h"

namespace eb {

std::vector<std::string> isas();       // instruction sets this CPU can run, widest first
const Table* current_table();          // the table every kernel call takes
void set_isa(const std::string& isa);  // use this set's table from now on

}  // namespace eb
