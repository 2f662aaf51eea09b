/* test_keep.c — the keep-alive schedule in the engine (rl_engine_keep_*),
 * no network: each test is the driver, with a clock of its own. It advances
 * the engine to the times it picks, reads the extensions and releases the
 * engine wants written, and feeds hand-written replies. */
#include <stdio.h>
#include <string.h>

#include "../src/command.h"
#include "../src/engine.h"
#include "fake_driver.h"
#include "redlock.h"

#define RELEASE_SHA "7205bbba00977f9b6b2fe01cccf64e0a4c625512"
#define EXTEND_SHA "36e94d1c6e02fcefaa7ee5d79eee614dbac55f10"
#define VALUE "0123456789abcdef0123456789abcdef01234567"
#define OK1 ":1\r\n"
#define GONE ":0\r\n"
#define FAIL "-ERR no\r\n"

static const char *const urls[] = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};

/* ---- the driver (fake_driver.h) ---- */

/* Feed node i at t; the engine must take it. */
static void feed_ok(int i, const char *resp, double t) {
    CHECK_INT(feed(i, resp, t), RL_OK);
}

/* Three nodes, connected and set up at t. */
static void start(double t) {
    E = engine(urls, 3, NULL);
    for (int i = 0; i < 3; i++) connect_node(i, t);
}

/* EVALSHA of the extend script (ttl > 0) or the release script on key (E's
 * waiter id its releaser). */
static const char *script(const char *key, int ttl) {
    static char buf[512];
    int len = snprintf(buf, sizeof(buf), "*6\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n$%zu\r\n%s\r\n$40\r\n%s\r\n",
                       ttl > 0 ? EXTEND_SHA : RELEASE_SHA, strlen(key), key, VALUE);
    if (ttl > 0) {
        char ttls[16];
        snprintf(buf + len, sizeof(buf) - (size_t)len, "$%d\r\n%d\r\n", snprintf(ttls, sizeof(ttls), "%d", ttl), ttl);
    } else {
        snprintf(buf + len, sizeof(buf) - (size_t)len, "$%d\r\n%s\r\n", RL_WAITER_ID_LEN, rl_engine_waiter_id(E));
    }
    return buf;
}

/* Advance to t and check what every node was sent (want: "" for nothing). */
static void advance_expect(double t, const char *want) {
    rl_engine_advance(E, t);
    for (int i = 0; i < 3; i++) CHECK_STR(drain(i, t), want);
}

/* Every node answers resp at t. */
static void answer(const char *resp, double t) {
    for (int i = 0; i < 3; i++) feed_ok(i, resp, t);
}

static int state(int id, double t) {
    return rl_engine_keep_state(E, id, NULL, t);
}

static double until(int id, double t) {
    double u = -1;
    rl_engine_keep_state(E, id, &u, t);
    return u;
}

/* When the schedule wants the engine advanced next; the engine's deadline
 * (which also has the streams' watchdog looks) is never later. */
static double keep_at(void) {
    double k = rl_keep_deadline(rl_engine_keeps(E)), d = rl_engine_deadline(E);
    CHECK(d >= 0 && d <= k);
    return k;
}

static void finish(void) {
    rl_result r;
    CHECK_INT(rl_engine_collect(E, &r), 0); /* the schedule's rounds are never handed out */
    rl_engine_free(E);
    E = NULL;
}

/* ---- the tests ---- */

/* Extended every third of ttl - margin, counted from the last answer; the
 * validity is the extension's, from its decision. Rounds stay inside. */
