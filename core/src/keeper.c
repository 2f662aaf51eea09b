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
 * signal-handling thread, and from the exit handler that the first keeper
 * registers (atexit), so that exit() with locks still kept releases them.
 *
 * An entry whose owner let go of it without releasing (rl_keeper_drop: a
 * lock object collected by Lua's GC) is DROPPING: due at once, the thread
 * releases it and then frees the slot. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "deadlines.h"
#include "opid.h"
#include "redlock.h"

#define RL_KEEPER_TICK_MS 10

/* Internal entry state beside the public RL_KEEP_*: the owner dropped the
 * lock; the thread releases it and frees the slot. */
#define KEEP_DROPPING 100

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
    int extend_ttl;       /* the ttl that extension asked for */
    int op;               /* extension (or, DROPPING, release) in flight, or -1 */
    int next_free;        /* free slot: the next free slot, or -1 */
} kept;

typedef struct op_owner {
    int entry;
    unsigned gen;
} op_owner;

struct rl_keeper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t released;
    rl_client *client;     /* used by the keeper thread only */
    kept *entries;
    int nentries, capentries;
    int free_head;         /* first free slot below nentries, or -1 */
    rl_deadlines deadlines; /* the held (and dropping) entries, earliest deadline first */
    op_owner *owners;      /* by operation slot (rl_opid_slot) */
    int capowners;
    rl_result *result;     /* the thread's scratch result, allocated before it starts */
    int stop;
    int release_requested; /* rl_keeper_release_all asks; the thread answers */
    int release_count;
    double release_deadline;
    struct rl_keeper *next_keeper;
};

/* What the exit handler waits at most for the releases it starts. */
#define RL_KEEPER_EXIT_RELEASE_MS 1000

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static rl_keeper *registry;
static pthread_once_t exit_handler_once = PTHREAD_ONCE_INIT;
static pid_t exit_handler_pid; /* the process that registered it (not a forked child) */

/* ---- the deadline heap: an entry is in it exactly while it is HELD ---- */

/* The moment e turns lost without a successful extension. */
static double lost_at(const kept *e) {
    return e->valid_until - e->margin_ms;
}

/* How long after a successful extension e is extended again: a third of
 * what its ttl leaves above the margin, so that two more tries fit before
 * the lock would be called lost (every ttl/3 with no margin). */
static double period_of(const kept *e) {
    double p = (e->ttl_ms - e->margin_ms) / 3.0;
    return p >= 1 ? p : 1;
}

/* When the thread must look at e next: its extension, unless one is in
 * flight or it would come after e is lost. */
static double deadline_of(const kept *e) {
    if (e->state == KEEP_DROPPING) return -INFINITY;
    double lost = lost_at(e);
    if (isnan(lost)) lost = INFINITY; /* never lost by time, as lost_if_out_of_time sees it */
    if (e->op >= 0 || e->next_due >= lost) return lost;
    return e->next_due;
}

/* File entry i at its current deadline: insert it, or move it. */
static void schedule(rl_keeper *k, int i) {
    rl_deadlines_set(&k->deadlines, i, deadline_of(&k->entries[i]));
}

