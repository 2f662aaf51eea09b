/*
 * driver.c — the redlock C API in the peers harness (../shared/peers/README.md,
 * "Driver protocol"): environment in, one JSON line per workload out.
 *
 *   seq      rl_acquire + rl_release on one resource (the blocking calls)
 *   conc     RB_CONC lockers on distinct resources, all in flight on ONE client:
 *            rl_begin_acquire / rl_begin_release, rl_run + rl_collect
 *   handoff  RB_WAITERS waiters on one resource, one client, one thread: each
 *            waiter is a state machine over begin/collect, retrying with the
 *            library's default policy (redlock.retry.default = jitter 50-250 ms,
 *            32 attempts; the waiter calls acquire again when it gives up),
 *            exactly like the harness's node peers (one process, async waiters,
 *            shared connections). The client watches the resource (rl_watch):
 *            a release heard wakes the waiter that has slept longest, unless an
 *            acquire is already in flight (the waiters share one client, so
 *            waking them all would only split the votes among them). That
 *            attempt is extra, as in the Lua retry loop. RB_NOTIFY=0: no watch.
 *   sem      (only when asked: RB_WORKLOADS=sem) RB_SEM_LOCKERS (16) lockers take
 *            one semaphore of RB_SEM_LIMIT (4) slots, hold RB_HOLD_MS, release the
 *            slot and ask again at once. RB_SEM_FORM=client (the default): all on
 *            the one client, in one thread, as the peer's lockers share one
 *            process (sem_one_client); a release goes out with the next
 *            locker's rl_begin_acquire_slot behind it. RB_SEM_FORM=threads: a
 *            thread and a client each, rl_acquire_slot with a ticket
 *            (rl_wall_ms when it starts waiting), sleeping on rl_sleep_until
 *            between attempts (the default policy's delay the fallback).
 *            Every form times its holds with rl_run_until, to the microsecond.
 *
 * The nodes: RB_SERVERS (URLs separated by commas or spaces; a cluster node is
 * one redis-cluster://h:p+h:p URL) when set, else RB_HOST and RB_PORTS.
 *
 * Built by bench/driver-c (cc, against the static library of the Release build).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "redlock.h"

#define MAXNODES RL_MAX_NODES

static int nodes;
static char urls[MAXNODES][1024]; /* the nodes' URLs (node_urls) */
static const char *up[MAXNODES];
static double dur;
static long seq_max, warmup;
static int ttl_ms, conc, waiters, hold_ms, clk_tck;
static const char *piddir;
static int pids[MAXNODES], npids;
static char prefix[128];
static rl_client *cl;

/* default retry policy of the Lua module (lua/redlock/retry.lua: jitter(50, 250, 32)) */
#define POLICY_MIN_MS 50.0
#define POLICY_MAX_MS 250.0
#define POLICY_ATTEMPTS 32

