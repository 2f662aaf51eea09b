/* test_stats.c — what the engine counts (rl_engine_stats), no network: a
 * scripted run whose every count is known in advance, keep-alive's counts,
 * counting turned off, and the holder's label in lock values. */
#include <stdio.h>
#include <string.h>

#include "fake_driver.h"
#include "redlock.h"

static const char *const urls[] = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};

enum { N = 6, K = 3 };          /* acquires; the first K find node 3 stalled */
static const int busy[N] = {0, 1, 0, 1, 0, 0}; /* M = 2 of them refused */

static rl_stats S;

static const rl_stats *stats(void) {
    rl_engine_stats(E, &S);
    return &S;
}

static unsigned long long histogram_total(const rl_histogram *h) {
    unsigned long long n = 0;
    for (int i = 0; i < RL_STATS_BUCKETS; i++) n += h->count[i];
    return n;
}

/* One acquire begun at t: nodes 1 and 2 answer (OK, or nil when refused)
 * a ms later and decide it; node 3 answers after the decision, or, stalled,
 * not at all. Its result is taken. Return the step check's nonce node 3 was
 * sent, if it was sent one now (else ""). */
static const char *acquire(int round, int stalled, double t) {
    static char nonce[32];
    char resource[16];
    snprintf(resource, sizeof(resource), "r%d", round);
    int id = rl_engine_begin_acquire(E, resource, strlen(resource), 10000, t);
    CHECK(id >= 0);
    for (int i = 0; i < 3; i++) drain(i, t);
    const char *vote = busy[round] ? "$-1\r\n" : "+OK\r\n";
    CHECK_INT(feed(0, vote, t + 1), RL_OK);
    CHECK_INT(feed(1, vote, t + 1), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, busy[round] ? RL_STATUS_BUSY : RL_STATUS_OK);
    drain(2, t + 1); /* a refused acquire's cleanup goes to node 3, which had not voted */
    nonce[0] = '\0';
    if (stalled) {
        rl_engine_advance(E, t + 60); /* the tail's (or the cleanup's) node timeout */
        const char *echo = strstr(drain(2, t + 60), "rl-step-");
        if (echo) snprintf(nonce, sizeof(nonce), "%.*s", (int)strcspn(echo, "\r"), echo);
    } else {
        CHECK_INT(feed(2, vote, t + 2), RL_OK);
        if (busy[round]) CHECK_INT(feed(2, ":0\r\n", t + 2), RL_OK); /* the cleanup: not ours there */
    }
    return nonce;
}

/* N acquires, M of them refused as busy, node 3 stalled for the first K:
 * every count is what the script did, once. */
