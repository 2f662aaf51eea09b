/* keep.c — keep-alive decided in the engine (redlock.h, "Keep-alive in the
 * engine"): the schedule of kept locks, without I/O and without a clock.
 *
 * Every HELD entry still extended sits in a min-heap keyed by when it must
 * be looked at next: when its extension is due or, with an extension in
 * flight (or one that would come too late), when it turns lost. Advancing
 * the engine begins the extensions due, at most once a tick, so that those
 * falling due close together go out in one write per node. An extension is
 * an ordinary round of the engine whose result comes back here
 * (rl_keep_result) instead of to the driver. A dropped lock (and every lock
 * rl_engine_keep_release_all lets go of) waits in a FIFO for its release,
 * at most KEEP_RELEASE_WINDOW of them in flight: every round must be
 * answered within the node timeout, and ten thousand begun together are
 * not. An id is an entry's index with the entry's generation above it:
 * the id of a freed entry names nothing until the entry has been used
 * 1,024 times more. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "keep.h"

#define KEEP_TICK_MS 10
#define KEEP_RELEASE_WINDOW 256

void rl_keep_init(rl_keep *k) {
    memset(k, 0, sizeof(*k));
    k->free_head = k->pending_head = k->pending_tail = -1;
}

void rl_keep_free(rl_keep *k) {
    for (int i = 0; i < k->n; i++) free(k->entries[i].resource);
    free(k->entries);
    rl_deadlines_free(&k->deadlines);
    rl_keep_init(k);
}

/* ---- the rules ---- */

/* The moment x turns lost without a successful extension. */
static double lost_at(const rl_kept *x) {
    return x->valid_until - x->margin_ms;
}

/* How long after a successful extension x is extended again: a third of
 * what its ttl leaves above the margin, so that two more tries fit before
 * the lock would be called lost (every ttl/3 with no margin). */
static double period_of(const rl_kept *x) {
    double p = (x->ttl_ms - x->margin_ms) / 3.0;
    return p >= 1 ? p : 1;
}

/* When x, added or extended at now, is extended next: after its period,
 * or halfway to the moment it would be called lost when that comes within
 * two periods (a grant or an extension that took long, next to its ttl:
 * a node timeout near the ttl, slow nodes, waiting for replicas), so that
 * it is still tried before then. */
static double due_after(const rl_kept *x, double now) {
    double wait = period_of(x), left = lost_at(x) - now;
    if (left < 2 * wait) wait = left / 2;
    return now + (wait >= 1 ? wait : 1);
}

/* When x must be looked at next: its extension, unless one is in flight or
 * it would come after x is lost. */
static double deadline_of(const rl_kept *x) {
    double lost = lost_at(x);
    return x->busy || x->next_due >= lost ? lost : x->next_due;
}

/* File entry i at its deadline, if it is HELD and still extended. */
static void schedule(rl_keep *k, int i) {
    const rl_kept *x = &k->entries[i];
    if (x->state == RL_KEEP_HELD && !x->lapsed) rl_deadlines_set(&k->deadlines, i, deadline_of(x));
}

static void set_lost(rl_keep *k, int i) {
    if (k->entries[i].state == RL_KEEP_HELD) k->lost_total++;
    rl_deadlines_remove(&k->deadlines, i);
    k->entries[i].state = RL_KEEP_LOST;
}

static void lost_if_out_of_time(rl_keep *k, int i, double now) {
    if (k->entries[i].state == RL_KEEP_HELD && now >= lost_at(&k->entries[i])) set_lost(k, i);
}

/* ---- releases: the FIFO, the tally ---- */

/* Queue entry i's release, due since due (at the front: it was there). */
static void enqueue(rl_keep *k, int i, double due, int front) {
    rl_kept *x = &k->entries[i];
    x->release = x->queued = 1;
    x->due = due;
    x->prev = front ? -1 : k->pending_tail;
    x->next = front ? k->pending_head : -1;
    if (x->prev >= 0) k->entries[x->prev].next = i;
    else k->pending_head = i;
    if (x->next >= 0) k->entries[x->next].prev = i;
    else k->pending_tail = i;
    k->npending++;
}

