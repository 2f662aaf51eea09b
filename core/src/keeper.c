/* keeper.c — keep-alive: a thread with its own client that extends kept locks.
 *
 * Every held entry sits in a min-heap keyed by its next deadline: when its
 * extension is due, or (with an extension in flight, or a retry that would
 * come too late) when it turns lost. The thread serves its connections until
 * the earliest deadline (at most RL_KEEPER_TICK_MS), collects the results and,
 * at most once a tick, pops only the entries whose deadline has come. Other
 * threads only touch the entry table under the mutex; the client is the
 * thread's own. Every keeper is listed in a process-wide registry so
 * rl_keeper_release_all can reach them from an exit path or a
 * signal-handling thread. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"

#define RL_KEEPER_TICK_MS 10

typedef struct kept {
    int state;            /* 0 = free slot, else RL_KEEP_* */
    unsigned gen;         /* bumped when the slot is reused */
    char *resource;
    size_t len;
    char value[RL_VALUE_LEN + 1];
    int ttl_ms;
    int margin_ms;
    double valid_until;   /* end of validity, monotonic ms */
    double next_due;      /* when to extend next */
    double extend_start;  /* clock reading before the extension in flight was sent */
    int op;               /* extension in flight, or -1 */
    int heap_pos;         /* index in the deadline heap, or -1 (not held) */
    int next_free;        /* free slot: the next free slot, or -1 */
} kept;

typedef struct op_owner {
    int entry;
    unsigned gen;
} op_owner;

typedef struct heap_slot {
    double at;            /* the entry's deadline, monotonic ms */
    int entry;
} heap_slot;

struct rl_keeper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t released;
    rl_client *client;     /* used by the keeper thread only */
    kept *entries;
    int nentries, capentries;
    int free_head;         /* first free slot below nentries, or -1 */
    heap_slot *heap;       /* the held entries, earliest deadline first; capentries long */
    int nheap;
    op_owner *owners;      /* by operation id */
    int capowners;
    int stop;
    int release_requested; /* rl_keeper_release_all asks; the thread answers */
    int release_count;
    double release_deadline;
    struct rl_keeper *next_keeper;
};

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static rl_keeper *registry;

/* ---- the deadline heap: an entry is in it exactly while it is HELD ---- */

/* The moment e turns lost without a successful extension. */
static double lost_at(const kept *e) {
    return e->valid_until - e->margin_ms;
}

/* When the thread must look at e next: its extension, unless one is in
 * flight or it would come after e is lost. */
static double deadline_of(const kept *e) {
    double lost = lost_at(e);
    if (isnan(lost)) lost = INFINITY; /* never lost by time, as lost_if_out_of_time sees it */
    if (e->op >= 0 || e->next_due >= lost) return lost;
    return e->next_due;
}

static void heap_put(rl_keeper *k, int pos, heap_slot d) {
    k->heap[pos] = d;
    k->entries[d.entry].heap_pos = pos;
}

static void sift_up(rl_keeper *k, int pos) {
    heap_slot d = k->heap[pos];
    while (pos > 0) {
        int parent = (pos - 1) / 2;
        if (k->heap[parent].at <= d.at) break;
        heap_put(k, pos, k->heap[parent]);
        pos = parent;
    }
    heap_put(k, pos, d);
}

static void sift_down(rl_keeper *k, int pos) {
    heap_slot d = k->heap[pos];
    for (;;) {
        int child = 2 * pos + 1;
        if (child >= k->nheap) break;
        if (child + 1 < k->nheap && k->heap[child + 1].at < k->heap[child].at) child++;
        if (d.at <= k->heap[child].at) break;
        heap_put(k, pos, k->heap[child]);
        pos = child;
    }
    heap_put(k, pos, d);
}

/* File entry i at its current deadline: insert it, or move it. */
static void schedule(rl_keeper *k, int i) {
    kept *e = &k->entries[i];
    double at = deadline_of(e);
    int pos = e->heap_pos;
    if (pos < 0) {
        pos = k->nheap++;
        heap_put(k, pos, (heap_slot){at, i});
        sift_up(k, pos);
        return;
    }
    double was = k->heap[pos].at;
    k->heap[pos].at = at;
    if (at < was) sift_up(k, pos);
    else sift_down(k, pos);
}

