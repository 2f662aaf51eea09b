/* skipped.h — the values of acquires a suspect node was not sent (see
 * rl_stream_suspect): a release of such a value has nothing to undo there
 * and need not wait for the node. The newest RL_SKIPPED_MAX are known; a
 * release of a value not among them is kept for the node, as if its SET
 * had reached it (a release of a key that is not there does nothing). */
#ifndef RL_SKIPPED_H
#define RL_SKIPPED_H

#include "redlock.h"

#define RL_SKIPPED_MAX 256

typedef struct rl_skipped {
    char (*values)[RL_VALUE_LEN]; /* a ring of RL_SKIPPED_MAX, allocated at the first note */
    unsigned next, count;
} rl_skipped;

/* Note that value (RL_VALUE_LEN characters) was not sent to the node; the
 * oldest noted falls out when the ring is full. Out of memory: not noted. */
void rl_skipped_note(rl_skipped *k, const char *value);

/* 1 if value was noted (it is forgotten now), else 0. */
int rl_skipped_take(rl_skipped *k, const char *value);

/* Forget every value and free the ring. */
void rl_skipped_clear(rl_skipped *k);

#endif
