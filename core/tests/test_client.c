/* test_client.c — the client and the keeper against real redis-server
 * processes on loopback (started and stopped here, by pid), so the network
 * paths run under the sanitizers too. Skips (exit 77) when redis-server is
 * not on PATH. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "redlock.h"
#include "check.h"
#include "nodes.h"

#define NODES 3

static pid_t pids[NODES];
static int ports[NODES];
static char urls[NODES][64];
static const char *url_list[NODES];

/* The verdict of a blocking call: its rl_result's status, or RL_ERR if the
 * operation did not start. */
static int verdict(int rc, const rl_result *r) {
    return rc == RL_OK ? r->status : RL_ERR;
}

static void stop_node(int i) {
    kill_node(&pids[i]);
}

static void stop_all(void) {
    for (int i = 0; i < NODES; i++) stop_node(i);
}

/* 1 if node i holds value under key (asked with redis-cli, not the client). */
static int node_holds(int i, const char *key, const char *value) {
    char cmd[160], got[64] = "";
    snprintf(cmd, sizeof(cmd), "timeout 5 redis-cli -p %d GET %s 2>/dev/null", ports[i], key);
    FILE *p = popen(cmd, "r");
    if (p == NULL) return 0;
    if (fgets(got, sizeof(got), p) == NULL) got[0] = '\0';
    pclose(p);
    got[strcspn(got, "\n")] = '\0';
    return strcmp(got, value) == 0;
}

/* Wait until every node takes part (they are up and we are connected): a
 * lock this client takes shows on every node. Rounds decide at quorum, so
 * that is looked up on the nodes themselves while the client serves the
 * rest of the round (its tail). */
static int wait_ready(rl_client *c, rl_result *r) {
    for (int tries = 0; tries < 200; tries++) {
        if (verdict(rl_acquire(c, "ready", 5, 1000, r), r) == RL_STATUS_OK) {
            char value[RL_VALUE_LEN + 1];
            memcpy(value, r->value, sizeof(value));
            int everywhere = 0;
            for (int k = 0; k < 10 && !everywhere; k++) {
                rl_sleep(c, 5);
                everywhere = 1;
                for (int i = 0; i < NODES && everywhere; i++) everywhere = node_holds(i, "ready", value);
            }
            if (verdict(rl_release(c, "ready", 5, value, r), r) == RL_STATUS_OK && everywhere) return 0;
        }
        rl_sleep(c, 25);
    }
    return -1;
}

static void acquire_release_extend(rl_client *c, rl_result *r) {
    CHECK_INT(verdict(rl_acquire(c, "res\0x", 5, 5000, r), r), RL_STATUS_OK);
    CHECK(r->validity_ms > 4000 && r->validity_ms <= 5000 - 52);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    rl_result *other = calloc(1, sizeof(*other));
    CHECK_INT(verdict(rl_acquire(c, "res\0x", 5, 5000, other), other), RL_STATUS_BUSY);
    CHECK(other->taken >= NODES / 2 + 1); /* decided as soon as quorum was impossible */
    CHECK_INT(verdict(rl_extend(c, "res\0x", 5, value, 20000, r), r), RL_STATUS_OK);
    CHECK(r->validity_ms > 19000);
    CHECK_INT(verdict(rl_release(c, "res\0x", 5, value, r), r), RL_STATUS_OK);
    CHECK_INT(r->failed, 0);
    CHECK_INT(verdict(rl_release(c, "res\0x", 5, value, r), r), RL_STATUS_NOT_HELD);
    CHECK_INT(verdict(rl_extend(c, "res\0x", 5, value, 1000, r), r), RL_STATUS_NOT_HELD);
    free(other);
}

/* Hand-off: a waiter watching a resource hears another client's release
 * (one message per node), and its sleep ends early; unwatched, it hears
 * nothing and sleeps the whole time. */
static void waiter_hears_a_release(rl_client *c, rl_result *r) {
    char err[RL_ERR_LEN];
    rl_client *w = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    CHECK(w != NULL);
    CHECK_INT(rl_client_listening(w), 0);
    CHECK_INT(rl_heard(w, "hand\0off", 8), 0);
    CHECK_INT(rl_watch(w, "hand\0off", 8), RL_OK);
    CHECK_INT(rl_watch(w, "hand\0off", 8), RL_OK); /* watches nest */
    CHECK_INT(rl_watch(w, "", 0), RL_ERR);
    double until = rl_now_ms() + 2000;
    while (rl_client_listening(w) < NODES && rl_now_ms() < until) rl_sleep(w, 5);
    CHECK_INT(rl_client_listening(w), NODES);
    rl_sleep(w, 50); /* the SUBSCRIBEs reached the nodes */
    unsigned seen = rl_heard(w, "hand\0off", 8);
    CHECK_INT(seen, 0);
    CHECK_INT(verdict(rl_acquire(c, "hand\0off", 8, 5000, r), r), RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(c, "hand\0off", 8, r->value, r), r), RL_STATUS_OK);
    double t0 = rl_now_ms();
    CHECK_INT(rl_sleep_until(w, "hand\0off", 8, seen, 3000), 1);
    CHECK(rl_now_ms() - t0 < 1000);
    CHECK_INT(rl_sleep_until(w, "hand\0off", 8, seen, 3000), 1); /* at once: already moved */
    rl_sleep(w, 50);
    CHECK_INT(rl_heard(w, "hand\0off", 8), NODES); /* every node published */
    CHECK_INT(rl_heard(w, NULL, 0), NODES);
    /* a release that deletes nothing publishes nothing */
    CHECK_INT(verdict(rl_release(c, "hand\0off", 8, r->value, r), r), RL_STATUS_NOT_HELD);
    CHECK_INT(rl_sleep_until(w, "hand\0off", 8, NODES, 100), 0);
    rl_unwatch(w, "hand\0off", 8);
    rl_unwatch(w, "hand\0off", 8);
    rl_unwatch(w, "hand\0off", 8); /* one too many: ignored */
    CHECK_INT(rl_heard(w, "hand\0off", 8), 0);
    rl_sleep(w, 50); /* the UNSUBSCRIBEs reached the nodes */
    CHECK_INT(verdict(rl_acquire(c, "hand\0off", 8, 5000, r), r), RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(c, "hand\0off", 8, r->value, r), r), RL_STATUS_OK);
    rl_sleep(w, 50);
    CHECK_INT(rl_heard(w, NULL, 0), NODES); /* nothing more heard */
    CHECK_INT(rl_client_listening(w), NODES); /* kept open */
    rl_client_free(w);
}

/* rl_client_close: what was acquired and not collected is let go on the
 * nodes, a lock collected stays held, every later call that would use a
 * connection is refused with the reason, reading calls still answer, and
 * rl_client_free frees the rest (ASan: nothing twice, nothing leaked). */