static const char *envs(const char *k, const char *d) {
    const char *v = getenv(k);
    return v && *v ? v : d;
}
static void die(const char *m) {
    fprintf(stderr, "redlock driver-c: %s\n", m);
    exit(1);
}
static double cpu_ms(int who) {
    struct rusage ru;
    getrusage(who, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

static void load_pids(void) {
    if (!piddir) return;
    DIR *d = opendir(piddir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && npids < MAXNODES) {
        int port;
        char tail[8];
        if (sscanf(e->d_name, "redis-%d.%7s", &port, tail) == 2 && !strcmp(tail, "pid")) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", piddir, e->d_name);
            FILE *f = fopen(p, "r");
            if (f) {
                if (fscanf(f, "%d", &pids[npids]) == 1) npids++;
                fclose(f);
            }
        }
    }
    closedir(d);
}
static double srv_cpu_ms(void) {
    double ticks = 0;
    for (int i = 0; i < npids; i++) {
        char p[64], buf[1024];
        snprintf(p, sizeof p, "/proc/%d/stat", pids[i]);
        FILE *f = fopen(p, "r");
        if (!f) return -1;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        char *s = strrchr(buf, ')');
        if (!s) return -1;
        unsigned long ut = 0, st = 0;
        if (sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return -1;
        ticks += ut + st;
    }
    return ticks * 1000.0 / clk_tck;
}

/* ------------------------------------------------------------ latency arrays (µs) */
typedef struct {
    double *v;
    size_t n, cap;
} vec;
static void vpush(vec *a, double x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 65536;
        a->v = realloc(a->v, a->cap * sizeof(double));
        if (!a->v) die("out of memory");
    }
    a->v[a->n++] = x;
}
static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* same rank rule as bench-node.js: ceil(p/100 * n) - 1 on the sorted samples */
static int no_pct; /* RB_PROFILE=1: no percentiles (keeps qsort out of instruction counts) */
static double vpct(vec *a, double p) {
    if (!a->n || no_pct) return -1;
    qsort(a->v, a->n, sizeof(double), dcmp);
    size_t i = (size_t)(p / 100.0 * a->n + 0.999999999);
    if (i < 1) i = 1;
    if (i > a->n) i = a->n;
    return a->v[i - 1];
}
static void out_common(void) {
    printf("{\"peer\":\"%s\",\"impl\":\"redlock %s C API (rl_acquire/rl_release; begin/run/collect)\",\"nodes\":%d,",
           envs("RB_LABEL", "redlock-c"), rl_version(), nodes);
}

/* ------------------------------------------------------------ seq */
static void wl_seq(void) {
    char key[160];
    int klen = snprintf(key, sizeof key, "%sseq", prefix);
    rl_result *r = malloc(sizeof *r);
    char value[RL_VALUE_LEN + 1];
    vec acq = {0}, rel = {0};
    long errors = 0;
    for (long i = 0; i < warmup; i++) {
        if (rl_acquire(cl, key, klen, ttl_ms, r) != RL_OK || r->status != RL_STATUS_OK) continue;
        memcpy(value, r->value, sizeof value);
        rl_release(cl, key, klen, value, r);
    }
    double s0 = srv_cpu_ms(), c0 = cpu_ms(RUSAGE_SELF), t0 = rl_now_ms(), deadline = t0 + dur * 1e3, c = t0;
    long n = 0;
    while (n < seq_max) {
        double a = rl_now_ms();
        if (rl_acquire(cl, key, klen, ttl_ms, r) != RL_OK || r->status != RL_STATUS_OK) {
            errors++;
            if (rl_now_ms() >= deadline) break;
            continue;
        }
        double b = rl_now_ms();
        memcpy(value, r->value, sizeof value);
        if (rl_release(cl, key, klen, value, r) != RL_OK || r->status != RL_STATUS_OK) errors++;
        c = rl_now_ms();
        vpush(&acq, (b - a) * 1e3);
        vpush(&rel, (c - b) * 1e3);
        n++;
        if (c >= deadline) break;
    }
    double t1 = rl_now_ms(), cpu = cpu_ms(RUSAGE_SELF) - c0, srv = srv_cpu_ms() - s0, secs = (t1 - t0) / 1e3;
    out_common();
    printf("\"workload\":\"seq\",\"cycles\":%ld,\"secs\":%.3f,\"rate\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
           "\"rel_p50_us\":%.1f,\"rel_p99_us\":%.1f,\"cpu_ms_per_1k\":%.1f,\"srv_cpu_ms_per_1k\":%.1f,\"errors\":%ld}\n",
           n, secs, n / secs, vpct(&acq, 50), vpct(&acq, 99), vpct(&rel, 50), vpct(&rel, 99),
           n ? cpu * 1000 / n : 0, n ? srv * 1000 / n : 0, errors);
    fflush(stdout);
    free(acq.v);
    free(rel.v);
    free(r);
}

/* ---------------------------------------------- op id -> owner (by id % RL_ID_SLOTS) */
static int owner[RL_ID_SLOTS];
static void set_owner(int id, int who) {
    if (id < 0) die(rl_client_errstr(cl));
    owner[id % RL_ID_SLOTS] = who;
}

/* ------------------------------------------------------------ conc */
typedef struct {
    char key[160];
    int klen;
    char value[RL_VALUE_LEN + 1];
    double start;
} locker;

static void wl_conc(void) {
    locker *L = calloc((size_t)conc, sizeof *L);
    rl_result *r = malloc(sizeof *r);
    vec cyc = {0};
    long cycles = 0, errors = 0;
    int active = 0;
    for (int j = 0; j < conc; j++) L[j].klen = snprintf(L[j].key, sizeof L[j].key, "%sc:%d", prefix, j);
    double s0 = srv_cpu_ms(), c0 = cpu_ms(RUSAGE_SELF), t0 = rl_now_ms(), deadline = t0 + dur * 1e3;
    for (int j = 0; j < conc; j++) {
        L[j].start = rl_now_ms();
        set_owner(rl_begin_acquire(cl, L[j].key, L[j].klen, ttl_ms), j);
        active++;
    }
    while (active > 0) {
        rl_run(cl, 1000);
        while (rl_collect(cl, r)) {
            int j = owner[r->id % RL_ID_SLOTS];
            locker *l = &L[j];
            if (r->op == RL_OP_ACQUIRE) {
                if (r->status != RL_STATUS_OK) { /* no contention here: should not happen */
                    errors++;
                    if (rl_now_ms() < deadline) set_owner(rl_begin_acquire(cl, l->key, l->klen, ttl_ms), j);
                    else active--;
                    continue;
                }
                memcpy(l->value, r->value, sizeof l->value);
                set_owner(rl_begin_release(cl, l->key, l->klen, l->value), j);
            } else {
                double t = rl_now_ms();
                if (r->status != RL_STATUS_OK) errors++;
                vpush(&cyc, (t - l->start) * 1e3);
                cycles++;
                if (t < deadline) {
                    l->start = t;
                    set_owner(rl_begin_acquire(cl, l->key, l->klen, ttl_ms), j);
                } else {
                    active--;
                }
            }
        }
    }
    double t1 = rl_now_ms(), cpu = cpu_ms(RUSAGE_SELF) - c0, srv = srv_cpu_ms() - s0, secs = (t1 - t0) / 1e3;
    out_common();
    printf("\"workload\":\"conc\",\"inflight\":%d,\"cycles\":%ld,\"secs\":%.3f,\"rate\":%.0f,\"p50_us\":%.1f,"
           "\"p99_us\":%.1f,\"cpu_ms_per_1k\":%.1f,\"srv_cpu_ms_per_1k\":%.1f,\"errors\":%ld}\n",
           conc, cycles, secs, cycles / secs, vpct(&cyc, 50), vpct(&cyc, 99), cycles ? cpu * 1000 / cycles : 0,
           cycles ? srv * 1000 / cycles : 0, errors);
    fflush(stdout);
    free(cyc.v);
    free(L);
    free(r);
}

/* ------------------------------------------------------------ handoff */
enum { W_ACQUIRING, W_SLEEPING, W_HOLDING, W_RELEASING, W_PARKED, W_DONE };
typedef struct {
    int state;
    int attempt;     /* attempts made in the current acquire() */
    double until;    /* SLEEPING / HOLDING: when that ends */
    double slept;    /* SLEEPING: since when */
    int woken;       /* ACQUIRING on a heard release: an extra attempt (the sleep goes on after) */
    unsigned epoch;  /* PARKED: the epoch of our own acquisition */
    int counted;     /* HOLDING and counted in holders */
    char value[RL_VALUE_LEN + 1];
} waiter;

/* The ceiling of the hand-off workload: one waiter alone doing acquire, hold,
 * release for a second on the same key. No hand-off can beat it; the waiters'
 * rate is read against it. */
static double handoff_ceiling(const char *key, int klen, rl_result *r) {
    long n = 0;
    double t0 = rl_now_ms();
    while (rl_now_ms() - t0 < 1000) {
        if (rl_acquire(cl, key, (size_t)klen, ttl_ms, r) != RL_OK || r->status != RL_STATUS_OK) continue;
        char value[RL_VALUE_LEN + 1];
        memcpy(value, r->value, sizeof value);
        rl_sleep(cl, hold_ms);
        rl_release(cl, key, (size_t)klen, value, r);
        n++;
    }
    return n * 1000 / (rl_now_ms() - t0);
}

static void wl_handoff(void) {
    char key[160];
    int klen = snprintf(key, sizeof key, "%sh", prefix);
    waiter *W = calloc((size_t)waiters, sizeof *W);
    rl_result *r = malloc(sizeof *r);
    double ceiling = handoff_ceiling(key, klen, r);
    int notify = atoi(envs("RB_NOTIFY", "1")) != 0;
    unsigned seen = 0;
    if (notify && rl_watch(cl, key, (size_t)klen) != RL_OK) notify = 0;
    vec lat = {0};
    long acquisitions = 0, gave_up = 0, rel_errors = 0, violations = 0;
    int holders = 0, stop = 0, busy = 0;
    unsigned epoch = 0;
    double last_release = 0;
    double s0 = srv_cpu_ms(), c0 = cpu_ms(RUSAGE_SELF), t0 = rl_now_ms(), t_stop = t0 + dur * 1e3, t1 = 0;
    for (int i = 0; i < waiters; i++) {
        W[i].state = W_ACQUIRING;
        W[i].attempt = 1;
        set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), i);
        busy++;
    }
    /* busy = waiters with an operation in flight; after stop, drain them (they are fast) */
    while (busy > 0 || !stop) {
        double now = rl_now_ms();
        if (!stop && now >= t_stop) {
            stop = 1;
            t1 = now;
        }
        /* timers; once stopped: sleepers and parked waiters leave, holders release */
        double next = now + 1000;
        for (int i = 0; i < waiters; i++) {
            waiter *w = &W[i];
            if (w->state == W_SLEEPING && (stop || now >= w->until)) {
                if (stop) {
                    w->state = W_DONE;
                    continue;
                }
                w->state = W_ACQUIRING;
                set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), i);
                busy++;
            } else if (w->state == W_HOLDING && (stop || now >= w->until)) {
                if (w->counted) {
                    holders--;
                    w->counted = 0;
                    last_release = rl_now_ms();
                }
                w->state = W_RELEASING;
                set_owner(rl_begin_release(cl, key, klen, w->value), i);
                busy++;
            } else if (w->state == W_PARKED && (stop || w->epoch != epoch)) {
                if (stop) {
                    w->state = W_DONE;
                    continue;
                }
                w->state = W_ACQUIRING;
                w->attempt = 1;
                set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), i);
                busy++;
            }
            if ((w->state == W_SLEEPING || w->state == W_HOLDING) && w->until < next) next = w->until;
        }
        if (stop && busy == 0) break;
        if (!stop && t_stop < next) next = t_stop;
        int ms = (int)(next - rl_now_ms() + 0.999);
        if (ms < 0) ms = 0;
        if (notify && busy == 0) rl_sleep_until(cl, key, (size_t)klen, seen, ms);
        else rl_run(cl, ms);
        if (notify && rl_heard(cl, key, (size_t)klen) != seen) {
            seen = rl_heard(cl, key, (size_t)klen);
            int in_flight = 0, first = -1;
            for (int i = 0; i < waiters; i++) {
                if (W[i].state == W_ACQUIRING) in_flight = 1;
                if (W[i].state == W_SLEEPING && (first < 0 || W[i].slept < W[first].slept)) first = i;
            }
            if (!in_flight && first >= 0 && !stop) {
                W[first].state = W_ACQUIRING;
                W[first].woken = 1;
                set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), first);
                busy++;
            }
        }
        while (rl_collect(cl, r)) {
            int i = owner[r->id % RL_ID_SLOTS];
            waiter *w = &W[i];
            busy--;
            double t = rl_now_ms();
            if (r->op == RL_OP_ACQUIRE) {
                int woken = w->woken;
                w->woken = 0;
                if (r->status == RL_STATUS_OK) {
                    memcpy(w->value, r->value, sizeof w->value);
                    w->state = W_HOLDING;
                    w->until = t + hold_ms;
                    if (stop) continue; /* released at once by the timer pass */
                    w->counted = 1;
                    if (++holders > 1) violations++;
                    if (last_release > 0) vpush(&lat, (t - last_release) * 1e3);
                    acquisitions++;
                    w->epoch = ++epoch;
                } else if (stop) {
                    w->state = W_DONE;
                } else if (woken) {
                    w->state = W_SLEEPING; /* until the policy's delay is over, first in line still */
                } else if (w->attempt < POLICY_ATTEMPTS) {
                    w->attempt++;
                    w->state = W_SLEEPING;
                    w->slept = t;
                    w->until = t + POLICY_MIN_MS + rl_random() * (POLICY_MAX_MS - POLICY_MIN_MS);
                } else { /* the library gave up: the waiter just calls acquire again */
                    gave_up++;
                    w->attempt = 1;
                    w->state = W_ACQUIRING;
                    set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), i);
                    busy++;
                }
            } else {
                if (r->status != RL_STATUS_OK) rel_errors++;
                if (stop) {
                    w->state = W_DONE;
                } else if (w->epoch == epoch) {
                    w->state = W_PARKED; /* wait until another waiter acquired */
                } else {
                    w->state = W_ACQUIRING;
                    w->attempt = 1;
                    set_owner(rl_begin_acquire(cl, key, klen, ttl_ms), i);
                    busy++;
                }
            }
        }
    }
    double cpu = cpu_ms(RUSAGE_SELF) - c0, srv = srv_cpu_ms() - s0, secs = (t1 - t0) / 1e3;
    long n = acquisitions;
    out_common();
    printf("\"workload\":\"handoff\",\"waiters\":%d,\"hold_ms\":%d,\"cycles\":%ld,\"secs\":%.3f,\"rate\":%.0f,\"ceiling_rate\":%.0f,"
           "\"p50_us\":%.1f,\"p99_us\":%.1f,\"cpu_ms_per_1k\":%.1f,\"srv_cpu_ms_per_1k\":%.1f,\"errors\":%ld,"
           "\"acquire_gave_up\":%ld,\"violations\":%ld,\"note\":\"1 process, 1 client, %d async waiters; "
           "default policy jitter 50-250 ms x 32; notify %s\"}\n",
           waiters, hold_ms, n, secs, n / secs, ceiling, vpct(&lat, 50), vpct(&lat, 99), n ? cpu * 1000 / n : 0,
           n ? srv * 1000 / n : 0, rel_errors, gave_up, violations, waiters, notify ? "on" : "off");
    fflush(stdout);
    if (notify) rl_unwatch(cl, key, (size_t)klen);
    free(lat.v);
    free(W);
    free(r);
}