/* Take entry i out of the heap (no-op if it is not in it). */
static void unschedule(rl_keeper *k, int i) {
    int pos = k->entries[i].heap_pos;
    if (pos < 0) return;
    k->entries[i].heap_pos = -1;
    heap_slot last = k->heap[--k->nheap];
    if (pos == k->nheap) return;
    heap_put(k, pos, last);
    if (pos > 0 && k->heap[(pos - 1) / 2].at > last.at) sift_up(k, pos);
    else sift_down(k, pos);
}

/* Entry i stops being HELD. */
static void set_state(rl_keeper *k, int i, int state) {
    unschedule(k, i);
    k->entries[i].state = state;
}

/* ---- the entries ---- */

static void lost_if_out_of_time(rl_keeper *k, int i, double now) {
    kept *e = &k->entries[i];
    if (e->state == RL_KEEP_HELD && now >= lost_at(e)) set_state(k, i, RL_KEEP_LOST);
}

static int own_op(rl_keeper *k, int op, int entry) {
    if (op >= k->capowners) {
        int cap = k->capowners ? k->capowners : 64;
        while (cap <= op) cap *= 2;
        op_owner *o = realloc(k->owners, (size_t)cap * sizeof(*o));
        if (!o) return -1;
        k->owners = o;
        k->capowners = cap;
    }
    k->owners[op].entry = entry;
    k->owners[op].gen = k->entries[entry].gen;
    return 0;
}

/* Start extending entry i. If it cannot start, try again a tick later. */
static void start_extension(rl_keeper *k, int i, double now) {
    kept *e = &k->entries[i];
    e->extend_start = rl_now_ms();
    int id = rl_begin_extend(k->client, e->resource, e->len, e->value, e->ttl_ms);
    if (id >= 0 && own_op(k, id, i) == 0) e->op = id;
    else e->next_due = now + RL_KEEPER_TICK_MS;
    schedule(k, i);
}

/* Is the earliest deadline due? */
static int anything_due(const rl_keeper *k, double now) {
    return k->nheap > 0 && k->heap[0].at <= now;
}

/* Milliseconds to serve the connections for: until the earliest deadline,
 * but not before not_before; at least 1, at most a tick. */
static int ms_to_wait(const rl_keeper *k, double now, double not_before) {
    double at = k->nheap > 0 ? k->heap[0].at : INFINITY;
    double wait = (at > not_before ? at : not_before) - now;
    if (!(wait < RL_KEEPER_TICK_MS)) return RL_KEEPER_TICK_MS;
    return wait < 0 ? 1 : (int)wait + 1;
}

/* Handle every entry whose deadline has come: lost ones turn LOST, due ones
 * start their extension. Called with the mutex held. */
static void start_due(rl_keeper *k, double now) {
    while (anything_due(k, now)) {
        int i = k->heap[0].entry;
        if (now >= lost_at(&k->entries[i])) set_state(k, i, RL_KEEP_LOST);
        else start_extension(k, i, now); /* in flight, it is due only when lost */
    }
}

/* Apply a finished extension. Called with the mutex held. */
static void apply(rl_keeper *k, const rl_result *r) {
    if (r->op != RL_OP_EXTEND || r->id < 0 || r->id >= k->capowners) return;
    op_owner o = k->owners[r->id];
    kept *e = &k->entries[o.entry];
    if (e->gen != o.gen || e->op != r->id) return; /* removed meanwhile */
    e->op = -1;
    if (e->state != RL_KEEP_HELD) return;
    double now = rl_now_ms();
    if (r->status == RL_STATUS_OK) {
        e->valid_until = e->extend_start + r->validity_ms;
        e->next_due = now + e->ttl_ms / 3.0;
    } else if (r->status == RL_STATUS_NOT_HELD) {
        set_state(k, o.entry, RL_KEEP_LOST);
        return;
    } else {
        /* unavailable / timeout: try again soon, until validity runs out */
        double retry = e->ttl_ms / 10.0;
        e->next_due = now + (retry < 100 ? retry : 100);
        lost_if_out_of_time(k, o.entry, now);
        if (e->state != RL_KEEP_HELD) return;
    }
    schedule(k, o.entry);
}

