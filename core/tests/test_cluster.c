/* test_cluster.c — a node that is a Redis Cluster, in the engine alone (no
 * network): the map read from a seed, a command waiting for it and then
 * routed by hash slot to its shard's link, MOVED (map updated, command sent
 * again, counted), ASK (ASKING, then the command, once), the redirection
 * limit, CLUSTERDOWN as a failed vote, a fenced counter named in the key's
 * slot, a watch subscribed (SSUBSCRIBE) on the serving shard only, a
 * vote that waits for replicas decided by the WAIT behind its last send,
 * TRYAGAIN (the command sent again after a pause, a bounded number of
 * times, an acquire only while its round is open), and the shard table
 * full (48 masters in use; a free shard reused for a new master), and a
 * release kept after ASK sent again behind its ASKING. */
#include <stdlib.h>

#include "fake_driver.h"
#include "hashslot.h"

/* Links of the one cluster node (N = 1): 0 its seed, 1 the seed's
 * subscriber (unused), then per shard k: 2 + 2k commands, 3 + 2k subscriber. */
#define SEED 0
#define SHARD(k) (2 + 2 * (k))
#define SHARD_SUB(k) (3 + 2 * (k))

/* 7000 serves 0-8191, 7001 8192-16383. foo is in 12182, bar in 5061. */
static const char MAP[] = "id0 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8191\n"
                          "id1 127.0.0.1:7001@17001 master - 0 0 2 connected 8192-16383\n";

static void feed_map(int link, const char *map, double t) {
    char resp[512];
    snprintf(resp, sizeof(resp), "$%zu\r\n%s\r\n", strlen(map), map);
    CHECK_INT(feed(link, resp, t), RL_OK);
}

/* The cluster node, its map read; shard 0 is the second seed (7001), shard
 * 1 the other master (7000); both connected. */
static void start(const rl_options *o) {
    const char *urls[] = {"redis-cluster://127.0.0.1:7000+127.0.0.1:7001"};
    E = engine(urls, 1, o);
    CHECK_INT(rl_engine_links(E), 4); /* the seed, and the second seed as shard 0 */
    CHECK_STR(rl_engine_node_name(E, 0), "redis-cluster://127.0.0.1:7000+127.0.0.1:7001");
    connect_node(SEED, 0);
    rl_engine_node_open(E, SEED, 0);
}

static void connect_shards(double t) {
    for (int k = 0; k < 2; k++) connect_node(SHARD(k), t);
}

/* The map asked for by an acquire of "x" (slot 16287: 7001), answered. */
static void map_known(double t) {
    int id = rl_engine_begin_acquire(E, "x", 1, 10000, t);
    drain(SEED, t);
    feed_map(SEED, MAP, t);
    connect_shards(t);
    CHECK(strstr(drain(SHARD(0), t), "$1\r\nx\r\n") != NULL);
    CHECK_INT(feed(SHARD(0), "+OK\r\n", t), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
}

static void routes_by_slot_and_follows_moved(void) {
    start(NULL);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1);
    CHECK(id >= 0);
    CHECK(strstr(drain(SEED, 1), "CLUSTER\r\n$5\r\nNODES") != NULL); /* the acquire waits for the map */
    feed_map(SEED, MAP, 2);
    CHECK_INT(rl_engine_links(E), 6);
    CHECK_INT(rl_engine_node_port(E, SHARD(1)), 7000);
    CHECK_INT(rl_engine_node_port(E, SHARD(0)), 7001);
    CHECK_INT(rl_engine_next_wanting(E, SHARD(0) - 1), SHARD(0));
    connect_shards(2);
    CHECK(strstr(drain(SHARD(0), 3), "$3\r\nfoo\r\n") != NULL); /* slot 12182: 7001 */
    CHECK_INT(drain(SHARD(1), 3)[0], '\0');
    /* the slot moved to 7000: sent again there, counted, the map asked again */
    CHECK_INT(feed(SHARD(0), "-MOVED 12182 127.0.0.1:7000\r\n", 4), RL_OK);
    CHECK(strstr(drain(SHARD(1), 4), "$3\r\nfoo\r\n") != NULL);
    CHECK(strstr(drain(SEED, 4), "CLUSTER\r\n$5\r\nNODES") != NULL);
    CHECK_INT(feed(SHARD(1), "+OK\r\n", 5), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    rl_stats st;
    rl_engine_stats(E, &st);
    CHECK_INT(st.node[0].moved, 1);
    CHECK_INT(st.node[0].ask, 0);
    /* the map now routes foo to 7000 at once */
    id = rl_engine_begin_release(E, "foo", 3, r.value, 6);
    CHECK(strstr(drain(SHARD(1), 6), "EVALSHA") != NULL);
    /* ASK: ASKING, then the command, on the shard named; once */
    CHECK_INT(feed(SHARD(1), "-ASK 12182 127.0.0.1:7001\r\n", 7), RL_OK);
    const char *asked = drain(SHARD(0), 7);
    CHECK(strncmp(asked, "*1\r\n$6\r\nASKING\r\n", 16) == 0);
    CHECK(strstr(asked, "EVALSHA") != NULL);
    CHECK_INT(feed(SHARD(0), "+OK\r\n:1\r\n", 8), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    rl_engine_stats(E, &st);
    CHECK_INT(st.node[0].ask, 1);
    /* a second ASK for a command sent after ASKING is not followed: a failed vote */
    id = rl_engine_begin_acquire(E, "foo", 3, 10000, 9);
    drain(SHARD(1), 9);
    CHECK_INT(feed(SHARD(1), "-ASK 12182 127.0.0.1:7001\r\n", 9), RL_OK);
    drain(SHARD(0), 9);
    CHECK_INT(feed(SHARD(0), "+OK\r\n-ASK 12182 127.0.0.1:7000\r\n", 10), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "ASK") != NULL);
    rl_engine_free(E);
}

static void redirects_are_bounded(void) {
    start(NULL);
    map_known(1);
    int id = rl_engine_begin_acquire(E, "bar", 3, 10000, 2); /* 5061: 7000 */
    int on = 1, moves = 0;
    for (double t = 3; t < 20; t++) {
        if (!strstr(drain(SHARD(on), t), "$3\r\nSET\r\n$3\r\nbar\r\n")) break; /* not the SET (its cleanup) */
        CHECK_INT(feed(SHARD(on), on ? "-MOVED 5061 127.0.0.1:7001\r\n" : "-MOVED 5061 127.0.0.1:7000\r\n", t), RL_OK);
        moves++;
        on = !on;
    }
    CHECK_INT(moves, 6); /* the first send, then 5 redirections; then its cleanup goes */
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "MOVED") != NULL);
    /* CLUSTERDOWN: one failed vote */
    id = rl_engine_begin_acquire(E, "foo", 3, 10000, 30);
    drain(SHARD(0), 30);
    CHECK_INT(feed(SHARD(0), "-CLUSTERDOWN The cluster is down\r\n", 31), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "CLUSTERDOWN") != NULL);
    rl_engine_free(E);
}

