/* keeper.c — keep-alive in a thread: a thread of its own drives an
 * rl_client whose engine keeps the locks (the schedule is the engine's:
 * keep.c, redlock.h's "Keep-alive"). This file only drives it.
 *
 * The engine is not thread-safe, so every call into it happens under the
 * keeper's mutex: the thread holds it all the time except while its loop
 * waits for I/O (rl_client_share), and rl_keeper_* calls from other threads
 * take it for their own engine calls (no I/O: they only change the
 * schedule, which the thread looks at before its next wait, at most a tick
 * later). A forked child inherits the keeper but not its thread, which may
 * have held the mutex at the fork (nobody would ever let go of it in the
 * child): every rl_keeper_* call first checks that it runs in the process
 * that made the keeper, and in any other refuses or does nothing without
 * touching the mutex (inherited). Every keeper is listed in a process-wide
 * registry so rl_keeper_release_all can reach them from an exit path or a
 * signal-handling thread, and from the exit handler that the first keeper
 * registers (atexit), so that exit() with locks still kept releases them.
 * The registry's mutex is never held across a wait, and an atfork handler
 * takes it around fork(), so a child finds it free. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "redlock.h"

/* The longest the thread's loop waits before it looks at what other
 * threads asked (a stop, a release) or changed in the schedule. */
#define RL_KEEPER_TICK_MS 10

struct rl_keeper {
    pthread_t thread;
    pthread_mutex_t mu;    /* every call into the engine (see the top) */
    pthread_cond_t released;
    rl_client *client;     /* driven by the keeper's thread only */
    rl_engine *engine;     /* the client's: it keeps the locks */
    int stop;
    int release_requested; /* rl_keeper_release_all asks; the thread answers */
    int release_count;
    double release_deadline;
    double release_quiet_ms; /* how long the release waits once no release is decided (the caller's timeout) */
    double release_cap;      /* when the release of the locks now being released must end at the latest */
    struct rl_keeper *next_keeper;
    int users;             /* rl_keeper_release_all calls waiting on it (registry_mu): free waits for 0 */
    pid_t pid;             /* the process that made it (a forked child inherits it, not its thread) */
    atomic_int closing;    /* an rl_keeper_close (or free) has begun: a second one does nothing */
    atomic_int closed;     /* it ended: no thread, no client; only the memory is left */
};

/* What the exit handler waits at most for the releases it starts, once
 * none is being decided any more. */
#define RL_KEEPER_EXIT_RELEASE_MS 1000

/* A release of every kept lock waits this long at most in all, however
 * long its releases go on being decided (a group of 65,536 names takes
 * about 1.5 s on loopback); a later one while some are still undecided
 * (the host's exit, then its Lua state's finalizer) does not start it over. */
#define RL_KEEPER_RELEASE_MAX_MS 10000

/* How often the wait for releases looks whether any was decided. */
#define RL_KEEPER_PROGRESS_LOOK_MS 50

/* The registry: held only while the list or a keeper's users change, never
 * while a release is waited for, and taken around fork() (an atfork
 * handler), so that a child never inherits it locked by a thread it does
 * not have. */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t registry_unused = PTHREAD_COND_INITIALIZER; /* some keeper's users fell */
static rl_keeper *registry;
static pthread_once_t process_handlers_once = PTHREAD_ONCE_INIT;

/* 1 if k was made before fork() in another process: the caller is a forked
 * child, which must leave k's mutex, thread and sockets (the parent's) alone. */
static int inherited(const rl_keeper *k) {
    return k->pid != getpid();
}

/* 1 if k may not be used: inherited, or closed (its client is gone). A
 * call that passes may still find k closed once it holds k's mutex (another
 * thread's rl_keeper_close): engine_of says so. */
static int unusable(const rl_keeper *k) {
    return inherited(k) || atomic_load(&k->closed);
}

/* k's engine, with k's mutex taken; or NULL, nothing taken, when k may not
 * be used (unusable) or was closed meanwhile. */
