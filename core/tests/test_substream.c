/* test_substream.c — hand-off's subscriptions through the rl_engine_* API,
 * no network: the test is the driver of the subscriber links (N + i). It
 * reads the bytes the engine wants written, and feeds hand-written pub/sub
 * replies at times it picks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/substream.h"
#include "fake_driver.h"
#include "redlock.h"

static const char *const urls3[] = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};


/* RESP of a bulk string. */
static const char *bulk(const char *s, char *buf, size_t len) {
    snprintf(buf, len, "$%zu\r\n%s\r\n", strlen(s), s);
    return buf;
}

/* The two channels of resource r: the broadcast and this engine's wake channel. */
static const char *channel(const char *r) {
    static char buf[256];
    snprintf(buf, sizeof(buf), "redlock:released:%s", r);
    return buf;
}

static const char *wake_channel(const char *r) {
    static char buf[256];
    snprintf(buf, sizeof(buf), "redlock:wake:%s:%s", rl_engine_waiter_id(E), r);
    return buf;
}

/* What SUBSCRIBE or UNSUBSCRIBE of the resources r[0 .. n-1] looks like. */
static const char *command(const char *verb, const char *const *r, int n) {
    static char buf[4096];
    char b[300];
    int at = snprintf(buf, sizeof(buf), "*%d\r\n%s", 1 + 2 * n, bulk(verb, b, sizeof(b)));
    for (int i = 0; i < n; i++) {
        at += snprintf(buf + at, sizeof(buf) - (size_t)at, "%s", bulk(channel(r[i]), b, sizeof(b)));
        at += snprintf(buf + at, sizeof(buf) - (size_t)at, "%s", bulk(wake_channel(r[i]), b, sizeof(b)));
    }
    return buf;
}

/* A message on ch saying payload. */
static const char *message(const char *ch, const char *payload) {
    static char buf[4096];
    char a[300], b[300];
    snprintf(buf, sizeof(buf), "*3\r\n$7\r\nmessage\r\n%s%s", bulk(ch, a, sizeof(a)), bulk(payload, b, sizeof(b)));
    return buf;
}

/* SUBSCRIBE's confirmation of ch. */
static const char *confirmation(const char *ch, int count) {
    static char buf[512];
    char a[300];
    snprintf(buf, sizeof(buf), "*3\r\n$9\r\nsubscribe\r\n%s:%d\r\n", bulk(ch, a, sizeof(a)), count);
    return buf;
}

/* Connect subscriber link k at t (it must want that). */
static void connect_link(int k, double t) {
    CHECK_INT(rl_engine_node_wants(E, k) & RL_WANT_CONNECT, RL_WANT_CONNECT);
    CHECK_INT(rl_engine_node_connected(E, k, 1, t), RL_OK);
}

/* ---- subscribing ---- */

/* Nothing is asked of the driver before the first watch; the first asks
 * every subscriber link to connect and subscribes there; a nested watch
 * sends nothing; a second resource is subscribed on its own on links up. */
static void subscribe_on_watch(void) {
    E = engine(urls3, 3, NULL);
    CHECK_INT(rl_engine_wanting(E), 0);
    CHECK_INT(rl_engine_listening(E), 0);
    CHECK_INT(rl_engine_watch(E, "", 0, 0), RL_ERR);
    CHECK_INT(rl_engine_watch(E, NULL, 3, 0), RL_ERR);
    CHECK(strstr(rl_engine_errstr(E), "non-empty") != NULL);
    static char too_long[RL_MAX_KEY_LEN + 1];
    memset(too_long, 'r', sizeof(too_long));
    CHECK_INT(rl_engine_watch(E, too_long, sizeof(too_long), 0), RL_ERR);
    CHECK(strstr(rl_engine_errstr(E), "longer than a key") != NULL);
    CHECK_INT(rl_engine_wanting(E), 0);
    int id = rl_engine_watch(E, "a", 1, 0);
    CHECK(id >= 0);
    CHECK_INT(rl_engine_wanting(E), 7 << 3); /* links 3, 4, 5: the nodes' subscribers */
    CHECK_INT(rl_engine_watch(E, "a", 1, 0), id); /* nested: the same watch */
    for (int k = 3; k < 6; k++) {
        CHECK_STR(rl_engine_node_host(E, k), "127.0.0.1");
        CHECK_INT(rl_engine_node_port(E, k), 7001 + k - 3);
        connect_link(k, 1);
        const char *r[] = {"a"};
        CHECK_STR(drain(k, 1), command("SUBSCRIBE", r, 1));
    }
    CHECK_INT(rl_engine_listening(E), 3);
    CHECK_INT(rl_engine_wanting(E), 0);
    /* the command links are not touched */
    CHECK_INT(rl_engine_node_unanswered(E, 0), 0);
    CHECK_INT(rl_engine_unwritten(E), 0);
    int id2 = rl_engine_watch(E, "b", 1, 2);
    CHECK(id2 >= 0 && id2 != id);
    const char *r[] = {"b"};
    CHECK_STR(drain(4, 2), command("SUBSCRIBE", r, 1));
    CHECK_INT(rl_engine_node_unanswered(E, 4), 0);
    rl_engine_free(E);
}

