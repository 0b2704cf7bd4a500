/* The scalar rule of every pass, one op folder each (<op>/scalar.h: the rule every tier equals
 * bit for bit, its numeric bounds next to its loops, and the scalar tier's entry), included in
 * dependency order. Every tier reproduces these operation by operation (the whole module is
 * compiled with -ffp-contract=off: an FMA happens only where one is written), so every tier
 * returns the same bits as the scalar tier. A tier's SIMD form of an op is <op>/<tier>.h, included
 * by the tier's header (<tier>.h) inside its target region. */
#ifndef I8A_COMMON_H
#define I8A_COMMON_H

#include "core/scalar.h"
#include "half_row/scalar.h"
#include "quantize/scalar.h"
#include "window/scalar.h"
#include "kdots/scalar.h"
#include "planes/scalar.h"
#include "vpass/scalar.h"
#include "k4/scalar.h"
#include "v4/scalar.h"
#include "attend/scalar.h"
#include "merge/scalar.h"
#include "stream/scalar.h"
#include "rotate/scalar.h"

#endif