/* ------------------------------------------------------------ sem */
#define SEM_MAXREC 65536 /* hold intervals per locker */
typedef struct {
    int i, gave_up, rel_errors;
    long n;
    double *ask, *acq, *rel; /* acquire asked / got / release called, rl_now_ms */
} sem_locker;
static const char *sem_key;
static int sem_klen, sem_limit;
static volatile int sem_stop;

/* Hold for ms from now, to the microsecond (rl_sleep counts whole
 * milliseconds and the event loop may add one), serving the client. */
static void sem_hold(rl_client *c, int ms) {
    double until = rl_now_ms() + ms;
    while (rl_now_ms() < until) rl_run_until(c, until);
}

/* Wait up to 2 ms after a first wake-up until a quorum of nodes said the
 * slot is free (as redlock.wait does for a semaphore's waiter). */
static void quorum_of_wakes(rl_client *c, unsigned seen) {
    double by = rl_now_ms() + 2;
    unsigned h = rl_heard(c, sem_key, (size_t)sem_klen);
    while ((unsigned)(h - seen) < (unsigned)rl_client_quorum(c)) {
        int left = (int)(by - rl_now_ms() + 0.999);
        if (left <= 0 || rl_sleep_until(c, sem_key, (size_t)sem_klen, h, left) != 1) return;
        h = rl_heard(c, sem_key, (size_t)sem_klen);
    }
}

