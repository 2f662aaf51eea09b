/* opid.h — operation ids: a slot in the low bits, the slot's use count in the
 * high bits, so an id that outlived its operation names no other one (until
 * the same slot has been used 2^15 times more). The engine makes them. */
#ifndef RL_OPID_H
#define RL_OPID_H

#include "redlock.h"

#define RL_OPID_SLOT_BITS 16
#define RL_OPID_MAX_SLOTS RL_ID_SLOTS /* the header promises: ids in flight differ modulo this */
#define RL_OPID_USE_MASK 0x7FFFu

_Static_assert(RL_OPID_MAX_SLOTS == 1 << RL_OPID_SLOT_BITS, "the slot is the id's low bits");

/* The id of the uses-th operation of slot (uses is kept to 15 bits). */
static inline int rl_opid_make(unsigned uses, int slot) {
    return (int)((uses & RL_OPID_USE_MASK) << RL_OPID_SLOT_BITS) | slot;
}

/* The slot an id (>= 0) names. */
static inline int rl_opid_slot(int id) {
    return id & (RL_OPID_MAX_SLOTS - 1);
}

#endif