static void fenced_counter_and_watch_in_the_slot(void) {
    start(NULL);
    rl_engine_begin_acquire_fenced(E, "foo", 3, 10000, 1);
    drain(SEED, 1);
    feed_map(SEED, MAP, 1);
    connect_shards(1);
    const char *sent = drain(SHARD(0), 1);
    CHECK(strstr(sent, "$11\r\n{foo}:fence\r\n") != NULL);
    CHECK(strstr(sent, "$3\r\nfoo\r\n") != NULL);
    CHECK_INT(drain(SHARD(1), 1)[0], '\0');
    /* a watch: SSUBSCRIBE on the shard serving foo, nothing on the other */
    CHECK(rl_engine_watch(E, "foo", 3, 2) >= 0);
    CHECK(rl_engine_node_wants(E, SHARD_SUB(0)) & RL_WANT_CONNECT);
    CHECK_INT(rl_engine_node_wants(E, SHARD_SUB(1)), 0);
    CHECK_INT(rl_engine_node_wants(E, 1), 0); /* the node's own subscriber: none */
    CHECK_INT(rl_engine_node_connected(E, SHARD_SUB(0), 1, 2), RL_OK);
    char want[256], wake[64];
    int wlen = snprintf(wake, sizeof(wake), "redlock:wake:%s:{foo}", rl_engine_waiter_id(E));
    snprintf(want, sizeof(want), "*3\r\n$10\r\nSSUBSCRIBE\r\n$22\r\nredlock:released:{foo}\r\n$%d\r\n%s\r\n", wlen,
             wake);
    CHECK_STR(drain(SHARD_SUB(0), 2), want);
    const char *msg = "*3\r\n$8\r\nsmessage\r\n$22\r\nredlock:released:{foo}\r\n$1\r\n1\r\n";
    CHECK_INT(feed(SHARD_SUB(0), msg, 3), RL_OK);
    CHECK_INT(rl_engine_heard(E, "foo", 3), 1);
    rl_engine_free(E);
}

/* Redis 7 ends the sharded subscriptions of a slot its master gives up (an
 * unasked sunsubscribe) and refuses SSUBSCRIBE for a slot it does not serve
 * (MOVED): either asks for the map, whose reading subscribes the watch
 * again (here on the same shard: the slot moved away and back), and the
 * subscriber's connection stays; after MOVED, at most once a second (a map
 * that still names that master would be refused again, in a loop). The answer to our own SUNSUBSCRIBE (the
 * last waiter gone) asks for nothing. Before, the push was ignored (the
 * watch heard no more releases) and MOVED dropped the connection. */