/* The last unwatch unsubscribes (nested watches: only the last), forgets
 * what was heard, and an unknown resource is ignored. */
static void unsubscribe_on_last_unwatch(void) {
    E = engine(urls3, 3, NULL);
    rl_engine_watch(E, "a", 1, 0);
    rl_engine_watch(E, "a", 1, 0);
    connect_link(3, 0);
    drain(3, 0);
    CHECK_INT(feed(3, message(channel("a"), "2"), 1), RL_OK);
    CHECK_INT(rl_engine_heard(E, "a", 1), 1);
    rl_engine_unwatch(E, "a", 1, 2);
    CHECK_STR(drain(3, 2), "");
    CHECK_INT(rl_engine_heard(E, "a", 1), 1);
    rl_engine_unwatch(E, "zz", 2, 2);
    rl_engine_unwatch(E, NULL, 0, 2);
    rl_engine_unwatch(E, "a", 1, 3);
    const char *r[] = {"a"};
    CHECK_STR(drain(3, 3), command("UNSUBSCRIBE", r, 1));
    CHECK_INT(rl_engine_heard(E, "a", 1), 0);
    CHECK_INT(rl_engine_heard(E, NULL, 0), 1); /* every message ever */
    CHECK_INT(rl_engine_heard_next(E, NULL), -1); /* its news went with it */
    rl_engine_unwatch(E, "a", 1, 4);            /* one too many: ignored */
    CHECK_STR(drain(3, 4), "");
    /* the connection stays, and links not yet begun are not needed any more */
    CHECK_INT(rl_engine_listening(E), 1);
    CHECK_INT(rl_engine_node_wants(E, 4), 0);
    CHECK_INT(rl_engine_wanting(E), 0);
    rl_engine_free(E);
}

/* ---- what is heard ---- */

/* Only a release's message counts: a positive decimal (1 to 9 digits, no
 * leading zero) on the resource's channel, "1" on the wake channel. The
 * news say which watch heard, and whether anyone may compete. */