/* Release every held entry on the keeper's own connections. Mutex held on
 * entry and exit; dropped while waiting for replies. */
static void release_held(rl_keeper *k) {
    rl_result *r = malloc(sizeof(*r));
    int started = 0, released = 0;
    for (int i = 0; r && i < k->nentries; i++) {
        kept *e = &k->entries[i];
        if (e->state != RL_KEEP_HELD && e->state != RL_KEEP_LOST) continue;
        e->op = -1;
        if (rl_begin_release(k->client, e->resource, e->len, e->value) >= 0) started++;
        set_state(k, i, RL_KEEP_RELEASED);
    }
    pthread_mutex_unlock(&k->mu);
    while (r && started > 0) {
        int left = (int)(k->release_deadline - rl_now_ms());
        if (left <= 0) break;
        rl_run(k->client, left);
        while (rl_collect(k->client, r)) {
            if (r->op != RL_OP_RELEASE) continue;
            started--;
            if (r->status == RL_STATUS_OK) released++;
        }
    }
    free(r);
    pthread_mutex_lock(&k->mu);
    k->release_count = released;
    k->release_requested = 0;
    pthread_cond_broadcast(&k->released);
}

static void *keeper_main(void *arg) {
    rl_keeper *k = arg;
    rl_result *r = malloc(sizeof(*r));
    /* start_due runs at most once a tick: the extensions that fall due in
     * between go out together, one write per node for the batch instead of
     * one wake-up and one write per lock. None is later than a tick. */
    double next_sweep = 0;
    pthread_mutex_lock(&k->mu);
    while (!k->stop && r) {
        if (k->release_requested) release_held(k);
        double now = rl_now_ms();
        if (now >= next_sweep && anything_due(k, now)) {
            start_due(k, now);
            next_sweep = now + RL_KEEPER_TICK_MS;
        }
        int wait_ms = ms_to_wait(k, now, next_sweep);
        pthread_mutex_unlock(&k->mu);
        rl_run(k->client, wait_ms);
        pthread_mutex_lock(&k->mu);
        while (rl_collect(k->client, r)) apply(k, r);
    }
    pthread_mutex_unlock(&k->mu);
    free(r);
    return NULL;
}

/* A slot for a new entry: the last one freed, else a new one (the table and
 * the heap grow together). Its gen is kept. Return -1 when out of memory.
 * Called with the mutex held. */
static int take_free_slot(rl_keeper *k) {
    if (k->free_head >= 0) {
        int id = k->free_head;
        k->free_head = k->entries[id].next_free;
        return id;
    }
    if (k->nentries == k->capentries) {
        int cap = k->capentries ? k->capentries * 2 : 16;
        kept *e = realloc(k->entries, (size_t)cap * sizeof(*e));
        if (!e) return -1;
        k->entries = e;
        heap_slot *h = realloc(k->heap, (size_t)cap * sizeof(*h));
        if (!h) return -1;
        k->heap = h;
        k->capentries = cap;
    }
    int id = k->nentries++;
    k->entries[id].gen = 0;
    return id;
}

rl_keeper *rl_keeper_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen) {
    rl_keeper *k = calloc(1, sizeof(*k));
    if (!k) return snprintf(err, errlen, "out of memory"), NULL;
    k->client = rl_client_new(urls, nurls, opts, err, errlen);
    if (!k->client) {
        free(k);
        return NULL;
    }
    k->free_head = -1;
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->released, NULL);
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        rl_client_free(k->client);
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->released);
        free(k);
        return snprintf(err, errlen, "cannot start the keep-alive thread"), NULL;
    }
    pthread_mutex_lock(&registry_mu);
    k->next_keeper = registry;
    registry = k;
    pthread_mutex_unlock(&registry_mu);
    return k;
}