static void a_subscription_the_shard_ended_asks_for_the_map(void) {
    start(NULL);
    map_known(1);
    CHECK(rl_engine_watch(E, "foo", 3, 2) >= 0);
    CHECK_INT(rl_engine_node_connected(E, SHARD_SUB(0), 1, 2), RL_OK);
    CHECK(strstr(drain(SHARD_SUB(0), 2), "SSUBSCRIBE") != NULL);
    const char *ended = "*3\r\n$12\r\nsunsubscribe\r\n$22\r\nredlock:released:{foo}\r\n:1\r\n";
    CHECK_INT(feed(SHARD_SUB(0), ended, 3), RL_OK);
    CHECK(strstr(drain(SEED, 3), "CLUSTER\r\n$5\r\nNODES") != NULL);
    feed_map(SEED, MAP, 4);
    CHECK(strstr(drain(SHARD_SUB(0), 4), "$10\r\nSSUBSCRIBE\r\n$22\r\nredlock:released:{foo}") != NULL);
    CHECK_INT(feed(SHARD_SUB(0), "-MOVED 12182 127.0.0.1:7000\r\n", 5), RL_OK);
    CHECK_INT(rl_engine_node_wants(E, SHARD_SUB(0)) & RL_WANT_CLOSE, 0);
    CHECK(strstr(drain(SEED, 5), "CLUSTER\r\n$5\r\nNODES") != NULL);
    feed_map(SEED, MAP, 6);
    drain(SHARD_SUB(0), 6); /* subscribed again where the map says */
    /* a map that names the refusing master again: refused again, and the
     * map is asked for again only a second after the last refusal's ask */
    CHECK_INT(feed(SHARD_SUB(0), "-MOVED 12182 127.0.0.1:7000\r\n", 7), RL_OK);
    CHECK_INT(drain(SEED, 7)[0], '\0');
    CHECK_INT(feed(SHARD_SUB(0), "-MOVED 12182 127.0.0.1:7000\r\n", 1010), RL_OK);
    CHECK(strstr(drain(SEED, 1010), "CLUSTER\r\n$5\r\nNODES") != NULL);
    feed_map(SEED, MAP, 1011);
    rl_engine_unwatch(E, "foo", 3, 1012);
    drain(SHARD_SUB(0), 1012);
    CHECK_INT(feed(SHARD_SUB(0), ended, 1013), RL_OK);
    CHECK_INT(drain(SEED, 1013)[0], '\0');
    rl_engine_free(E);
}

/* A slot no master serves (CLUSTER DELSLOTS, a dead master forgotten):
 * each command for it is a failed vote at once, and the map is asked for
 * again at most once a second, not once per command. Before, every
 * command asked (about 900 CLUSTER NODES a second under load in nginx). */
static void an_unserved_slot_asks_for_the_map_once_a_second(void) {
    static const char HOLE[] = "id0 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8191\n"
                               "id1 127.0.0.1:7001@17001 master - 0 0 2 connected 8192-12000 12500-16383\n";
    start(NULL);
    int id = rl_engine_begin_acquire(E, "x", 1, 10000, 1);
    drain(SEED, 1);
    feed_map(SEED, HOLE, 1);
    connect_shards(1);
    drain(SHARD(0), 1);
    CHECK_INT(feed(SHARD(0), "+OK\r\n", 2), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    int asks = 0;
    for (double t = 10; t < 1000; t += 100) {
        id = rl_engine_begin_acquire(E, "foo", 3, 10000, t); /* slot 12182: nobody's */
        rl_result r = take(id);
        CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
        CHECK_STR(r.node[0].errstr, "CLUSTERDOWN hash slot 12182 is not served");
        if (strstr(drain(SEED, t), "CLUSTER\r\n$5\r\nNODES") == NULL) continue;
        asks++;
        feed_map(SEED, HOLE, t); /* the same hole */
    }
    CHECK_INT(asks, 1);
    rl_engine_begin_acquire(E, "foo", 3, 10000, 1020);
    CHECK(strstr(drain(SEED, 1020), "CLUSTER\r\n$5\r\nNODES") != NULL);
    rl_engine_free(E);
}

/* The first seed cannot be reached: the map comes from the next one, and
 * the command waiting for it goes; with no seed left, it fails its vote. */
static void map_from_the_next_seed(void) {
    const char *urls[] = {"redis-cluster://127.0.0.1:7000+127.0.0.1:7001"};
    E = engine(urls, 1, NULL);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1);
    CHECK(rl_engine_node_wants(E, SEED) & RL_WANT_CONNECT);
    rl_engine_node_down(E, SEED, "connection refused", 1);
    connect_node(SHARD(0), 2); /* the second seed, asked instead */
    CHECK(strstr(drain(SHARD(0), 2), "CLUSTER\r\n$5\r\nNODES") != NULL);
    feed_map(SHARD(0), MAP, 3);
    CHECK(strstr(drain(SHARD(0), 3), "$3\r\nfoo\r\n") != NULL); /* foo: 7001, this very shard */
    CHECK_INT(feed(SHARD(0), "+OK\r\n", 4), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    rl_engine_free(E);

    E = engine(urls, 1, NULL);
    id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1);
    rl_engine_node_down(E, SEED, "connection refused", 1);
    CHECK(rl_engine_node_wants(E, SHARD(0)) & RL_WANT_CONNECT);
    rl_engine_node_down(E, SHARD(0), "connection refused", 2);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "cluster map not known") != NULL);
    rl_engine_free(E);
}

/* An acquire of foo at t whose shard (7001, gone) refuses the connection
 * if it tries one: one failed vote. */
