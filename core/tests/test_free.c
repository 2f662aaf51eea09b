/* test_free.c — what rl_client_free does with the acquires a caller began
 * and never collected, against real redis-server processes on loopback
 * (started and stopped here, by pid): one not written to a node yet is
 * never sent there, and one sent, decided or not, is released on every
 * node it went to. Nothing of them stays locked for its ttl; an acquire
 * the caller did collect stays held. Skips (exit 77) when redis-server is
 * not on PATH. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redlock.h"
#include "check.h"
#include "nodes.h"

#define NODES 3
#define EACH 40 /* acquires of each kind */

static pid_t pids[NODES];
static int ports[NODES];
static char urls[NODES][64];
static const char *url_list[NODES];

static void stop_all(void) {
    for (int i = 0; i < NODES; i++) kill_node(&pids[i]);
}

/* What redis-cli prints for args on node i, line by line into lines (NULL:
 * only counted), empty lines left out (an empty list prints one). Return
 * the number of lines, or -1. */
static long ask_node(int i, const char *args, char lines[][256], long max) {
    char cmd[512], line[256];
    snprintf(cmd, sizeof(cmd), "timeout 5 redis-cli -p %d %s 2>/dev/null", ports[i], args);
    FILE *p = popen(cmd, "r");
    if (p == NULL) return -1;
    long n = 0;
    while (fgets(line, sizeof(line), p) != NULL) {
        if (line[0] == '\n') continue;
        if (lines && n < max) snprintf(lines[n], sizeof(lines[n]), "%s", line);
        n++;
    }
    pclose(p);
    return n;
}

/* Keys on node i that hold something for the resources named "<tag>:...":
 * locks (a fenced lock's counter aside: it stays by design), semaphore
 * slots, and shared holds' readers. */
static long held_on(int i, const char *tag) {
    char args[128];
    long n = 0;
    const char *patterns[] = {"'%s:*[^e]'", "'redlock:slot:*:%s:*'", "'redlock:readers:%s:*'"};
    for (int k = 0; k < 3; k++) {
        char pattern[96];
        snprintf(pattern, sizeof(pattern), patterns[k], tag);
        snprintf(args, sizeof(args), "--raw KEYS %s", pattern);
        long got = ask_node(i, args, NULL, 0);
        if (got < 0) return -1;
        n += got;
    }
    return n;
}

/* Writes node i has run (SET, EVAL, EVALSHA: every acquire and release
 * this client sends), from its INFO commandstats. */
static long long writes_on(int i) {
    char lines[64][256];
    long n = ask_node(i, "INFO commandstats", lines, 64);
    long long calls = 0;
    for (long k = 0; k < n && k < 64; k++) {
        long long c;
        if (sscanf(lines[k], "cmdstat_set:calls=%lld", &c) == 1 || sscanf(lines[k], "cmdstat_eval:calls=%lld", &c) == 1 ||
            sscanf(lines[k], "cmdstat_evalsha:calls=%lld", &c) == 1)
            calls += c;
    }
    return calls;
}

/* A client whose connections to every node are up and set up: a lock it
 * takes shows on every node (looked up there, while the client serves the
 * round's tail). */
static rl_client *ready_client(void) {
    char err[RL_ERR_LEN];
    rl_result r;
    rl_client *c = rl_client_new(url_list, NODES, NULL, err, sizeof(err));
    if (c == NULL) return NULL;
    for (int tries = 0; tries < 200; tries++) {
        if (rl_acquire(c, "free-ready", 10, 1000, &r) == RL_OK && r.status == RL_STATUS_OK) {
            char value[RL_VALUE_LEN + 1], args[96], got[1][256];
            memcpy(value, r.value, sizeof(value));
            snprintf(args, sizeof(args), "--raw GET free-ready");
            int everywhere = 1;
            for (int i = 0; i < NODES && everywhere; i++) {
                rl_run(c, 0);
                everywhere = ask_node(i, args, got, 1) == 1 && strncmp(got[0], value, RL_VALUE_LEN) == 0;
            }
            rl_release(c, "free-ready", 10, value, &r);
            rl_run(c, 20); /* the release's tail */
            if (everywhere) return c;
        }
        rl_sleep(c, 25);
    }
    rl_client_free(c);
    return NULL;
}

