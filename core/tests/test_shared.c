/* test_shared.c — shared (read) holds in the engine, no network: their
 * commands, and that a reader's value takes every later command of its
 * lock (the cleanup of a failed acquire, release, extend, keep-alive) to
 * the shared scripts, while a writer's keeps the scripts by SHA. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <string.h>

#include "../src/command.h"
#include "../src/shared.h"
#include "fake_driver.h"
#include "redlock.h"

#define WRITER "0123456789abcdef0123456789abcdef01234567"
#define READER "0123456789abcdef0123456789abcdef0123456s"

static const char *const urls[] = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"};

/* 1 if the bytes hold text. */
static int holds(const char *data, size_t len, const char *text) {
    return memmem(data, len, text, strlen(text)) != NULL;
}

/* EVAL <script> 1 <key> <value> <word>: the bytes, whole. */
static int is_eval(const rl_buf *b, const char *script, const char *key, const char *value, const char *word) {
    char want[8192];
    int n = snprintf(want, sizeof(want), "*6\r\n$4\r\nEVAL\r\n$%zu\r\n%s\r\n$1\r\n1\r\n$%zu\r\n%s\r\n$40\r\n%s\r\n$%zu\r\n%s\r\n",
                     strlen(script), script, strlen(key), key, value, strlen(word), word);
    return n > 0 && (size_t)n == b->len && memcmp(b->data, want, b->len) == 0;
}

static void encodes_the_shared_scripts_whole(void) {
    rl_buf b = {0};
    CHECK_INT(rl_cmd_shared_acquire(&b, "k", 1, READER, 1500), 0);
    CHECK(is_eval(&b, rl_shared_acquire_script, "k", READER, "1500"));
    CHECK_INT(rl_cmd_shared_extend(&b, "k", 1, READER, 2147483647), 0);
    CHECK(is_eval(&b, rl_shared_extend_script, "k", READER, "2147483647"));
    CHECK_INT(rl_cmd_shared_release(&b, "k", 1, READER, 1), 0);
    CHECK(is_eval(&b, rl_shared_release_script, "k", READER, "quiet"));
    CHECK_INT(rl_cmd_shared_release(&b, "k", 1, READER, 0), 0);
    CHECK(is_eval(&b, rl_shared_release_script, "k", READER, "wake"));
    rl_buf_free(&b);
}

/* rl_cmd_release and rl_cmd_extend see a reader's value and send its
 * scripts, even when asked for the SHA; a writer's value is unchanged. */
static void a_readers_value_chooses_the_shared_scripts(void) {
    rl_buf b = {0};
    CHECK(rl_value_shared(READER));
    CHECK(!rl_value_shared(WRITER));
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, READER, "fedcba9876543210"), 0);
    CHECK(is_eval(&b, rl_shared_release_script, "k", READER, "wake"));
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, READER, NULL), 0);
    CHECK(is_eval(&b, rl_shared_release_script, "k", READER, "quiet"));
    CHECK_INT(rl_cmd_extend(&b, 1, "k", 1, READER, 900), 0);
    CHECK(is_eval(&b, rl_shared_extend_script, "k", READER, "900"));
    CHECK_INT(rl_cmd_release(&b, 1, "k", 1, WRITER, "fedcba9876543210"), 0);
    CHECK(holds(b.data, b.len, "EVALSHA") && !holds(b.data, b.len, RL_READERS_PREFIX));
    CHECK_INT(rl_cmd_extend(&b, 1, "k", 1, WRITER, 900), 0);
    CHECK(holds(b.data, b.len, "EVALSHA") && !holds(b.data, b.len, RL_READERS_PREFIX));
    rl_buf_free(&b);
}

/* The scripts keep to the key layout of shared.h, and the queued acquire
 * marks and clears the writer's intent. */
static void scripts_use_the_documented_keys(void) {
    CHECK(holds(rl_shared_acquire_script, strlen(rl_shared_acquire_script), RL_INTENT_PREFIX));
    CHECK(holds(rl_shared_acquire_script, strlen(rl_shared_acquire_script), RL_SHARED_MARK));
    CHECK(holds(rl_shared_release_script, strlen(rl_shared_release_script), RL_READERS_PREFIX));
    CHECK(holds(rl_shared_release_script, strlen(rl_shared_release_script), "redlock:released:"));
    CHECK(holds(rl_acquire_queued_script, strlen(rl_acquire_queued_script), RL_INTENT_PREFIX));
    CHECK(!holds(rl_release_script, strlen(rl_release_script), RL_INTENT_PREFIX));
}