static void acquire_foo_refused(double t) {
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, t);
    if (rl_engine_node_wants(E, SHARD(0)) & RL_WANT_CONNECT) rl_engine_node_down(E, SHARD(0), "connection refused", t);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
}

/* The map, asked on link at 1031, names the replica the cluster promoted
 * (7002, shard 2) for 7001's slots: an acquire of foo goes there and is
 * granted. */
static void promoted_serves_foo(int link) {
    feed_map(link,
             "id0 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-8191\n"
             "id1 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected\n"
             "id2 127.0.0.1:7002@17002 master - 0 0 3 connected 8192-16383\n",
             1031);
    CHECK_INT(rl_engine_node_port(E, SHARD(2)), 7002);
    connect_node(SHARD(2), 1032);
    rl_result r;
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1040);
    CHECK(strstr(drain(SHARD(2), 1040), "$3\r\nfoo\r\n") != NULL);
    CHECK_INT(feed(SHARD(2), "+OK\r\n", 1041), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
}

/* A master that is gone sends no MOVED: its connection lost (even with
 * nothing in flight), or a command it cannot take, asks for the map again
 * (at most once a second while it stays unreachable), and the map names the
 * replica the cluster promoted. Before, a connection lost with nothing in
 * flight asked for no map: a cluster whose nodes all moved to other
 * addresses one at a time, while the client locked only keys of one
 * master, lost its vote for good (every address it knew was gone by the
 * time a command failed). */
static void lost_master_asks_for_the_map(void) {
    start(NULL);
    map_known(1);
    rl_engine_node_down(E, SHARD(0), "connection refused", 10); /* 7001 (foo's) is gone, idle */
    CHECK(strstr(drain(SEED, 10), "CLUSTER\r\n$5\r\nNODES") != NULL);
    acquire_foo_refused(20);
    CHECK_INT(drain(SEED, 20)[0], '\0'); /* within the second: not asked again */
    feed_map(SEED, MAP, 21); /* the failover has not happened yet: the same map */
    for (double t = 100; t < 1000; t += 100) {
        acquire_foo_refused(t);
        CHECK_INT(drain(SEED, t)[0], '\0'); /* within the second: not asked again */
    }
    acquire_foo_refused(1030);
    CHECK(strstr(drain(SEED, 1030), "CLUSTER\r\n$5\r\nNODES") != NULL);
    promoted_serves_foo(SEED);
    CHECK_INT(rl_engine_links(E), 8);
    rl_engine_free(E);
}

/* Before: a seed that was asked for the map and then stopped answering
 * (a stopped process keeps its connection: no reply, no error) kept the
 * ask in flight for good, and no other stream was asked: the master its
 * cluster promoted was never found. Now an ask on a stream that has
 * become suspect (the stall watchdog found it silent) is given up, and the
 * next stream of the spell asked. */
static void a_seed_that_does_not_answer_the_map_is_passed(void) {
    start(NULL);
    map_known(1);
    rl_engine_node_down(E, SHARD(0), "connection refused", 10); /* 7001 (foo's) is gone */
    acquire_foo_refused(20);
    CHECK(strstr(drain(SEED, 20), "CLUSTER\r\n$5\r\nNODES") != NULL); /* and the seed never answers */
    for (double t = 100; t <= 1000; t += 100) rl_engine_advance(E, t);
    acquire_foo_refused(1030);
    CHECK(strstr(drain(SEED, 1030), "CLUSTER") == NULL); /* (its probes only) */
    CHECK(strstr(drain(SHARD(1), 1030), "CLUSTER\r\n$5\r\nNODES") != NULL); /* 7000 asked instead */
    promoted_serves_foo(SHARD(1));
    rl_engine_free(E);
}

static void bad_cluster_urls(void) {
    char err[RL_ERR_LEN];
    const char *nodb[] = {"redis-cluster://127.0.0.1:7000+127.0.0.1:7001/2"};
    CHECK(rl_engine_new(nodb, 1, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "only database 0") != NULL);
    const char *empty[] = {"redis-cluster://127.0.0.1:7000++127.0.0.1:7001"};
    CHECK(rl_engine_new(empty, 1, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "empty seed") != NULL);
    const char *none[] = {"redis-cluster://"};
    CHECK(rl_engine_new(none, 1, NULL, err, sizeof(err)) == NULL);
    const char *trailing[] = {"redis-cluster://127.0.0.1:7000+"};
    CHECK(rl_engine_new(trailing, 1, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "empty seed") != NULL);
    /* the query is the whole node's: checked for every seed */
    const char *query[] = {"redis-cluster://127.0.0.1:7000+127.0.0.1:7001?replicas=x"};
    CHECK(rl_engine_new(query, 1, NULL, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "replicas must be a number") != NULL);
    const char *good[] = {"redis-cluster://127.0.0.1:7000+127.0.0.1:7001?replicas=1"};
    rl_engine *e = rl_engine_new(good, 1, NULL, err, sizeof(err));
    CHECK(e != NULL);
    if (e) CHECK_STR(rl_engine_node_name(e, 0), "redis-cluster://127.0.0.1:7000+127.0.0.1:7001?replicas=1");
    rl_engine_free(e);
}