/* Begin EACH acquires of every kind on resources "<tag>:<kind>:<k>";
 * return how many were begun. */
static int begin_every_kind(rl_client *c, const char *tag) {
    int begun = 0;
    for (int k = 0; k < EACH; k++) {
        char name[64];
        int len;
        len = snprintf(name, sizeof(name), "%s:plain:%d", tag, k);
        begun += rl_begin_acquire(c, name, (size_t)len, 60000) >= 0;
        len = snprintf(name, sizeof(name), "%s:fenced:%d", tag, k);
        begun += rl_begin_acquire_fenced(c, name, (size_t)len, 60000) >= 0;
        len = snprintf(name, sizeof(name), "%s:queued:%d", tag, k);
        begun += rl_begin_acquire_queued(c, name, (size_t)len, 60000) >= 0;
        len = snprintf(name, sizeof(name), "%s:shared:%d", tag, k);
        begun += rl_begin_acquire_shared(c, name, (size_t)len, 60000) >= 0;
        len = snprintf(name, sizeof(name), "%s:sem:%d", tag, k);
        begun += rl_begin_acquire_slot(c, name, (size_t)len, 2, 60000, 0) >= 0;
    }
    return begun;
}

/* Acquires begun and never run: freeing sends none of them (no node runs
 * a write), and no key is left. */
static void never_run_is_never_sent(void) {
    rl_client *c = ready_client();
    CHECK(c != NULL);
    if (c == NULL) return;
    long long before[NODES];
    for (int i = 0; i < NODES; i++) before[i] = writes_on(i);
    CHECK_INT(begin_every_kind(c, "unrun"), 5 * EACH);
    rl_client_free(c);
    for (int i = 0; i < NODES; i++) {
        CHECK_INT(held_on(i, "unrun"), 0);
        CHECK_INT(writes_on(i) - before[i], 0);
    }
}

/* Acquires run until every one is decided (granted), one of them
 * collected: freeing releases all the others on every node; the one
 * collected is the caller's, and stays. */
static void decided_and_not_collected_is_released(void) {
    rl_client *c = ready_client();
    CHECK(c != NULL);
    if (c == NULL) return;
    rl_result r;
    int kept = rl_begin_acquire(c, "run:kept", 8, 60000);
    CHECK_INT(rl_wait(c, kept, &r), RL_OK);
    CHECK_INT(r.status, RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r.value, sizeof(value));
    int begun = begin_every_kind(c, "run");
    CHECK_INT(begun, 5 * EACH);
    for (int tries = 0; tries < 200 && rl_run(c, 0) < begun; tries++) rl_sleep(c, 10);
    rl_sleep(c, 50); /* their tails */
    CHECK_INT(rl_run(c, 0), begun); /* decided, none collected */
    for (int i = 0; i < NODES; i++) CHECK(held_on(i, "run") > 5 * EACH); /* held there (and run:kept) */
    rl_client_free(c);
    for (int i = 0; i < NODES; i++) {
        char got[1][256];
        CHECK_INT(held_on(i, "run"), 1);
        CHECK_INT(ask_node(i, "--raw GET run:kept", got, 1), 1);
        got[0][strcspn(got[0], "\n")] = '\0';
        CHECK_STR(got[0], value);
    }
}

/* Acquires run for a moment, undecided or decided, and begun again after:
 * whatever state each is in, freeing leaves none held. */
static void in_flight_is_released(void) {
    rl_client *c = ready_client();
    CHECK(c != NULL);
    if (c == NULL) return;
    begin_every_kind(c, "mid");
    rl_run(c, 0);
    begin_every_kind(c, "mid2");
    rl_client_free(c);
    for (int i = 0; i < NODES; i++) {
        CHECK_INT(held_on(i, "mid"), 0);
        CHECK_INT(held_on(i, "mid2"), 0);
    }
}

int main(void) {
    if (!have_redis_server()) {
        printf("test_free: redis-server not found, skipped\n");
        return 77;
    }
    start_nodes(NODES, ports, pids, urls, url_list);
    atexit(stop_all);
    never_run_is_never_sent();
    decided_and_not_collected_is_released();
    in_flight_is_released();
    return check_report("test_free");
}