static void extends_every_third(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    CHECK_INT(id, 0);
    CHECK_INT(rl_engine_keeping(E), 1);
    CHECK(keep_at() == 2000);
    advance_expect(1999, "");
    advance_expect(2000, script("k", 3000));
    CHECK_INT(rl_engine_inflight(E), 1);
    answer(OK1, 2010); /* validity 3000 - 10 - (30 + 2) from the decision at 2010 */
    CHECK_INT(state(id, 2010), RL_KEEP_HELD);
    CHECK(until(id, 2010) == 4968);
    CHECK_INT(rl_engine_inflight(E), 0);
    CHECK(keep_at() == 3010);
    advance_expect(3009, "");
    advance_expect(3010, script("k", 3000));
    answer(OK1, 3020);
    CHECK(until(id, 3020) == 5978);
    /* with a margin: every (ttl - margin) / 3 */
    CHECK_INT(rl_engine_keep_add(E, "m", 1, VALUE, 3000, 6000, 1500, 3020), 1);
    CHECK(keep_at() == 3520);
    advance_expect(3520, script("m", 3000));
    finish();
}

/* A grant or an extension that took long next to its ttl leaves less than
 * two periods before the lock would be called lost: the next extension
 * comes halfway there, not after the period (which fell after it: the lock
 * was called lost with no extension tried). */
static void slow_rounds_are_extended_in_time(void) {
    start(1000);
    /* ttl 900, no margin: period 300; the grant left validity until 1184 */
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 900, 1184, 0, 1000);
    CHECK(keep_at() == 1092);
    advance_expect(1092, script("k", 900));
    answer(OK1, 1442); /* 350 ms: validity 900 - 350 - (9 + 2) from 1442 */
    CHECK_INT(state(id, 1442), RL_KEEP_HELD);
    CHECK(until(id, 1442) == 1981);
    CHECK(keep_at() == 1711.5); /* two periods (2042) would be past 1981 */
    advance_expect(1712, script("k", 900));
    answer(OK1, 1722);
    CHECK_INT(state(id, 1722), RL_KEEP_HELD);
    CHECK(until(id, 1722) == 2601);
    CHECK(keep_at() == 2022); /* a quick one: the period again */
    finish();
}

/* Extensions falling due within a tick go out together, at the later end. */
static void due_together_in_a_tick(void) {
    start(1000);
    int a = rl_engine_keep_add(E, "a", 1, VALUE, 3000, 3900, 0, 1000);
    int b = rl_engine_keep_add(E, "b", 1, VALUE, 3000, 3900, 0, 1005);
    advance_expect(2000, script("a", 3000));
    CHECK(keep_at() == 2010); /* b was due at 2005 */
    advance_expect(2009, "");
    advance_expect(2010, script("b", 3000));
    answer(OK1 OK1, 2020);
    CHECK_INT(state(a, 2020), RL_KEEP_HELD);
    CHECK_INT(state(b, 2020), RL_KEEP_HELD);
    finish();
}

/* A failed extension (errors, or no reply within the node timeout) is tried
 * again after min(ttl / 10, 100) ms; the lock stays held meanwhile. */
static void failed_extension_is_retried(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    answer(FAIL, 2010);
    CHECK_INT(state(id, 2010), RL_KEEP_HELD);
    CHECK(until(id, 2010) == 3900);
    CHECK(keep_at() == 2110);
    advance_expect(2109, "");
    advance_expect(2110, script("k", 3000));
    /* no reply: the round times out at the node timeout (50 ms), the nodes
     * get a step check; their late answers come in after */
    rl_engine_advance(E, 2160);
    CHECK_INT(state(id, 2160), RL_KEEP_HELD);
    for (int i = 0; i < 3; i++) {
        const char *echo = strstr(drain(i, 2160), "ECHO\r\n");
        CHECK(echo != NULL);
        feed_ok(i, OK1, 2161);
        if (echo) feed_ok(i, echo + 6, 2161);
    }
    CHECK(until(id, 2161) == 3900);
    advance_expect(2260, script("k", 3000));
    answer(OK1, 2270);
    CHECK(until(id, 2270) == 5228);
    /* a short ttl retries after ttl / 10 */
    int s = rl_engine_keep_add(E, "s", 1, VALUE, 600, 2870, 0, 2270);
    advance_expect(2470, script("s", 600));
    answer(FAIL, 2475);
    CHECK(keep_at() == 2535);
    advance_expect(2535, script("s", 600));
    CHECK_INT(state(s, 2535), RL_KEEP_HELD);
    finish();
}

