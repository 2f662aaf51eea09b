/*
 * soak.c — long runs of the C API in one process, built with the sanitizers
 * by bench/soak (which starts the nodes and passes their ports):
 *
 *   cycles     RB_SOAK_CYCLES lock/unlock cycles (default 1000000), with
 *              RB_SOAK_CONC of them in flight on ONE client (default 64):
 *              rl_begin_acquire / rl_begin_release, rl_run + rl_collect.
 *              VmRSS at the start, every RB_SOAK_EVERY cycles (default
 *              100000) and at the end. RB_SOAK_CYCLE_S > 0 ends the phase
 *              after that many seconds, if the cycles are not done by then.
 *   keep       RB_SOAK_KEEP locks (default 10000, 0: skip) acquired, handed
 *              to one rl_keeper with ttl RB_SOAK_KEEP_TTL ms (default 15000:
 *              an extension every 5 s), kept RB_SOAK_KEEP_S seconds (default
 *              600), VmRSS and the held/lost counts sampled every
 *              RB_SOAK_SAMPLE_S seconds (default 60); then released.
 *
 * Environment: RB_PORTS (comma-separated, required), RB_HOST (127.0.0.1),
 * RB_SOAK_TTL (ttl of the cycles' locks, ms, default 10000).
 * Every line is "soak: ..."; the exit status is 0 when every cycle and every
 * kept lock went as expected (LeakSanitizer adds its own verdict at exit).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "redlock.h"

static long envl(const char *k, long d) {
    const char *v = getenv(k);
    return v && *v ? strtol(v, NULL, 10) : d;
}

static void die(const char *m) {
    fprintf(stderr, "soak: %s\n", m);
    exit(1);
}

/* VmRSS of this process in kB, or -1. */
static long rss_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    fclose(f);
    return kb;
}

static rl_client *cl;
static int owner[RL_ID_SLOTS];

static void set_owner(int id, int who) {
    if (id < 0) die(rl_client_errstr(cl));
    owner[id % RL_ID_SLOTS] = who;
}

typedef struct {
    char key[64];
    int klen;
    char value[RL_VALUE_LEN + 1];
} locker;

/* Phase a: cycles lock/unlock cycles, conc in flight. Return the errors. */
static long cycles_phase(long cycles, int conc, int ttl, long every, long max_s) {
    locker *L = calloc((size_t)conc, sizeof *L);
    rl_result *r = malloc(sizeof *r);
    if (!L || !r) die("out of memory");
    long started = 0, done = 0, errors = 0, next_report = every;
    int active = 0;
    double t0 = rl_now_ms();
    printf("soak: cycles start rss_kb=%ld cycles=%ld inflight=%d ttl_ms=%d\n", rss_kb(), cycles, conc, ttl);
    fflush(stdout);
    for (int j = 0; j < conc && started < cycles; j++, started++, active++) {
        L[j].klen = snprintf(L[j].key, sizeof L[j].key, "soak:c:%d", j);
        set_owner(rl_begin_acquire(cl, L[j].key, L[j].klen, ttl), j);
    }
    while (active > 0) {
        rl_run(cl, 1000);
        while (rl_collect(cl, r)) {
            int j = owner[r->id % RL_ID_SLOTS];
            locker *l = &L[j];
            if (r->op == RL_OP_ACQUIRE && r->status == RL_STATUS_OK) {
                memcpy(l->value, r->value, sizeof l->value);
                set_owner(rl_begin_release(cl, l->key, l->klen, l->value), j);
                continue;
            }
            /* a release, or an acquire that failed (no contention here: an error) */
            if (r->status != RL_STATUS_OK) {
                errors++;
                if (errors <= 10)
                    fprintf(stderr, "soak: %s %s (ok %d, failed %d)\n", r->op == RL_OP_ACQUIRE ? "acquire" : "release",
                            rl_status_word(r->status), r->ok, r->failed);
            }
            done++;
            if (done >= next_report) {
                double s = (rl_now_ms() - t0) / 1e3;
                printf("soak: cycles %ld rss_kb=%ld secs=%.0f rate=%.0f/s errors=%ld\n", done, rss_kb(), s, done / s,
                       errors);
                fflush(stdout);
                next_report += every;
            }
            if (started < cycles && (max_s <= 0 || rl_now_ms() - t0 < max_s * 1e3)) {
                started++;
                set_owner(rl_begin_acquire(cl, l->key, l->klen, ttl), j);
            } else {
                active--;
            }
        }
    }
    double s = (rl_now_ms() - t0) / 1e3;
    printf("soak: cycles end rss_kb=%ld cycles=%ld secs=%.0f rate=%.0f/s errors=%ld\n", rss_kb(), done, s,
           done / s, errors);
    fflush(stdout);
    free(L);
    free(r);
    return errors;
}