/* replicas = 1: the write and its WAIT go to the slot's shard. A write
 * that MOVED sends elsewhere goes again with a WAIT of its own; the WAIT
 * left behind on the first shard decides nothing, even answered after the
 * write's new yes (it counts what that connection wrote, not our key). */
static void moved_write_waits_on_its_new_shard(void) {
    rl_options o;
    rl_options_init(&o);
    o.replicas = 1;
    start(&o);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1);
    drain(SEED, 1);
    feed_map(SEED, MAP, 2);
    connect_shards(2);
    const char *first = drain(SHARD(0), 3);
    CHECK(strstr(first, "$3\r\nfoo\r\n") != NULL && strstr(first, "WAIT") != NULL);
    CHECK_INT(feed(SHARD(0), "-MOVED 12182 127.0.0.1:7000\r\n", 4), RL_OK);
    const char *again = drain(SHARD(1), 4);
    CHECK(strstr(again, "$3\r\nfoo\r\n") != NULL && strstr(again, "WAIT") != NULL);
    CHECK_INT(feed(SHARD(1), "+OK\r\n", 5), RL_OK); /* the yes, held for its WAIT */
    CHECK_INT(feed(SHARD(0), ":1\r\n", 5), RL_OK);  /* the old shard's WAIT: not ours */
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 0);
    CHECK_INT(feed(SHARD(1), ":0\r\n", 6), RL_OK);  /* the new shard's WAIT decides */
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "0 of 1 replicas acknowledged") != NULL);
    rl_engine_free(E);
}

static const char TRYAGAIN[] = "-TRYAGAIN Multiple keys request during rehashing of slot\r\n";

/* TRYAGAIN: the same bytes go to the same shard again after a pause (an
 * eighth of the node timeout), after ASKING when they went so; counted. */
static void tryagain_goes_again_after_a_pause(void) {
    start(NULL); /* node timeout 50 ms: a pause of 6.25 ms */
    map_known(1);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 2); /* 12182: 7001, shard 0 */
    drain(SHARD(0), 2);
    CHECK_INT(feed(SHARD(0), "+OK\r\n", 3), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    char value[sizeof(r.value)];
    memcpy(value, r.value, sizeof(value));
    id = rl_engine_begin_release(E, "foo", 3, value, 10);
    char first[512];
    snprintf(first, sizeof(first), "%s", drain(SHARD(0), 10));
    CHECK(strstr(first, "EVALSHA") != NULL);
    CHECK_INT(feed(SHARD(0), TRYAGAIN, 11), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 0); /* no vote yet */
    CHECK(rl_engine_deadline(E) > 17.2 && rl_engine_deadline(E) < 17.3);
    rl_engine_advance(E, 17);
    CHECK_INT(drain(SHARD(0), 17)[0], '\0');
    rl_engine_advance(E, 17.3);
    CHECK_STR(drain(SHARD(0), 17.3), first);
    CHECK_INT(feed(SHARD(0), ":1\r\n", 18), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    /* after ASK, on the shard it pointed to, with ASKING again */
    id = rl_engine_begin_release(E, "foo", 3, value, 20);
    drain(SHARD(0), 20);
    CHECK_INT(feed(SHARD(0), "-ASK 12182 127.0.0.1:7000\r\n", 21), RL_OK);
    snprintf(first, sizeof(first), "%s", drain(SHARD(1), 21));
    CHECK(strncmp(first, "*1\r\n$6\r\nASKING\r\n", 16) == 0 && strstr(first, "EVALSHA") != NULL);
    CHECK_INT(feed(SHARD(1), "+OK\r\n", 21), RL_OK);
    CHECK_INT(feed(SHARD(1), TRYAGAIN, 22), RL_OK);
    rl_engine_advance(E, 29);
    CHECK_STR(drain(SHARD(1), 29), first);
    CHECK_INT(drain(SHARD(0), 29)[0], '\0');
    CHECK_INT(feed(SHARD(1), "+OK\r\n:1\r\n", 30), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    rl_stats st;
    rl_engine_stats(E, &st);
    CHECK_INT(st.node[0].tryagain, 2);
    CHECK_INT(st.node[0].ask, 1);
    rl_engine_free(E);
}

/* At most 12 sends again (RL_TRYAGAIN_MAX), then TRYAGAIN is the failed vote;
 * and an acquire whose round ended while it waited to go again does not go
 * (its caller may have released already): the TRYAGAIN answers it. */
static void tryagain_is_bounded(void) {
    rl_options o;
    rl_options_init(&o);
    o.node_timeout_ms = 2000; /* a pause of 100 ms: 12 of them fit */
    start(&o);
    map_known(1);
    int id = rl_engine_begin_acquire_fenced(E, "foo", 3, 10000, 10);
    char first[1024];
    snprintf(first, sizeof(first), "%s", drain(SHARD(0), 10));
    CHECK(strstr(first, "{foo}:fence") != NULL);
    int sends = 1;
    double t = 10;
    CHECK_INT(feed(SHARD(0), TRYAGAIN, t), RL_OK);
    for (; t < 2000; t += 100) {
        rl_engine_advance(E, t + 100);
        if (strcmp(drain(SHARD(0), t + 100), first) != 0) break;
        sends++;
        CHECK_INT(feed(SHARD(0), TRYAGAIN, t + 100), RL_OK);
    }
    CHECK_INT(sends, 1 + 12); /* RL_TRYAGAIN_MAX */
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "TRYAGAIN") != NULL);
    rl_stats st;
    rl_engine_stats(E, &st);
    CHECK_INT(st.node[0].tryagain, 13); /* every TRYAGAIN met, the last (not sent again) too */
    rl_engine_free(E);

    start(NULL); /* node timeout 50 ms */
    map_known(1);
    id = rl_engine_begin_acquire_fenced(E, "foo", 3, 10000, 10);
    snprintf(first, sizeof(first), "%s", drain(SHARD(0), 10));
    CHECK_INT(feed(SHARD(0), TRYAGAIN, 58), RL_OK); /* due at 64.25, the round ends at 60 */
    rl_engine_advance(E, 60);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    /* the vote says what the node answered (before: "no reply within 50 ms") */
    CHECK_STR(r.node[0].errstr,
              "TRYAGAIN Multiple keys request during rehashing of slot (the slot still migrating after 1 send)");
    rl_engine_advance(E, 65);
    CHECK(strcmp(drain(SHARD(0), 65), first) != 0);
    rl_engine_free(E);
}

