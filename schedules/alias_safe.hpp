// Elementwise kernels may write an output over an input of the very same view: in-place methods
// (x.add_(y)), out= into an input, and ops with an inout buffer (axpy_). A pointwise kernel reads
// each element before it writes it, which makes that safe, except for one thing schedules do: a
// ShiftInwards tail (Halide's default for a pure output) recomputes the last vector, chunk or
// tile over elements already written, so on an aliased buffer the second pass reads the first
// one's result (y += x applied twice). Every split of the output is therefore given a
// GuardWithIf tail, whichever scheduler made it; the cost is a guarded last vector.
#pragma once
#include <Halide.h>

namespace opforge::schedules {

inline void guard_tails(Halide::Internal::Definition& d) {
  using Halide::TailStrategy;
  using Halide::Internal::Split;
  for (Split& s : d.schedule().splits())
    if (s.split_type == Split::SplitVar &&
        (s.tail == TailStrategy::Auto || s.tail == TailStrategy::ShiftInwards))
      s.tail = TailStrategy::GuardWithIf;
  for (auto& sp : d.specializations()) guard_tails(sp.definition);
}

// Makes f's every stage safe to run with its output aliasing an input of the same view.
inline void make_alias_safe(Halide::Func f) {
  Halide::Internal::Function fn = f.function();
  guard_tails(fn.definition());
  for (size_t i = 0; i < fn.updates().size(); i++) guard_tails(fn.update(int(i)));
}

}  // namespace opforge::schedules