static void counts_only_releases(void) {
    E = engine(urls3, 3, NULL);
    int a = rl_engine_watch(E, "a", 1, 0), b = rl_engine_watch(E, "b", 1, 0);
    connect_link(3, 0);
    drain(3, 0);
    const char *ignored[] = {"0", "01", "-1", "1x", "", "1234567890", "1 ", "hello"};
    for (size_t i = 0; i < sizeof(ignored) / sizeof(*ignored); i++)
        CHECK_INT(feed(3, message(channel("a"), ignored[i]), 1), RL_OK);
    CHECK_INT(feed(3, message(wake_channel("a"), "2"), 1), RL_OK);
    CHECK_INT(feed(3, message("redlock:released:zz", "1"), 1), RL_OK);   /* not watched */
    CHECK_INT(feed(3, "*3\r\n$7\r\nmessage\r\n$18\r\nredlock:released:a\r\n:1\r\n", 1), RL_OK); /* not a string */
    CHECK_INT(feed(3, "*2\r\n$7\r\nmessage\r\n$18\r\nredlock:released:a\r\n", 1), RL_OK); /* not a message's shape */
    CHECK_INT(feed(3, "+OK\r\n", 1), RL_OK);
    CHECK_INT(feed(3, confirmation(channel("a"), 1), 1), RL_OK);
    CHECK_INT(rl_engine_heard(E, "a", 1), 0);
    CHECK_INT(rl_engine_heard(E, NULL, 0), 0);
    CHECK_INT(rl_engine_heard_next(E, NULL), -1);
    CHECK_INT(rl_engine_heard_listeners(E, "a", 1), 0);
    /* a broadcast: every waiter may compete */
    CHECK_INT(feed(3, message(channel("a"), "123456789"), 2), RL_OK);
    CHECK_INT(rl_engine_heard(E, "a", 1), 1);
    CHECK_INT(rl_engine_heard_listeners(E, "a", 1), 123456789);
    int broadcast = -1;
    CHECK_INT(rl_engine_heard_next(E, &broadcast), a);
    CHECK_INT(broadcast, 1);
    CHECK_INT(rl_engine_heard_next(E, &broadcast), -1);
    /* a wake-up from the queue, byte by byte: this client alone */
    const char *m = message(wake_channel("b"), "1");
    for (size_t i = 0; m[i]; i++) CHECK_INT(rl_engine_node_feed(E, 3, m + i, 1, 3), RL_OK);
    connect_link(4, 3); /* another node's copy of the same release */
    drain(4, 3);
    CHECK_INT(feed(4, message(wake_channel("b"), "1"), 3), RL_OK);
    CHECK_INT(rl_engine_heard(E, "b", 1), 2);
    CHECK_INT(rl_engine_heard_listeners(E, "b", 1), 1);
    CHECK_INT(rl_engine_heard_next(E, &broadcast), b); /* once, however much it heard */
    CHECK_INT(broadcast, 0);
    CHECK_INT(rl_engine_heard_next(E, &broadcast), -1);
    /* both kinds since the last look: a broadcast */
    feed(3, message(wake_channel("a"), "1"), 4);
    feed(3, message(channel("a"), "2"), 4);
    CHECK_INT(rl_engine_heard_next(E, &broadcast), a);
    CHECK_INT(broadcast, 1);
    CHECK_INT(rl_engine_heard(E, NULL, 0), 5);
    CHECK_INT(rl_engine_heard_listeners(E, NULL, 0), 2);
    rl_engine_free(E);
}

/* Thousands of watches: each message reaches its own, whichever watches
 * came and went before (their places reused, the index rebuilt as it grew). */
static void many_watches(void) {
    E = engine(urls3, 3, NULL);
    enum { N = 3000 };
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "r%d", i);
        CHECK_INT(rl_engine_watch(E, name, strlen(name), 0), i);
    }
    for (int i = 0; i < N; i += 2) {
        snprintf(name, sizeof(name), "r%d", i);
        rl_engine_unwatch(E, name, strlen(name), 0);
    }
    for (int i = 0; i < N; i += 2) { /* the freed places, under other names */
        snprintf(name, sizeof(name), "s%d", i);
        CHECK(rl_engine_watch(E, name, strlen(name), 0) >= 0);
    }
    connect_link(3, 0);
    drain(3, 0);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "%c%d", i % 2 ? 'r' : 's', i);
        CHECK_INT(feed(3, message(i % 3 ? channel(name) : wake_channel(name), "1"), 1), RL_OK);
        CHECK_INT(rl_engine_heard(E, name, strlen(name)), 1);
        snprintf(name, sizeof(name), "r%d", i);
        if (i % 2 == 0) CHECK_INT(rl_engine_heard(E, name, strlen(name)), 0); /* unwatched */
    }
    CHECK_INT(rl_engine_heard(E, NULL, 0), N);
    rl_engine_free(E);
}

/* With cluster nodes, "{orders}"'s plain channels are "orders"'s sharded
 * ones: a message counts for the watch whose names it came on, by the kind
 * of stream it came from, whichever was watched first. */
static void plain_and_sharded_names_apart(void) {
    rl_options o;
    rl_options_init(&o);
    rl_subs s;
    CHECK_INT(rl_subs_init(&s, NULL, 0, &o), 0);
    s.clusters = 1;
    const char waiter[] = "0123456789abcdef";
    int braced = rl_subs_watch(&s, "{orders}", 8, waiter, 1);
    int plain = rl_subs_watch(&s, "orders", 6, waiter, 1);
    CHECK(braced >= 0 && plain >= 0 && braced != plain);
    const rl_watched *w = &s.w[plain];
    CHECK(w->clen == s.w[braced].len && memcmp(w->cchannel, s.w[braced].channel, w->clen) == 0);
    rl_subs_message(&s, w->cchannel, w->clen, "1", 1, 1); /* a shard's release of "orders" */
    CHECK_INT(rl_subs_heard(&s, "orders", 6), 1);
    CHECK_INT(rl_subs_heard(&s, "{orders}", 8), 0);
    rl_subs_message(&s, w->cwake, w->cwake_len, "1", 1, 1);
    CHECK_INT(rl_subs_heard(&s, "orders", 6), 2);
    rl_subs_message(&s, s.w[braced].channel, s.w[braced].len, "1", 1, 0); /* a plain node's of "{orders}" */
    CHECK_INT(rl_subs_heard(&s, "{orders}", 8), 1);
    CHECK_INT(rl_subs_heard(&s, "orders", 6), 2);
    rl_subs_free(&s);
}