static void dequeue(rl_keep *k, int i) {
    rl_kept *x = &k->entries[i];
    if (!x->queued) return;
    if (x->prev >= 0) k->entries[x->prev].next = x->next;
    else k->pending_head = x->next;
    if (x->next >= 0) k->entries[x->next].prev = x->prev;
    else k->pending_tail = x->prev;
    x->queued = 0;
    k->npending--;
}

static void uncount(rl_keep *k, rl_kept *x, int ok) {
    if (!x->counted) return;
    x->counted = 0;
    k->releasing--;
    if (ok) k->released++;
}

/* Forget entry i: nothing of it is extended or released any more (a round
 * in flight ends unheard). */
static void free_entry(rl_keep *k, int i) {
    rl_kept *x = &k->entries[i];
    rl_deadlines_remove(&k->deadlines, i);
    dequeue(k, i);
    if (x->busy && x->release) k->releases--;
    uncount(k, x, 0);
    free(x->resource);
    x->resource = NULL;
    x->state = 0;
    x->seq++;
    x->gen++;
    x->busy = x->release = x->lapsed = 0;
    x->next = k->free_head;
    k->free_head = i;
}

/* Entry i's release is over (ok: a quorum confirmed it). */
static void release_done(rl_keep *k, int i, int ok) {
    rl_kept *x = &k->entries[i];
    x->release = 0;
    uncount(k, x, ok);
    if (x->state == KEEP_DROPPING) free_entry(k, i);
}

/* Entry i is to be released: out of the schedule, its round in flight
 * (an extension) ignored, its release queued. */
static void let_go(rl_keep *k, int i, int state, double now) {
    rl_kept *x = &k->entries[i];
    rl_deadlines_remove(&k->deadlines, i);
    if (!x->release) {
        x->seq++;
        x->busy = 0;
        enqueue(k, i, now, 0);
    }
    x->state = state;
}

/* ---- what advancing begins ---- */

/* Begin queued releases while the window has room. */
static void begin_releases(rl_engine *e, rl_keep *k, double now) {
    while (k->pending_head >= 0 && k->releases < KEEP_RELEASE_WINDOW && now >= k->retry_at) {
        int i = k->pending_head;
        rl_kept *x = &k->entries[i];
        double due = x->due;
        dequeue(k, i);
        x->seq++;
        x->busy = 1;
        k->releases++; /* before: a round decided at once reports here */
        rl_keep_ref ref = {i, x->seq};
        int id = rl_engine_begin_kept(e, RL_OP_RELEASE, x->resource, x->len, x->slot, x->value, 0, ref, now);
        if (id >= 0) continue;
        x->busy = 0;
        k->releases--;
        if (id == RL_ERR_FULL) { /* every operation slot taken: again a tick later */
            enqueue(k, i, due, 1);
            k->retry_at = now + KEEP_TICK_MS;
            return;
        }
        release_done(k, i, 0); /* out of memory: the key runs out its ttl */
    }
}

/* Begin extending entry i. If it cannot begin, try again a tick later. */
static void start_extension(rl_engine *e, rl_keep *k, int i, double now) {
    rl_kept *x = &k->entries[i];
    x->seq++;
    x->busy = 1;
    x->extend_start = now;
    x->extend_ttl = x->ttl_ms;
    rl_keep_ref ref = {i, x->seq};
    int id = rl_engine_begin_kept(e, RL_OP_EXTEND, x->resource, x->len, x->slot, x->value, x->ttl_ms, ref, now);
    if (id < 0) {
        x->busy = 0;
        x->next_due = now + KEEP_TICK_MS;
    }
    schedule(k, i);
}