static void a_closed_client_refuses_calls(rl_client *probe, rl_result *r) {
    char err[RL_ERR_LEN];
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    CHECK(c != NULL);
    CHECK_INT(rl_acquire(c, "closed:kept", 11, 30000, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_OK);
    char kept[RL_VALUE_LEN + 1];
    memcpy(kept, r->value, sizeof(kept));
    CHECK(rl_begin_acquire(c, "closed:open", 11, 30000) >= 0);
    CHECK_INT(rl_watch(c, "closed:kept", 11), RL_OK);
    rl_sleep(c, 200);
    CHECK(rl_client_listening(c) > 0);
    rl_client_close(c);
    rl_client_close(c); /* twice: nothing more */
    /* its gauges say so (before: still listening, still up) */
    CHECK_INT(rl_client_listening(c), 0);
    rl_stats *st = calloc(1, sizeof(*st));
    rl_client_stats(c, st);
    for (int i = 0; i < NODES; i++) CHECK_INT(st->node[i].up, 0);
    free(st);
    CHECK_INT(rl_begin_acquire(c, "closed:x", 8, 1000), RL_ERR);
    CHECK(strstr(rl_client_errstr(c), "this client was closed") != NULL);
    CHECK_INT(rl_acquire(c, "closed:x", 8, 1000, r), RL_ERR);
    CHECK_INT(rl_run(c, 10), RL_ERR);
    CHECK_INT(rl_run_until(c, rl_now_ms() + 10), RL_ERR);
    CHECK_INT(rl_collect(c, r), RL_ERR);
    CHECK_INT(rl_watch(c, "closed:y", 8), RL_ERR);
    double t0 = rl_now_ms();
    rl_sleep(c, 20);
    CHECK(rl_now_ms() - t0 >= 20);
    CHECK_INT(rl_client_nodes(c), NODES);
    (void)rl_heard(c, NULL, 0);
    rl_unwatch(c, "closed:kept", 11);
    rl_client_free(c);
    /* the abandoned acquire holds nothing; the collected one is still held */
    CHECK_INT(rl_acquire(probe, "closed:open", 11, 1000, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(probe, "closed:open", 11, r->value, r), r), RL_STATUS_OK);
    CHECK_INT(rl_acquire(probe, "closed:kept", 11, 1000, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_BUSY);
    CHECK_INT(verdict(rl_release(probe, "closed:kept", 11, kept, r), r), RL_STATUS_OK);
    rl_client_close(NULL);
}

/* A client that cannot make its timerfd (no descriptor left) keeps
 * rl_run_until's contract on the millisecond timer: a deadline waited for,
 * and NaN or a past one returning at once (NaN once armed that timer for
 * INT_MAX ms: SIGALRM ends the test instead of a hang). */
static void run_until_without_a_timerfd(void) {
    char err[RL_ERR_LEN];
    rl_client *f = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    CHECK(f != NULL);
    rl_sleep(f, 50);
    struct rlimit was, low;
    CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0);
    low = was;
    if (low.rlim_cur > 512) low.rlim_cur = 512;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    static int taken[512];
    int n = 0, null = open("/dev/null", O_RDONLY);
    CHECK(null >= 0);
    while (n < 512 && (taken[n] = dup(null)) >= 0) n++;
    CHECK(n < 512 && errno == EMFILE); /* every descriptor taken: no timerfd to be had */
    alarm(20);
    double t0 = rl_now_ms(), deadline = t0 + 20.5;
    CHECK_INT(rl_run_until(f, deadline), 0);
    CHECK(rl_now_ms() >= deadline);
    t0 = rl_now_ms();
    CHECK_INT(rl_run_until(f, NAN), 0);
    CHECK_INT(rl_run_until(f, t0 - 5), 0);
    CHECK(rl_now_ms() - t0 < 1000);
    alarm(0);
    while (n > 0) close(taken[--n]);
    close(null);
    CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0);
    rl_client_free(f);
}

/* rl_run_until returns for whichever comes first: its deadline (never
 * before it, also a fraction of a millisecond away), a finished operation,
 * or a release heard on a watched resource; a deadline already past serves
 * what is ready and returns. Its timer firing after an early return does
 * not cut a later rl_sleep short. HUGE_VAL waits without limit, NaN not at
 * all. */
static void run_until_a_deadline_a_result_or_a_release(rl_client *c, rl_result *r) {
    for (int i = 0; i < 20; i++) {
        double deadline = rl_now_ms() + (i % 2 ? 0.3 : 2.5);
        CHECK_INT(rl_run_until(c, deadline), 0);
        CHECK(rl_now_ms() >= deadline);
    }
    double t0 = rl_now_ms();
    CHECK_INT(rl_run_until(c, t0 - 1), 0);
    CHECK_INT(rl_run_until(c, 0), 0);
    int id = rl_begin_acquire(c, "until", 5, 5000);
    CHECK(id >= 0);
    t0 = rl_now_ms();
    int done = 0;
    while (done == 0 && rl_now_ms() - t0 < 5000) done = rl_run_until(c, t0 + 60000);
    CHECK_INT(done, 1);
    CHECK(rl_now_ms() - t0 < 5000);
    CHECK_INT(rl_collect(c, r), 1);
    CHECK_INT(r->id, id);
    CHECK_INT(r->status, RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    /* returned for a result 300 ms before its deadline: the timerfd fires
     * during the next sleep, which still lasts its whole 400 ms */
    id = rl_begin_acquire(c, "until:b", 7, 5000);
    double deadline = rl_now_ms() + 300;
    for (done = 0; done == 0 && rl_now_ms() < deadline;) done = rl_run_until(c, deadline);
    CHECK_INT(done, 1);
    CHECK(rl_now_ms() < deadline);
    t0 = rl_now_ms();
    rl_sleep(c, 400);
    CHECK(rl_now_ms() - t0 >= 400);
    CHECK(rl_now_ms() > deadline);
    CHECK(rl_wait(c, id, r) == RL_OK && r->status == RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(c, "until:b", 7, r->value, r), r), RL_STATUS_OK);
    /* no limit, and no deadline at all */
    id = rl_begin_acquire(c, "until:c", 7, 5000);
    for (done = 0; done == 0;) done = rl_run_until(c, HUGE_VAL);
    CHECK(rl_wait(c, id, r) == RL_OK && r->status == RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(c, "until:c", 7, r->value, r), r), RL_STATUS_OK);
    t0 = rl_now_ms();
    CHECK_INT(rl_run_until(c, NAN), 0);
    CHECK(rl_now_ms() - t0 < 1000);
    run_until_without_a_timerfd();

    char err[RL_ERR_LEN];
    rl_client *w = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    CHECK(w != NULL);
    CHECK_INT(rl_watch(w, "until", 5), RL_OK);
    double until = rl_now_ms() + 2000;
    while (rl_client_listening(w) < NODES && rl_now_ms() < until) rl_sleep(w, 5);
    rl_sleep(w, 50); /* the SUBSCRIBEs reached the nodes */
    unsigned heard = rl_heard(w, NULL, 0);
    CHECK_INT(verdict(rl_release(c, "until", 5, value, r), r), RL_STATUS_OK);
    t0 = rl_now_ms();
    while (rl_heard(w, NULL, 0) == heard && rl_now_ms() - t0 < 5000) CHECK_INT(rl_run_until(w, t0 + 60000), 0);
    CHECK(rl_heard(w, NULL, 0) != heard);
    CHECK(rl_now_ms() - t0 < 5000);
    rl_client_free(w);
}