/* Bytes that are no RESP, and an error reply (a refused SUBSCRIBE), end the
 * connection: the driver closes it, the engine connects again later. */
static void garbage_drops_the_connection(void) {
    E = engine(urls3, 3, NULL);
    rl_engine_watch(E, "a", 1, 0);
    connect_link(3, 0);
    drain(3, 0);
    CHECK_INT(feed(3, "?garbage\r\n", 1), RL_ERR);
    CHECK_INT(rl_engine_node_wants(E, 3), RL_WANT_CLOSE);
    CHECK_STR(rl_engine_node_errstr(E, 3), "connection reset: Protocol error, got \"?\" as reply type byte");
    CHECK_INT(rl_engine_listening(E), 0);
    CHECK_INT(feed(3, message(channel("a"), "1"), 1), RL_ERR); /* nothing more from it */
    CHECK_INT(rl_engine_heard(E, "a", 1), 0);
    rl_engine_advance(E, 51);
    connect_link(3, 51);
    drain(3, 51);
    CHECK_INT(feed(3, "-NOPERM this user has no permissions to access the channel\r\n", 52), RL_ERR);
    CHECK_INT(rl_engine_node_wants(E, 3), RL_WANT_CLOSE);
    CHECK_STR(rl_engine_node_errstr(E, 3), "refused: NOPERM this user has no permissions to access the channel");
    rl_engine_free(E);
}

/* A frame longer than RL_REPLY_MAX_STRING (64 KB) plus the longest channel
 * name watched ends the connection once that many of its bytes are in; a
 * name longer than 64 KB is heard all the same. */
static void frame_over_the_cap(void) {
    E = engine(urls3, 3, NULL);
    rl_engine_watch(E, "a", 1, 0);
    connect_link(3, 0);
    drain(3, 0);
    const char *ch = wake_channel("a"); /* the longest name */
    size_t cap = 65536 + strlen(ch);
    /* a message whose every string fits, and whose frame does not */
    size_t plen = 65536;
    char *frame = malloc(plen + 512);
    int h = snprintf(frame, 512, "*3\r\n$7\r\nmessage\r\n$%zu\r\n%s\r\n$%zu\r\n", strlen(ch), ch, plen);
    memset(frame + h, 'x', plen);
    memcpy(frame + h + plen, "\r\n", 3);
    size_t total = (size_t)h + plen + 2;
    CHECK(total > cap);
    CHECK_INT(rl_engine_node_feed(E, 3, frame, cap, 1), RL_OK);
    CHECK_INT(rl_engine_node_feed(E, 3, frame + cap, 1, 1), RL_ERR);
    CHECK_INT(rl_engine_node_wants(E, 3), RL_WANT_CLOSE);
    CHECK(strstr(rl_engine_node_errstr(E, 3), "a frame over") != NULL);
    /* a string declared longer than the cap: refused from its header */
    rl_engine_advance(E, 51);
    connect_link(3, 51);
    drain(3, 51);
    CHECK_INT(feed(3, "*3\r\n$7\r\nmessage\r\n$1\r\nx\r\n$900000\r\n", 52), RL_ERR);
    CHECK(strstr(rl_engine_node_errstr(E, 3), "reply too large") != NULL);
    free(frame);
    /* the longest resource (64 KB): its messages are frames of more than 64 KB */
    size_t rlen = RL_MAX_KEY_LEN;
    char *r = malloc(rlen + 1);
    memset(r, 'r', rlen);
    r[rlen] = '\0';
    CHECK(rl_engine_watch(E, r, rlen, 52) >= 0);
    rl_engine_advance(E, 200);
    connect_link(3, 200);
    size_t len = rl_engine_node_output(E, 3, &(const char *){NULL});
    CHECK(len > 2 * rlen);
    rl_engine_node_wrote(E, 3, len, 200);
    char *big = malloc(rlen + 256);
    int n = snprintf(big, rlen + 256, "*3\r\n$7\r\nmessage\r\n$%zu\r\nredlock:released:%s\r\n$1\r\n4\r\n", rlen + 17, r);
    CHECK_INT(rl_engine_node_feed(E, 3, big, (size_t)n, 201), RL_OK);
    CHECK_INT(rl_engine_heard(E, r, rlen), 1);
    CHECK_INT(rl_engine_heard_listeners(E, r, rlen), 4);
    free(big);
    free(r);
    rl_engine_free(E);
}