void rl_keep_advance(rl_engine *e, rl_keep *k, double now) {
    begin_releases(e, k, now);
    double at;
    if (now < k->next_sweep || rl_deadlines_first(&k->deadlines, &at) < 0 || at > now) return;
    int i;
    while ((i = rl_deadlines_first(&k->deadlines, &at)) >= 0 && at <= now) {
        if (now >= lost_at(&k->entries[i])) set_lost(k, i);
        else start_extension(e, k, i, now); /* in flight, it is due only when lost */
    }
    k->next_sweep = now + KEEP_TICK_MS;
}

double rl_keep_deadline(const rl_keep *k) {
    double at = -1, d;
    if (rl_deadlines_first(&k->deadlines, &d) >= 0) at = d > k->next_sweep ? d : k->next_sweep;
    if (k->pending_head >= 0 && k->releases < KEEP_RELEASE_WINDOW) {
        d = k->entries[k->pending_head].due;
        if (d < k->retry_at) d = k->retry_at;
        if (at < 0 || d < at) at = d;
    }
    return at;
}

/* Whether every node ran round r (pending: unless it is still to answer):
 * one that timed out, or whose connection was lost or absent (an error, to
 * be safe), may still run the command later, or never. */
static int all_ran(const rl_result *r, int pending) {
    for (int i = 0; i < r->nodes; i++) {
        int s = r->node[i].state;
        if (s == RL_NODE_TIMEOUT || s == RL_NODE_ERROR || (s == RL_NODE_PENDING && !pending)) return 0;
    }
    return 1;
}

/* Our extension of x (to ttl; round seq) may still reach a node that has
 * not run it. */
static void unsettle(rl_kept *x, int ttl, unsigned seq) {
    if (x->unsettled_ttl == 0 || ttl < x->unsettled_ttl) x->unsettled_ttl = ttl;
    x->unsettled_seq = seq;
}

/* Round seq of ours ran on every node: so did every earlier one (ours go
 * out on one connection per node, in order). */
static void settle(rl_kept *x, unsigned seq) {
    if (x->unsettled_ttl > 0 && seq >= x->unsettled_seq) x->unsettled_ttl = 0;
}

void rl_keep_settled(rl_keep *k, rl_keep_ref ref, const rl_result *r) {
    if (ref.entry < 0 || ref.entry >= k->n || k->entries[ref.entry].state == 0) return;
    if (r->op == RL_OP_EXTEND && all_ran(r, 1)) settle(&k->entries[ref.entry], ref.seq);
}

/* The owner's extension to ttl_ms, begun at started_ms and valid until
 * valid_until_ms, counted down to what an extension of ours of a shorter
 * ttl that was decided before every node answered it (x->unsettled_ttl)
 * leaves: a keeper thread's goes out on connections of its own, not the
 * owner's, and a node it reaches after the owner's keeps the key for its
 * ttl from then on, no earlier than the owner's start: valid_until_ms less
 * the difference in ttl. (Inside nginx the owner's goes out behind ours on
 * the same connection, so the cap is not needed there; it costs one
 * extension more.) */
static double unsettled_until(const rl_kept *x, int ttl_ms, double valid_until_ms) {
    if (x->unsettled_ttl <= 0 || x->unsettled_ttl >= ttl_ms) return valid_until_ms;
    return valid_until_ms - (ttl_ms - x->unsettled_ttl);
}

