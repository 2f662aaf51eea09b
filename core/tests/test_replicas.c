/* test_replicas.c — votes that wait for replicas (rl_options.replicas, a
 * URL's ?replicas=N), no network: the WAIT behind each write that grants or
 * prolongs a hold, the vote held until WAIT answers, a short WAIT as a
 * failed vote that is undone, none behind a release, the per-node
 * override, and a NOSCRIPT's EVAL with a WAIT of its own. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "../src/command.h"
#include "../src/url.h"
#include "fake_driver.h"
#include "redlock.h"

#define VALUE "0123456789abcdef0123456789abcdef01234567"
#define NOSCRIPT "-NOSCRIPT No matching script. Please use EVAL.\r\n"
#define WAIT_1_25 "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$2\r\n25\r\n"

static const char *const urls[] = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};

/* How many times text occurs in out. */
static int count(const char *text) {
    int n = 0;
    for (const char *p = out; (p = memmem(p, outlen - (size_t)(p - out), text, strlen(text))) != NULL; p++) n++;
    return n;
}

/* 1 if out ends with text. */
static int ends_with(const char *text) {
    size_t n = strlen(text);
    return outlen >= n && memcmp(out + outlen - n, text, n) == 0;
}

static rl_engine *engine_wanting(int replicas, const char *const *list) {
    rl_options o;
    rl_options_init(&o);
    o.replicas = replicas;
    return engine(list, 3, &o);
}

/* A yes counts once WAIT reports the replicas; one WAIT short is a failed
 * vote that names the count; the round is OK on the other two. */
static void acquire_counts_a_yes_once_the_replicas_have_it(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_acquire(E, "k", 1, 10000, 0);
    for (int i = 0; i < 3; i++) {
        connect_node(i, 0);
        drain(i, 0);
        CHECK(strncmp(out, "*6\r\n$3\r\nSET\r\n", 13) == 0);
        CHECK(ends_with(WAIT_1_25)); /* node timeout 50 ms: WAIT's is 25 */
        CHECK_INT(count("WAIT"), 1);
    }
    CHECK_INT(feed(0, "+OK\r\n", 1), RL_OK);
    CHECK_INT(feed(1, "+OK\r\n", 1), RL_OK);
    CHECK_INT(rl_engine_done(E), 0); /* two yes, no replica heard from yet */
    CHECK_INT(feed(1, ":0\r\n", 2), RL_OK);
    CHECK_INT(rl_engine_done(E), 0);
    CHECK_INT(feed(0, ":1\r\n", 3), RL_OK);
    CHECK_INT(rl_engine_done(E), 0);
    CHECK_INT(feed(2, "+OK\r\n:2\r\n", 4), RL_OK); /* more replicas than wanted will do */
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK_INT(r.ok, 2);
    CHECK_INT(r.failed, 1);
    CHECK_INT(r.node[1].state, RL_NODE_ERROR);
    CHECK_STR(r.node[1].errstr, "0 of 1 replicas acknowledged the write within 25 ms");
    CHECK_INT(rl_engine_tails(E), 0);
    /* a release has no WAIT behind it */
    int rid = rl_engine_begin_release(E, "k", 1, r.value, 5);
    for (int i = 0; i < 3; i++) {
        drain(i, 5);
        CHECK_INT(count("EVALSHA"), 1);
        CHECK_INT(count("WAIT"), 0);
        CHECK_INT(feed(i, ":1\r\n", 6), RL_OK);
    }
    CHECK_INT(take(rid).status, RL_STATUS_OK);
    rl_engine_free(E);
}

/* Without a quorum of replicated yes the acquire fails, and the write
 * that did land is released there like any failed vote's; a WAIT refused
 * or lost is a failed vote too. */
static void short_waits_fail_the_acquire_and_are_undone(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_acquire(E, "k", 1, 10000, 0);
    for (int i = 0; i < 3; i++) connect_node(i, 0), drain(i, 0);
    CHECK_INT(feed(0, "+OK\r\n:0\r\n", 1), RL_OK);
    CHECK_INT(feed(1, "+OK\r\n-ERR WAIT cannot be used with replica instances\r\n", 1), RL_OK);
    rl_result r = take(id); /* two failed: decided without node 2 */
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK_INT(r.ok, 0);
    CHECK_INT(r.failed, 2);
    CHECK_STR(r.node[0].errstr, "0 of 1 replicas acknowledged the write within 25 ms");
    CHECK_STR(r.node[1].errstr, "WAIT refused: ERR WAIT cannot be used with replica instances");
    for (int i = 0; i < 3; i++) {
        drain(i, 1);
        CHECK_INT(count("EVALSHA"), 1); /* the cleanup, on every node the SET reached */
        CHECK_INT(count("quiet"), 1);
        CHECK_INT(count("WAIT"), 0);
    }
    CHECK_INT(feed(2, "+OK\r\n:1\r\n", 1), RL_OK); /* its late yes and WAIT, then the cleanups' */
    for (int i = 0; i < 3; i++) CHECK_INT(feed(i, ":1\r\n", 2), RL_OK);
    CHECK_INT(rl_engine_tails(E), 0);
    rl_engine_free(E);
}