void rl_keeper_free(rl_keeper *k) {
    if (!k) return;
    pthread_mutex_lock(&registry_mu);
    for (rl_keeper **p = &registry; *p; p = &(*p)->next_keeper)
        if (*p == k) {
            *p = k->next_keeper;
            break;
        }
    pthread_mutex_unlock(&registry_mu);
    pthread_mutex_lock(&k->mu);
    k->stop = 1;
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);
    rl_client_free(k->client);
    for (int i = 0; i < k->nentries; i++) free(k->entries[i].resource);
    free(k->entries);
    free(k->heap);
    free(k->owners);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->released);
    free(k);
}

int rl_keeper_add(rl_keeper *k, const char *resource, size_t len, const char *value, int ttl_ms,
                  double valid_until_ms, int margin_ms, char *err, size_t errlen) {
    if (!resource || len == 0) return snprintf(err, errlen, "resource must be a non-empty string"), RL_ERR;
    if (!value || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN)
        return snprintf(err, errlen, "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    if (ttl_ms <= 0) return snprintf(err, errlen, "ttl must be > 0 ms"), RL_ERR;
    if (margin_ms < 0) return snprintf(err, errlen, "margin must be >= 0 ms"), RL_ERR;
    char *copy = malloc(len);
    if (!copy) return snprintf(err, errlen, "out of memory"), RL_ERR;
    memcpy(copy, resource, len);

    pthread_mutex_lock(&k->mu);
    int id = take_free_slot(k);
    if (id < 0) {
        pthread_mutex_unlock(&k->mu);
        free(copy);
        return snprintf(err, errlen, "out of memory"), RL_ERR;
    }
    kept *e = &k->entries[id];
    unsigned gen = e->gen + 1;
    memset(e, 0, sizeof(*e));
    e->gen = gen;
    e->state = RL_KEEP_HELD;
    e->resource = copy;
    e->len = len;
    memcpy(e->value, value, RL_VALUE_LEN + 1);
    e->ttl_ms = ttl_ms;
    e->margin_ms = margin_ms;
    e->valid_until = valid_until_ms;
    e->next_due = rl_now_ms() + ttl_ms / 3.0;
    e->op = -1;
    e->heap_pos = -1;
    e->next_free = -1;
    schedule(k, id);
    pthread_mutex_unlock(&k->mu);
    return id;
}

int rl_keeper_state(rl_keeper *k, int id, double *valid_until_ms) {
    int state = RL_ERR;
    pthread_mutex_lock(&k->mu);
    if (id >= 0 && id < k->nentries && k->entries[id].state != 0) {
        kept *e = &k->entries[id];
        lost_if_out_of_time(k, id, rl_now_ms());
        state = e->state;
        if (valid_until_ms) *valid_until_ms = e->valid_until;
    }
    pthread_mutex_unlock(&k->mu);
    return state;
}

int rl_keeper_remove(rl_keeper *k, int id) {
    int rc = RL_ERR;
    pthread_mutex_lock(&k->mu);
    if (id >= 0 && id < k->nentries && k->entries[id].state != 0) {
        kept *e = &k->entries[id];
        set_state(k, id, 0);
        free(e->resource);
        e->resource = NULL;
        e->op = -1;
        e->gen++;
        e->next_free = k->free_head;
        k->free_head = id;
        rc = RL_OK;
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int rl_keeper_release_all(int timeout_ms) {
    int total = 0;
    double deadline = rl_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&registry_mu);
    for (rl_keeper *k = registry; k; k = k->next_keeper) {
        pthread_mutex_lock(&k->mu);
        k->release_requested = 1;
        k->release_deadline = deadline;
        while (k->release_requested && !k->stop) pthread_cond_wait(&k->released, &k->mu);
        total += k->release_count;
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_unlock(&registry_mu);
    return total;
}