/* Fenced grants on real nodes: tokens start at 1 and strictly increase; a
 * node's counter (the key "fenced:fence") holds the last token committed;
 * the grant is a lock like any other (refused while held). */
static void fenced_tokens_increase(rl_client *c, rl_result *r) {
    long long last = 0;
    for (int k = 0; k < 3; k++) {
        CHECK_INT(verdict(rl_acquire_fenced(c, "fenced", 6, 5000, r), r), RL_STATUS_OK);
        CHECK(r->token > last);
        CHECK(r->validity_ms > 4000);
        if (k == 0) CHECK_INT(r->token, 1);
        last = r->token;
        char value[RL_VALUE_LEN + 1], token[24];
        memcpy(value, r->value, sizeof(value));
        snprintf(token, sizeof(token), "%lld", last);
        CHECK_INT(verdict(rl_acquire_fenced(c, "fenced", 6, 5000, r), r), RL_STATUS_BUSY);
        CHECK_INT(r->token, 0);
        int committed = 0;
        for (int i = 0; i < NODES; i++) committed += node_holds(i, "fenced:fence", token);
        CHECK(committed >= NODES / 2 + 1);
        CHECK_INT(verdict(rl_release(c, "fenced", 6, value, r), r), RL_STATUS_OK);
    }
    CHECK_INT(verdict(rl_acquire(c, "fenced", 6, 5000, r), r), RL_STATUS_OK);
    CHECK_INT(r->token, 0); /* not fenced: no token */
    CHECK_INT(verdict(rl_release(c, "fenced", 6, r->value, r), r), RL_STATUS_OK);
}

static void many_in_flight(rl_client *c, rl_result *r) {
    int ids[64], acquired = 0, ok = 0, released = 0;
    char name[16];
    for (int i = 0; i < 64; i++) {
        snprintf(name, sizeof(name), "many%d", i);
        ids[i] = rl_begin_acquire(c, name, strlen(name), 5000);
        CHECK(ids[i] >= 0);
    }
    /* the header's promise: ids in flight differ modulo RL_ID_SLOTS */
    for (int i = 0; i < 64; i++)
        for (int j = 0; j < i; j++) CHECK(ids[i] % RL_ID_SLOTS != ids[j] % RL_ID_SLOTS);
    /* Each finished acquire begins its release; both finish in any order. */
    while (acquired < 64 || released < ok) {
        if (rl_run(c, 1000) == 0) break;
        while (rl_collect(c, r)) {
            if (r->op == RL_OP_RELEASE) {
                released += r->status == RL_STATUS_OK;
                continue;
            }
            acquired++;
            ok += r->status == RL_STATUS_OK;
            int i = 0;
            while (i < 64 && ids[i] != r->id) i++;
            CHECK(i < 64);
            snprintf(name, sizeof(name), "many%d", i);
            CHECK(rl_begin_release(c, name, strlen(name), r->value) >= 0);
        }
    }
    CHECK_INT(ok, 64);
    CHECK_INT(released, 64);
    CHECK_INT(rl_wait(c, 12345, r), RL_ERR);
}

/* Acquire and release count big resources (named first.., first+1.., ...)
 * at once on client c; return how many acquires succeeded. Every release
 * must be heard by at least quorum. */
static int big_batch(rl_client *c, rl_result *r, char *name, size_t len, char first, int count) {
    int ids[64], ok = 0;
    char values[64][RL_VALUE_LEN + 1];
    for (int i = 0; i < count; i++) {
        name[0] = (char)(first + i);
        ids[i] = rl_begin_acquire(c, name, len, 10000);
        CHECK(ids[i] >= 0);
    }
    for (int i = 0; i < count; i++) {
        CHECK_INT(rl_wait(c, ids[i], r), RL_OK);
        ok += r->status == RL_STATUS_OK;
        memcpy(values[i], r->value, sizeof(values[i]));
    }
    for (int i = 0; i < count; i++) {
        name[0] = (char)(first + i);
        ids[i] = rl_begin_release(c, name, len, values[i]);
    }
    for (int i = 0; i < count; i++) {
        CHECK_INT(rl_wait(c, ids[i], r), RL_OK);
        CHECK_INT(r->status, RL_STATUS_OK);
        CHECK(r->ok >= NODES / 2 + 1);
    }
    return ok;
}

/* Batches larger than the socket buffers: the rest of a write waits for the
 * socket to drain, and replies still pair with their commands. A stalled
 * node whose socket is full is one failed vote, and serves again after
 * SIGCONT. */