static void test_scripted_counts(void) {
    rl_options o;
    rl_options_init(&o);
    o.stall_reset_ms = 100000; /* the stalled node is not reset: its replies come late, in order */
    E = engine(urls, 3, &o);
    for (int i = 0; i < 3; i++) connect_node(i, 0);
    char nonce[32] = "";
    for (int round = 0; round < K; round++) {
        const char *sent = acquire(round, 1, 100.0 * (round + 1));
        if (sent[0]) {
            CHECK_INT(nonce[0], 0); /* one step check at a time */
            snprintf(nonce, sizeof(nonce), "%s", sent);
        }
    }
    CHECK(nonce[0] != 0);
    /* node 3 wakes up and answers all it owes, in order: SET 1, the step
     * check, SET 2 and its cleanup. A node timeout after the step check it
     * had become suspect, so SET 3 never went to it. */
    char late[256];
    snprintf(late, sizeof(late), "+OK\r\n$%zu\r\n%s\r\n$-1\r\n:0\r\n", strlen(nonce), nonce);
    CHECK_INT(feed(2, late, 390), RL_OK);
    for (int round = K; round < N; round++) acquire(round, 0, 100.0 * (round + 1));

    const rl_stats *s = stats();
    CHECK_INT(s->nodes, 3);
    CHECK_INT(s->ops[RL_OP_ACQUIRE][RL_STATUS_OK], 4);
    CHECK_INT(s->ops[RL_OP_ACQUIRE][RL_STATUS_BUSY], 2);
    unsigned long long all = 0;
    for (int k = 0; k < RL_STATS_KINDS; k++)
        for (int st = 0; st < RL_STATS_OUTCOMES; st++) all += s->ops[k][st];
    CHECK_INT(all, N); /* nothing else, nothing twice */
    CHECK_INT(histogram_total(&s->decision[RL_OP_ACQUIRE]), N);
    CHECK_INT(s->decision[RL_OP_ACQUIRE].count[1], N); /* decided 1 ms in: the (0.5, 1] bucket */
    CHECK(s->decision[RL_OP_ACQUIRE].sum_ms == N);
    for (int i = 0; i < 2; i++) {
        CHECK_INT(s->node[i].votes[RL_NODE_OK], 4);
        CHECK_INT(s->node[i].votes[RL_NODE_TAKEN], 2);
        CHECK_INT(s->node[i].timeouts, 0);
        CHECK_INT(s->node[i].step_checks, 0);
        CHECK_INT(s->node[i].reply.count[1], N); /* each answered in 1 ms */
        CHECK_INT(histogram_total(&s->node[i].reply), N);
    }
    CHECK_INT(s->node[2].votes[RL_NODE_PENDING], N - 1); /* never among the first two, */
    CHECK_INT(s->node[2].votes[RL_NODE_TIMEOUT], 1);     /* but failed at once while suspect */
    CHECK_INT(s->node[2].votes[RL_NODE_OK] + s->node[2].votes[RL_NODE_TAKEN], 0);
    CHECK_INT(s->node[2].timeouts, K);      /* the stalled rounds, on the stalled node: late, or suspect */
    CHECK_INT(s->node[2].step_checks, 1);   /* one in flight at a time */
    CHECK_INT(s->node[2].suspected, 1);
    CHECK_INT(s->node[2].suspect, 0);       /* it answered again */
    CHECK_INT(histogram_total(&s->node[2].reply), N + 1); /* the SETs it was sent and both cleanups */
    CHECK_INT(s->node[2].reply.count[RL_STATS_BUCKETS - 1], 0);
    CHECK_INT(s->node[2].reply.count[8], 2); /* SET 1 (290 ms) and SET 2 (190 ms): (100, 250] */
    CHECK_INT(s->tails, N - 3);   /* the granted rounds decided before node 3 answered (not SET 3's) */
    CHECK_INT(s->cleanups, 2);
    for (int i = 0; i < 3; i++) {
        CHECK_INT(s->node[i].connects, 1);
        CHECK_INT(s->node[i].reconnects + s->node[i].resets + s->node[i].lost, 0);
        CHECK_INT(s->node[i].up, 1);
    }
    CHECK_INT(s->inflight + s->tails_running, 0);

    /* node 3's connection ends while idle: it is lost, then asked for again
     * by the next command */
    rl_engine_node_down(E, 2, "connection lost: test", 1000);
    s = stats();
    CHECK_INT(s->node[2].lost, 1);
    CHECK_INT(s->node[2].up, 0);
    CHECK_INT(s->node[2].connects, 1);
    rl_engine_begin_acquire(E, "again", 5, 10000, 1001);
    s = stats();
    CHECK_INT(s->node[2].connects, 2);
    CHECK_INT(s->node[2].reconnects, 1);
    rl_engine_free(E);
}