/* One locker: its own client, watching the semaphore throughout. */
static void *locker_main(void *arg) {
    sem_locker *me = arg;
    char err[RL_ERR_LEN];
    rl_options opts;
    rl_options_init(&opts);
    opts.tls.cafile = getenv("RB_TLS_CAFILE");
    rl_client *c = rl_client_new(up, nodes, &opts, err, sizeof err);
    if (!c) die(err);
    rl_result *r = malloc(sizeof *r);
    if (rl_watch(c, sem_key, (size_t)sem_klen) != RL_OK) die(rl_client_errstr(c));
    rl_sleep(c, 100);
    while (!sem_stop) {
        double asked = rl_now_ms(), ticket = rl_wall_ms();
        unsigned seen = rl_heard(c, sem_key, (size_t)sem_klen);
        int attempts = 0, got = 0;
        while (!sem_stop) {
            if (rl_acquire_slot(c, sem_key, (size_t)sem_klen, sem_limit, ttl_ms, ticket, r) == RL_OK &&
                r->status == RL_STATUS_OK) {
                got = 1;
                break;
            }
            if (++attempts == POLICY_ATTEMPTS) { /* the library gave up: ask again */
                me->gave_up++;
                attempts = 0;
            }
            int delay = (int)(POLICY_MIN_MS + rl_random() * (POLICY_MAX_MS - POLICY_MIN_MS));
            if (rl_sleep_until(c, sem_key, (size_t)sem_klen, seen, delay) == 1) quorum_of_wakes(c, seen);
            seen = rl_heard(c, sem_key, (size_t)sem_klen);
        }
        if (!got) break;
        double t = rl_now_ms();
        char value[RL_VALUE_LEN + 1];
        int slot = r->slot;
        memcpy(value, r->value, sizeof value);
        sem_hold(c, hold_ms);
        if (me->n < SEM_MAXREC) {
            me->ask[me->n] = asked, me->acq[me->n] = t, me->rel[me->n] = rl_now_ms();
            me->n++;
        }
        if (rl_on_slot(c, RL_OP_RELEASE, sem_key, (size_t)sem_klen, slot, value, 0, r) != RL_OK ||
            r->status != RL_STATUS_OK)
            me->rel_errors++;
    }
    rl_unwatch(c, sem_key, (size_t)sem_klen);
    free(r);
    rl_client_free(c);
    return NULL;
}