static void commands_larger_than_the_socket(void) {
    enum { BIG = RL_MAX_KEY_LEN, COUNT = 64 }; /* the longest names: 4 MB a node in one batch */
    rl_options o;
    rl_options_init(&o);
    /* 4 MB per node in one batch, under the sanitizers, on a machine of any
     * speed: the node timeout is not what this checks. */
    o.node_timeout_ms = 60000;
    char err[RL_ERR_LEN];
    rl_client *c = rl_client_new(url_list, NODES, &o, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    char *name = malloc(BIG);
    CHECK(c != NULL && r != NULL && name != NULL);
    memset(name, 'b', BIG);
    CHECK_INT(wait_ready(c, r), 0);
    CHECK_INT(big_batch(c, r, name, BIG, 'a', COUNT), COUNT);
    CHECK_INT(r->failed, 0);

    kill(pids[2], SIGSTOP);
    CHECK_INT(big_batch(c, r, name, BIG, 'a', COUNT), COUNT);
    CHECK(r->node[2].state != RL_NODE_OK);
    kill(pids[2], SIGCONT);
    CHECK_INT(wait_ready(c, r), 0);
    /* Other names: the SETs that sat in the stalled node's socket when its
     * connection was reset run once it resumes, and hold those keys there
     * until their ttl (one minority vote; a known limit). */
    CHECK_INT(big_batch(c, r, name, BIG, 'A', 2), 2);
    CHECK_INT(r->failed, 0);
    free(name);
    free(r);
    rl_client_free(c);
}

/* The documented form: the call says whether the operation ran (RL_OK), the
 * result says how it ended. */
static void verdict_is_in_the_result(rl_client *c, rl_result *r) {
    int held = 0;
    if (rl_acquire(c, "form", 4, 5000, r) == RL_OK && r->status == RL_STATUS_OK) held = 1;
    CHECK_INT(held, 1);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    rl_result *other = calloc(1, sizeof(*other));
    CHECK_INT(rl_acquire(c, "form", 4, 5000, other), RL_OK); /* it ran ... */
    CHECK_INT(other->status, RL_STATUS_BUSY);                 /* ... and found the lock taken */
    CHECK_INT(rl_extend(c, "form", 4, value, 5000, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_OK);
    CHECK_INT(rl_release(c, "form", 4, value, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_OK);
    CHECK_INT(rl_release(c, "form", 4, value, r), RL_OK);
    CHECK_INT(r->status, RL_STATUS_NOT_HELD);
    /* misuse: RL_ERR, and the result is left as it was */
    r->status = -7;
    CHECK_INT(rl_acquire(c, "form", 4, 0, r), RL_ERR);
    CHECK_INT(r->status, -7);
    free(other);
}

/* An id that was collected names no operation, even after its slot has been
 * reused by later operations: rl_wait refuses it instead of answering with
 * another operation's result. */
static void stale_ids_are_refused(rl_client *c, rl_result *r) {
    int first = rl_begin_acquire(c, "stale1", 6, 5000);
    CHECK(first >= 0);
    CHECK_INT(rl_wait(c, first, r), RL_OK);
    CHECK_INT(r->id, first);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    int second = rl_begin_acquire(c, "stale2", 6, 5000); /* reuses the freed slot */
    CHECK(second >= 0 && second != first);
    CHECK_INT(rl_wait(c, first, r), RL_ERR);
    CHECK(strstr(rl_client_errstr(c), "no operation") != NULL);
    CHECK_INT(rl_wait(c, second, r), RL_OK);
    CHECK_INT(r->id, second);
    CHECK_INT(r->status, RL_STATUS_OK);
    CHECK_INT(rl_wait(c, second, r), RL_ERR);
    rl_release(c, "stale2", 6, r->value, r);
    rl_release(c, "stale1", 6, value, r);
    /* many reuses later, the first id is still refused */
    for (int i = 0; i < 100; i++) {
        int id = rl_begin_release(c, "stale1", 6, value);
        CHECK(id != first && id != second);
        CHECK_INT(rl_wait(c, id, r), RL_OK);
    }
    CHECK_INT(rl_wait(c, first, r), RL_ERR);
    CHECK_INT(rl_wait(c, -1, r), RL_ERR);
    /* a result nobody wants: dropped, and the id forgotten (before: refused
     * as "not in flight" while it was, and never collected) */
    int dropped = rl_begin_release(c, "stale1", 6, value);
    CHECK_INT(rl_wait(c, dropped, NULL), RL_OK);
    CHECK_INT(rl_wait(c, dropped, r), RL_ERR);
}

static void misuse_is_refused(rl_client *c, rl_result *r) {
    CHECK_INT(verdict(rl_acquire(c, "", 0, 1000, r), r), RL_ERR);
    CHECK(strstr(rl_client_errstr(c), "resource") != NULL);
    CHECK_INT(verdict(rl_acquire(c, "x", 1, 0, r), r), RL_ERR);
    CHECK(strstr(rl_client_errstr(c), "ttl") != NULL);
    CHECK_INT(verdict(rl_release(c, "x", 1, "short", r), r), RL_ERR);
    char err[RL_ERR_LEN];
    const char *dup[2] = {"redis://127.0.0.1:7000", "redis://localhost:7000/2"};
    CHECK(rl_client_new(dup, 2, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "same server") != NULL);
    rl_options o;
    rl_options_init(&o);
    o.quorum = 1;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "quorum") != NULL);
    /* lengths no buffer could hold: refused, never wrapped into a small
     * allocation (before: a hang in rl_watch, bad memcpys elsewhere) */
    CHECK_INT(rl_begin_acquire(c, "x", SIZE_MAX - 1, 1000), RL_ERR);
    CHECK(strstr(rl_client_errstr(c), "longer than a key") != NULL);
    CHECK_INT(rl_watch(c, "x", SIZE_MAX / 2 + 1), RL_ERR);
    rl_unwatch(c, "x", SIZE_MAX);
    rl_options_init(&o);
    o.prefix = "p";
    o.prefix_len = SIZE_MAX;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "prefix") != NULL);
    /* a node's name, and nothing past the nodes (before: the names of the
     * subscriber links and shards behind them) */
    CHECK_INT(rl_client_nodes(c), NODES);
    CHECK(rl_client_node_name(c, NODES - 1) != NULL);
    CHECK(rl_client_node_name(c, NODES) == NULL);
    CHECK(rl_client_node_name(c, 2 * NODES - 1) == NULL);
    CHECK(rl_client_node_name(c, -1) == NULL);
}

/* Reconnect delays up to INT_MAX through a real client (test_engine checks
 * the backoff's values): under the sanitizer build, no signed overflow in
 * the backoff nor in rl_client_free's bound for unwritten commands (before:
 * both overflowed). */
static void extreme_reconnect_delays(void) {
    const char *closed[1] = {"redis://127.0.0.1:1"};
    char err[RL_ERR_LEN];
    rl_options o;
    rl_options_init(&o);
    o.reconnect_min_ms = 1 << 30;
    o.reconnect_max_ms = INT_MAX;
    o.connect_timeout_ms = 100;
    rl_client *c = rl_client_new(closed, 1, &o, err, sizeof(err));
    CHECK(c != NULL);
    rl_result r;
    CHECK_INT(rl_acquire(c, "x", 1, 1000, &r), RL_OK);
    CHECK(r.status != RL_STATUS_OK);
    rl_client_free(c);
}