void rl_keep_result(rl_keep *k, rl_keep_ref ref, const rl_result *r, double now) {
    if (ref.entry < 0 || ref.entry >= k->n) return;
    rl_kept *x = &k->entries[ref.entry];
    if (x->state == 0 || x->seq != ref.seq || !x->busy) return; /* removed, dropped or released meanwhile */
    x->busy = 0;
    if (r->op == RL_OP_RELEASE) {
        k->releases--;
        release_done(k, ref.entry, r->status == RL_STATUS_OK);
        return;
    }
    if (all_ran(r, 0)) settle(x, ref.seq);
    else unsettle(x, x->extend_ttl, ref.seq);
    if (x->state != RL_KEEP_HELD) {
        /* lost by time meanwhile; a quorum without our value still ends
         * what validity the owner's extension could take back (take_back) */
        if (r->status == RL_STATUS_NOT_HELD && x->extend_start < x->valid_until) x->valid_until = x->extend_start;
        return;
    }
    if (r->status == RL_STATUS_OK && x->extend_ttl != x->ttl_ms) {
        /* The owner extended to another ttl meanwhile (rl_engine_keep_update):
         * nodes may hold either; count the shorter, extend again at once. */
        double until = x->extend_start + r->elapsed_ms + r->validity_ms;
        if (until < x->valid_until) x->valid_until = until;
        x->next_due = now;
    } else if (r->status == RL_STATUS_OK) {
        x->valid_until = x->extend_start + r->elapsed_ms + r->validity_ms; /* from the decision */
        x->next_due = due_after(x, now);
    } else if (r->status == RL_STATUS_NOT_HELD) {
        /* our value is gone from a quorum: nothing is left of the validity
         * (someone else may hold the lock already) */
        if (x->extend_start < x->valid_until) x->valid_until = x->extend_start;
        set_lost(k, ref.entry);
        return;
    } else {
        /* unavailable / timeout: try again soon, until validity runs out */
        double retry = x->ttl_ms / 10.0;
        x->next_due = now + (retry < 100 ? retry : 100);
        lost_if_out_of_time(k, ref.entry, now);
    }
    schedule(k, ref.entry);
}

/* ---- the public functions (redlock.h) ---- */

/* Entry i's id (its generation above its index). */
static int id_of(const rl_keep *k, int i) {
    unsigned gen = k->entries[i].gen & ((1u << (31 - KEEP_INDEX_BITS)) - 1);
    return (int)(gen << KEEP_INDEX_BITS) | i;
}

/* The index of the entry id names for its owner (a dropped one is no longer
 * the owner's, a freed one's id names nothing), or -1. */
static int owned(const rl_keep *k, int id) {
    int i = id & (KEEP_MAX_ENTRIES - 1);
    if (id < 0 || i >= k->n || id_of(k, i) != id) return -1;
    const rl_kept *x = &k->entries[i];
    return x->state != 0 && x->state != KEEP_DROPPING ? i : -1;
}

/* A free entry: the last one freed, else a new one (entries and heap grow
 * together). Return -1 when out of memory. */
static int take_entry(rl_keep *k) {
    if (k->free_head >= 0) {
        int i = k->free_head;
        k->free_head = k->entries[i].next;
        return i;
    }
    if (k->n == KEEP_MAX_ENTRIES) return -1;
    if (k->n == k->cap) {
        int cap = k->cap ? k->cap * 2 : 16;
        rl_kept *entries = realloc(k->entries, (size_t)cap * sizeof(*entries));
        if (!entries) return -1;
        k->entries = entries;
        if (rl_deadlines_reserve(&k->deadlines, cap) != 0) return -1;
        k->cap = cap;
    }
    k->entries[k->n].seq = k->entries[k->n].gen = 0;
    return k->n++;
}

int rl_engine_keep_add(rl_engine *e, const char *resource, size_t len, const char *value, int ttl_ms,
                       double valid_until_ms, int margin_ms, double now_ms) {
    return rl_engine_keep_add_slot(e, resource, len, 0, value, ttl_ms, valid_until_ms, margin_ms, now_ms);
}

