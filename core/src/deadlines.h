/* deadlines.h — a min-heap of moments, each owned by a small integer id (an
 * operation slot, a kept lock): the earliest first, and any id's moment set,
 * moved or removed in O(log n). Room is reserved per id up front, so setting
 * a deadline never allocates. */
#ifndef RL_DEADLINES_H
#define RL_DEADLINES_H

typedef struct rl_deadline {
    double at;
    int id;
} rl_deadline;

typedef struct rl_deadlines {
    rl_deadline *heap;  /* earliest first; n used */
    int n;
    int *pos;           /* pos[id]: where id sits in heap, or -1; room for nids ids */
    int nids;
} rl_deadlines;

/* Make room for ids 0 .. ids-1. Return 0, or -1 when out of memory (what was
 * there is kept). */
int rl_deadlines_reserve(rl_deadlines *d, int ids);

/* Set id's deadline to at (adding it, or moving it). id must be reserved. */
void rl_deadlines_set(rl_deadlines *d, int id, double at);

/* Remove id's deadline; nothing happens if it has none. */
void rl_deadlines_remove(rl_deadlines *d, int id);

/* The id with the earliest deadline (its moment in *at), or -1 if none. */
int rl_deadlines_first(const rl_deadlines *d, double *at);

/* 1 if id has a deadline. */
int rl_deadlines_has(const rl_deadlines *d, int id);

void rl_deadlines_free(rl_deadlines *d);

#endif
