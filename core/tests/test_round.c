/* test_round.c — the round logic fed with replies and clock readings, no network. */
#include "../src/round.h"
#include "check.h"

static rl_reply status_ok = {.type = RL_REPLY_STATUS, .len = 2, .str = "OK"};
static rl_reply nil = {.type = RL_REPLY_NIL};
static rl_reply one = {.type = RL_REPLY_INTEGER, .integer = 1};
static rl_reply zero = {.type = RL_REPLY_INTEGER, .integer = 0};
static rl_reply oom = {.type = RL_REPLY_ERROR, .len = 28, .str = "OOM command not allowed when"};
static rl_reply weird = {.type = RL_REPLY_INTEGER, .integer = 7};

static rl_round r;
static rl_result res;

static void start(int op, int n, int quorum, int ttl) {
    rl_round_start(&r, &res, op, n, quorum, ttl, 0.01, 1000.0);
}

static void acquire_decides_at_quorum(void) {
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 3, &status_ok, NULL, 1002), 0);
    CHECK_INT(rl_round_reply(&r, 1, &status_ok, NULL, 1004), 1);
    CHECK_INT(res.status, RL_STATUS_OK);
    CHECK_INT(res.ok, 3);
    /* validity = ttl - elapsed - (ttl * drift + 2) = 10000 - 4 - 102 */
    CHECK(res.validity_ms > 9893.99 && res.validity_ms < 9894.01);
    CHECK(res.elapsed_ms > 3.99 && res.elapsed_ms < 4.01);
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
    /* late votes change nothing */
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1005), 0);
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
    CHECK_INT(res.taken, 0);
}

static void acquire_fails_as_soon_as_quorum_is_impossible(void) {
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 3, &nil, NULL, 1002), 1);
    CHECK_INT(res.status, RL_STATUS_BUSY);
    CHECK_INT(res.validity_ms, 0);
}

static void failures_without_holders_are_unavailable(void) {
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 0, NULL, "connection lost", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &oom, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &weird, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
    CHECK_INT(res.failed, 3);
    CHECK_STR(res.node[0].errstr, "connection lost");
    CHECK_STR(res.node[1].errstr, "OOM command not allowed when");
    CHECK_STR(res.node[2].errstr, "unexpected reply (type 3)");
}