/* An extension that finds our value gone from a quorum: lost at once,
 * nothing more is sent. */
static void lost_when_not_held(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    feed_ok(0, GONE, 2005);
    feed_ok(1, GONE, 2005);
    CHECK_INT(state(id, 2005), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keeping(E), 0);
    feed_ok(2, OK1, 2006);
    advance_expect(5000, "");
    CHECK_INT(state(id, 5000), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keep_update(E, id, 5000, 4000, 9000, 5000), RL_ERR); /* not held */
    CHECK_INT(rl_engine_keep_remove(E, id), RL_OK);
    CHECK_INT(state(id, 5000), RL_ERR);
    finish();
}

/* Nodes down: every extension fails at once (most as they begin); the lock
 * turns lost at valid_until - margin, whether or not anyone asks. */
static void lost_on_time(void) {
    char err[RL_ERR_LEN];
    E = rl_engine_new(urls, 3, NULL, err, sizeof(err));
    for (int i = 0; i < 3; i++) rl_engine_node_down(E, i, "connect failed: refused", 1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    int tries = 0;
    double t = 1000;
    for (; t < 4000; t++) {
        double at = rl_keep_deadline(rl_engine_keeps(E));
        rl_engine_advance(E, t);
        for (int i = 0; i < 3; i++) /* every reconnect fails at once */
            if (rl_engine_node_wants(E, i) & RL_WANT_CONNECT) rl_engine_node_down(E, i, "connect failed: refused", t);
        CHECK_INT(rl_engine_inflight(E), 0); /* failed at once */
        if (rl_engine_keeping(E) == 0) break;
        if (at <= t && rl_keep_deadline(rl_engine_keeps(E)) > t) tries++;
    }
    CHECK(t == 3400);
    CHECK(tries >= 10); /* first at 1833, then every 100 ms */
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    rl_engine_free(E);
    /* lost by time with an extension in flight, as soon as anyone looks */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    CHECK_INT(state(id, 3399), RL_KEEP_HELD);
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    answer(OK1, 3401); /* too late: a lost lock stays lost */
    CHECK_INT(state(id, 3401), RL_KEEP_LOST);
    finish();
}

/* The owner extends while one of the schedule's extensions is in flight:
 * nodes may hold either ttl, so the shorter validity counts and the lock is
 * extended again at once, with the owner's ttl. */
static void update_while_in_flight(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    /* the owner's extend to 9000, begun at 2004, left validity to 12904 */
    CHECK_INT(rl_engine_keep_update(E, id, 9000, 2004, 12904, 2006), RL_OK);
    CHECK(until(id, 2006) == 3900);
    answer(OK1, 2010); /* ours, with the old ttl: 2010 + 2958 */
    CHECK(until(id, 2010) == 3900);
    advance_expect(2010, script("k", 9000));
    answer(OK1, 2020); /* 9000 - 10 - 92 from 2020 */
    CHECK(until(id, 2020) == 10918);
    CHECK(keep_at() == 5020);
    /* an update with no extension of ours overlapping: the owner's counts */
    CHECK_INT(rl_engine_keep_update(E, id, 6000, 3000, 8900, 3001), RL_OK);
    CHECK(until(id, 3001) == 8900);
    CHECK(keep_at() == 5001);
    /* ours began after the owner's (whose answer came later): again at once */
    advance_expect(5001, script("k", 6000));
    answer(OK1, 5011);
    CHECK_INT(rl_engine_keep_update(E, id, 7000, 4990, 11000, 5012), RL_OK);
    CHECK(until(id, 5012) == 10939); /* ours: 6000 - 10 - 62 from 5011 */
    advance_expect(5012, script("k", 7000));
    CHECK_INT(rl_engine_keep_update(E, id, 0, 5012, 11000, 5013), RL_ERR);
    finish();
}

/* One of ours was decided before every node answered it (node 3's answer
 * held back): it may still reach node 3 after the owner's extension to a
 * longer ttl, which goes out on another connection, and leave the key there
 * only its ttl. The owner's counts no longer than that (its validity less
 * the difference in ttl, and never above ours), and ours goes again at
 * once with the owner's ttl, behind the held-back one. Once every node
 * answered one of ours, an owner's extension counts in full. */
static void unanswered_extension_caps_the_owners(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    feed_ok(0, OK1, 2010);
    feed_ok(1, OK1, 2010); /* decided: 3000 - 10 - 32 from 2010 */
    CHECK(until(id, 2010) == 4968);
    /* the owner's extend to 9000, begun at 2005, left validity to 10913 */
    CHECK_INT(rl_engine_keep_update(E, id, 9000, 2005, 10913, 2020), RL_OK);
    CHECK(until(id, 2020) == 4913); /* 10913 less 6000 */
    advance_expect(2020, script("k", 9000));
    feed_ok(2, OK1, 2025); /* the held-back answer: ours ran everywhere */
    feed_ok(0, OK1, 2030);
    feed_ok(1, OK1, 2030); /* decided: 9000 - 10 - 92 from 2030 */
    CHECK(until(id, 2030) == 10928);
    /* the owner's extend to 12000 (from 2500) while node 3 owes that answer */
    CHECK_INT(rl_engine_keep_update(E, id, 12000, 2500, 14378, 2540), RL_OK);
    CHECK(until(id, 2540) == 10928); /* 14378 - 3000 = 11378: ours' is lower */
    finish();

    /* once every node answered ours, an owner's extension counts in full */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    answer(OK1, 2010); /* node 3 answers in the tail */
    CHECK_INT(rl_engine_keep_update(E, id, 12000, 2500, 14378, 2540), RL_OK);
    CHECK(until(id, 2540) == 14378);
    finish();

    /* taken back after a loss: ours unanswered by one node caps it too */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    feed_ok(0, FAIL, 1840);
    feed_ok(1, FAIL, 1840); /* two errors decide it, node 3 unanswered */
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    /* the owner's extend to 9000, begun at 3300, valid to 12200: 6000 less */
    CHECK_INT(rl_engine_keep_update(E, id, 9000, 3300, 12200, 3420), RL_OK);
    CHECK(until(id, 3420) == 6200);
    finish();
}

/* Lost for want of time while the owner's own extension was in flight:
 * that extension, confirmed by a quorum, takes the lock back (held, and
 * extended again at once; the answer to ours begun before the loss no
 * longer counts). Not when it leaves no validity above the margin; and a
 * lock whose value an extension found gone stays lost (lost_when_not_held). */
/* Lost by time with keep-alive's extension out; that extension then finds
 * our value gone from a quorum: the owner's extension, begun before it and
 * answered after, takes nothing back (the value was gone after it began). */
static void value_found_gone_is_not_taken_back(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    answer(GONE, 3410);
    CHECK_INT(rl_engine_keep_update(E, id, 3000, 1800, 4700, 3420), RL_ERR);
    CHECK_INT(state(id, 3420), RL_KEEP_LOST);
    finish();

    /* lost by time; the owner's own extension then finds the value gone:
     * refused, and the validity it found (none after its start) counts */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keep_update(E, id, 3000, 3300, 3300, 3420), RL_ERR);
    CHECK(until(id, 3420) == 3300);
    finish();
}

