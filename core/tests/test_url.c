/* test_url.c — node URL parsing and same-server detection. */
#include <stdio.h>
#include <string.h>

#include "../src/url.h"
#include "check.h"

static rl_url u;
static char err[256];

static int parse(const char *text) {
    err[0] = '\0';
    return rl_url_parse(text, &u, err, sizeof(err));
}

static void tcp_urls(void) {
    CHECK_INT(parse("redis://127.0.0.1:7001"), 0);
    CHECK_INT(u.kind, RL_URL_TCP);
    CHECK_STR(u.host, "127.0.0.1");
    CHECK_INT(u.port, 7001);
    CHECK_INT(u.db, 0);
    CHECK_STR(u.password, "");
    CHECK_STR(u.name, "redis://127.0.0.1:7001");

    CHECK_INT(parse("redis://alice:s%40cret@db.example:6380/3"), 0);
    CHECK_STR(u.user, "alice");
    CHECK_STR(u.password, "s@cret");
    CHECK_INT(u.db, 3);
    CHECK_STR(u.name, "redis://alice@db.example:6380/3");

    CHECK_INT(parse("redis://:pw@localhost"), 0);
    CHECK_STR(u.user, "");
    CHECK_STR(u.password, "pw");
    CHECK_INT(u.port, 6379);

    /* a lone userinfo is the password, up to the password's room (before:
     * one of 128 to 255 bytes was refused as a bad user name) */
    char url[400], pw[201];
    memset(pw, 'p', 200);
    pw[200] = '\0';
    snprintf(url, sizeof(url), "redis://%s@localhost:7003", pw);
    CHECK_INT(parse(url), 0);
    CHECK_STR(u.user, "");
    CHECK_STR(u.password, pw);

    CHECK_INT(parse("redis://[::1]:7002"), 0);
    CHECK_STR(u.host, "::1");
    CHECK_STR(u.name, "redis://[::1]:7002");
}

static void unix_urls(void) {
    CHECK_INT(parse("unix:///tmp/redis.sock"), 0);
    CHECK_INT(u.kind, RL_URL_UNIX);
    CHECK_STR(u.path, "/tmp/redis.sock");
    CHECK_INT(parse("unix:///tmp/redis.sock?db=2"), 0);
    CHECK_INT(u.db, 2);
    CHECK_INT(parse("unix://relative.sock"), -1);
    CHECK_INT(parse("unix:///tmp/x.sock?foo=1"), -1);
}

static void tls_urls(void) {
    CHECK_INT(parse("rediss://u:pw@example.com:6380/2"), 0);
    CHECK_INT(u.kind, RL_URL_TCP);
    CHECK_INT(u.tls, 1);
    CHECK_STR(u.host, "example.com");
    CHECK_INT(u.port, 6380);
    CHECK_STR(u.password, "pw");
    CHECK_STR(u.name, "rediss://u@example.com:6380/2");
    CHECK_INT(parse("redis://127.0.0.1:7000"), 0);
    CHECK_INT(u.tls, 0);
    CHECK_INT(parse("rediss://"), -1);
}

static void bad_urls(void) {
    CHECK_INT(parse("redis://127.0.0.1:0"), -1);
    CHECK(strstr(err, "port must be a number from 1 to 65535") != NULL);
    CHECK_INT(parse("redis://127.0.0.1:70000"), -1);
    CHECK_INT(parse("redis://127.0.0.1:12ab"), -1);
    CHECK_INT(parse("redis://:7000"), -1);
    CHECK(strstr(err, "missing host") != NULL);
    CHECK_INT(parse("http://127.0.0.1:7000"), -1);
    CHECK(strstr(err, "unknown scheme") != NULL);
    CHECK_INT(parse("127.0.0.1:7000"), -1);
    CHECK_INT(parse(""), -1);
    CHECK_INT(parse("redis://127.0.0.1:7000/x"), -1);
    CHECK_INT(parse("redis://a b:7000"), -1);
    CHECK_INT(parse("redis://u:%zz@h:1"), -1);
    CHECK_INT(parse("redis://[::1:7000"), -1);
}

static void same_server(void) {
    rl_url a, b;
    rl_url_parse("redis://localhost:7001/1", &a, err, sizeof(err));
    rl_url_parse("redis://:pw@127.0.0.1:7001/2", &b, err, sizeof(err));
    CHECK(rl_url_same_server(&a, &b));
    rl_url_parse("redis://127.0.0.1:7002", &b, err, sizeof(err));
    CHECK(!rl_url_same_server(&a, &b));
    rl_url_parse("unix:///tmp/a.sock", &a, err, sizeof(err));
    rl_url_parse("unix:///tmp/a.sock?db=3", &b, err, sizeof(err));
    CHECK(rl_url_same_server(&a, &b));
}

/* A password never shows in what parse errors quote, nor in what a node
 * said to AUTH. */
static void passwords_hidden(void) {
    CHECK_INT(parse("redis://alice:topsecret"), -1); /* "alice:topsecret,2024@h" split at the comma */
    CHECK(strstr(err, "'redis://alice:***'") != NULL);
    CHECK(strstr(err, "topsecret") == NULL);
    CHECK_INT(parse("redis://[::1]:pw"), -1);
    CHECK(strstr(err, "pw") == NULL);
    CHECK_INT(parse("redis://127.0.0.1:70000"), -1); /* a port stays */
    CHECK(strstr(err, "127.0.0.1:70000") != NULL);
    CHECK_INT(parse("redis-cluster://h1:99999+h2:2"), -1);
    CHECK(strstr(err, "h1:99999+h2:2") != NULL);
    CHECK_INT(parse("redis://127.0.0.1:1;redis://127.0.0.1:2"), -1); /* a list split at the wrong character */
    CHECK(strstr(err, "redis://127.0.0.1:1;redis://127.0.0.1:2") != NULL);
    CHECK_INT(parse("redis://alice:12;secret"), -1);
    CHECK(strstr(err, "secret") == NULL);
    CHECK_INT(parse("redis://alice:hunter2@127.0.0.1:7000"), 0);
    char out[128];
    rl_url_scrub(&u, "ERR unknown command 'AUTH', with args beginning with: 'alice' 'hunter2' ", out, sizeof(out));
    CHECK_STR(out, "ERR unknown command 'AUTH'");
    rl_url_scrub(&u, "says hunter2, twice: hunter2", out, sizeof(out));
    CHECK_STR(out, "says ***, twice: ***");
    rl_url_scrub(&u, "WRONGPASS invalid username-password pair", out, 10);
    CHECK_STR(out, "WRONGPASS");
}

int main(void) {
    passwords_hidden();
    tcp_urls();
    tls_urls();
    unix_urls();
    bad_urls();
    same_server();
    return check_report("test_url");
}