static void dead_and_stalled_nodes(rl_client *c, rl_result *r) {
    stop_node(0);
    CHECK_INT(verdict(rl_acquire(c, "dead", 4, 5000, r), r), RL_STATUS_OK);
    CHECK_INT(r->ok, 2);
    rl_release(c, "dead", 4, r->value, r);
    stop_node(1);
    double t0 = rl_now_ms();
    CHECK_INT(verdict(rl_acquire(c, "dead", 4, 5000, r), r), RL_STATUS_UNAVAILABLE);
    CHECK(rl_now_ms() - t0 < 1000);
    pids[0] = start_node(ports[0]);
    pids[1] = start_node(ports[1]);
    CHECK_INT(wait_ready(c, r), 0);

    kill(pids[2], SIGSTOP);
    t0 = rl_now_ms();
    CHECK_INT(verdict(rl_acquire(c, "stall", 5, 5000, r), r), RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    /* decided by the two that answer: the stalled node is the tail */
    CHECK_INT(verdict(rl_release(c, "stall", 5, value, r), r), RL_STATUS_OK);
    CHECK_INT(r->node[2].state, RL_NODE_PENDING);
    rl_sleep(c, 600); /* past stall_reset_ms: the connection is reset */
    kill(pids[2], SIGCONT);
    CHECK_INT(wait_ready(c, r), 0);
}

/* A release decided without a stalled node leaves that node the tail of the
 * round: the node answers NOSCRIPT once it resumes (its scripts were
 * flushed), the client's next calls send it the EVAL, and the key goes there
 * too. Closing a client with a tail still running returns and leaks nothing
 * (the sanitizer build checks the leak). */
static void tails_run_after_the_decision(void) {
    char err[RL_ERR_LEN], cmd[96];
    rl_options o;
    rl_options_init(&o);
    o.node_timeout_ms = 3000; /* the stall below stays well inside the node timeout */
    o.stall_reset_ms = 10000;
    rl_client *c = rl_client_new(url_list, NODES, &o, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c != NULL && r != NULL);
    CHECK_INT(wait_ready(c, r), 0);
    CHECK_INT(verdict(rl_acquire(c, "tail", 4, 60000, r), r), RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    for (int k = 0; k < 100 && !node_holds(2, "tail", value); k++) rl_sleep(c, 10);
    CHECK(node_holds(2, "tail", value));
    snprintf(cmd, sizeof(cmd), "redis-cli -p %d SCRIPT FLUSH >/dev/null", ports[2]);
    CHECK_INT(system(cmd), 0);
    kill(pids[2], SIGSTOP);
    CHECK_INT(verdict(rl_release(c, "tail", 4, value, r), r), RL_STATUS_OK);
    CHECK_INT(r->ok, 2);
    CHECK_INT(r->node[2].state, RL_NODE_PENDING);
    CHECK(node_holds(0, "tail", "") && node_holds(1, "tail", ""));
    rl_sleep(c, 200);
    kill(pids[2], SIGCONT);
    int gone = 0;
    for (int k = 0; k < 200 && !gone; k++) {
        rl_sleep(c, 10);
        gone = node_holds(2, "tail", "");
    }
    CHECK(gone);

    /* close with a tail running: node 2 stalled, its reply owed */
    CHECK_INT(verdict(rl_acquire(c, "tail", 4, 60000, r), r), RL_STATUS_OK);
    memcpy(value, r->value, sizeof(value));
    kill(pids[2], SIGSTOP);
    CHECK_INT(verdict(rl_release(c, "tail", 4, value, r), r), RL_STATUS_OK);
    CHECK_INT(r->node[2].state, RL_NODE_PENDING);
    rl_client_free(c);
    kill(pids[2], SIGCONT);
    free(r);
}

/* Once c is ready: acquire name (ttl 300) with c into r, and hand it to k;
 * the keeper's id. */
static int acquire_kept(rl_client *c, rl_keeper *k, const char *name, rl_result *r) {
    char err[RL_ERR_LEN];
    size_t len = strlen(name);
    CHECK_INT(wait_ready(c, r), 0);
    double t0 = rl_now_ms();
    CHECK_INT(verdict(rl_acquire(c, name, len, 300, r), r), RL_STATUS_OK);
    int id = rl_keeper_add(k, name, len, r->value, 300, t0 + r->elapsed_ms + r->validity_ms, 0, err, sizeof(err));
    CHECK(id >= 0);
    return id;
}

static void keeper_extends_and_releases(void) {
    char err[RL_ERR_LEN];
    rl_options o;
    rl_options_init(&o);
    rl_client *c = rl_client_new(url_list, NODES, &o, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, &o, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k);
    int id = acquire_kept(c, k, "kept", r);
    rl_sleep(c, 900); /* three ttls */
    double until = 0;
    CHECK_INT(rl_keeper_state(k, id, &until), RL_KEEP_HELD);
    CHECK(until > rl_now_ms());
    rl_result *other = calloc(1, sizeof(*other));
    CHECK_INT(verdict(rl_acquire(c, "kept", 4, 300, other), other), RL_STATUS_BUSY);
    CHECK_INT(rl_keeper_release_all(1000), 1);
    CHECK_INT(rl_keeper_state(k, id, NULL), RL_KEEP_RELEASED);
    CHECK_INT(verdict(rl_acquire(c, "kept", 4, 300, other), other), RL_STATUS_OK);
    /* stolen: keys replaced by another holder -> lost */
    id = rl_keeper_add(k, "kept", 4, r->value, 300, rl_now_ms() + 10000, 0, err, sizeof(err));
    rl_sleep(c, 400);
    CHECK_INT(rl_keeper_state(k, id, NULL), RL_KEEP_LOST);
    CHECK_INT(rl_keeper_remove(k, id), RL_OK);
    CHECK_INT(rl_keeper_state(k, id, NULL), RL_ERR);
    CHECK_INT(rl_keeper_add(k, "x", 1, "bad", 300, 0, 0, err, sizeof(err)), RL_ERR);
    rl_release(c, "kept", 4, other->value, other);
    free(other);
    free(r);
    rl_keeper_free(k);
    rl_client_free(c);
}

/* A closed keeper has stopped (its kept lock is no longer extended) and
 * refuses every call, its memory kept until rl_keeper_free. */
static void keeper_closed_refuses_calls(void) {
    char err[RL_ERR_LEN];
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k);
    int id = acquire_kept(c, k, "closed", r);
    rl_keeper_close(k);
    rl_keeper_close(k); /* twice: nothing */
    CHECK_INT(rl_keeper_state(k, id, NULL), RL_ERR);
    CHECK_INT(rl_keeper_update(k, id, 300, rl_now_ms(), rl_now_ms() + 200), RL_ERR);
    CHECK_INT(rl_keeper_drop(k, id), RL_ERR);
    CHECK_INT(rl_keeper_remove(k, id), RL_ERR);
    CHECK_INT(rl_keeper_release(k, 100), 0);
    CHECK_INT(rl_keeper_add(k, "closed", 6, r->value, 300, rl_now_ms() + 200, 0, err, sizeof(err)), RL_ERR);
    CHECK_STR(err, "this keeper was closed");
    rl_stats st;
    rl_keeper_stats(k, &st);
    CHECK(st.nodes == 0 && st.keep_extends[0] == 0);
    rl_sleep(c, 400); /* past the ttl: nobody extends it */
    rl_result *other = calloc(1, sizeof(*other));
    CHECK_INT(verdict(rl_acquire(c, "closed", 6, 300, other), other), RL_STATUS_OK);
    rl_release(c, "closed", 6, other->value, other);
    free(other);
    free(r);
    rl_keeper_free(k);
    rl_keeper_close(NULL);
    rl_client_free(c);
}

/* rl_keeper_close from one thread while others call the keeper, or close
 * it too: every other call returns RL_ERR or works, none touches a freed
 * engine, and a second close does nothing (before: a NULL engine read, or
 * both closers joining the thread and one hanging for good). */
static void *keeper_state_loop(void *arg) {
    rl_keeper *k = arg;
    for (int i = 0; i < 100000 && rl_keeper_state(k, 0, NULL) != RL_ERR; i++) continue;
    rl_stats *st = calloc(1, sizeof(*st));
    for (int i = 0; i < 1000; i++) rl_keeper_stats(k, st); /* zeros once closed */
    free(st);
    return NULL;
}

static void *keeper_closer(void *arg) {
    rl_keeper_close(arg);
    return NULL;
}

static void keeper_closed_while_in_use(void) {
    char err[RL_ERR_LEN];
    for (int round = 0; round < 10; round++) {
        rl_keeper *k = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
        CHECK(k != NULL);
        pthread_t user, closer;
        pthread_create(&user, NULL, keeper_state_loop, k);
        pthread_create(&closer, NULL, keeper_closer, k);
        rl_keeper_close(k);
        pthread_join(closer, NULL);
        pthread_join(user, NULL);
        CHECK_INT(rl_keeper_state(k, 0, NULL), RL_ERR);
        rl_keeper_free(k);
    }
}

/* Locks with many different ttls all stay extended (the keeper wakes for the
 * earliest deadline, whichever entry it is); removed ones are left to expire
 * and their slots are reused. */
static void keeper_extends_many_ttls(void) {
    enum { KEPT = 24 };
    char err[RL_ERR_LEN], name[16];
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k);
    int ids[KEPT];
    char values[KEPT][RL_VALUE_LEN + 1];
    for (int i = 0; i < KEPT; i++) {
        int ttl = 1320 - 40 * i; /* added longest first: the heap must reorder */
        snprintf(name, sizeof(name), "heap%d", i);
        double t0 = rl_now_ms();
        CHECK_INT(verdict(rl_acquire(c, name, strlen(name), ttl, r), r), RL_STATUS_OK);
        memcpy(values[i], r->value, sizeof(values[i]));
        double until = t0 + r->elapsed_ms + r->validity_ms;
        ids[i] = rl_keeper_add(k, name, strlen(name), r->value, ttl, until, 0, err, sizeof(err));
        CHECK(ids[i] >= 0);
    }
    int gone[2] = {3, 20};
    CHECK_INT(rl_keeper_remove(k, ids[gone[0]]), RL_OK);
    rl_sleep(c, 150);
    CHECK_INT(rl_keeper_remove(k, ids[gone[1]]), RL_OK);
    CHECK_INT(rl_keeper_remove(k, ids[gone[1]]), RL_ERR);
    rl_sleep(c, 2700); /* two of the longest ttls */
    for (int i = 0; i < KEPT; i++) {
        snprintf(name, sizeof(name), "heap%d", i);
        if (i == gone[0] || i == gone[1]) {
            CHECK_INT(rl_keeper_state(k, ids[i], NULL), RL_ERR);
            CHECK_INT(verdict(rl_acquire(c, name, strlen(name), 1000, r), r), RL_STATUS_OK); /* expired */
            rl_release(c, name, strlen(name), r->value, r);
            continue;
        }
        double until = 0;
        CHECK_INT(rl_keeper_state(k, ids[i], &until), RL_KEEP_HELD);
        CHECK(until > rl_now_ms());
        CHECK_INT(verdict(rl_acquire(c, name, strlen(name), 1000, r), r), RL_STATUS_BUSY);
    }
    /* a freed slot is handed out again, with a fresh state */
    CHECK_INT(verdict(rl_acquire(c, "heapnew", 7, 1000, r), r), RL_STATUS_OK);
    int id = rl_keeper_add(k, "heapnew", 7, r->value, 1000, rl_now_ms() + 900, 0, err, sizeof(err));
    /* (its place, under a new id: the old ids still name nothing) */
    CHECK((id & 0xfffff) == (ids[gone[0]] & 0xfffff) || (id & 0xfffff) == (ids[gone[1]] & 0xfffff));
    CHECK(id != ids[gone[0]] && id != ids[gone[1]]);
    CHECK_INT(rl_keeper_state(k, ids[gone[0]], NULL), RL_ERR);
    CHECK_INT(rl_keeper_state(k, ids[gone[1]], NULL), RL_ERR);
    CHECK_INT(rl_keeper_state(k, id, NULL), RL_KEEP_HELD);
    CHECK_INT(rl_keeper_remove(k, id), RL_OK);
    rl_release(c, "heapnew", 7, r->value, r);
    for (int i = 0; i < KEPT; i++) {
        if (i == gone[0] || i == gone[1]) continue;
        snprintf(name, sizeof(name), "heap%d", i);
        CHECK_INT(rl_keeper_remove(k, ids[i]), RL_OK);
        CHECK_INT(verdict(rl_release(c, name, strlen(name), values[i], r), r), RL_STATUS_OK);
    }
    free(r);
    rl_keeper_free(k);
    rl_client_free(c);
}