static void owner_extension_takes_back_a_lost_lock(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000)); /* ours, unanswered */
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    /* the owner's extend to 3000, begun at 2500, answered at 3420 */
    CHECK_INT(rl_engine_keep_update(E, id, 3000, 2500, 5400, 3420), RL_OK);
    CHECK_INT(state(id, 3420), RL_KEEP_HELD);
    CHECK(until(id, 3420) == 5400);
    CHECK_INT(rl_engine_keeping(E), 1);
    answer(OK1, 3425); /* ours from 1834: it would count from before the loss */
    CHECK(until(id, 3425) == 5400);
    advance_expect(3430, script("k", 3000)); /* again at once */
    answer(OK1, 3440);                       /* 3000 - 10 - 32 from 3440 */
    CHECK(until(id, 3440) == 6398);
    CHECK_INT(state(id, 3440), RL_KEEP_HELD);
    finish();

    /* ours in flight asked for a shorter ttl than the owner's: a node it
     * reaches last keeps the key only extend_start + its ttl, less what the
     * owner's extension lost to elapsed time and drift (2500 + 9000 - 11400) */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keep_update(E, id, 9000, 2500, 11400, 3420), RL_OK);
    CHECK(until(id, 3420) == 4734);
    answer(OK1, 3425);
    CHECK(until(id, 3425) == 4734);
    advance_expect(3430, script("k", 9000));
    finish();

    /* an extension that leaves no more than the margin: still lost */
    start(1000);
    id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    advance_expect(1834, script("k", 3000));
    CHECK_INT(state(id, 3400), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keep_update(E, id, 3000, 1000, 3920, 3420), RL_ERR);
    CHECK_INT(state(id, 3420), RL_KEEP_LOST);
    CHECK_INT(rl_engine_keeping(E), 0);
    finish();
}