/* Take entry i out of the heap (no-op if it is not in it). */
static void unschedule(rl_keeper *k, int i) {
    rl_deadlines_remove(&k->deadlines, i);
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

/* File operation id as entry's. Return 0, or -1 when out of memory. */
static int own_op(rl_keeper *k, int id, int entry) {
    int slot = rl_opid_slot(id);
    if (slot >= k->capowners) {
        int cap = k->capowners ? k->capowners : 64;
        while (cap <= slot) cap *= 2;
        op_owner *o = realloc(k->owners, (size_t)cap * sizeof(*o));
        if (!o) return -1;
        for (int i = k->capowners; i < cap; i++) o[i].entry = -1;
        k->owners = o;
        k->capowners = cap;
    }
    k->owners[slot].entry = entry;
    k->owners[slot].gen = k->entries[entry].gen;
    return 0;
}

/* Forget entry i and put its slot on the free list. */
static void free_entry(rl_keeper *k, int i) {
    kept *e = &k->entries[i];
    set_state(k, i, 0);
    free(e->resource);
    e->resource = NULL;
    e->op = -1;
    e->gen++;
    e->next_free = k->free_head;
    k->free_head = i;
}

/* A dropped entry: send its release; the slot is freed when it is answered
 * (or now, if it cannot be sent: the key then runs out its ttl). */
static void start_drop(rl_keeper *k, int i) {
    kept *e = &k->entries[i];
    int id = rl_begin_release(k->client, e->resource, e->len, e->value);
    if (id >= 0 && own_op(k, id, i) == 0) {
        e->op = id;
        unschedule(k, i);
    } else {
        free_entry(k, i);
    }
}

/* Start extending entry i. If it cannot start, try again a tick later. */
static void start_extension(rl_keeper *k, int i, double now) {
    kept *e = &k->entries[i];
    e->extend_start = rl_now_ms();
    e->extend_ttl = e->ttl_ms;
    int id = rl_begin_extend(k->client, e->resource, e->len, e->value, e->ttl_ms);
    if (id >= 0 && own_op(k, id, i) == 0) e->op = id;
    else e->next_due = now + RL_KEEPER_TICK_MS;
    schedule(k, i);
}

/* Is the earliest deadline due? */
static int anything_due(const rl_keeper *k, double now) {
    double at;
    return rl_deadlines_first(&k->deadlines, &at) >= 0 && at <= now;
}

/* Milliseconds to serve the connections for: until the earliest deadline,
 * but not before not_before; at least 1, at most a tick. */
static int ms_to_wait(const rl_keeper *k, double now, double not_before) {
    double at = INFINITY;
    rl_deadlines_first(&k->deadlines, &at);
    double wait = (at > not_before ? at : not_before) - now;
    if (!(wait < RL_KEEPER_TICK_MS)) return RL_KEEPER_TICK_MS;
    return wait < 0 ? 1 : (int)wait + 1;
}

/* Handle every entry whose deadline has come: lost ones turn LOST, due ones
 * start their extension. Called with the mutex held. */
static void start_due(rl_keeper *k, double now) {
    while (anything_due(k, now)) {
        int i = rl_deadlines_first(&k->deadlines, NULL);
        if (k->entries[i].state == KEEP_DROPPING) start_drop(k, i);
        else if (now >= lost_at(&k->entries[i])) set_state(k, i, RL_KEEP_LOST);
        else start_extension(k, i, now); /* in flight, it is due only when lost */
    }
}

/* Apply a finished extension (or a dropped entry's release). Called with
 * the mutex held. */
static void apply(rl_keeper *k, const rl_result *r) {
    int slot = r->id >= 0 ? rl_opid_slot(r->id) : k->capowners;
    if (slot >= k->capowners) return;
    op_owner o = k->owners[slot];
    if (o.entry < 0 || o.entry >= k->nentries) return;
    kept *e = &k->entries[o.entry];
    if (e->gen != o.gen || e->op != r->id) return; /* removed meanwhile */
    e->op = -1;
    if (e->state == KEEP_DROPPING) {
        free_entry(k, o.entry);
        return;
    }
    if (e->state != RL_KEEP_HELD || r->op != RL_OP_EXTEND) return;
    double now = rl_now_ms();
    if (r->status == RL_STATUS_OK && e->extend_ttl != e->ttl_ms) {
        /* The owner extended to another ttl meanwhile (rl_keeper_update):
         * nodes may hold either; count the shorter, extend again at once. */
        double until = e->extend_start + r->validity_ms;
        if (until < e->valid_until) e->valid_until = until;
        e->next_due = now;
    } else if (r->status == RL_STATUS_OK) {
        e->valid_until = e->extend_start + r->validity_ms;
        e->next_due = now + period_of(e);
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

/* Is r the answer to a release that release_held filed for its entry? */
static int is_release_of_held(rl_keeper *k, const rl_result *r) {
    int slot = rl_opid_slot(r->id);
    if (r->op != RL_OP_RELEASE || r->id < 0 || slot >= k->capowners) return 0;
    op_owner o = k->owners[slot];
    if (o.entry < 0 || o.entry >= k->nentries) return 0;
    kept *e = &k->entries[o.entry];
    if (e->gen != o.gen || e->op != r->id || e->state != RL_KEEP_RELEASED) return 0;
    e->op = -1;
    return 1;
}

/* Releases in flight at once in release_held. Every round must be answered
 * within the node timeout: ten thousand releases begun together are not
 * (the nodes take longer than that to work through them), so they time
 * out as unavailable, and what is still unwritten when the keeper is freed
 * never reaches the nodes. A window keeps each round small. */
#define RL_KEEPER_RELEASE_WINDOW 256

static int releasable(const kept *e) {
    return e->state == RL_KEEP_HELD || e->state == RL_KEEP_LOST || e->state == KEEP_DROPPING;
}

/* Release every held (or lost, or dropped) entry on the keeper's own
 * connections, at most RL_KEEPER_RELEASE_WINDOW at a time, and count the
 * releases that a quorum confirmed by the deadline. Every entry is RELEASED
 * from then on, also those the deadline came before (they are left to
 * expire). A dropped entry stays RELEASED (nobody asks for it; it is freed
 * with the keeper). Mutex held on entry and exit; dropped while waiting. */
static void release_held(rl_keeper *k) {
    rl_result *r = k->result;
    int started = 0, released = 0, next = 0, end = k->nentries;
    for (;;) {
        for (; next < end && started < RL_KEEPER_RELEASE_WINDOW; next++) {
            kept *e = &k->entries[next];
            if (!releasable(e)) continue;
            int dropping = e->state == KEEP_DROPPING;
            int id = dropping && e->op >= 0 ? e->op : rl_begin_release(k->client, e->resource, e->len, e->value);
            e->op = -1;
            set_state(k, next, RL_KEEP_RELEASED);
            if (id >= 0 && own_op(k, id, next) == 0) {
                e->op = id;
                started++;
            }
        }
        if (started == 0) break;
        int left = (int)(k->release_deadline - rl_now_ms());
        if (left <= 0) break;
        pthread_mutex_unlock(&k->mu);
        rl_run(k->client, left);
        pthread_mutex_lock(&k->mu);
        while (rl_collect(k->client, r)) {
            if (!is_release_of_held(k, r)) continue;
            started--;
            if (r->status == RL_STATUS_OK) released++;
        }
    }
    for (; next < end; next++) /* not reached by the deadline */
        if (releasable(&k->entries[next])) {
            k->entries[next].op = -1;
            set_state(k, next, RL_KEEP_RELEASED);
        }
    k->release_count = released;
    k->release_requested = 0;
    pthread_cond_broadcast(&k->released);
}

static void *keeper_main(void *arg) {
    rl_keeper *k = arg;
    rl_result *r = k->result;
    /* start_due runs at most once a tick: the extensions that fall due in
     * between go out together, one write per node for the batch instead of
     * one wake-up and one write per lock. None is later than a tick. */
    double next_sweep = 0;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
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
        if (rl_deadlines_reserve(&k->deadlines, cap) != 0) return -1;
        k->capentries = cap;
    }
    int id = k->nentries++;
    k->entries[id].gen = 0;
    return id;
}

/* atexit: release what every keeper still keeps, bounded in time. A forked
 * child that calls exit() has the registry but none of the threads (and maybe
 * a mutex locked by one of them): it does nothing. Keepers already freed have
 * left the registry, so there is nothing to touch. */
static void release_at_exit(void) {
    if (getpid() != exit_handler_pid) return;
    rl_keeper_release_all(RL_KEEPER_EXIT_RELEASE_MS);
}

static void register_exit_handler(void) {
    exit_handler_pid = getpid();
    atexit(release_at_exit);
}

rl_keeper *rl_keeper_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen) {
    char dummy[RL_ERR_LEN];
    if (err == NULL) err = dummy, errlen = sizeof(dummy);
    rl_keeper *k = calloc(1, sizeof(*k));
    if (k) k->result = malloc(sizeof(*k->result));
    if (!k || !k->result) {
        free(k);
        return snprintf(err, errlen, "out of memory"), NULL;
    }
    k->client = rl_client_new(urls, nurls, opts, err, errlen);
    if (!k->client) {
        free(k->result);
        free(k);
        return NULL;
    }
    k->free_head = -1;
    pthread_mutex_init(&k->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&k->released, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        rl_client_free(k->client);
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->released);
        free(k->result);
        free(k);
        return snprintf(err, errlen, "cannot start the keep-alive thread"), NULL;
    }
    pthread_once(&exit_handler_once, register_exit_handler);
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
    pthread_cond_broadcast(&k->released);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->thread, NULL);
    rl_client_free(k->client);
    for (int i = 0; i < k->nentries; i++) free(k->entries[i].resource);
    free(k->entries);
    rl_deadlines_free(&k->deadlines);
    free(k->owners);
    free(k->result);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->released);
    free(k);
}