/* A CLUSTER NODES text longer than other replies may be (64 KB: many
 * replicas listed) is read, and routes as a short one does. */
static void reads_a_long_map(void) {
    start(NULL);
    enum { REPLICAS = 1200 };
    size_t cap = sizeof(MAP) + REPLICAS * 128 + 64;
    char *map = malloc(cap), *resp = malloc(cap + 32);
    size_t len = (size_t)snprintf(map, cap, "%s", MAP);
    for (int k = 0; k < REPLICAS; k++)
        len += (size_t)snprintf(map + len, cap - len,
                                "replica%06d 127.0.0.%d:%d@%d slave id%d 0 0 %d connected\n", k, 2 + k % 200,
                                8000 + k, 18000 + k, k % 2, 1 + k % 2);
    CHECK(len > 65536);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 1);
    drain(SEED, 1);
    int n = snprintf(resp, cap + 32, "$%zu\r\n%s\r\n", len, map);
    CHECK_INT(feed(SEED, resp, 2), RL_OK);
    connect_shards(2);
    CHECK(strstr(drain(SHARD(0), 3), "$3\r\nfoo\r\n") != NULL); /* slot 12182: 7001 */
    CHECK_INT(feed(SHARD(0), "+OK\r\n", 4), RL_OK);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_OK);
    (void)n;
    free(map);
    free(resp);
    rl_engine_free(E);
}

/* A client keeps a shard for every master address it meets, at most
 * RL_MAX_SHARDS at a time: while every one is in the map, a slot whose
 * master finds the table full, and a MOVED to such a master, fail their
 * vote saying so (not "hash slot not served", not the MOVED). 50 masters, 7000 + m serving slots from m * 328: 7048 and
 * 7049 get no shard (the second seed, 7001, is shard 0). */
static void too_many_masters_say_so(void) {
    start(NULL);
    char map[8192], resp[8300];
    size_t len = 0;
    for (int m = 0; m < 50; m++)
        len += (size_t)snprintf(map + len, sizeof(map) - len, "id%d 127.0.0.1:%d@%d master - 0 0 %d connected %d-%d\n",
                                m, 7000 + m, 17000 + m, m + 1, m * 328, m == 49 ? 16383 : m * 328 + 327);
    int id = rl_engine_begin_acquire(E, "x", 1, 10000, 1); /* slot 16287: 7049's */
    drain(SEED, 1);
    snprintf(resp, sizeof(resp), "$%zu\r\n%s\r\n", len, map);
    CHECK_INT(feed(SEED, resp, 2), RL_OK);
    CHECK_INT(rl_engine_links(E), 2 + 2 * RL_MAX_SHARDS);
    rl_result r;
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "too many cluster masters (48)") != NULL);
    /* foo (12182) is 7037's, shard 37: a MOVED from there to 7099 */
    id = rl_engine_begin_acquire(E, "foo", 3, 10000, 3);
    connect_node(SHARD(37), 3);
    CHECK(strstr(drain(SHARD(37), 3), "$3\r\nfoo\r\n") != NULL);
    CHECK_INT(feed(SHARD(37), "-MOVED 12182 127.0.0.1:7099\r\n", 4), RL_OK);
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    CHECK_INT(r.status, RL_STATUS_UNAVAILABLE);
    CHECK(strstr(r.node[0].errstr, "too many cluster masters (48)") != NULL);
    rl_engine_free(E);
}

/* The map of 48 masters, 7000 + m serving slots from m * 342 (none skipped:
 * skip, or -1), and 7099 in place of 7000 + swap (or -1), as its reply. */