typedef struct {
    double t;
    int d;
} sem_event;

static int event_cmp(const void *a, const void *b) {
    const sem_event *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->d - y->d; /* a release and an acquire at the same moment: the release first */
}

/* The ceiling: one client alone on the semaphore, acquire + hold + release
 * for a second, times the limit. */
static double sem_ceiling(rl_result *r) {
    long n = 0;
    double t0 = rl_now_ms();
    while (rl_now_ms() - t0 < 1000) {
        if (rl_acquire_slot(cl, sem_key, (size_t)sem_klen, sem_limit, ttl_ms, 0, r) != RL_OK ||
            r->status != RL_STATUS_OK)
            continue;
        char value[RL_VALUE_LEN + 1];
        int slot = r->slot;
        memcpy(value, r->value, sizeof value);
        sem_hold(cl, hold_ms);
        rl_on_slot(cl, RL_OP_RELEASE, sem_key, (size_t)sem_klen, slot, value, 0, r);
        n++;
    }
    return n * 1000 / (rl_now_ms() - t0) * sem_limit;
}

/* RB_SEM_FORM=client (the default): the lockers are state machines on the
 * one client, in one thread, as the peer's lockers share one process and
 * its connections. They wait in the order they asked: the first of them
 * attempts while fewer acquires are in flight than slots this process does
 * not hold. A holder's release goes out with that attempt behind it, on the
 * same connections, so each node frees the slot before it is asked for one.
 * A refused attempt (another process holds the slot, or the nodes did not
 * agree) puts its locker first again, to wait for a release heard or its
 * policy's delay. The loop waits with rl_run_until for the next hold's end
 * (or a result, or a release heard). Each records ask / acq / rel as
 * locker_main does. */