/* Three nodes on pooled connections (no setup to answer). */
static void start(double t) {
    char err[RL_ERR_LEN] = "";
    E = rl_engine_new(urls, 3, NULL, err, sizeof(err));
    CHECK(E != NULL);
    for (int i = 0; i < 3; i++) {
        rl_engine_node_open(E, i, t);
        CHECK_INT(rl_engine_node_wants(E, i), RL_WANT_CONNECT);
        CHECK_INT(rl_engine_node_connected(E, i, 0, t), RL_OK);
    }
}

/* A shared acquire: a reader's value ('s', then hex); refused by a quorum,
 * it is BUSY, and the node that granted it gets the quiet shared release. */
static void a_refused_shared_acquire_is_busy_and_cleaned_up_as_shared(void) {
    start(100);
    int id = rl_engine_begin_acquire_shared(E, "r", 1, 1000, 100);
    CHECK(id >= 0);
    for (int i = 0; i < 3; i++) {
        drain(i, 100);
        CHECK(holds(out, outlen, rl_shared_acquire_script));
    }
    CHECK_INT(feed(0, "+OK\r\n", 101), RL_OK);
    CHECK_INT(feed(1, "$-1\r\n", 102), RL_OK);
    CHECK_INT(feed(2, "$-1\r\n", 103), RL_OK);
    rl_result r = take(id);
    CHECK_INT(r.op, RL_OP_ACQUIRE);
    CHECK_INT(r.status, RL_STATUS_BUSY);
    CHECK_INT(r.value[RL_VALUE_LEN - 1], RL_SHARED_CHAR);
    CHECK_INT(strspn(r.value, "0123456789abcdef"), RL_VALUE_LEN - 1);
    drain(0, 103);
    CHECK(holds(out, outlen, rl_shared_release_script) && holds(out, outlen, r.value) && holds(out, outlen, "quiet"));
    CHECK_INT(drain(1, 103)[0], 0);
    CHECK_INT(feed(0, ":1\r\n", 104), RL_OK);
    CHECK_INT(rl_engine_tails(E), 0);
    rl_engine_free(E);
    E = NULL;
}

/* Granted at quorum with validity as any acquire's; its release and
 * extension (and a kept one's) are the shared scripts. */
static void a_granted_shared_hold_is_extended_and_released_as_shared(void) {
    start(100);
    int id = rl_engine_begin_acquire_shared(E, "r", 1, 1000, 100);
    for (int i = 0; i < 3; i++) drain(i, 100);
    CHECK_INT(feed(0, "+OK\r\n", 110), RL_OK);
    CHECK_INT(feed(2, "+OK\r\n", 110), RL_OK);
    rl_result r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK(r.validity_ms == 1000 - 10 - (10 + 2));
    CHECK_INT(feed(1, "+OK\r\n", 111), RL_OK);
    id = rl_engine_begin_extend(E, "r", 1, r.value, 2000, 120);
    for (int i = 0; i < 3; i++) {
        drain(i, 120);
        CHECK(holds(out, outlen, rl_shared_extend_script));
    }
    for (int i = 0; i < 3; i++) CHECK_INT(feed(i, ":1\r\n", 121), RL_OK);
    CHECK_INT(take(id).status, RL_STATUS_OK);
    int kept = rl_engine_keep_add(E, "r", 1, r.value, 900, 1000, 0, 130);
    CHECK(kept >= 0);
    rl_engine_advance(E, 430); /* a third of the ttl */
    for (int i = 0; i < 3; i++) {
        drain(i, 430);
        CHECK(holds(out, outlen, rl_shared_extend_script));
    }
    for (int i = 0; i < 3; i++) CHECK_INT(feed(i, ":1\r\n", 431), RL_OK);
    CHECK_INT(rl_engine_keep_state(E, kept, NULL, 431), RL_KEEP_HELD);
    CHECK_INT(rl_engine_keep_remove(E, kept), RL_OK);
    id = rl_engine_begin_release(E, "r", 1, r.value, 440);
    for (int i = 0; i < 3; i++) {
        drain(i, 440);
        CHECK(holds(out, outlen, rl_shared_release_script) && holds(out, outlen, "wake"));
    }
    CHECK_INT(feed(0, ":2\r\n", 441), RL_OK);
    CHECK_INT(feed(1, ":0\r\n", 441), RL_OK);
    CHECK_INT(feed(2, ":1\r\n", 441), RL_OK);
    r = take(id);
    CHECK_INT(r.status, RL_STATUS_OK);
    CHECK_INT(r.heard, 1);
    rl_engine_free(E);
    E = NULL;
}

int main(void) {
    encodes_the_shared_scripts_whole();
    a_readers_value_chooses_the_shared_scripts();
    scripts_use_the_documented_keys();
    a_refused_shared_acquire_is_busy_and_cleaned_up_as_shared();
    a_granted_shared_hold_is_extended_and_released_as_shared();
    return check_report("test_shared");
}