int rl_engine_keep_add_slot(rl_engine *e, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
                            double valid_until_ms, int margin_ms, double now_ms) {
    char why[RL_ERR_LEN];
    /* one that could never be extended is refused here, as rl_begin_* refuse it */
    if (rl_engine_check_resource(e, resource, len) != 0) return RL_ERR;
    if (!value || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN)
        return snprintf(why, sizeof(why), "value must be %d characters", RL_VALUE_LEN), rl_engine_fail(e, why), RL_ERR;
    if (ttl_ms <= 0) return rl_engine_fail(e, "ttl must be > 0 ms"), RL_ERR;
    if (slot < 0 || slot > RL_MAX_LIMIT) return rl_engine_fail(e, "slot out of range"), RL_ERR;
    if (margin_ms < 0 || margin_ms >= ttl_ms)
        return snprintf(why, sizeof(why), "margin must be from 0 to ttl - 1 ms (got %d)", margin_ms),
               rl_engine_fail(e, why), RL_ERR;
    if (!isfinite(valid_until_ms)) return rl_engine_fail(e, "valid_until must be a finite number"), RL_ERR;
    rl_keep *k = rl_engine_keeps(e);
    if (k->free_head < 0 && k->n == KEEP_MAX_ENTRIES)
        return snprintf(why, sizeof(why), "%d locks are kept already", KEEP_MAX_ENTRIES), rl_engine_fail(e, why), RL_ERR;
    char *copy = malloc(len);
    int i = copy ? take_entry(k) : -1;
    if (i < 0) {
        free(copy);
        return rl_engine_fail(e, "out of memory"), RL_ERR;
    }
    memcpy(copy, resource, len);
    rl_kept *x = &k->entries[i];
    unsigned seq = x->seq, gen = x->gen;
    memset(x, 0, sizeof(*x));
    x->seq = seq;
    x->gen = gen;
    x->state = RL_KEEP_HELD;
    x->resource = copy;
    x->len = len;
    x->slot = slot;
    memcpy(x->value, value, RL_VALUE_LEN + 1);
    x->ttl_ms = x->extend_ttl = ttl_ms;
    x->margin_ms = margin_ms;
    x->valid_until = valid_until_ms;
    x->next_due = due_after(x, rl_engine_clock(e, now_ms));
    x->prev = x->next = -1;
    schedule(k, i);
    return id_of(k, i);
}

int rl_engine_keep_state(rl_engine *e, int id, double *valid_until_ms, double now_ms) {
    rl_keep *k = rl_engine_keeps(e);
    int i = owned(k, id);
    if (i < 0) return RL_ERR;
    rl_kept *x = &k->entries[i];
    lost_if_out_of_time(k, i, rl_engine_clock(e, now_ms));
    if (valid_until_ms) *valid_until_ms = x->valid_until;
    return x->state;
}

/* The owner's extension (to ttl_ms, begun at started_ms, valid until
 * valid_until_ms: a quorum confirmed it) came back after entry i turned
 * lost for want of time: the lock is held again if that leaves validity
 * above the margin. One of ours begun before the loss is not waited for
 * (its answer would count from before it), but a node it reaches last
 * keeps the key only for the ttl it asked for: if that is the shorter, it
 * counts from when ours began, less what the owner's lost to elapsed time
 * and drift. The lock is extended again at once either way. A lock lost
 * because an extension found our value gone (no validity was left after
 * that extension began) stays lost. RL_OK, or RL_ERR when it stays lost. */
static int take_back(rl_keep *k, int i, int ttl_ms, double started_ms, double valid_until_ms, double now) {
    rl_kept *x = &k->entries[i];
    if (x->valid_until <= x->extend_start) return RL_ERR;
    double until = unsettled_until(x, ttl_ms, valid_until_ms);
    if ((x->busy || x->extend_start >= started_ms) && x->extend_ttl < ttl_ms) {
        double ours = x->extend_start + x->extend_ttl - (started_ms + ttl_ms - valid_until_ms);
        if (ours < until) until = ours;
    }
    if (until - x->margin_ms <= now) return RL_ERR;
    if (x->busy) { /* its answer is not waited for: it may still reach a node */
        unsettle(x, x->extend_ttl, x->seq);
        x->seq++;
        x->busy = 0;
    }
    x->state = RL_KEEP_HELD;
    x->ttl_ms = ttl_ms;
    x->valid_until = until;
    x->next_due = now;
    schedule(k, i);
    return RL_OK;
}