/* A dropped lock is released by the engine (once its extension in flight
 * is out: the release follows it), then forgotten. */
static void drop_releases(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    CHECK_INT(rl_engine_keep_drop(E, id, 2001), RL_OK);
    CHECK_INT(state(id, 2001), RL_ERR);
    CHECK_INT(rl_engine_keep_drop(E, id, 2001), RL_ERR);
    CHECK(keep_at() <= 2001);
    CHECK_INT(rl_engine_keeping(E), 1);
    advance_expect(2001, script("k", 0));
    answer(OK1, 2005); /* the extension's answer: ignored */
    CHECK_INT(rl_engine_keeping(E), 1);
    answer(OK1, 2006);
    CHECK_INT(rl_engine_keeping(E), 0);
    /* the entry is used again, under an id of its own: the old id names nothing */
    int again = rl_engine_keep_add(E, "n", 1, VALUE, 3000, 5000, 0, 2006);
    CHECK(again >= 0 && again != id);
    CHECK_INT(state(id, 2006), RL_ERR);
    CHECK_INT(rl_engine_keep_remove(E, id), RL_ERR);
    CHECK_INT(state(again, 2006), RL_KEEP_HELD);
    finish();
}

/* remove forgets: no extension, no release; a late answer is ignored. */
static void remove_forgets(void) {
    start(1000);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 0, 1000);
    advance_expect(2000, script("k", 3000));
    CHECK_INT(rl_engine_keep_remove(E, id), RL_OK);
    CHECK_INT(rl_engine_keep_remove(E, id), RL_ERR);
    CHECK_INT(rl_engine_keeping(E), 0);
    answer(OK1, 2010);
    advance_expect(9000, "");
    CHECK_INT(state(id, 9000), RL_ERR);
    /* lapse: not extended, held until its validity less margin, then lost */
    id = rl_engine_keep_add(E, "l", 1, VALUE, 3000, 11900, 100, 9000);
    CHECK_INT(rl_engine_keep_lapse(E, id), RL_OK);
    CHECK_INT(rl_engine_keeping(E), 0);
    advance_expect(11000, "");
    CHECK_INT(state(id, 11799), RL_KEEP_HELD);
    CHECK_INT(state(id, 11800), RL_KEEP_LOST);
    finish();
}