/* ---- connections ---- */

/* A connection lost is made again after the backoff, and subscribes to
 * everything watched, in one command. */
static void resubscribe_after_reconnect(void) {
    E = engine(urls3, 3, NULL);
    rl_engine_watch(E, "a", 1, 0);
    connect_link(5, 0);
    drain(5, 0);
    rl_engine_watch(E, "b", 1, 1);
    drain(5, 1);
    CHECK_INT(feed(5, confirmation(channel("a"), 1), 2), RL_OK);
    rl_engine_node_down(E, 5, "connection lost: closed by the server", 10);
    CHECK_STR(rl_engine_node_errstr(E, 5), "connection lost: closed by the server");
    CHECK_INT(rl_engine_node_wants(E, 5), 0); /* no close: the driver's socket is gone */
    CHECK_INT(rl_engine_listening(E), 0);
    CHECK(rl_engine_deadline(E) == 60); /* reconnect_min_ms */
    rl_engine_advance(E, 59);
    CHECK_INT(rl_engine_node_wants(E, 5), 0);
    rl_engine_advance(E, 60);
    connect_link(5, 61);
    const char *r[] = {"a", "b"};
    CHECK_STR(drain(5, 61), command("SUBSCRIBE", r, 2));
    /* a pooled link given back: never clean; asked for again while watched */
    CHECK_INT(rl_engine_node_detach(E, 5, 70), 0);
    CHECK_INT(rl_engine_node_wants(E, 5), RL_WANT_CONNECT);
    CHECK_INT(rl_engine_node_connected(E, 5, 1, 71), RL_OK);
    CHECK_STR(drain(5, 71), command("SUBSCRIBE", r, 2));
    CHECK_INT(rl_engine_node_connected(E, 5, 1, 72), RL_ERR); /* not asked for */
    rl_engine_free(E);
}

/* A subscriber's connect taken late by the driver counts its timeout from
 * the take (rl_engine_node_wants), as a command link's does. */
static void connect_timeout_counts_from_the_take(void) {
    rl_options o;
    rl_options_init(&o);
    o.connect_timeout_ms = 1000;
    E = engine(urls3, 1, &o); /* one node: link 1 is its subscriber */
    rl_engine_advance(E, 0);
    rl_engine_watch(E, "a", 1, 0);
    CHECK(rl_engine_deadline(E) < 0 || rl_engine_deadline(E) > 1000); /* no connect has begun */
    rl_engine_advance(E, 5000); /* the driver's first turn, late */
    CHECK_INT(rl_engine_node_wants(E, 1), RL_WANT_CONNECT);
    CHECK(rl_engine_deadline(E) == 6000);
    rl_engine_advance(E, 5999);
    CHECK_INT(rl_engine_node_wants(E, 1), 0);
    CHECK_INT(rl_engine_node_connected(E, 1, 1, 5999), RL_OK);
    CHECK_STR(drain(1, 5999), command("SUBSCRIBE", (const char *[]){"a"}, 1));
    rl_engine_free(E);
}

/* The reconnect delay doubles from reconnect_min_ms to reconnect_max_ms, and
 * a confirmed SUBSCRIBE starts it over; the connect timeout ends a connect
 * (or its TLS handshake); nothing watched, the retry is not made. */