static void pause_nodes(int sig) {
    for (int i = 0; i < NODES; i++) kill(pids[i], sig);
}

/* Extensions that hang (every node paused): a lock turns LOST at its
 * validity minus margin, not before, and a late success does not bring it
 * back; a lock removed while its extension is in flight does not leak that
 * result into the entry that reuses its slot. */
static void keeper_hung_extensions(void) {
    char err[RL_ERR_LEN];
    rl_options o;
    rl_options_init(&o);
    o.node_timeout_ms = 1500; /* the extensions stay in flight while the nodes are paused */
    o.stall_reset_ms = 5000;
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, &o, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k);
    CHECK_INT(wait_ready(c, r), 0);
    char hung[RL_VALUE_LEN + 1], gone[RL_VALUE_LEN + 1], fresh[RL_VALUE_LEN + 1];
    /* keys that outlive the pause on the nodes; the keeper extends every 100 ms */
    CHECK_INT(verdict(rl_acquire(c, "hung", 4, 5000, r), r), RL_STATUS_OK);
    memcpy(hung, r->value, sizeof(hung));
    CHECK_INT(verdict(rl_acquire(c, "gone", 4, 5000, r), r), RL_STATUS_OK);
    memcpy(gone, r->value, sizeof(gone));
    CHECK_INT(verdict(rl_acquire(c, "fresh", 5, 5000, r), r), RL_STATUS_OK);
    memcpy(fresh, r->value, sizeof(fresh));
    int hung_id = rl_keeper_add(k, "hung", 4, hung, 300, rl_now_ms() + 290, 50, err, sizeof(err));
    int gone_id = rl_keeper_add(k, "gone", 4, gone, 300, rl_now_ms() + 5000, 0, err, sizeof(err));
    CHECK(hung_id >= 0 && gone_id >= 0);
    rl_sleep(c, 50);
    pause_nodes(SIGSTOP);
    rl_sleep(c, 120); /* the first extensions are in flight now */
    CHECK_INT(rl_keeper_remove(k, gone_id), RL_OK);
    double fresh_until = rl_now_ms() + 29000.5;
    int fresh_id = rl_keeper_add(k, "fresh", 5, fresh, 30000, fresh_until, 0, err, sizeof(err));
    CHECK_INT(fresh_id & 0xfffff, gone_id & 0xfffff); /* the freed place, with the old extension still in flight */
    CHECK_INT(rl_keeper_state(k, gone_id, NULL), RL_ERR);

    double until = 0, deadline = rl_now_ms() + 3000;
    int state;
    while ((state = rl_keeper_state(k, hung_id, &until)) == RL_KEEP_HELD && rl_now_ms() < deadline) rl_sleep(c, 10);
    CHECK_INT(state, RL_KEEP_LOST);
    CHECK(rl_now_ms() >= until - 50); /* not before validity minus margin */

    pause_nodes(SIGCONT);
    rl_sleep(c, 400); /* the late replies arrive and are ignored */
    double late_until = 0;
    CHECK_INT(rl_keeper_state(k, hung_id, &late_until), RL_KEEP_LOST);
    CHECK(late_until == until);
    double fresh_seen = 0;
    CHECK_INT(rl_keeper_state(k, fresh_id, &fresh_seen), RL_KEEP_HELD);
    CHECK(fresh_seen == fresh_until);

    CHECK_INT(rl_keeper_remove(k, hung_id), RL_OK);
    CHECK_INT(rl_keeper_remove(k, fresh_id), RL_OK);
    rl_release(c, "hung", 4, hung, r);
    rl_release(c, "gone", 4, gone, r);
    rl_release(c, "fresh", 5, fresh, r);
    free(r);
    rl_keeper_free(k);
    rl_client_free(c);
}