/* A node's URL says otherwise than the client: ?replicas=0 sends no WAIT
 * there, ?replicas=2 waits for two (others keep the client's option). */
static void a_node_url_overrides_the_option(void) {
    static const char *const mixed[] = {"redis://127.0.0.1:7001?replicas=0", "redis://127.0.0.1:7002?replicas=2",
                                        "unix:///tmp/rl-none.sock?db=2&replicas=1"};
    E = engine_wanting(0, mixed);
    rl_engine_begin_extend(E, "k", 1, VALUE, 3000, 0);
    connect_node(0, 0);
    drain(0, 0);
    CHECK_INT(count("WAIT"), 0);
    connect_node(1, 0);
    drain(1, 0);
    CHECK(ends_with("*3\r\n$4\r\nWAIT\r\n$1\r\n2\r\n$2\r\n25\r\n"));
    rl_engine_free(E);
    E = engine_wanting(1, mixed);
    rl_engine_begin_acquire(E, "k", 1, 3000, 0);
    connect_node(0, 0);
    drain(0, 0);
    CHECK_INT(count("WAIT"), 0);
    rl_engine_free(E);

    rl_url u;
    char err[RL_ERR_LEN];
    CHECK_INT(rl_url_parse("redis://h:1?replicas=3", &u, err, sizeof(err)), 0);
    CHECK_INT(u.replicas, 3);
    CHECK_INT(rl_url_parse("redis://h:1/4", &u, err, sizeof(err)), 0);
    CHECK_INT(u.replicas, -1);
    CHECK_INT(u.db, 4);
    CHECK_INT(rl_url_parse("redis://h:1?replicas=65", &u, err, sizeof(err)), -1);
    CHECK_STR(err, "'redis://h:1?replicas=65': replicas must be a number from 0 to 64");
    CHECK_INT(rl_url_parse("redis://h:1?replicas=1&replicas=2", &u, err, sizeof(err)), -1);
    CHECK_INT(rl_url_parse("redis://h:1?db=2", &u, err, sizeof(err)), -1);
    CHECK_STR(err, "'redis://h:1?db=2': the query may say replicas=N, each once");
    CHECK_INT(rl_url_parse("unix:///s?replicas=1&db=5", &u, err, sizeof(err)), 0);
    CHECK_INT(u.db, 5);
    CHECK_INT(u.replicas, 1);

    rl_options o;
    rl_options_init(&o);
    o.replicas = RL_MAX_REPLICAS + 1;
    CHECK(rl_engine_new(urls, 3, &o, err, sizeof(err)) == NULL);
    CHECK_STR(err, "replicas must be from 0 to 64");
}

/* An extension refused as NOSCRIPT goes again as EVAL with a WAIT of its
 * own; the first WAIT's reply (it followed a write that did nothing) is
 * not taken for the EVAL's. */
static void noscript_extend_waits_again_behind_its_eval(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_extend(E, "k", 1, VALUE, 7000, 0);
    for (int i = 0; i < 3; i++) connect_node(i, 0), drain(i, 0);
    CHECK_INT(feed(0, NOSCRIPT, 1), RL_OK);
    drain(0, 1);
    CHECK(strncmp(out, "*6\r\n$4\r\nEVAL\r\n", 13) == 0);
    CHECK(ends_with(WAIT_1_25));
    CHECK_INT(feed(0, ":1\r\n", 2), RL_OK); /* the first WAIT: no vote */
    CHECK_INT(feed(1, ":1\r\n:1\r\n", 2), RL_OK);
    CHECK_INT(feed(0, ":1\r\n", 3), RL_OK); /* the EVAL's yes, held */
    CHECK_INT(rl_engine_done(E), 0);
    CHECK_INT(feed(0, ":1\r\n", 4), RL_OK); /* its WAIT */
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK_INT(r.ok, 2);
    CHECK_INT(feed(2, ":1\r\n:1\r\n", 5), RL_OK); /* the tail */
    CHECK_INT(rl_engine_tails(E), 0);
    rl_engine_free(E);
}

/* A fenced acquire waits for the replicas in both rounds; a grant whose
 * WAIT fell short does not raise the token. */
