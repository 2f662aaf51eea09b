/* deadlines.c — the deadline heap (see deadlines.h). */
#include <stdlib.h>

#include "deadlines.h"

int rl_deadlines_reserve(rl_deadlines *d, int ids) {
    if (ids <= d->nids) return 0;
    int cap = d->nids ? d->nids : 16;
    while (cap < ids) cap *= 2;
    rl_deadline *heap = realloc(d->heap, (size_t)cap * sizeof(*heap));
    if (heap == NULL) return -1;
    d->heap = heap;
    int *pos = realloc(d->pos, (size_t)cap * sizeof(*pos));
    if (pos == NULL) return -1;
    d->pos = pos;
    for (int i = d->nids; i < cap; i++) pos[i] = -1;
    d->nids = cap;
    return 0;
}

static void put(rl_deadlines *d, int at, rl_deadline x) {
    d->heap[at] = x;
    d->pos[x.id] = at;
}

static void sift_up(rl_deadlines *d, int i) {
    rl_deadline x = d->heap[i];
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (d->heap[parent].at <= x.at) break;
        put(d, i, d->heap[parent]);
        i = parent;
    }
    put(d, i, x);
}

static void sift_down(rl_deadlines *d, int i) {
    rl_deadline x = d->heap[i];
    for (;;) {
        int child = 2 * i + 1;
        if (child >= d->n) break;
        if (child + 1 < d->n && d->heap[child + 1].at < d->heap[child].at) child++;
        if (x.at <= d->heap[child].at) break;
        put(d, i, d->heap[child]);
        i = child;
    }
    put(d, i, x);
}

void rl_deadlines_set(rl_deadlines *d, int id, double at) {
    int i = d->pos[id];
    if (i < 0) {
        i = d->n++;
        put(d, i, (rl_deadline){at, id});
        sift_up(d, i);
        return;
    }
    double was = d->heap[i].at;
    d->heap[i].at = at;
    if (at < was) sift_up(d, i);
    else sift_down(d, i);
}

void rl_deadlines_remove(rl_deadlines *d, int id) {
    if (id < 0 || id >= d->nids) return;
    int i = d->pos[id];
    if (i < 0) return;
    d->pos[id] = -1;
    rl_deadline last = d->heap[--d->n];
    if (i == d->n) return;
    put(d, i, last);
    if (i > 0 && d->heap[(i - 1) / 2].at > last.at) sift_up(d, i);
    else sift_down(d, i);
}

int rl_deadlines_first(const rl_deadlines *d, double *at) {
    if (d->n == 0) return -1;
    if (at) *at = d->heap[0].at;
    return d->heap[0].id;
}

int rl_deadlines_has(const rl_deadlines *d, int id) {
    return id >= 0 && id < d->nids && d->pos[id] >= 0;
}

void rl_deadlines_free(rl_deadlines *d) {
    free(d->heap);
    free(d->pos);
    d->heap = NULL;
    d->pos = NULL;
    d->n = d->nids = 0;
}