/* A client made before fork(): in the child its calls are refused (its
 * sockets are the parent's: it would take the parent's replies for its
 * own), and freeing it touches nothing of the parent's; a client and a
 * keeper the child makes work, and exit() releases what that keeper keeps.
 * The parent's client goes on as before. */
static void client_made_before_fork(rl_client *c, rl_result *r) {
    CHECK_INT(verdict(rl_acquire(c, "fork:parent", 11, 10000, r), r), RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        int bad = 0;
        rl_result cr;
        char err[RL_ERR_LEN];
        if (rl_acquire(c, "fork:child", 10, 10000, &cr) != RL_ERR || !strstr(rl_client_errstr(c), "before fork()"))
            bad |= 1;
        if (rl_run(c, 10) != RL_ERR || rl_run_until(c, rl_now_ms() + 10) != RL_ERR) bad |= 2;
        rl_client_free(c);
        rl_keeper *k = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
        rl_client *own = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
        if (k == NULL || own == NULL || verdict(rl_acquire(own, "fork:kept", 9, 30000, &cr), &cr) != RL_STATUS_OK)
            bad |= 4;
        else if (rl_keeper_add(k, "fork:kept", 9, cr.value, 30000, rl_now_ms() + cr.validity_ms, 0, err, sizeof(err)) < 0)
            bad |= 8;
        rl_client_free(own);
        for (int i = 0; i < NODES; i++) pids[i] = 0; /* the nodes are the parent's to stop */
        exit(bad); /* the child's keeper releases fork:kept */
    }
    int status = -1;
    CHECK(child > 0 && waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK_INT(WEXITSTATUS(status), 0);
    for (int i = 0; i < NODES; i++) CHECK(node_holds(i, "fork:kept", "")); /* released (GET: nil) */
    for (int i = 0; i < NODES; i++) CHECK(node_holds(i, "fork:parent", value));
    CHECK_INT(verdict(rl_release(c, "fork:parent", 11, value, r), r), RL_STATUS_OK); /* its sockets intact */
}

/* The child's checks on the keepers it inherited: every call is refused or
 * does nothing, at once (their threads stayed in the parent, and may have
 * held a keeper's mutex at the fork); freeing them touches nothing; exit()
 * (the exit handler) releases nothing of the parent's. Exit status: 0 if
 * all held. */
static void inherited_keepers_in_the_child(rl_keeper *busy, int id, rl_keeper *fresh) {
    int bad = 0;
    char err[RL_ERR_LEN] = "";
    rl_stats st;
    rl_keeper *both[2] = {fresh, busy};
    for (int i = 0; i < 2; i++) {
        rl_keeper *k = both[i];
        if (rl_keeper_add(k, "fork:inherited", 14, "v", 1000, rl_now_ms() + 900, 0, err, sizeof(err)) != RL_ERR ||
            !strstr(err, "before fork()"))
            bad |= 1;
        if (rl_keeper_state(k, id, NULL) != RL_ERR) bad |= 2;
        if (rl_keeper_update(k, id, 1000, rl_now_ms(), rl_now_ms() + 900) != RL_ERR) bad |= 4;
        if (rl_keeper_remove(k, id) != RL_ERR || rl_keeper_drop(k, id) != RL_ERR) bad |= 8;
        memset(&st, 0xff, sizeof(st));
        rl_keeper_stats(k, &st);
        if (st.kept != 0) bad |= 16;
        if (rl_keeper_release(k, 1000) != 0) bad |= 32;
    }
    if (rl_keeper_release_all(1000) != 0) bad |= 64;
    rl_keeper_free(fresh);
    rl_keeper_free(busy);
    for (int i = 0; i < NODES; i++) pids[i] = 0; /* the nodes are the parent's to stop */
#if defined(__SANITIZE_ADDRESS__)
    /* The leak check at exit locks the sanitizer's allocator, which a
     * parent's thread may have held at the fork: it would wait for ever.
     * The exit handler's own call (rl_keeper_release_all) was made above. */
    _exit(bad);
#else
    exit(bad);
#endif
}

/* Keepers made before fork(), one with its thread busy extending many short
 * locks, one just made (its thread still connecting): in each of many
 * children their calls return at once (they used to wait forever for a
 * mutex a parent's thread held at the fork, or hand out an id nothing would
 * extend), and the child exits within a bound. The parent's locks stay held
 * and extended throughout. */
static void keeper_inherited_by_forked_children(void) {
    enum { KEPT = 64, FORKS = 30, TTL = 300, CHILD_BOUND_MS = 5000 };
    char err[RL_ERR_LEN], name[16];
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k && r);
    int ids[KEPT];
    char values[KEPT][RL_VALUE_LEN + 1];
    for (int i = 0; i < KEPT; i++) {
        snprintf(name, sizeof(name), "inherit%d", i);
        double t0 = rl_now_ms();
        CHECK_INT(verdict(rl_acquire(c, name, strlen(name), TTL, r), r), RL_STATUS_OK);
        memcpy(values[i], r->value, sizeof(values[i]));
        double until = t0 + r->elapsed_ms + r->validity_ms;
        ids[i] = rl_keeper_add(k, name, strlen(name), r->value, TTL, until, 0, err, sizeof(err));
        CHECK(ids[i] >= 0);
    }
    for (int n = 0; n < FORKS; n++) {
        rl_keeper *fresh = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
        CHECK(fresh != NULL);
        fflush(NULL);
        pid_t child = fork();
        if (child == 0) inherited_keepers_in_the_child(k, ids[n % KEPT], fresh);
        rl_keeper_free(fresh);
        CHECK(child > 0);
        if (child < 0) break;
        int status = -1;
        pid_t got = 0;
        for (double give_up = rl_now_ms() + CHILD_BOUND_MS; got == 0 && rl_now_ms() < give_up;) {
            got = waitpid(child, &status, WNOHANG);
            if (got == 0) usleep(5000);
        }
        if (got == 0) { /* hung: make sure it ends, and stop forking */
            fprintf(stderr, "test_client: child %d of %d still running after %d ms\n", n + 1, FORKS, CHILD_BOUND_MS);
            kill(child, SIGKILL);
            waitpid(child, &status, 0);
        }
        CHECK(got == child && WIFEXITED(status));
        if (got != child || !WIFEXITED(status)) break;
        CHECK_INT(WEXITSTATUS(status), 0);
    }
    rl_sleep(c, 2 * TTL); /* longer than any validity the locks had before it */
    for (int i = 0; i < KEPT; i++) {
        double until = 0;
        CHECK_INT(rl_keeper_state(k, ids[i], &until), RL_KEEP_HELD);
        CHECK(until > rl_now_ms());
    }
    for (int i = 0; i < KEPT; i += KEPT / 4) {
        snprintf(name, sizeof(name), "inherit%d", i);
        for (int j = 0; j < NODES; j++) CHECK(node_holds(j, name, values[i]));
    }
    CHECK(rl_keeper_release(k, 2000) == KEPT);
    rl_keeper_free(k);
    rl_client_free(c);
    free(r);
}