/* Phase b: keep nlocks locks for secs seconds. Return the locks lost. */
static long keep_phase(const char *const *urls, int nurls, int nlocks, int ttl, long secs, long sample) {
    char err[RL_ERR_LEN];
    rl_keeper *k = rl_keeper_new(urls, nurls, NULL, err, sizeof err);
    if (!k) die(err);
    locker *L = calloc((size_t)nlocks, sizeof *L);
    int *ids = malloc((size_t)nlocks * sizeof *ids);
    rl_result *r = malloc(sizeof *r);
    if (!L || !ids || !r) die("out of memory");
    printf("soak: keep start rss_kb=%ld locks=%d ttl_ms=%d secs=%ld\n", rss_kb(), nlocks, ttl, secs);
    fflush(stdout);

    /* Acquire them all, 256 in flight, and hand each to the keeper. */
    int begun = 0, kept = 0, inflight = 0;
    double *began = malloc((size_t)nlocks * sizeof *began);
    if (!began) die("out of memory");
    while (kept < nlocks) {
        while (inflight < 256 && begun < nlocks) {
            locker *l = &L[begun];
            l->klen = snprintf(l->key, sizeof l->key, "soak:k:%d", begun);
            began[begun] = rl_now_ms();
            set_owner(rl_begin_acquire(cl, l->key, l->klen, ttl), begun);
            begun++, inflight++;
        }
        rl_run(cl, 1000);
        while (rl_collect(cl, r)) {
            int j = owner[r->id % RL_ID_SLOTS];
            inflight--;
            if (r->status != RL_STATUS_OK) {
                set_owner(rl_begin_acquire(cl, L[j].key, L[j].klen, ttl), j);
                began[j] = rl_now_ms();
                inflight++;
                continue;
            }
            memcpy(L[j].value, r->value, sizeof L[j].value);
            ids[j] = rl_keeper_add(k, L[j].key, L[j].klen, L[j].value, ttl, began[j] + r->validity_ms, 0, err,
                                   sizeof err);
            if (ids[j] < 0) die(err);
            kept++;
        }
    }
    free(began);

    double t0 = rl_now_ms();
    long first = -1, last = -1, lost = 0;
    for (long t = 0; t <= secs; t += sample) {
        double until = t0 + t * 1e3;
        while (rl_now_ms() < until) {
            double left = until - rl_now_ms();
            rl_sleep(cl, left > 1000 ? 1000 : (int)left + 1);
        }
        int held = 0;
        lost = 0;
        for (int j = 0; j < nlocks; j++) {
            int st = rl_keeper_state(k, ids[j], NULL);
            if (st == RL_KEEP_HELD) held++;
            else lost++;
        }
        long kb = rss_kb();
        if (first < 0 && t >= sample) first = kb;
        last = kb;
        printf("soak: keep %lds rss_kb=%ld held=%d lost=%ld\n", t, kb, held, lost);
        fflush(stdout);
    }
    if (first < 0) first = last;
    long grow = last - first;
    long slack = first / 50 > 1024 ? first / 50 : 1024; /* 2 %, at least 1 MB */
    printf("soak: keep end rss_kb=%ld growth_after_first_sample_kb=%ld %s lost=%ld\n", last, grow,
           grow <= slack ? "flat" : "NOT FLAT", lost);
    int released = rl_keeper_release(k, 30000);
    printf("soak: keep released=%d of %d\n", released, nlocks);
    fflush(stdout);
    rl_keeper_free(k);
    free(L);
    free(ids);
    free(r);
    return lost + (nlocks - released);
}

int main(void) {
    const char *ports = getenv("RB_PORTS");
    const char *host = getenv("RB_HOST");
    if (!ports || !*ports) die("RB_PORTS not set (bench/soak sets it)");
    if (!host || !*host) host = "127.0.0.1";
    char urlbuf[RL_MAX_NODES][128];
    const char *urls[RL_MAX_NODES];
    int n = 0;
    for (const char *p = ports; *p && n < RL_MAX_NODES;) {
        snprintf(urlbuf[n], sizeof urlbuf[n], "redis://%s:%ld", host, strtol(p, NULL, 10));
        urls[n] = urlbuf[n];
        n++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    char err[RL_ERR_LEN];
    cl = rl_client_new(urls, n, NULL, err, sizeof err);
    if (!cl) die(err);
    rl_sleep(cl, 200); /* let the connections come up */

    long bad = 0;
    long cycles = envl("RB_SOAK_CYCLES", 1000000);
    if (cycles > 0)
        bad += cycles_phase(cycles, (int)envl("RB_SOAK_CONC", 64), (int)envl("RB_SOAK_TTL", 10000),
                            envl("RB_SOAK_EVERY", 100000), envl("RB_SOAK_CYCLE_S", 0));
    long keep = envl("RB_SOAK_KEEP", 10000);
    if (keep > 0)
        bad += keep_phase(urls, n, (int)keep, (int)envl("RB_SOAK_KEEP_TTL", 15000), envl("RB_SOAK_KEEP_S", 600),
                          envl("RB_SOAK_SAMPLE_S", 60));
    rl_client_free(cl);
    printf("soak: done, %ld unexpected results; rss_kb=%ld\n", bad, rss_kb());
    return bad ? 1 : 0;
}