int rl_keeper_add(rl_keeper *k, const char *resource, size_t len, const char *value, int ttl_ms,
                  double valid_until_ms, int margin_ms, char *err, size_t errlen) {
    char dummy[RL_ERR_LEN];
    if (err == NULL) err = dummy, errlen = sizeof(dummy);
    if (!resource || len == 0) return snprintf(err, errlen, "resource must be a non-empty string"), RL_ERR;
    if (!value || strnlen(value, RL_VALUE_LEN + 1) != RL_VALUE_LEN)
        return snprintf(err, errlen, "value must be %d characters", RL_VALUE_LEN), RL_ERR;
    if (ttl_ms <= 0) return snprintf(err, errlen, "ttl must be > 0 ms"), RL_ERR;
    if (margin_ms < 0 || margin_ms >= ttl_ms)
        return snprintf(err, errlen, "margin must be from 0 to ttl - 1 ms (got %d)", margin_ms), RL_ERR;
    if (!(valid_until_ms == valid_until_ms)) return snprintf(err, errlen, "valid_until must be a number"), RL_ERR;
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
    e->next_due = rl_now_ms() + period_of(e);
    e->op = -1;
    e->next_free = -1;
    schedule(k, id);
    pthread_mutex_unlock(&k->mu);
    return id;
}