/* release_all: held and lost locks are RELEASED, their releases counted. */
static void release_all_counts(void) {
    start(1000);
    int a = rl_engine_keep_add(E, "a", 1, VALUE, 3000, 3900, 0, 1000);
    int b = rl_engine_keep_add(E, "b", 1, VALUE, 3000, 3900, 0, 1000);
    CHECK_INT(rl_engine_keep_release_all(E, 1500), 2);
    CHECK_INT(state(a, 1500), RL_KEEP_RELEASED);
    rl_engine_advance(E, 1500);
    for (int i = 0; i < 3; i++) {
        drain(i, 1500);
        CHECK(strstr(out, "$1\r\na\r\n") && strstr(out, "$1\r\nb\r\n"));
    }
    int released = -1;
    answer(OK1 GONE, 1510);
    CHECK_INT(rl_engine_keep_releasing(E, &released), 0);
    CHECK_INT(released, 1);
    CHECK_INT(state(b, 1510), RL_KEEP_RELEASED);
    advance_expect(5000, "");
    CHECK_INT(rl_engine_keep_remove(E, a), RL_OK);
    CHECK_INT(rl_engine_keep_drop(E, b, 5000), RL_OK); /* released already: just forgotten */
    CHECK_INT(rl_engine_keeping(E), 0);
    finish();
}

/* What add, update and the rest refuse. */
static void refusals(void) {
    start(1000);
    CHECK_INT(rl_engine_keep_add(E, "k", 1, "short", 3000, 3900, 0, 1000), RL_ERR);
    CHECK_STR(rl_engine_errstr(E), "value must be 40 characters");
    CHECK_INT(rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 3000, 1000), RL_ERR);
    CHECK_STR(rl_engine_errstr(E), "margin must be from 0 to ttl - 1 ms (got 3000)");
    CHECK_INT(rl_engine_keep_add(E, "", 0, VALUE, 3000, 3900, 0, 1000), RL_ERR);
    /* a name no extension could ever use (before: held, then lost, unsaid) */
    CHECK_INT(rl_engine_keep_add(E, "x:fence", 7, VALUE, 3000, 3900, 0, 1000), RL_ERR);
    CHECK(strstr(rl_engine_errstr(E), "resource is reserved") != NULL);
    static char huge[RL_MAX_KEY_LEN + 1];
    memset(huge, 'a', sizeof(huge));
    CHECK_INT(rl_engine_keep_add(E, huge, sizeof(huge), VALUE, 3000, 3900, 0, 1000), RL_ERR);
    CHECK(strstr(rl_engine_errstr(E), "longer than a key may be") != NULL);
    CHECK_INT(rl_engine_keep_add(E, "k", 1, VALUE, 0, 3900, 0, 1000), RL_ERR);
    CHECK_INT(rl_engine_keep_add(E, "k", 1, VALUE, 3000, 1.0 / 0.0, 0, 1000), RL_ERR);
    int id = rl_engine_keep_add(E, "k", 1, VALUE, 3000, 3900, 500, 1000);
    CHECK_INT(rl_engine_keep_update(E, id, 500, 1000, 3900, 1000), RL_ERR); /* not above the margin */
    CHECK_INT(rl_engine_keep_update(E, id + 1, 5000, 1000, 3900, 1000), RL_ERR);
    CHECK_INT(rl_engine_keep_state(E, -1, NULL, 1000), RL_ERR);
    rl_engine_keep_clear(E);
    CHECK_INT(rl_engine_keeping(E), 0);
    CHECK_INT(state(id, 1000), RL_ERR);
    finish();
}

int main(void) {
    extends_every_third();
    slow_rounds_are_extended_in_time();
    due_together_in_a_tick();
    failed_extension_is_retried();
    lost_when_not_held();
    lost_on_time();
    update_while_in_flight();
    unanswered_extension_caps_the_owners();
    owner_extension_takes_back_a_lost_lock();
    value_found_gone_is_not_taken_back();
    drop_releases();
    remove_forgets();
    release_all_counts();
    refusals();
    return check_report("keep");
}
