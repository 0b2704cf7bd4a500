/* The scalar tier: the reference. The order of every floating-point operation in decode is
 * defined by the ops' rules (<op>/scalar.h, each with the scalar tier's entry i8a_<op>_scalar);
 * the SIMD tiers do the same operations in the same order, lanes side by side. Compiled at the
 * baseline of the target, with no ISA attributes. */
#ifndef I8A_SCALAR_H
#define I8A_SCALAR_H

#include "common.h"

#endif