static void map_of_48(char *resp, size_t cap, int skip, int skip2, int swap) {
    char map[8192];
    size_t len = 0;
    for (int m = 0; m < 48; m++) {
        if (m == skip || m == skip2) continue;
        int port = m == swap ? 7099 : 7000 + m;
        len += (size_t)snprintf(map + len, sizeof(map) - len, "id%d 127.0.0.1:%d@%d master - 0 0 %d connected %d-%d\n",
                                m, port, port + 10000, m + 1, m * 342, m == 47 ? 16383 : m * 342 + 341);
    }
    snprintf(resp, cap, "$%zu\r\n%s\r\n", len, map);
}

/* Once RL_MAX_SHARDS are made, a master at a new address takes over a shard
 * no map names any more, in the very map that drops it, but never a seed's
 * nor one that owes a reply: its links keep their numbers, are closed first
 * (what the driver says of the old socket until it takes that is refused)
 * and connect at the new address. Shards: 7001 is 0 (the second seed),
 * 7000 is 1, 7000 + m is m for m >= 2. */
static void a_free_shard_serves_a_new_master(void) {
    start(NULL);
    char resp[8300], key[32];
    int id = rl_engine_begin_acquire(E, "x", 1, 10000, 1); /* slot 16287: 7047's, shard 47 */
    drain(SEED, 1);
    map_of_48(resp, sizeof(resp), -1, -1, -1);
    CHECK_INT(feed(SEED, resp, 2), RL_OK);
    CHECK_INT(rl_engine_links(E), 2 + 2 * RL_MAX_SHARDS);
    connect_node(SHARD(47), 2);
    CHECK(strstr(drain(SHARD(47), 2), "$1\r\nx\r\n") != NULL);
    CHECK_INT(feed(SHARD(47), "+OK\r\n", 2), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    /* a key of 7000's (shard 1) whose reply is owed */
    for (int n = 0; rl_hash_slot(key, (size_t)snprintf(key, sizeof(key), "k%d", n)) >= 342; n++) {}
    rl_engine_begin_acquire(E, key, strlen(key), 10000, 3);
    connect_node(SHARD(1), 3);
    CHECK(strstr(drain(SHARD(1), 3), key) != NULL);
    /* a MOVED asks for the map: 7000 and 7001 are gone, 7005 is now 7099 */
    id = rl_engine_begin_acquire(E, "x", 1, 10000, 4);
    CHECK(strstr(drain(SHARD(47), 4), "$1\r\nx\r\n") != NULL);
    CHECK_INT(feed(SHARD(47), "-MOVED 16287 127.0.0.1:7047\r\n", 4), RL_OK);
    CHECK(strstr(drain(SEED, 4), "CLUSTER") != NULL);
    connect_node(SHARD(5), 4); /* its socket to 7005, set up and idle */
    map_of_48(resp, sizeof(resp), 0, 1, 5);
    CHECK_INT(feed(SEED, resp, 5), RL_OK);
    CHECK_INT(rl_engine_links(E), 2 + 2 * RL_MAX_SHARDS);
    CHECK_INT(rl_engine_node_port(E, SHARD(5)), 7099); /* not the seed's shard 0, nor shard 1 */
    CHECK_INT(rl_engine_node_port(E, SHARD(0)), 7001);
    CHECK_INT(rl_engine_node_port(E, SHARD(1)), 7000);
    CHECK(strstr(rl_engine_node_name(E, SHARD(5)), "127.0.0.1:7099") != NULL);
    CHECK_INT(feed(SHARD(5), "+OK\r\n", 5), RL_ERR); /* the old socket's bytes are refused */
    rl_engine_node_down(E, SHARD(5), "connection lost", 5);
    CHECK_INT(rl_engine_node_connected(E, SHARD(5), 1, 5), RL_ERR);
    CHECK_INT(rl_engine_node_wants(E, SHARD(5)) & (RL_WANT_CLOSE | RL_WANT_CONNECT), RL_WANT_CLOSE | RL_WANT_CONNECT);
    CHECK_INT(rl_engine_node_connected(E, SHARD(5), 1, 6), RL_OK); /* the new one, 7099's */
    CHECK_INT(feed(SHARD(47), "+OK\r\n", 6), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    rl_engine_free(E);
}

/* A shard whose master left the map while a release was kept for its next
 * connection (its connection lost with the release unanswered), and whose
 * reconnects fail, is reused all the same: the kept release would
 * otherwise pin it for good, and a client meeting new masters would run
 * out of shards. Shards as in a_free_shard_serves_a_new_master; only 7000's
 * (shard 1) is free when 7001 becomes 7099. */
static void a_dead_shard_with_kept_releases_is_reused(void) {
    start(NULL);
    char resp[8300], key[32];
    rl_result r;
    int id = rl_engine_begin_acquire(E, "x", 1, 10000, 1); /* 7047's, shard 47 */
    drain(SEED, 1);
    map_of_48(resp, sizeof(resp), -1, -1, -1);
    CHECK_INT(feed(SEED, resp, 2), RL_OK);
    connect_node(SHARD(47), 2);
    CHECK(strstr(drain(SHARD(47), 2), "$1\r\nx\r\n") != NULL);
    CHECK_INT(feed(SHARD(47), "+OK\r\n", 2), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    /* a lock on 7000 (shard 1), released; the connection drops unanswered */
    for (int n = 0; rl_hash_slot(key, (size_t)snprintf(key, sizeof(key), "k%d", n)) >= 342; n++) {}
    id = rl_engine_begin_acquire(E, key, strlen(key), 10000, 3);
    connect_node(SHARD(1), 3);
    CHECK(strstr(drain(SHARD(1), 3), key) != NULL);
    CHECK_INT(feed(SHARD(1), "+OK\r\n", 3), RL_OK);
    r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    int rid = rl_engine_begin_release(E, key, strlen(key), r.value, 3);
    CHECK(rid > 0);
    CHECK(strstr(drain(SHARD(1), 3), key) != NULL);
    rl_engine_node_down(E, SHARD(1), "connection lost", 3); /* its copy kept for 7000's next connection */
    CHECK(take(rid).status != RL_STATUS_OK);
    rl_engine_advance(E, 20000); /* reconnecting to 7000 by now */
    /* 7000 is gone and 7001 is now 7099: only shard 1 is free for it */
    id = rl_engine_begin_acquire(E, "x", 1, 10000, 20001);
    CHECK(strstr(drain(SHARD(47), 20001), "$1\r\nx\r\n") != NULL);
    CHECK_INT(feed(SHARD(47), "-MOVED 16287 127.0.0.1:7047\r\n", 20001), RL_OK);
    CHECK(strstr(drain(SEED, 20001), "CLUSTER") != NULL);
    map_of_48(resp, sizeof(resp), 0, -1, 1);
    CHECK_INT(feed(SEED, resp, 20002), RL_OK);
    CHECK_INT(rl_engine_node_port(E, SHARD(1)), 7099);
    CHECK(strstr(rl_engine_node_name(E, SHARD(1)), "127.0.0.1:7099") != NULL);
    CHECK_INT(feed(SHARD(47), "+OK\r\n", 20002), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    rl_engine_free(E);
}

/* A release that ASK sent to the importing master, its connection lost
 * unanswered, goes again on that master's next connection behind its own
 * ASKING: sent bare, it would be answered MOVED (nobody follows a kept
 * release's reply) and the key would stay there until its ttl. */
static void a_kept_release_goes_again_after_asking(void) {
    start(NULL);
    map_known(1);
    int id = rl_engine_begin_acquire(E, "foo", 3, 10000, 2); /* slot 12182: 7001, shard 0 */
    CHECK(strstr(drain(SHARD(0), 2), "$3\r\nfoo\r\n") != NULL);
    CHECK_INT(feed(SHARD(0), "+OK\r\n", 2), RL_OK);
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    int rid = rl_engine_begin_release(E, "foo", 3, r.value, 3);
    CHECK(strstr(drain(SHARD(0), 3), "EVALSHA") != NULL);
    CHECK_INT(feed(SHARD(0), "-ASK 12182 127.0.0.1:7000\r\n", 3), RL_OK); /* the key went to 7000 */
    const char *asked = drain(SHARD(1), 3);
    CHECK(strncmp(asked, "*1\r\n$6\r\nASKING\r\n", 16) == 0);
    CHECK(strstr(asked, "EVALSHA") != NULL);
    rl_engine_node_down(E, SHARD(1), "connection lost", 4);
    CHECK(take(rid).status != RL_STATUS_OK);
    rl_engine_advance(E, 1000);
    connect_node(SHARD(1), 1000);
    const char *again = drain(SHARD(1), 1000);
    CHECK(strncmp(again, "*1\r\n$6\r\nASKING\r\n", 16) == 0);
    CHECK(strstr(again + 16, "EVALSHA") == again + 16 + strlen("*4\r\n$7\r\n"));
    CHECK(strstr(again, r.value) != NULL);
    /* answered: nothing is kept, and the next connection sends nothing */
    CHECK_INT(feed(SHARD(1), "+OK\r\n:1\r\n", 1001), RL_OK);
    rl_engine_node_down(E, SHARD(1), "connection lost", 1002);
    rl_engine_advance(E, 3000);
    connect_node(SHARD(1), 3000);
    CHECK_INT(drain(SHARD(1), 3000)[0], '\0');
    rl_engine_free(E);
}

int main(void) {
    routes_by_slot_and_follows_moved();
    reads_a_long_map();
    redirects_are_bounded();
    fenced_counter_and_watch_in_the_slot();
    a_subscription_the_shard_ended_asks_for_the_map();
    an_unserved_slot_asks_for_the_map_once_a_second();
    map_from_the_next_seed();
    lost_master_asks_for_the_map();
    a_seed_that_does_not_answer_the_map_is_passed();
    bad_cluster_urls();
    moved_write_waits_on_its_new_shard();
    tryagain_goes_again_after_a_pause();
    tryagain_is_bounded();
    too_many_masters_say_so();
    a_free_shard_serves_a_new_master();
    a_dead_shard_with_kept_releases_is_reused();
    a_kept_release_goes_again_after_asking();
    return check_report("cluster");
}