/* Keep-alive's rounds count as its own, not as the caller's operations. */
static void test_keepalive_counts(void) {
    E = engine(urls, 3, NULL);
    for (int i = 0; i < 3; i++) connect_node(i, 0);
    const char *value = "0123456789abcdef0123456789abcdef01234567";
    int id = rl_engine_keep_add(E, "k", 1, value, 3000, 3000, 0, 0);
    CHECK(id >= 0);
    CHECK_INT(stats()->kept, 1);
    rl_engine_advance(E, 1000); /* due every ttl / 3 */
    for (int i = 0; i < 3; i++) {
        CHECK(drain(i, 1000)[0] != 0);
        CHECK_INT(feed(i, ":1\r\n", 1001), RL_OK);
    }
    rl_engine_advance(E, 2001);
    for (int i = 0; i < 3; i++) {
        CHECK(drain(i, 2001)[0] != 0);
        CHECK_INT(feed(i, ":0\r\n", 2002), RL_OK); /* our value is gone: lost */
    }
    const rl_stats *s = stats();
    CHECK_INT(s->keep_extends[RL_STATUS_OK], 1);
    CHECK_INT(s->keep_extends[RL_STATUS_NOT_HELD], 1);
    CHECK_INT(s->locks_lost, 1);
    CHECK_INT(s->kept, 0);
    CHECK_INT(s->ops[RL_OP_EXTEND][RL_STATUS_OK] + s->ops[RL_OP_EXTEND][RL_STATUS_NOT_HELD], 0);
    CHECK_INT(s->node[0].votes[RL_NODE_OK], 1);
    rl_engine_free(E);
}

/* no_stats: the same run counts nothing. */
static void test_counting_off(void) {
    rl_options o;
    rl_options_init(&o);
    o.no_stats = 1;
    E = engine(urls, 3, &o);
    for (int i = 0; i < 3; i++) connect_node(i, 0);
    acquire(0, 0, 100);
    const rl_stats *s = stats();
    rl_stats zero;
    memset(&zero, 0, sizeof(zero));
    zero.nodes = 3;
    CHECK(memcmp(s, &zero, sizeof(zero)) == 0);
    rl_engine_free(E);
}

/* A label is carried at the start of every lock value, which stays
 * RL_VALUE_LEN long with random hex after it. */
static void test_label(void) {
    rl_options o;
    rl_options_init(&o);
    o.label = "web-1:4242";
    E = engine(urls, 3, &o);
    int id = rl_engine_begin_acquire(E, "x", 1, 1000, 0);
    CHECK(id >= 0);
    rl_engine_node_down(E, 0, "down", 0);
    rl_engine_node_down(E, 1, "down", 0);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(strlen(r.value), RL_VALUE_LEN);
    CHECK(strncmp(r.value, "web-1:4242/", 11) == 0);
    CHECK_INT(strspn(r.value + 11, "0123456789abcdef"), RL_VALUE_LEN - 11);
    rl_engine_free(E);

    const char *bad[] = {"has space", "a/b", "sixteen-chars-xx", "tab\t"};
    for (int i = 0; i < 4; i++) {
        char err[RL_ERR_LEN] = "";
        o.label = bad[i];
        CHECK(rl_engine_new(urls, 3, &o, err, sizeof(err)) == NULL);
        CHECK(strncmp(err, "label ", 6) == 0);
    }
    o.label = "";
    E = engine(urls, 3, &o);
    id = rl_engine_begin_acquire(E, "x", 1, 1000, 0);
    rl_engine_node_down(E, 0, "down", 0);
    rl_engine_node_down(E, 1, "down", 0);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(strspn(r.value, "0123456789abcdef"), RL_VALUE_LEN);
    rl_engine_free(E);
}

static void test_words(void) {
    CHECK_STR(rl_stats_kind_word(RL_OP_ACQUIRE), "acquire");
    CHECK_STR(rl_stats_kind_word(5), "commit");
    CHECK_STR(rl_stats_kind_word(6), "slot");
    CHECK(rl_stats_kind_word(0) == NULL && rl_stats_kind_word(RL_STATS_KINDS) == NULL);
    CHECK(rl_stats_bucket_ms(0) == 0.5 && rl_stats_bucket_ms(RL_STATS_BUCKETS - 2) == 5000);
    CHECK(rl_stats_bucket_ms(RL_STATS_BUCKETS - 1) == -1);
}

int main(void) {
    test_scripted_counts();
    test_keepalive_counts();
    test_counting_off();
    test_label();
    test_words();
    return check_report("test_stats");
}