/* The entry id names for its owner (a dropped one is no longer the owner's),
 * or NULL. Called with the mutex held. */
static kept *owned(rl_keeper *k, int id) {
    if (id < 0 || id >= k->nentries) return NULL;
    kept *e = &k->entries[id];
    return e->state != 0 && e->state != KEEP_DROPPING ? e : NULL;
}

int rl_keeper_state(rl_keeper *k, int id, double *valid_until_ms) {
    int state = RL_ERR;
    pthread_mutex_lock(&k->mu);
    kept *e = owned(k, id);
    if (e) {
        lost_if_out_of_time(k, id, rl_now_ms());
        state = e->state;
        if (valid_until_ms) *valid_until_ms = e->valid_until;
    }
    pthread_mutex_unlock(&k->mu);
    return state;
}

int rl_keeper_update(rl_keeper *k, int id, int ttl_ms, double started_ms, double valid_until_ms) {
    if (ttl_ms <= 0 || !(valid_until_ms == valid_until_ms)) return RL_ERR;
    int rc = RL_ERR;
    pthread_mutex_lock(&k->mu);
    kept *e = owned(k, id);
    if (e && e->state == RL_KEEP_HELD && ttl_ms > e->margin_ms) {
        double now = rl_now_ms();
        e->ttl_ms = ttl_ms;
        if (e->op >= 0 || e->extend_start >= started_ms) {
            /* One of ours overlapped the owner's: nodes may hold either ttl.
             * Count the shorter validity and extend again at once. */
            if (valid_until_ms < e->valid_until) e->valid_until = valid_until_ms;
            e->next_due = now;
        } else {
            e->valid_until = valid_until_ms;
            e->next_due = now + period_of(e);
        }
        schedule(k, id);
        rc = RL_OK;
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int rl_keeper_remove(rl_keeper *k, int id) {
    int rc = RL_ERR;
    pthread_mutex_lock(&k->mu);
    if (owned(k, id)) {
        free_entry(k, id);
        rc = RL_OK;
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int rl_keeper_drop(rl_keeper *k, int id) {
    int rc = RL_ERR;
    pthread_mutex_lock(&k->mu);
    kept *e = owned(k, id);
    if (e && e->state == RL_KEEP_RELEASED) {
        free_entry(k, id);
        rc = RL_OK;
    } else if (e) {
        unschedule(k, id);
        e->state = KEEP_DROPPING;
        e->op = -1; /* an extension in flight is ignored; the release follows it on each connection */
        schedule(k, id);
        rc = RL_OK;
    }
    pthread_mutex_unlock(&k->mu);
    return rc;
}

/* A CLOCK_MONOTONIC time (what the keeper's condition variable waits on). */
static struct timespec monotonic_at(double ms) {
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)((ms - (double)ts.tv_sec * 1000) * 1e6);
    return ts;
}

/* Ask k's thread to release everything k keeps by deadline. */
static void ask_release(rl_keeper *k, double deadline) {
    pthread_mutex_lock(&k->mu);
    k->release_requested = 1;
    k->release_deadline = deadline;
    pthread_mutex_unlock(&k->mu);
}

/* Wait for k's answer to ask_release, a little past the deadline at most.
 * Return the number of releases a quorum confirmed (0 when the thread did
 * not answer in time). */
static int await_release(rl_keeper *k, double deadline) {
    int count = 0;
    pthread_mutex_lock(&k->mu);
    struct timespec give_up = monotonic_at(deadline + 100);
    while (k->release_requested && !k->stop)
        if (pthread_cond_timedwait(&k->released, &k->mu, &give_up) != 0) break;
    if (!k->release_requested) count = k->release_count;
    pthread_mutex_unlock(&k->mu);
    return count;
}

int rl_keeper_release(rl_keeper *k, int timeout_ms) {
    if (!k) return 0;
    if (timeout_ms < 0) timeout_ms = 0;
    double deadline = rl_now_ms() + timeout_ms;
    ask_release(k, deadline);
    return await_release(k, deadline);
}

int rl_keeper_release_all(int timeout_ms) {
    int total = 0;
    if (timeout_ms < 0) timeout_ms = 0;
    double deadline = rl_now_ms() + timeout_ms;
    pthread_mutex_lock(&registry_mu);
    /* every keeper releases at once; then collect the answers */
    for (rl_keeper *k = registry; k; k = k->next_keeper) ask_release(k, deadline);
    for (rl_keeper *k = registry; k; k = k->next_keeper) total += await_release(k, deadline);
    pthread_mutex_unlock(&registry_mu);
    return total;
}