static void mixed_failures_are_busy_only_when_holders_alone_block(void) {
    /* holders on 2, a node down: no quorum, and the last node decides the
     * word, so the round waits for it; a holder there makes it busy */
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 3, NULL, "down", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 4, &nil, NULL, 1002), 1);
    CHECK_INT(res.status, RL_STATUS_BUSY);
    /* ... a failure there makes it unavailable */
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 3, NULL, "down", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 4, NULL, "down", 1002), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
    /* ... and so does its silence, at the node timeout */
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    CHECK_INT(rl_round_reply(&r, 1, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 3, NULL, "down", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 0, NULL, "down", 1001), 0);
    CHECK_INT(rl_round_expire(&r, "no reply", 1050), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
    /* one node down of three, the other two held: busy, whoever answers first */
    start(RL_OP_ACQUIRE, 3, 2, 10000);
    CHECK_INT(rl_round_reply(&r, 0, NULL, "connection refused", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &nil, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &nil, NULL, 1002), 1);
    CHECK_INT(res.status, RL_STATUS_BUSY);
    /* with no holder possible any more, the failure is decided at once */
    start(RL_OP_ACQUIRE, 3, 2, 10000);
    CHECK_INT(rl_round_reply(&r, 0, NULL, "down", 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, NULL, "down", 1001), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
}

static void quorum_too_late_is_a_timeout(void) {
    start(RL_OP_ACQUIRE, 3, 2, 100);
    rl_round_reply(&r, 0, &status_ok, NULL, 1050);
    /* 100 - 97 - (1 + 2) = 0: never hand out a lock with validity <= 0 */
    CHECK_INT(rl_round_reply(&r, 1, &status_ok, NULL, 1097), 1);
    CHECK_INT(res.status, RL_STATUS_TIMEOUT);
    CHECK(res.validity_ms <= 0);
}

static void expiry_marks_every_silent_node(void) {
    start(RL_OP_ACQUIRE, 5, 3, 10000);
    rl_round_reply(&r, 0, &status_ok, NULL, 1001);
    CHECK_INT(rl_round_expire(&r, "no reply within 50 ms", 1050), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
    CHECK_INT(res.failed, 4);
    for (int i = 1; i < 5; i++) {
        CHECK_INT(res.node[i].state, RL_NODE_TIMEOUT);
        CHECK_STR(res.node[i].errstr, "no reply within 50 ms");
    }
    CHECK_INT(rl_round_expire(&r, "again", 1060), 0);
}

static void expiry_after_quorum_keeps_the_decision(void) {
    start(RL_OP_ACQUIRE, 3, 2, 10000);
    rl_round_reply(&r, 0, &status_ok, NULL, 1001);
    rl_round_reply(&r, 1, &status_ok, NULL, 1001);
    CHECK_INT(res.status, RL_STATUS_OK);
    CHECK_INT(rl_round_expire(&r, "late", 1100), 0);
    CHECK_INT(res.status, RL_STATUS_OK);
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
}

static void release_and_extend_read_integers(void) {
    /* a release decides at quorum, like an acquire; the third node is its tail */
    start(RL_OP_RELEASE, 3, 2, 0);
    CHECK_INT(rl_round_reply(&r, 0, &one, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &one, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_OK);
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
    CHECK_INT(rl_round_reply(&r, 2, &zero, NULL, 1002), 0); /* late: no vote */
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
    CHECK_INT(res.ok, 2);

    /* ... and as soon as quorum is out of reach */
    start(RL_OP_RELEASE, 3, 2, 0);
    CHECK_INT(rl_round_reply(&r, 0, &zero, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 1, &zero, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_NOT_HELD);
    CHECK_INT(res.node[2].state, RL_NODE_PENDING);
    CHECK_INT(rl_round_expire(&r, "no reply", 1050), 0);

    /* a split release waits for the vote that decides it, or the timeout */
    start(RL_OP_RELEASE, 3, 2, 0);
    rl_round_reply(&r, 0, &one, NULL, 1001);
    rl_round_reply(&r, 1, &zero, NULL, 1001);
    CHECK_INT(rl_round_expire(&r, "no reply", 1050), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
    CHECK_INT(res.node[2].state, RL_NODE_TIMEOUT);

    /* an extension decides at quorum; validity counts to the quorum-th reply */
    start(RL_OP_EXTEND, 3, 2, 5000);
    CHECK_INT(rl_round_reply(&r, 0, &one, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 2, &one, NULL, 1005), 1);
    CHECK_INT(res.status, RL_STATUS_OK);
    CHECK(res.validity_ms > 4942.99 && res.validity_ms < 4943.01);
    CHECK_INT(res.node[1].state, RL_NODE_PENDING);

    /* a status reply to a script is not a vote for */
    start(RL_OP_EXTEND, 1, 1, 5000);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_UNAVAILABLE);
}

static void raised_quorum_and_single_node(void) {
    start(RL_OP_ACQUIRE, 5, 5, 10000);
    for (int i = 0; i < 4; i++) CHECK_INT(rl_round_reply(&r, i, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 4, &nil, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_BUSY); /* with quorum 5 of 5, one holder alone blocks */

    start(RL_OP_ACQUIRE, 1, 1, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &nil, NULL, 1001), 1);
    CHECK_INT(res.status, RL_STATUS_BUSY);
}

static void replies_must_fit_their_command(void) {
    CHECK(rl_reply_fits(RL_OP_ACQUIRE, &status_ok));
    CHECK(rl_reply_fits(RL_OP_ACQUIRE, &nil));
    CHECK(rl_reply_fits(RL_OP_ACQUIRE, &oom));
    CHECK(!rl_reply_fits(RL_OP_ACQUIRE, &one));
    CHECK(rl_reply_fits(RL_OP_RELEASE, &zero));
    CHECK(!rl_reply_fits(RL_OP_RELEASE, &status_ok));
    CHECK(!rl_reply_fits(RL_OP_EXTEND, &nil));
}

static void a_node_votes_once(void) {
    start(RL_OP_ACQUIRE, 3, 2, 10000);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 0);
    CHECK_INT(rl_round_reply(&r, 0, &status_ok, NULL, 1001), 0);
    CHECK_INT(res.ok, 1);
    CHECK_INT(rl_round_vote(&r, 7, RL_NODE_OK, NULL, 1001), 0);
    CHECK_INT(res.status, RL_STATUS_PENDING);
}

int main(void) {
    acquire_decides_at_quorum();
    acquire_fails_as_soon_as_quorum_is_impossible();
    failures_without_holders_are_unavailable();
    mixed_failures_are_busy_only_when_holders_alone_block();
    quorum_too_late_is_a_timeout();
    expiry_marks_every_silent_node();
    expiry_after_quorum_keeps_the_decision();
    release_and_extend_read_integers();
    raised_quorum_and_single_node();
    a_node_votes_once();
    replies_must_fit_their_command();
    return check_report("test_round");
}