static void backoff_doubles(void) {
    rl_options o;
    rl_options_init(&o);
    o.reconnect_min_ms = 50;
    o.reconnect_max_ms = 300;
    o.connect_timeout_ms = 1000;
    E = engine(urls3, 1, &o); /* one node: link 1 is its subscriber */
    rl_engine_watch(E, "a", 1, 0);
    double t = 0;
    int delays[] = {50, 100, 200, 300, 300};
    for (int i = 0; i < 5; i++) {
        CHECK_INT(rl_engine_node_wants(E, 1) & RL_WANT_CONNECT, RL_WANT_CONNECT);
        rl_engine_node_down(E, 1, "connect failed: Connection refused", t);
        CHECK(rl_engine_deadline(E) <= t + delays[i]);
        rl_engine_advance(E, t + delays[i] - 1);
        CHECK_INT(rl_engine_node_wants(E, 1), 0);
        t += delays[i];
        rl_engine_advance(E, t);
    }
    connect_link(1, t);
    drain(1, t);
    CHECK_INT(feed(1, confirmation(channel("a"), 1), t), RL_OK);
    rl_engine_node_down(E, 1, "connection lost", t);
    rl_engine_advance(E, t + 50);
    CHECK_INT(rl_engine_node_wants(E, 1) & RL_WANT_CONNECT, RL_WANT_CONNECT);
    t += 50;
    /* the connect timeout, then the handshake's */
    rl_engine_advance(E, t + 1000);
    CHECK_INT(rl_engine_node_wants(E, 1), RL_WANT_CLOSE);
    CHECK_STR(rl_engine_node_errstr(E, 1), "connect timed out after 1000 ms");
    t += 1000 + 100; /* a failure after a connect that was not confirmed: the backoff doubled */
    rl_engine_advance(E, t);
    CHECK_INT(rl_engine_node_wants(E, 1), RL_WANT_CONNECT);
    rl_engine_node_handshaking(E, 1);
    rl_engine_advance(E, t + 1000);
    CHECK_STR(rl_engine_node_errstr(E, 1), "TLS handshake timed out after 1000 ms");
    CHECK_INT(rl_engine_node_wants(E, 1), RL_WANT_CLOSE);
    /* nothing watched when the backoff ends: no connection */
    rl_engine_unwatch(E, "a", 1, t + 1000);
    rl_engine_advance(E, t + 5000);
    CHECK_INT(rl_engine_node_wants(E, 1), 0);
    CHECK_INT(rl_engine_wanting(E), 0);
    CHECK(rl_engine_deadline(E) < 0);
    rl_engine_free(E);
}

/* AUTH first when the URL has a password (with its user, if any); a
 * refused AUTH ends the connection. */
static void auth_first(void) {
    const char *urls[] = {"redis://:secret@127.0.0.1:7001", "redis://alice:pw@127.0.0.1:7002",
                          "redis://127.0.0.1:7003/9"};
    E = engine(urls, 3, NULL);
    rl_engine_watch(E, "a", 1, 0);
    const char *r[] = {"a"};
    char want[4096];
    connect_link(3, 0);
    snprintf(want, sizeof(want), "*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n%s", command("SUBSCRIBE", r, 1));
    CHECK_STR(drain(3, 0), want);
    connect_link(4, 0);
    snprintf(want, sizeof(want), "*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$2\r\npw\r\n%s", command("SUBSCRIBE", r, 1));
    CHECK_STR(drain(4, 0), want);
    connect_link(5, 0); /* no password: no AUTH (and a subscriber needs no SELECT) */
    CHECK_STR(drain(5, 0), command("SUBSCRIBE", r, 1));
    CHECK_INT(feed(4, "+OK\r\n", 1), RL_OK);
    CHECK_INT(feed(3, "-WRONGPASS invalid username-password pair or user is disabled.\r\n", 1), RL_ERR);
    CHECK_INT(rl_engine_node_wants(E, 3), RL_WANT_CLOSE);
    CHECK_STR(rl_engine_node_errstr(E, 3), "refused: WRONGPASS invalid username-password pair or user is disabled.");
    CHECK_INT(rl_engine_listening(E), 2);
    rl_engine_free(E);
}

/* ---- lingering after a won wait ---- */

/* A won wait's last unwatch leaves the channels subscribed for
 * RL_WATCH_LINGER_MS: a watch within that time subscribes nothing and gets
 * the same id, nothing heard meanwhile counts, and the linger's end
 * unsubscribes. A plain unwatch of a lingering resource changes nothing. */