static void fenced_rounds_wait_and_a_short_grant_sets_no_token(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_acquire_fenced(E, "f", 1, 10000, 0);
    for (int i = 0; i < 3; i++) connect_node(i, 0), drain(i, 0);
    CHECK_INT(feed(1, "$1\r\n9\r\n:0\r\n", 1), RL_OK); /* 9, on no replica */
    CHECK_INT(feed(0, "$1\r\n7\r\n:1\r\n", 1), RL_OK);
    CHECK_INT(feed(2, "$1\r\n8\r\n:1\r\n", 1), RL_OK);
    CHECK_INT(rl_engine_done(E), 0); /* the commit */
    for (int i = 0; i < 3; i++) {
        drain(i, 1);
        CHECK_INT(count("\r\n$1\r\n8\r\n"), 1);
        CHECK(ends_with(WAIT_1_25));
    }
    CHECK_INT(feed(0, ":1\r\n:1\r\n", 2), RL_OK);
    CHECK_INT(feed(1, ":1\r\n:0\r\n", 2), RL_OK);
    CHECK_INT(rl_engine_done(E), 0);
    CHECK_INT(feed(2, ":1\r\n:1\r\n", 3), RL_OK);
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK_INT(r.token, 8);
    CHECK_INT(r.ok, 2);
    rl_engine_free(E);
}

/* A yes whose WAIT is still blocked at the node timeout (Redis ends a WAIT
 * on its cron tick, later than its timeout) times out saying so. */
static void blocked_wait_times_out_saying_so(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_acquire(E, "k", 1, 10000, 0);
    for (int i = 0; i < 3; i++) connect_node(i, 0), drain(i, 0);
    CHECK_INT(feed(0, "+OK\r\n", 1), RL_OK);
    CHECK_INT(feed(1, "+OK\r\n:1\r\n", 1), RL_OK);
    rl_engine_advance(E, 51);
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK_INT(r.node[0].state, RL_NODE_TIMEOUT);
    CHECK_STR(r.node[0].errstr, "no reply to WAIT within 50 ms: the write is on the node, not known on 1 replica");
    CHECK_INT(r.node[2].state, RL_NODE_TIMEOUT);
    CHECK_STR(r.node[2].errstr, "no reply within 50 ms");
    rl_engine_free(E);
}

/* WAIT's timeout: half the smaller of the node timeout and the watchdog's
 * period, at least 1 ms. */
static void wait_timeout_fits_the_node_timeout(void) {
    static const char *const one[] = {"redis://127.0.0.1:7001"};
    static const struct { int node_timeout; const char *wait; } cases[] = {
        {2000, "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$3\r\n250\r\n"}, /* the watchdog's 500 ms is the smaller */
        {1, "*3\r\n$4\r\nWAIT\r\n$1\r\n1\r\n$1\r\n1\r\n"},       /* never 0: WAIT 0 would block for good */
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        rl_options o;
        rl_options_init(&o);
        o.replicas = 1;
        o.node_timeout_ms = cases[k].node_timeout;
        E = engine(one, 1, &o);
        rl_engine_begin_acquire(E, "k", 1, 3000, 0);
        connect_node(0, 0);
        drain(0, 0);
        CHECK(ends_with(cases[k].wait));
        rl_engine_free(E);
    }
}

/* A semaphore's acquire won while a node's write has answered a slot and
 * its WAIT has not: that node's cleanup goes at the decision, for the slot
 * it answered (here another one), not when the WAIT answers, which tells
 * nothing of what the write took. A node yet to answer at all gets its
 * cleanup once it answers. */
static void semaphore_cleanup_of_a_write_behind_its_wait(void) {
    E = engine_wanting(1, urls);
    int id = rl_engine_begin_acquire_slot(E, "s", 1, 2, 10000, 0, 0);
    for (int i = 0; i < 3; i++) connect_node(i, 0), drain(i, 0);
    CHECK_INT(feed(0, ":1\r\n:1\r\n", 1), RL_OK);
    CHECK_INT(feed(2, ":2\r\n", 1), RL_OK); /* slot 2, its WAIT still out */
    CHECK_INT(rl_engine_done(E), 0);
    CHECK_INT(feed(1, ":1\r\n:1\r\n", 2), RL_OK);
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK_INT(r.slot, 1);
    drain(2, 2);
    CHECK_INT(count("redlock:slot:2:s"), 1); /* the release of slot 2 there */
    CHECK_INT(count("redlock:slot:1:s"), 0);
    CHECK_INT(feed(2, ":1\r\n:1\r\n", 3), RL_OK); /* the WAIT's reply, then the cleanup's */
    CHECK_INT(rl_engine_tails(E), 0);
    rl_engine_free(E);
}

int main(void) {
    semaphore_cleanup_of_a_write_behind_its_wait();
    acquire_counts_a_yes_once_the_replicas_have_it();
    short_waits_fail_the_acquire_and_are_undone();
    a_node_url_overrides_the_option();
    noscript_extend_waits_again_behind_its_eval();
    fenced_rounds_wait_and_a_short_grant_sets_no_token();
    wait_timeout_fits_the_node_timeout();
    blocked_wait_times_out_saying_so();
    return check_report("test_replicas");
}
