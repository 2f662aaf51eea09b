/* test_failures.c — the core when the C library fails it: every allocation
 * in turn fails once (client, connection setup, rounds, cleanup, hand-off's
 * watches and subscriber connection, keeper), and
 * getrandom is unavailable. Linked with -Wl,--wrap for malloc, calloc,
 * realloc and getrandom, so the core's own calls come here first. Run under
 * ASan+UBSan in CI, where a half-queued command (a memcpy from NULL), a leak
 * or a use after free fails the test; a keeper thread that died would hang
 * rl_keeper_release_all and time the test out. Needs one redis-server (skips
 * with exit 77 without it). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>

#include "redlock.h"
#include "check.h"
#include "nodes.h"

/* ---- the wrapped C library ---- */

static atomic_long countdown = -1; /* the allocation that takes it from 0 to -1 fails */
static atomic_long failed;         /* allocations failed so far */
static atomic_int no_getrandom;

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
ssize_t __real_getrandom(void *buf, size_t len, unsigned flags);

static int fail_now(void) {
    if (atomic_load(&countdown) < 0) return 0;
    if (atomic_fetch_sub(&countdown, 1) != 0) return 0;
    atomic_fetch_add(&failed, 1);
    return 1;
}

void *__wrap_malloc(size_t n) {
    return fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t a, size_t b) {
    return fail_now() ? NULL : __real_calloc(a, b);
}

void *__wrap_realloc(void *p, size_t n) {
    return fail_now() ? NULL : __real_realloc(p, n);
}

ssize_t __wrap_getrandom(void *buf, size_t len, unsigned flags) {
    if (atomic_load(&no_getrandom)) {
        errno = ENOSYS;
        return -1;
    }
    return __real_getrandom(buf, len, flags);
}

/* ---- the tests ---- */

static pid_t node;
static char url[64];
static const char *urls[1] = {url};

static void stop(void) {
    kill_node(&node);
}

/* One lock cycle: acquire until the node answers (bounded), then release. */
static void lock_cycle(rl_client *c, rl_result *r) {
    for (int tries = 0; tries < 40; tries++) {
        if (rl_acquire(c, "failures", 8, 1000, r) == RL_OK && r->status == RL_STATUS_OK) {
            rl_release(c, "failures", 8, r->value, r);
            return;
        }
        rl_sleep(c, 5);
    }
}

/* Fail allocation n (n = 0, 1, 2, ...) of a whole client lifecycle, for
 * every n until one lifecycle runs without reaching its n-th allocation.
 * The URL selects db 1, so every connection queues a SELECT first. */
static void every_client_allocation_fails_once(void) {
    rl_result *r = calloc(1, sizeof(*r));
    char err[RL_ERR_LEN];
    long n;
    for (n = 0; n < 500; n++) {
        atomic_store(&failed, 0);
        atomic_store(&countdown, n);
        rl_client *c = rl_client_new(urls, 1, NULL, err, sizeof(err));
        if (c) {
            lock_cycle(c, r);
            /* hand-off: a watch, its subscriber connection and SUBSCRIBE, a second watch, the unwatches */
            if (rl_watch(c, "w", 1) == RL_OK) {
                rl_sleep(c, 20);
                if (rl_watch(c, "v", 1) == RL_OK) rl_unwatch(c, "v", 1);
                rl_unwatch(c, "w", 1);
            }
            int id = rl_begin_acquire(c, "abandoned", 9, 1000); /* freed with it in flight */
            (void)id;
            rl_client_free(c);
        } else {
            CHECK(strstr(err, "out of memory") != NULL);
        }
        atomic_store(&countdown, -1);
        if (atomic_load(&failed) == 0) break; /* the lifecycle has fewer than n allocations */
    }
    printf("client lifecycle: %ld allocations, each failed once\n", n);
    CHECK(n > 5 && n < 500); /* it swept the whole lifecycle */
    /* and the library still works afterwards */
    rl_client *c = rl_client_new(urls, 1, NULL, err, sizeof(err));
    CHECK(c != NULL);
    if (c) {
        int ok = 0;
        for (int tries = 0; tries < 200 && !ok; tries++) {
            ok = rl_acquire(c, "after", 5, 1000, r) == RL_OK && r->status == RL_STATUS_OK;
            if (!ok) rl_sleep(c, 10);
        }
        CHECK(ok);
        rl_release(c, "after", 5, r->value, r);
        CHECK_INT(rl_watch(c, "w", 1), RL_OK);
        for (int tries = 0; tries < 200 && rl_client_listening(c) < 1; tries++) rl_sleep(c, 10);
        CHECK_INT(rl_client_listening(c), 1);
        rl_unwatch(c, "w", 1);
        rl_client_free(c);
    }
    free(r);
}