enum { M_QUEUED, M_ACQUIRING, M_HOLDING, M_DONE };
typedef struct {
    int state, slot;
    double asked, ticket, got, until;
    char value[RL_VALUE_LEN + 1];
} sem_mux;

typedef struct {
    int *at, head, n, cap; /* lockers waiting, first at[head] */
} sem_line;
static void line_push(sem_line *q, int i) { q->at[(q->head + q->n++) % q->cap] = i; }
static void line_push_front(sem_line *q, int i) {
    q->head = (q->head + q->cap - 1) % q->cap;
    q->at[q->head] = i;
    q->n++;
}
static int line_pop(sem_line *q) {
    int i = q->at[q->head];
    q->head = (q->head + 1) % q->cap;
    q->n--;
    return i;
}

static void sem_one_client(sem_locker *L, int W, double t_stop) {
    sem_mux *M = calloc((size_t)W, sizeof *M);
    sem_line line = {calloc((size_t)W, sizeof(int)), 0, 0, W};
    rl_result *r = malloc(sizeof *r);
    if (!M || !line.at || !r) die("out of memory");
    if (rl_watch(cl, sem_key, (size_t)sem_klen) != RL_OK) die(rl_client_errstr(cl));
    rl_sleep(cl, 100);
    unsigned seen = rl_heard(cl, sem_key, (size_t)sem_klen);
    int holding = 0, acquiring = 0, busy = 0, stop = 0;
    double polled_at = 0; /* the first may attempt from then on (0: now) */
    for (int i = 0; i < W; i++) {
        M[i].asked = rl_now_ms(), M[i].ticket = rl_wall_ms();
        line_push(&line, i);
    }
    while (!stop || busy > 0) {
        double now = rl_now_ms(), next = now + 1000;
        if (now >= t_stop) stop = 1;
        for (int i = 0; i < W; i++) { /* holds that are over: release, and ask again */
            sem_mux *m = &M[i];
            if (m->state != M_HOLDING) continue;
            if (!stop && now < m->until) {
                if (m->until < next) next = m->until;
                continue;
            }
            sem_locker *me = &L[i];
            if (me->n < SEM_MAXREC) {
                me->ask[me->n] = m->asked, me->acq[me->n] = m->got, me->rel[me->n] = now;
                me->n++;
            }
            set_owner(rl_begin_on_slot(cl, RL_OP_RELEASE, sem_key, (size_t)sem_klen, m->slot, m->value, 0), -1 - i);
            busy++, holding--;
            m->state = stop ? M_DONE : M_QUEUED;
            if (!stop) {
                m->asked = now, m->ticket = rl_wall_ms();
                line_push(&line, i);
            }
        }
        unsigned h = rl_heard(cl, sem_key, (size_t)sem_klen);
        if (h != seen) seen = h, polled_at = 0;
        while (!stop && line.n > 0 && holding + acquiring < sem_limit && now >= polled_at) {
            int i = line_pop(&line);
            M[i].state = M_ACQUIRING;
            set_owner(rl_begin_acquire_slot(cl, sem_key, (size_t)sem_klen, sem_limit, ttl_ms, M[i].ticket), i);
            busy++, acquiring++;
        }
        if (polled_at > now && polled_at < next) next = polled_at;
        if (!stop && t_stop < next) next = t_stop;
        rl_run_until(cl, next); /* or a release heard, or a result */
        while (rl_collect(cl, r)) {
            int who = owner[r->id % RL_ID_SLOTS];
            busy--;
            if (who < 0) { /* a release */
                if (r->status != RL_STATUS_OK) L[-1 - who].rel_errors++;
                continue;
            }
            sem_mux *m = &M[who];
            acquiring--;
            if (r->status == RL_STATUS_OK) {
                holding++;
                m->state = M_HOLDING, m->slot = r->slot, m->got = rl_now_ms();
                m->until = m->got + hold_ms;
                memcpy(m->value, r->value, sizeof m->value);
            } else if (stop) {
                m->state = M_DONE;
            } else {
                m->state = M_QUEUED;
                line_push_front(&line, who);
                polled_at = rl_now_ms() + POLICY_MIN_MS + rl_random() * (POLICY_MAX_MS - POLICY_MIN_MS);
            }
        }
    }
    rl_unwatch(cl, sem_key, (size_t)sem_klen);
    free(M), free(line.at), free(r);
}