/* A thread's rl_keeper_release_all, for fork_while_a_thread_releases_all. */
static void *release_all_in_a_thread(void *released) {
    *(int *)released = rl_keeper_release_all(1500);
    return NULL;
}

/* fork() while another thread's rl_keeper_release_all waits for a slow
 * release (two nodes stopped): the child makes a keeper of its own, calls
 * rl_keeper_release_all and exits (the exit handler calls it again) within
 * a bound. Each of these used to wait for ever for the process-wide
 * registry's mutex, which the other thread held for its whole wait at the
 * fork. */
static void fork_while_a_thread_releases_all(void) {
    enum { CHILD_BOUND_MS = 3000 };
    char err[RL_ERR_LEN];
    rl_options o;
    rl_options_init(&o);
    o.node_timeout_ms = 1000;
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_keeper *k = rl_keeper_new(url_list, NODES, &o, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c && k && r);
    double t0 = rl_now_ms();
    CHECK_INT(verdict(rl_acquire(c, "fork:releasing", 14, 10000, r), r), RL_STATUS_OK);
    double until = t0 + r->elapsed_ms + r->validity_ms;
    CHECK(rl_keeper_add(k, "fork:releasing", 14, r->value, 10000, until, 0, err, sizeof(err)) >= 0);
    kill(pids[0], SIGSTOP);
    kill(pids[1], SIGSTOP);
    int released = -1;
    pthread_t releaser;
    CHECK(pthread_create(&releaser, NULL, release_all_in_a_thread, &released) == 0);
    usleep(200 * 1000); /* well inside its wait for the stopped nodes */
    fflush(NULL);
    pid_t child = fork();
    if (child == 0) {
        rl_keeper *own = rl_keeper_new(url_list, NODES, NULL, err, sizeof(err));
        int bad = own == NULL || rl_keeper_release_all(100) != 0;
        rl_keeper_free(own);
        for (int i = 0; i < NODES; i++) pids[i] = 0; /* the nodes are the parent's to stop */
#if defined(__SANITIZE_ADDRESS__)
        _exit(bad); /* see inherited_keepers_in_the_child */
#else
        exit(bad);
#endif
    }
    CHECK(child > 0);
    int status = -1;
    pid_t got = 0;
    for (double give_up = rl_now_ms() + CHILD_BOUND_MS; child > 0 && got == 0 && rl_now_ms() < give_up;) {
        got = waitpid(child, &status, WNOHANG);
        if (got == 0) usleep(5000);
    }
    if (child > 0 && got == 0) {
        fprintf(stderr, "test_client: the child still runs after %d ms\n", CHILD_BOUND_MS);
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
    }
    CHECK(got == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    pthread_join(releaser, NULL);
    CHECK_INT(released, 0); /* one node of three answered: no quorum */
    kill(pids[0], SIGCONT);
    kill(pids[1], SIGCONT);
    rl_keeper_free(k); /* its releases reach the nodes that ran again */
    int left = NODES;
    for (double give_up = rl_now_ms() + 2000; left > 0 && rl_now_ms() < give_up; usleep(10 * 1000)) {
        left = 0;
        for (int i = 0; i < NODES; i++) left += !node_holds(i, "fork:releasing", "");
    }
    CHECK_INT(left, 0);
    rl_client_free(c);
    free(r);
}

int main(void) {
    if (!have_redis_server()) {
        printf("test_client: redis-server not found, skipped\n");
        return 77;
    }
    start_nodes(NODES, ports, pids, urls, url_list);
    atexit(stop_all);
    char err[RL_ERR_LEN];
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    rl_result *r = calloc(1, sizeof(*r));
    CHECK(c != NULL);
    CHECK_INT(wait_ready(c, r), 0);
    acquire_release_extend(c, r);
    verdict_is_in_the_result(c, r);
    stale_ids_are_refused(c, r);
    many_in_flight(c, r);
    fenced_tokens_increase(c, r);
    waiter_hears_a_release(c, r);
    run_until_a_deadline_a_result_or_a_release(c, r);
    a_closed_client_refuses_calls(c, r);
    commands_larger_than_the_socket();
    misuse_is_refused(c, r);
    extreme_reconnect_delays();
    dead_and_stalled_nodes(c, r);
    tails_run_after_the_decision();
    keeper_extends_and_releases();
    keeper_closed_refuses_calls();
    keeper_closed_while_in_use();
    keeper_extends_many_ttls();
    keeper_hung_extensions();
    client_made_before_fork(c, r);
    keeper_inherited_by_forked_children();
    fork_while_a_thread_releases_all();
    /* freeing with operations in flight abandons them cleanly */
    rl_begin_acquire(c, "abandoned", 9, 1000);
    rl_client_free(c);
    free(r);
    return check_report("test_client");
}