/* The same for a client whose votes wait for a replica (rl_options.replicas):
 * a write with its WAIT behind it, both or neither. The node has no replica,
 * so every acquire fails, and is undone, whatever allocation failed. */
static void every_allocation_with_replicas_fails_once(void) {
    rl_result *r = calloc(1, sizeof(*r));
    rl_options o;
    rl_options_init(&o);
    o.replicas = 1;
    char err[RL_ERR_LEN];
    long n;
    for (n = 0; n < 500; n++) {
        atomic_store(&failed, 0);
        atomic_store(&countdown, n);
        rl_client *c = rl_client_new(urls, 1, &o, err, sizeof(err));
        if (c) {
            rl_sleep(c, 5); /* connected and set up, mostly */
            int rc = rl_acquire(c, "replicas", 8, 1000, r);
            CHECK(rc != RL_OK || r->status != RL_STATUS_OK); /* no replica: never granted */
            rl_client_free(c);
        } else {
            CHECK(strstr(err, "out of memory") != NULL);
        }
        atomic_store(&countdown, -1);
        if (atomic_load(&failed) == 0) break;
    }
    printf("client with replicas: %ld allocations, each failed once\n", n);
    CHECK(n > 5 && n < 500);
    free(r);
}

/* The same for a keeper: whatever allocation fails, rl_keeper_release_all
 * returns (within its bound) and rl_keeper_free cleans up. */
static void every_keeper_allocation_fails_once(void) {
    char err[RL_ERR_LEN], value[RL_VALUE_LEN + 1];
    memset(value, 'a', RL_VALUE_LEN);
    value[RL_VALUE_LEN] = '\0';
    long n;
    for (n = 0; n < 500; n++) {
        atomic_store(&failed, 0);
        atomic_store(&countdown, n);
        rl_keeper *k = rl_keeper_new(urls, 1, NULL, err, sizeof(err));
        if (k) {
            int id = rl_keeper_add(k, "kept", 4, value, 300, rl_now_ms() + 250, 0, err, sizeof(err));
            double t0 = rl_now_ms();
            rl_keeper_release_all(200);
            CHECK(rl_now_ms() - t0 < 5000);
            if (id >= 0) rl_keeper_drop(k, id);
            rl_keeper_free(k);
        }
        atomic_store(&countdown, -1);
        if (atomic_load(&failed) == 0) break;
    }
    printf("keeper lifecycle: %ld allocations, each failed once\n", n);
    CHECK(n > 3 && n < 500);
}

/* The keeper's functions take a NULL error buffer like the client's. */
static void keeper_errors_without_a_buffer(void) {
    const char *bad[1] = {"redis://127.0.0.1:99999"};
    CHECK(rl_keeper_new(bad, 1, NULL, NULL, 0) == NULL);
    rl_keeper *k = rl_keeper_new(urls, 1, NULL, NULL, 0);
    CHECK(k != NULL);
    CHECK_INT(rl_keeper_add(k, "", 0, "short", 0, 0, 0, NULL, 0), RL_ERR);
    CHECK_INT(rl_keeper_drop(k, 12345), RL_ERR);
    CHECK_INT(rl_keeper_update(k, 12345, 1000, 0, 0), RL_ERR);
    rl_keeper_free(k);
}

/* Without getrandom, jitter still differs between processes started
 * together (before: every process fell back to one fixed seed). */
static void jitter_without_getrandom(void) {
    atomic_store(&no_getrandom, 1);
    double seen[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            double x = rl_random();
            _exit(write(fds[1], &x, sizeof(x)) == (ssize_t)sizeof(x) ? 0 : 1);
        }
        close(fds[1]);
        CHECK(read(fds[0], &seen[i], sizeof(seen[i])) == (ssize_t)sizeof(seen[i]));
        close(fds[0]);
        waitpid(pid, NULL, 0);
    }
    CHECK(seen[0] >= 0 && seen[0] < 1 && seen[1] >= 0 && seen[1] < 1);
    CHECK(seen[0] != seen[1]);
    /* lock values never fall back: without randomness, no acquire starts */
    rl_client *c = rl_client_new(urls, 1, NULL, NULL, 0);
    CHECK(c != NULL);
    if (c) {
        CHECK_INT(rl_begin_acquire(c, "norandom", 8, 1000), RL_ERR);
        CHECK(strstr(rl_client_errstr(c), "getrandom") != NULL);
        rl_client_free(c);
    }
    atomic_store(&no_getrandom, 0);
}

int main(void) {
    if (!have_redis_server()) {
        printf("test_failures: redis-server not found, skipped\n");
        return 77;
    }
    int port = free_port();
    node = start_node(port);
    atexit(stop);
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d/1", port);

    jitter_without_getrandom();
    keeper_errors_without_a_buffer();
    every_client_allocation_fails_once();
    every_allocation_with_replicas_fails_once();
    every_keeper_allocation_fails_once();
    return check_report("test_failures");
}