static void wl_sem(void) {
    char key[160];
    sem_klen = snprintf(key, sizeof key, "%ss", prefix);
    sem_key = key;
    sem_limit = atoi(envs("RB_SEM_LIMIT", "4"));
    int W = atoi(envs("RB_SEM_LOCKERS", "16"));
    if (W < 1 || W > 256 || sem_limit < 1 || sem_limit > RL_MAX_LIMIT) die("bad RB_SEM_LOCKERS or RB_SEM_LIMIT");
    rl_result *r = malloc(sizeof *r);
    double ceiling = sem_ceiling(r);
    sem_locker *L = calloc((size_t)W, sizeof *L);
    pthread_t *th = calloc((size_t)W, sizeof *th);
    sem_stop = 0;
    int one = strcmp(envs("RB_SEM_FORM", "client"), "threads") != 0;
    double s0 = srv_cpu_ms(), c0 = cpu_ms(RUSAGE_SELF), t0 = rl_now_ms(), t1;
    for (int i = 0; i < W; i++) {
        L[i].i = i;
        L[i].ask = malloc(SEM_MAXREC * sizeof(double));
        L[i].acq = malloc(SEM_MAXREC * sizeof(double));
        L[i].rel = malloc(SEM_MAXREC * sizeof(double));
        if (!L[i].ask || !L[i].acq || !L[i].rel || (!one && pthread_create(&th[i], NULL, locker_main, &L[i]) != 0))
            die("no memory or threads for the lockers");
    }
    if (one) {
        sem_one_client(L, W, t0 + dur * 1e3);
        t1 = t0 + dur * 1e3;
    } else {
        rl_sleep(cl, (int)(dur * 1e3));
        sem_stop = 1;
        t1 = rl_now_ms();
        for (int i = 0; i < W; i++) pthread_join(th[i], NULL);
    }
    double cpu = cpu_ms(RUSAGE_SELF) - c0, srv = srv_cpu_ms() - s0, secs = (t1 - t0) / 1e3;
    long total = 0, gave_up = 0, rel_errors = 0;
    for (int i = 0; i < W; i++) total += L[i].n, gave_up += L[i].gave_up, rel_errors += L[i].rel_errors;
    sem_event *ev = malloc((size_t)(2 * total + 1) * sizeof *ev);
    vec waits = {0}, held = {0};
    long n = 0, ne = 0;
    for (int i = 0; i < W; i++)
        for (long k = 0; k < L[i].n; k++) {
            if (L[i].acq[k] > t1) continue;
            ev[ne++] = (sem_event){L[i].acq[k], 1};
            ev[ne++] = (sem_event){L[i].rel[k], -1};
            vpush(&waits, (L[i].acq[k] - L[i].ask[k]) * 1e3);
            vpush(&held, (L[i].rel[k] - L[i].acq[k]) * 1e3);
            n++;
        }
    qsort(ev, (size_t)ne, sizeof *ev, event_cmp);
    int holders = 0, most = 0;
    long violations = 0;
    for (long k = 0; k < ne; k++) {
        holders += ev[k].d;
        if (holders > most) most = holders;
        if (ev[k].d > 0 && holders > sem_limit) violations++;
    }
    out_common();
    printf("\"workload\":\"sem\",\"lockers\":%d,\"limit\":%d,\"max_holders\":%d,\"hold_ms\":%d,\"cycles\":%ld,"
           "\"secs\":%.3f,\"rate\":%.0f,\"ceiling_rate\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"hold_p50_us\":%.1f,"
           "\"cpu_ms_per_1k\":%.1f,\"srv_cpu_ms_per_1k\":%.1f,\"errors\":%ld,\"acquire_gave_up\":%ld,\"violations\":%ld,"
           "\"note\":\"%s\"}\n",
           W, sem_limit, most, hold_ms, n, secs, n / secs, ceiling, vpct(&waits, 50), vpct(&waits, 99), vpct(&held, 50),
           n ? cpu * 1000 / n : 0, n ? srv * 1000 / n : 0, rel_errors, gave_up, violations,
           one ? "1 process, 1 client, 1 thread: the lockers wait in line, a release goes out with the next "
                 "rl_begin_acquire_slot behind it"
               : "1 process, a thread and a client per locker, rl_acquire_slot with a ticket, rl_sleep_until "
                 "between attempts (default policy jitter 50-250 ms)");
    fflush(stdout);
    for (int i = 0; i < W; i++) free(L[i].ask), free(L[i].acq), free(L[i].rel);
    free(waits.v);
    free(held.v);
    free(ev);
    free(L);
    free(th);
    free(r);
}