static void won_watch_lingers(void) {
    E = engine(urls3, 3, NULL);
    const char *r[] = {"a"};
    int id = rl_engine_watch(E, "a", 1, 0);
    connect_link(3, 0);
    CHECK_STR(drain(3, 0), command("SUBSCRIBE", r, 1));
    feed(3, message(channel("a"), "2"), 1);
    CHECK_INT(rl_engine_heard(E, "a", 1), 1);
    rl_engine_unwatch_won(E, "a", 1, 100);
    CHECK_STR(drain(3, 100), "");
    CHECK_INT(rl_engine_heard_next(E, NULL), -1); /* its news went with its waiter */
    CHECK(rl_engine_deadline(E) == 100 + RL_WATCH_LINGER_MS);
    feed(3, message(channel("a"), "3"), 150); /* nobody waits: not counted */
    CHECK_INT(rl_engine_heard_next(E, NULL), -1);
    rl_engine_unwatch(E, "a", 1, 150); /* no waiter left to undo: ignored */
    CHECK_INT(rl_engine_watch(E, "a", 1, 200), id);
    CHECK_STR(drain(3, 200), "");
    CHECK_INT(rl_engine_heard(E, "a", 1), 1); /* goes on from where it was */
    feed(3, message(channel("a"), "2"), 210);
    CHECK_INT(rl_engine_heard(E, "a", 1), 2);
    CHECK_INT(rl_engine_heard_next(E, NULL), id);
    rl_engine_unwatch_won(E, "a", 1, 300);
    rl_engine_advance(E, 300 + RL_WATCH_LINGER_MS - 1);
    CHECK_STR(drain(3, 300 + RL_WATCH_LINGER_MS - 1), "");
    rl_engine_advance(E, 300 + RL_WATCH_LINGER_MS);
    CHECK_STR(drain(3, 300 + RL_WATCH_LINGER_MS), command("UNSUBSCRIBE", r, 1));
    CHECK_INT(rl_engine_heard(E, "a", 1), 0);
    CHECK(rl_engine_deadline(E) < 0);
    /* a watch after the linger subscribes again */
    rl_engine_watch(E, "a", 1, 900);
    CHECK_STR(drain(3, 900), command("SUBSCRIBE", r, 1));
    /* a failed wait's unwatch unsubscribes at once */
    rl_engine_unwatch(E, "a", 1, 910);
    CHECK_STR(drain(3, 910), command("UNSUBSCRIBE", r, 1));
    rl_engine_free(E);
}

/* A wake-up on a lingering watch's own channel (a node that still has this
 * engine queued gave it the turn) ends the linger at the next advance, so
 * that the node, finding nobody listening, passes the turn on. */
static void wake_ends_a_linger(void) {
    E = engine(urls3, 3, NULL);
    const char *r[] = {"a", "b"};
    rl_engine_watch(E, "a", 1, 0);
    rl_engine_watch(E, "b", 1, 0);
    connect_link(3, 0);
    drain(3, 0);
    rl_engine_unwatch_won(E, "a", 1, 10);
    rl_engine_unwatch_won(E, "b", 1, 20);
    CHECK(rl_engine_deadline(E) == 10 + RL_WATCH_LINGER_MS);
    feed(3, message(wake_channel("b"), "1"), 30);
    CHECK_INT(rl_engine_heard_next(E, NULL), -1);
    CHECK(rl_engine_deadline(E) <= 30);
    rl_engine_advance(E, 30);
    CHECK_STR(drain(3, 30), command("UNSUBSCRIBE", r + 1, 1));
    CHECK(rl_engine_deadline(E) == 10 + RL_WATCH_LINGER_MS); /* a's linger goes on */
    rl_engine_advance(E, 10 + RL_WATCH_LINGER_MS);
    CHECK_STR(drain(3, 10 + RL_WATCH_LINGER_MS), command("UNSUBSCRIBE", r, 1));
    /* a lingering watch is forgotten with its engine */
    rl_engine_watch(E, "b", 1, 600);
    rl_engine_unwatch_won(E, "b", 1, 600);
    rl_engine_free(E);
}

int main(void) {
    connect_timeout_counts_from_the_take();
    subscribe_on_watch();
    unsubscribe_on_last_unwatch();
    counts_only_releases();
    garbage_drops_the_connection();
    frame_over_the_cap();
    resubscribe_after_reconnect();
    backoff_doubles();
    auth_first();
    won_watch_lingers();
    wake_ends_a_linger();
    many_watches();
    plain_and_sharded_names_apart();
    return check_report("substream");
}