static rl_engine *engine_of(rl_keeper *k) {
    if (unusable(k)) return NULL;
    pthread_mutex_lock(&k->mu);
    if (k->engine != NULL) return k->engine;
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

static void unlock_mu(void *mu) {
    pthread_mutex_unlock(mu);
}

static void lock_mu(void *mu) {
    pthread_mutex_lock(mu);
}

static int releasing(const rl_engine *e) {
    return rl_engine_keep_releasing(e, NULL);
}

/* Commands of decided rounds still on their way: tails, and releases kept
 * for a node that has stopped answering or is reconnecting. */
static int unfinished(const rl_engine *e) {
    return rl_engine_tails(e) + rl_engine_unwritten(e);
}

/* Drive the client while busy() counts something, until k's release
 * deadline; whenever the count has fallen since the last look, the deadline
 * moves to quiet_ms from now (no later than cap): a large group's releases
 * are waited for as long as the nodes go on deciding them, and a node that
 * stops answering costs quiet_ms. */
static void run_while_deciding(rl_keeper *k, int (*busy)(const rl_engine *), double quiet_ms, double cap) {
    int before = busy(k->engine);
    while (before > 0) {
        double left = k->release_deadline - rl_now_ms();
        if (left < 1) return;
        rl_client_run_while(k->client, busy, left < RL_KEEPER_PROGRESS_LOOK_MS ? (int)left : RL_KEEPER_PROGRESS_LOOK_MS);
        int after = busy(k->engine);
        double later = rl_now_ms() + quiet_ms;
        if (after < before && later > k->release_deadline) k->release_deadline = later < cap ? later : cap;
        before = after;
    }
}

/* Release every lock kept (the engine begins the releases, a window at a
 * time) and drive the client until they are decided, then until the nodes
 * outside the quorum have their releases too (a caller about to exit would
 * leave those keys for their ttl), or the deadline has come (moved on while
 * releases are decided: run_while_deciding); count those a quorum
 * confirmed. Mutex held (let go while the loop waits). */
static void release_held(rl_keeper *k) {
    int released = 0;
    double now = rl_now_ms();
    if (releasing(k->engine) == 0) k->release_cap = now + RL_KEEPER_RELEASE_MAX_MS; /* (else: still going) */
    rl_engine_keep_release_all(k->engine, now);
    run_while_deciding(k, releasing, k->release_quiet_ms, k->release_cap);
    run_while_deciding(k, unfinished, k->release_quiet_ms, k->release_cap);
    rl_engine_keep_releasing(k->engine, &released);
    k->release_count = released;
    k->release_requested = 0;
    pthread_cond_broadcast(&k->released);
}

static void *keeper_main(void *arg) {
    rl_keeper *k = arg;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        if (k->release_requested) release_held(k);
        rl_sleep(k->client, RL_KEEPER_TICK_MS); /* the engine's deadlines: extensions, retries, releases */
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* atexit: release what every keeper of this process still keeps, bounded
 * in time (a forked child inherits the handler, and releases the keepers it
 * made itself: see rl_keeper_release_all). Keepers already freed have left
 * the registry, so there is nothing to touch. */
static void release_at_exit(void) {
    rl_keeper_release_all(RL_KEEPER_EXIT_RELEASE_MS);
}

static void lock_registry(void) {
    pthread_mutex_lock(&registry_mu);
}

static void unlock_registry(void) {
    pthread_mutex_unlock(&registry_mu);
}

static void register_process_handlers(void) {
    atexit(release_at_exit);
    pthread_atfork(lock_registry, unlock_registry, unlock_registry);
}

/* Free k's client (its loop lets go of the mutex while it waits). After
 * rl_keeper_release, the client's last waits (rl_client_free's) end
 * by that release's deadline: the releases had their time, and what the
 * caller was told is the longest it waits. */
static void free_client(rl_keeper *k) {
    pthread_mutex_lock(&k->mu);
    if (k->engine != NULL) rl_engine_keep_clear(k->engine); /* freeing the client serves its tails: begin nothing more */
    k->engine = NULL; /* (a call that takes the mutex while the client's last waits let go of it finds none) */
    rl_client_free_by(k->client, k->release_deadline > 0 ? k->release_deadline : HUGE_VAL);
    k->client = NULL;
    pthread_mutex_unlock(&k->mu);
}

/* Free what is left of k once its client is gone. */
static void free_memory(rl_keeper *k) {
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->released);
    free(k);
}

rl_keeper *rl_keeper_new(const char *const *urls, int nurls, const rl_options *opts, char *err, size_t errlen) {
    char dummy[RL_ERR_LEN];
    if (err == NULL) err = dummy, errlen = sizeof(dummy);
    rl_keeper *k = calloc(1, sizeof(*k));
    if (!k) return snprintf(err, errlen, "out of memory"), NULL;
    k->client = rl_client_new(urls, nurls, opts, err, errlen);
    if (!k->client) {
        free(k);
        return NULL;
    }
    k->engine = rl_client_engine(k->client);
    pthread_mutex_init(&k->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&k->released, &attr);
    pthread_condattr_destroy(&attr);
    rl_client_share(k->client, unlock_mu, lock_mu, &k->mu);
    if (pthread_create(&k->thread, NULL, keeper_main, k) != 0) {
        free_client(k);
        free_memory(k);
        return snprintf(err, errlen, "cannot start the keep-alive thread"), NULL;
    }
    pthread_once(&process_handlers_once, register_process_handlers);
    k->pid = getpid();
    pthread_mutex_lock(&registry_mu);
    k->next_keeper = registry;
    registry = k;
    pthread_mutex_unlock(&registry_mu);
    return k;
}

/* Out of the registry, the thread stopped, the client freed: what is left
 * of k is its memory. */
static void close_keeper(rl_keeper *k) {
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
    pthread_mutex_lock(&registry_mu); /* an rl_keeper_release_all still waiting on k lets go of it first */
    while (k->users > 0) pthread_cond_wait(&registry_unused, &registry_mu);
    pthread_mutex_unlock(&registry_mu);
    free_client(k);
    atomic_store(&k->closed, 1);
}

/* The first caller to close k closes it; 0 for any other (it is closed, or
 * being closed by another thread). */
static int claim_close(rl_keeper *k) {
    int open = 0;
    return atomic_compare_exchange_strong(&k->closing, &open, 1);
}

void rl_keeper_close(rl_keeper *k) {
    if (!k || inherited(k) || !claim_close(k)) return;
    close_keeper(k);
}

void rl_keeper_free(rl_keeper *k) {
    /* A forked child frees nothing: freeing the client would take the mutex
     * (the thread may have been in the engine at the fork) and stopping the
     * thread would join one that is not there. The memory stays allocated,
     * the child's copies of the sockets open and the keeper in the registry
     * (where rl_keeper_release_all passes it by) until the child exits. */
    if (!k || inherited(k)) return;
    if (claim_close(k)) close_keeper(k);
    free_memory(k);
}

int rl_keeper_add(rl_keeper *k, const char *resource, size_t len, const char *value, int ttl_ms,
                  double valid_until_ms, int margin_ms, char *err, size_t errlen) {
    return rl_keeper_add_slot(k, resource, len, 0, value, ttl_ms, valid_until_ms, margin_ms, err, errlen);
}

int rl_keeper_add_slot(rl_keeper *k, const char *resource, size_t len, int slot, const char *value, int ttl_ms,
                       double valid_until_ms, int margin_ms, char *err, size_t errlen) {
    if (unusable(k)) {
        if (err && errlen)
            snprintf(err, errlen, "%s", inherited(k) ? "this keeper was made before fork(): make a new one in the child"
                                                     : "this keeper was closed");
        return RL_ERR;
    }
    rl_engine *e = engine_of(k);
    if (e == NULL) {
        if (err && errlen) snprintf(err, errlen, "this keeper was closed");
        return RL_ERR;
    }
    int id = rl_engine_keep_add_slot(e, resource, len, slot, value, ttl_ms, valid_until_ms, margin_ms, rl_now_ms());
    if (id < 0 && err && errlen) snprintf(err, errlen, "%s", rl_engine_errstr(e));
    pthread_mutex_unlock(&k->mu);
    return id;
}

int rl_keeper_state(rl_keeper *k, int id, double *valid_until_ms) {
    rl_engine *e = engine_of(k);
    if (e == NULL) return RL_ERR;
    int state = rl_engine_keep_state(e, id, valid_until_ms, rl_now_ms());
    pthread_mutex_unlock(&k->mu);
    return state;
}

void rl_keeper_stats(rl_keeper *k, rl_stats *out) {
    rl_engine *e = engine_of(k);
    if (e == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    rl_engine_stats(e, out);
    pthread_mutex_unlock(&k->mu);
}

int rl_keeper_update(rl_keeper *k, int id, int ttl_ms, double started_ms, double valid_until_ms) {
    rl_engine *e = engine_of(k);
    if (e == NULL) return RL_ERR;
    int rc = rl_engine_keep_update(e, id, ttl_ms, started_ms, valid_until_ms, rl_now_ms());
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int rl_keeper_remove(rl_keeper *k, int id) {
    rl_engine *e = engine_of(k);
    if (e == NULL) return RL_ERR;
    int rc = rl_engine_keep_remove(e, id);
    pthread_mutex_unlock(&k->mu);
    return rc;
}

int rl_keeper_drop(rl_keeper *k, int id) {
    rl_engine *e = engine_of(k);
    if (e == NULL) return RL_ERR;
    int rc = rl_engine_keep_drop(e, id, rl_now_ms());
    pthread_mutex_unlock(&k->mu);
    return rc;
}

/* The CLOCK_MONOTONIC time (what the keeper's condition variable waits on;
 * condition variables take no CLOCK_BOOTTIME) when rl_now_ms will read ms. */
static struct timespec monotonic_at(double ms) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double at = (double)now.tv_sec * 1000 + (double)now.tv_nsec / 1e6 + (ms - rl_now_ms());
    struct timespec ts;
    ts.tv_sec = (time_t)(at / 1000);
    ts.tv_nsec = (long)((at - (double)ts.tv_sec * 1000) * 1e6);
    if (ts.tv_nsec < 0) ts.tv_nsec = 0;
    if (ts.tv_nsec > 999999999) ts.tv_nsec = 999999999;
    return ts;
}

/* Ask k's thread to release everything k keeps by deadline, which moves on
 * to quiet_ms after each release decided (release_held). */
static void ask_release(rl_keeper *k, double deadline, int quiet_ms) {
    pthread_mutex_lock(&k->mu);
    k->release_requested = 1;
    k->release_deadline = deadline;
    k->release_quiet_ms = quiet_ms;
    pthread_mutex_unlock(&k->mu);
}

/* Wait for k's answer to ask_release, a little past its deadline at most
 * (which the thread moves on while releases are decided). Return the number
 * of releases a quorum confirmed (0 when the thread did not answer in time). */
static int await_release(rl_keeper *k) {
    int count = 0;
    pthread_mutex_lock(&k->mu);
    while (k->release_requested && !k->stop) {
        double until = k->release_deadline + 100;
        struct timespec give_up = monotonic_at(until);
        if (pthread_cond_timedwait(&k->released, &k->mu, &give_up) != 0 && k->release_deadline + 100 <= until) break;
    }
    if (!k->release_requested) count = k->release_count;
    pthread_mutex_unlock(&k->mu);
    return count;
}

int rl_keeper_release(rl_keeper *k, int timeout_ms) {
    if (!k || unusable(k)) return 0;
    if (timeout_ms < 0) timeout_ms = 0;
    double deadline = rl_now_ms() + timeout_ms;
    ask_release(k, deadline, timeout_ms);
    return await_release(k);
}

/* This process's keepers (not those a forked child inherited: their
 * threads stayed in the parent, and may have held their mutexes at the
 * fork; their sockets are the parent's), each marked in use so that
 * rl_keeper_free waits for unpin. Return how many, with *out a malloc'd
 * array (NULL when there are none or memory ran out). */
static int pin_own(rl_keeper ***out) {
    int n = 0;
    pid_t self = getpid();
    *out = NULL;
    pthread_mutex_lock(&registry_mu);
    for (rl_keeper *k = registry; k; k = k->next_keeper) n += k->pid == self;
    rl_keeper **own = n ? malloc((size_t)n * sizeof(*own)) : NULL;
    n = 0;
    for (rl_keeper *k = registry; k && own; k = k->next_keeper)
        if (k->pid == self) {
            k->users++;
            own[n++] = k;
        }
    pthread_mutex_unlock(&registry_mu);
    *out = own;
    return n;
}

static void unpin(rl_keeper **own, int n) {
    pthread_mutex_lock(&registry_mu);
    for (int i = 0; i < n; i++) own[i]->users--;
    pthread_cond_broadcast(&registry_unused);
    pthread_mutex_unlock(&registry_mu);
    free(own);
}

int rl_keeper_release_all(int timeout_ms) {
    int total = 0;
    if (timeout_ms < 0) timeout_ms = 0;
    double deadline = rl_now_ms() + timeout_ms;
    rl_keeper **own;
    int n = pin_own(&own); /* the registry is not held while they release (see registry_mu) */
    for (int i = 0; i < n; i++) ask_release(own[i], deadline, timeout_ms); /* all at once, then the answers */
    for (int i = 0; i < n; i++) total += await_release(own[i]);
    unpin(own, n);
    return total;
}
