/* The neon tier: armv8-a Advanced SIMD (Cortex-A72, Raspberry Pi 4). Same operations as
 * the ops' scalar rules (<op>/scalar.h) in the same order, four lanes at a time; each op in
 * <op>/neon.h, included below.
 *
 * Without SDOT the int8 dot widens: vmull_s8 + vmlal_s8 put two products in each int16 lane
 * (at most 2 * 127 * 127 = 32258: -128 is never stored, so no lane overflows), vpadalq_s16
 * adds the pairs into int32.
 *
 * The attend body is shared with neon_dotprod.h, which passes its own dot: one body, two tiers.
 */
#ifndef I8A_NEON_H
#define I8A_NEON_H

#include <arm_neon.h>

#include "common.h"

#include "core/neon.h"
#include "half_row/neon.h"
#include "quantize/neon.h"
#include "window/neon.h"
#include "kdots/neon.h"
#include "planes/neon.h"
#include "vpass/neon.h"
#include "k4/neon.h"
#include "v4/neon.h"
#include "attend/neon.h"
#include "merge/neon.h"
#include "stream/neon.h"
#include "rotate/neon.h"

#endif