/* The nodes' URLs into urls/up/nodes: RB_SERVERS when set (URLs separated by
 * commas or spaces, a cluster node one redis-cluster://h:p+h:p URL), else
 * RB_HOST and RB_PORTS as the harness gives them (rediss:// when tls). */
static void node_urls(int tls) {
    const char *servers = getenv("RB_SERVERS");
    if (servers && *servers) {
        char *list = strdup(servers);
        for (char *s = strtok(list, ", \t\n"); s && nodes < MAXNODES; s = strtok(NULL, ", \t\n")) {
            if (strlen(s) >= sizeof urls[0]) die("a URL of RB_SERVERS is too long");
            strcpy(urls[nodes++], s);
        }
        free(list);
    } else {
        const char *host = envs("RB_HOST", "127.0.0.1");
        char *pl = strdup(envs("RB_PORTS", "17101,17102,17103,17104,17105"));
        for (char *s = strtok(pl, ","); s && nodes < MAXNODES; s = strtok(NULL, ","))
            snprintf(urls[nodes++], sizeof urls[0], "%s://%s:%d", tls ? "rediss" : "redis", host, atoi(s));
        free(pl);
    }
    if (!nodes) die("no nodes (RB_SERVERS or RB_PORTS)");
    for (int i = 0; i < nodes; i++) up[i] = urls[i];
}

int main(void) {
    dur = atof(envs("RB_DUR", "5"));
    seq_max = atol(envs("RB_SEQ_MAX", "20000"));
    conc = atoi(envs("RB_CONC", "64"));
    waiters = atoi(envs("RB_WAITERS", "8"));
    hold_ms = atoi(envs("RB_HOLD_MS", "1"));
    ttl_ms = atoi(envs("RB_TTL_MS", "10000"));
    warmup = atol(envs("RB_WARMUP", "300"));
    no_pct = atoi(envs("RB_PROFILE", "0"));
    piddir = getenv("RB_PIDDIR");
    clk_tck = atoi(envs("RB_CLK_TCK", "100"));
    snprintf(prefix, sizeof prefix, "rb:%s:%d:", envs("RB_LABEL", "redlock-c"), (int)getpid());
    load_pids();

    /* RB_TLS_CAFILE: the nodes' ports serve TLS (rediss://), verified with that CA */
    const char *cafile = getenv("RB_TLS_CAFILE");
    rl_options opts;
    rl_options_init(&opts);
    opts.tls.cafile = cafile;
    /* RB_STATS=0: counting off (rl_options.no_stats), for measuring what counting costs */
    const char *stats = getenv("RB_STATS");
    opts.no_stats = stats && strcmp(stats, "0") == 0;
#ifdef RL_MAX_REPLICAS /* an older redlock.h (bench/ab) has no such option */
    /* RB_REPLICAS=N: every vote waits for N replicas (rl_options.replicas; bench/replicas) */
    opts.replicas = atoi(envs("RB_REPLICAS", "0"));
#endif
    node_urls(cafile != NULL);
    char err[RL_ERR_LEN];
    cl = rl_client_new(up, nodes, &opts, err, sizeof err);
    if (!cl) die(err);
    /* connections start without blocking: let them come up before timing anything */
    rl_sleep(cl, 100);
    {
        rl_result *r = malloc(sizeof *r);
        char k[160];
        int kl = snprintf(k, sizeof k, "%sprobe", prefix);
        if (rl_acquire(cl, k, kl, ttl_ms, r) != RL_OK) die(rl_client_errstr(cl));
        if (r->status != RL_STATUS_OK) {
            fprintf(stderr, "redlock driver-c: probe acquire: %s\n", rl_status_word(r->status));
            for (int i = 0; i < r->nodes; i++)
                fprintf(stderr, "  %s: %s %s\n", rl_client_node_name(cl, i), rl_node_state_word(r->node[i].state),
                        r->node[i].errstr);
            exit(1);
        }
        rl_release(cl, k, kl, r->value, r);
        free(r);
    }

    char *wls = strdup(envs("RB_WORKLOADS", "seq,conc,handoff"));
    for (char *s = strtok(wls, ","); s; s = strtok(NULL, ",")) {
        if (!strcmp(s, "seq")) wl_seq();
        else if (!strcmp(s, "conc")) wl_conc();
        else if (!strcmp(s, "handoff")) wl_handoff();
        else if (!strcmp(s, "sem")) wl_sem();
        else die("unknown workload");
    }
    free(wls);
    rl_client_free(cl);
    return 0;
}