int rl_engine_keep_update(rl_engine *e, int id, int ttl_ms, double started_ms, double valid_until_ms,
                          double now_ms) {
    rl_keep *k = rl_engine_keeps(e);
    int i = owned(k, id);
    if (i < 0) return RL_ERR;
    rl_kept *x = &k->entries[i];
    if (x->state != RL_KEEP_HELD && x->state != RL_KEEP_LOST) return RL_ERR;
    if (ttl_ms <= x->margin_ms || !isfinite(valid_until_ms)) return RL_ERR;
    double now = rl_engine_clock(e, now_ms);
    if (x->state == RL_KEEP_LOST) {
        if (take_back(k, i, ttl_ms, started_ms, valid_until_ms, now) == RL_OK) return RL_OK;
        /* it stays lost; what the owner's round found still counts */
        if (valid_until_ms < x->valid_until) x->valid_until = valid_until_ms;
        return RL_ERR;
    }
    x->ttl_ms = ttl_ms;
    double until = unsettled_until(x, ttl_ms, valid_until_ms);
    if (x->busy || x->extend_start >= started_ms || until < valid_until_ms) {
        /* One of ours overlapped the owner's, or may still reach a node
         * after it: nodes may hold either ttl. Count the shorter validity
         * and extend again at once (behind ours, on our connections). */
        if (until < x->valid_until) x->valid_until = until;
        x->next_due = now;
    } else {
        x->valid_until = valid_until_ms;
        x->next_due = due_after(x, now);
    }
    schedule(k, i);
    return RL_OK;
}

int rl_engine_keep_remove(rl_engine *e, int id) {
    rl_keep *k = rl_engine_keeps(e);
    int i = owned(k, id);
    if (i < 0) return RL_ERR;
    free_entry(k, i);
    return RL_OK;
}

int rl_engine_keep_drop(rl_engine *e, int id, double now_ms) {
    rl_keep *k = rl_engine_keeps(e);
    int i = owned(k, id);
    if (i < 0) return RL_ERR;
    rl_kept *x = &k->entries[i];
    if (x->state == RL_KEEP_RELEASED && !x->release) free_entry(k, i);
    else let_go(k, i, KEEP_DROPPING, rl_engine_clock(e, now_ms));
    return RL_OK;
}

int rl_engine_keep_lapse(rl_engine *e, int id) {
    rl_keep *k = rl_engine_keeps(e);
    int i = owned(k, id);
    if (i < 0) return RL_ERR;
    k->entries[i].lapsed = 1;
    rl_deadlines_remove(&k->deadlines, i);
    return RL_OK;
}

int rl_engine_keep_release_all(rl_engine *e, double now_ms) {
    rl_keep *k = rl_engine_keeps(e);
    double now = rl_engine_clock(e, now_ms);
    k->releasing = k->released = 0;
    for (int i = 0; i < k->n; i++) {
        rl_kept *x = &k->entries[i];
        x->counted = 0;
        if (x->state == RL_KEEP_HELD || x->state == RL_KEEP_LOST) let_go(k, i, RL_KEEP_RELEASED, now);
        if (x->state != 0 && x->release) {
            x->counted = 1;
            k->releasing++;
        }
    }
    return k->releasing;
}

int rl_engine_keep_releasing(const rl_engine *e, int *released) {
    const rl_keep *k = rl_engine_keeps((rl_engine *)e);
    if (released) *released = k->released;
    return k->releasing;
}

int rl_engine_keeping(const rl_engine *e) {
    const rl_keep *k = rl_engine_keeps((rl_engine *)e);
    return k->deadlines.n + k->npending + k->releases;
}

void rl_engine_keep_clear(rl_engine *e) {
    rl_keep *k = rl_engine_keeps(e);
    for (int i = 0; i < k->n; i++)
        if (k->entries[i].state != 0) free_entry(k, i);
}
