/* test_resolve.c — finding addresses: numeric ones at once and without a
 * thread, names on a thread that cleans up after itself. No network: the
 * only name looked up is localhost (/etc/hosts). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "../src/resolve.h"
#include "redlock.h"
#include "check.h"

/* Threads of this process, from /proc/self/task. */
static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    if (d == NULL) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* Wait up to 5 s for the thread count to come back to want. */
static int threads_back_to(int want) {
    for (int i = 0; i < 500 && threads() != want; i++) poll(NULL, 0, 10);
    return threads();
}

static void numeric(void) {
    rl_addrs a;
    char text[INET6_ADDRSTRLEN];

    CHECK_INT(rl_resolve_numeric("127.0.0.1", 7001, &a), 0);
    CHECK_INT(a.n, 1);
    CHECK_INT(a.addr[0].sa.any.sa_family, AF_INET);
    CHECK_INT(a.addr[0].len, sizeof(struct sockaddr_in));
    CHECK_INT(ntohs(a.addr[0].sa.in.sin_port), 7001);
    inet_ntop(AF_INET, &a.addr[0].sa.in.sin_addr, text, sizeof(text));
    CHECK_STR(text, "127.0.0.1");

    CHECK_INT(rl_resolve_numeric("::1", 6379, &a), 0);
    CHECK_INT(a.n, 1);
    CHECK_INT(a.addr[0].sa.any.sa_family, AF_INET6);
    CHECK_INT(ntohs(a.addr[0].sa.in6.sin6_port), 6379);
    inet_ntop(AF_INET6, &a.addr[0].sa.in6.sin6_addr, text, sizeof(text));
    CHECK_STR(text, "::1");

    /* what redis://[::ffff:127.0.0.1]:port leaves in the host */
    CHECK_INT(rl_resolve_numeric("::ffff:127.0.0.1", 6380, &a), 0);
    CHECK_INT(a.n, 1);
    CHECK_INT(a.addr[0].sa.any.sa_family, AF_INET6);
    inet_ntop(AF_INET6, &a.addr[0].sa.in6.sin6_addr, text, sizeof(text));
    CHECK_STR(text, "::ffff:127.0.0.1");

    /* names are not numeric; nothing is looked up */
    const char *names[] = {"localhost", "slow.invalid", "redis-1", "127.0.0.1.example", "[::1]", ""};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        a.n = 99;
        CHECK_INT(rl_resolve_numeric(names[i], 6379, &a), -1);
        CHECK_INT(a.n, 0);
    }
}

/* A client on numeric addresses and a unix socket starts no thread. */
static void numeric_client_starts_no_thread(void) {
    const char *urls[] = {"redis://127.0.0.1:1", "redis://[::1]:1", "redis://[::ffff:127.0.0.2]:1",
                          "unix:///nonexistent/redlock-test.sock"};
    char err[RL_ERR_LEN];
    int before = threads();
    CHECK(before > 0);
    rl_client *c = rl_client_new(urls, 4, NULL, err, sizeof(err));
    CHECK(c != NULL);
    CHECK_INT(threads(), before);
    rl_sleep(c, 120); /* connects fail and are retried: still no lookup */
    CHECK_INT(threads(), before);
    rl_client_free(c);
}

static void lookup_localhost(void) {
    char err[256] = "";
    int before = threads();
    rl_lookup *l = rl_lookup_start("localhost", 6379, err, sizeof(err));
    CHECK(l != NULL);
    if (l == NULL) return;
    CHECK_INT(rl_lookup_wait(l, rl_now_ms() + 5000), 1);
    rl_addrs a;
    CHECK_INT(rl_lookup_result(l, &a, err, sizeof(err)), 1);
    CHECK(a.n >= 1);
    /* IPv4 first, as hiredis preferred it */
    CHECK_INT(a.addr[0].sa.any.sa_family, AF_INET);
    CHECK_INT(ntohs(a.addr[0].sa.in.sin_port), 6379);
    rl_lookup_drop(l);
    CHECK_INT(threads_back_to(before), before);
}

/* An owner that walks away from a lookup in progress: its thread frees it
 * (AddressSanitizer reports a leak or a use after free otherwise). */
static void lookup_abandoned(void) {
    char err[256] = "";
    int before = threads();
    for (int i = 0; i < 8; i++) {
        rl_lookup *l = rl_lookup_start("localhost", 6379, err, sizeof(err));
        CHECK(l != NULL);
        rl_lookup_drop(l);
    }
    CHECK_INT(threads_back_to(before), before);
    rl_lookup_drop(NULL);
}

/* A client whose named nodes refuse connections looks the names up again
 * (in the background), and may be freed while it does. */
static void client_freed_while_resolving(void) {
    const char *urls[] = {"redis://localhost:1", "redis://127.0.0.1:2", "redis://localhost:3"};
    char err[RL_ERR_LEN];
    int before = threads();
    rl_client *c = rl_client_new(urls, 3, NULL, err, sizeof(err));
    CHECK(c != NULL);
    rl_sleep(c, 60);
    rl_client_free(c);
    CHECK_INT(threads_back_to(before), before);
}

int main(void) {
    numeric();
    numeric_client_starts_no_thread();
    lookup_localhost();
    lookup_abandoned();
    client_freed_while_resolving();
    return check_report("test_resolve");
}
