/* test_tls.c — the libev client over TLS against redis-server nodes serving
 * TLS only (--port 0 --tls-port), with certificates made here by the openssl
 * command-line tool, so the TLS paths (handshake, reads, writes, the
 * subscribers, every failure) run under the sanitizers too. Skips (exit 77)
 * without redis-server or openssl. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "redlock.h"
#include "check.h"
#include "nodes.h"

#define NODES 3

static char dir[] = "/tmp/redlock-tls-test.XXXXXX";
static char ca[128], ca_key[128], wrong_ca[128], wrong_key[128], crt[128], key[128];
static pid_t pids[NODES];
static int ports[NODES];
static char urls[NODES][64];
static const char *url_list[NODES];

static int verdict(int rc, const rl_result *r) {
    return rc == RL_OK ? r->status : RL_ERR;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* A CA, a second unrelated CA, and a server certificate for 127.0.0.1 and
 * localhost signed by the first. Return 0, or -1. */
static int make_certificates(void) {
    if (mkdtemp(dir) == NULL) return -1;
    snprintf(ca, sizeof(ca), "%s/ca.crt", dir);
    snprintf(ca_key, sizeof(ca_key), "%s/ca.key", dir);
    snprintf(wrong_ca, sizeof(wrong_ca), "%s/wrong.crt", dir);
    snprintf(wrong_key, sizeof(wrong_key), "%s/wrong.key", dir);
    snprintf(crt, sizeof(crt), "%s/server.crt", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    const char *gen = "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out";
    return sh("(cd %s && %s ca.key && %s wrong.key && %s server.key"
              " && openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj /CN=test-ca"
              " && openssl req -x509 -new -key wrong.key -out wrong.crt -days 2 -subj /CN=wrong-ca"
              " && openssl req -new -key server.key -out server.csr -subj /CN=server"
              " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext"
              " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
              " -out server.crt -days 2 -extfile san.ext) >/dev/null 2>&1",
              dir, gen, gen, gen) == 0 ? 0 : -1;
}

static pid_t start_tls_node(int port) {
    char p[16];
    snprintf(p, sizeof(p), "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        if (freopen("/dev/null", "w", stdout) == NULL) _exit(127);
        execlp("redis-server", "redis-server", "--port", "0", "--tls-port", p, "--bind", "127.0.0.1",
               "--tls-cert-file", crt, "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no",
               "--save", "", "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    return pid;
}

static void stop_all(void) {
    (void)start_node; /* nodes.h's plain node: not used here */
    for (int i = 0; i < NODES; i++) kill_node(&pids[i]);
}

static rl_client *client(const char *cafile, const char *server_name, int connect_ms, char *err) {
    rl_options o;
    rl_options_init(&o);
    o.tls.cafile = cafile;
    o.tls.server_name = server_name;
    if (connect_ms) o.connect_timeout_ms = connect_ms;
    return rl_client_new(url_list, NODES, &o, err, RL_ERR_LEN);
}

/* Acquire until it succeeds (the nodes may still be starting). */
static int wait_ready(rl_client *c, rl_result *r) {
    for (int tries = 0; tries < 200; tries++) {
        if (verdict(rl_acquire(c, "ready", 5, 1000, r), r) == RL_STATUS_OK) {
            rl_release(c, "ready", 5, r->value, r);
            return 0;
        }
        rl_sleep(c, 25);
    }
    return -1;
}

/* A majority of the nodes' error texts contain what, over attempts a
 * connect timeout apart (a round decides as soon as quorum is impossible:
 * the last nodes may still be pending). */
static int nodes_say(rl_client *c, rl_result *r, const char *what, int connect_ms) {
    int seen[NODES] = {0}, all = 0;
    for (int tries = 0; tries < 20 && !all; tries++) {
        rl_acquire(c, "fail", 4, 1000, r);
        int n = 0;
        for (int i = 0; i < r->nodes; i++) {
            if (strstr(r->node[i].errstr, what)) seen[i] = 1;
            n += seen[i];
        }
        all = n >= NODES / 2 + 1;
        if (!all) rl_sleep(c, connect_ms + 100);
    }
    if (!all)
        for (int i = 0; i < r->nodes; i++) fprintf(stderr, "  node %d: %s\n", i, r->node[i].errstr);
    return all;
}

static void bad_options(void) {
    char err[RL_ERR_LEN], path[256];
    rl_options o;
    rl_options_init(&o);
    snprintf(path, sizeof(path), "%s/none.pem", dir);
    o.tls.cafile = path;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    char want[512];
    snprintf(want, sizeof(want), "tls.cafile '%s': No such file or directory", path);
    CHECK_STR(err, want);
    rl_options_init(&o);
    o.tls.capath = ca;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    snprintf(want, sizeof(want), "tls.capath '%s': not a directory", ca);
    CHECK_STR(err, want);
    /* a device is no file: before, /dev/zero said "No such file or directory" */
    rl_options_init(&o);
    o.tls.cafile = "/dev/zero";
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK_STR(err, "tls.cafile '/dev/zero': not a regular file");
    /* a directory as the key: before, "PEM lib"; a missing key: "system lib" */
    rl_options_init(&o);
    o.tls.certfile = crt;
    o.tls.keyfile = dir;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    snprintf(want, sizeof(want), "tls.keyfile '%s': is a directory", dir);
    CHECK_STR(err, want);
    o.tls.keyfile = path;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    snprintf(want, sizeof(want), "tls.keyfile '%s': No such file or directory", path);
    CHECK_STR(err, want);
    rl_options_init(&o);
    o.tls.cafile = ca;
    o.tls.certfile = crt;
    o.tls.keyfile = ca_key;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK(strstr(err, "does not match tls.certfile") != NULL);
    /* rl_tls_check: the same checks, no client */
    CHECK_INT(rl_tls_check(&o.tls, err, sizeof(err)), RL_ERR);
    snprintf(want, sizeof(want), "tls.keyfile '%s': the key does not match tls.certfile", ca_key);
    CHECK_STR(err, want);
    o.tls.keyfile = key;
    CHECK_INT(rl_tls_check(&o.tls, err, sizeof(err)), RL_OK);
    rl_options_init(&o);
    o.tls.keyfile = key;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK_STR(err, "tls.keyfile needs tls.certfile");
    /* a server name no handshake can send (SNI: 255 bytes at most): before,
     * the client was made and every round failed every node with it */
    char name[257];
    memset(name, 'x', 256);
    name[256] = '\0';
    rl_options_init(&o);
    o.tls.server_name = name;
    CHECK(rl_client_new(url_list, NODES, &o, err, sizeof(err)) == NULL);
    CHECK_STR(err, "tls.server_name: longer than 255 bytes");
    name[255] = '\0';
    rl_client *c = rl_client_new(url_list, NODES, &o, err, sizeof(err));
    CHECK(c != NULL);
    rl_client_free(c);
}

static void locks_over_tls(rl_result *r) {
    char err[RL_ERR_LEN];
    rl_client *c = client(ca, NULL, 0, err);
    CHECK(c != NULL);
    if (c == NULL) return;
    CHECK_INT(wait_ready(c, r), 0);
    CHECK_INT(verdict(rl_acquire(c, "res\0x", 5, 5000, r), r), RL_STATUS_OK);
    char value[RL_VALUE_LEN + 1];
    memcpy(value, r->value, sizeof(value));
    CHECK_INT(verdict(rl_extend(c, "res\0x", 5, value, 20000, r), r), RL_STATUS_OK);
    CHECK_INT(verdict(rl_release(c, "res\0x", 5, value, r), r), RL_STATUS_OK);
    CHECK_INT(verdict(rl_acquire_fenced(c, "fenced", 6, 5000, r), r), RL_STATUS_OK);
    CHECK(r->token >= 1);
    CHECK_INT(verdict(rl_release(c, "fenced", 6, r->value, r), r), RL_STATUS_OK);
    /* a large batch: many records each way */
    int ids[200];
    char name[16];
    for (int k = 0; k < 200; k++) {
        snprintf(name, sizeof(name), "batch%d", k);
        ids[k] = rl_begin_acquire(c, name, strlen(name), 5000);
    }
    int ok = 0;
    for (int k = 0; k < 200; k++) ok += rl_wait(c, ids[k], r) == RL_OK && r->status == RL_STATUS_OK;
    CHECK_INT(ok, 200);

    /* the subscribers speak TLS too: a waiter hears a release */
    rl_client *w = client(ca, "localhost", 0, err);
    CHECK(w != NULL);
    if (w != NULL) {
        CHECK_INT(rl_watch(w, "hand", 4), RL_OK);
        double until = rl_now_ms() + 3000;
        while (rl_client_listening(w) < NODES && rl_now_ms() < until) rl_sleep(w, 5);
        CHECK_INT(rl_client_listening(w), NODES);
        rl_sleep(w, 50);
        CHECK_INT(verdict(rl_acquire(c, "hand", 4, 5000, r), r), RL_STATUS_OK);
        CHECK_INT(verdict(rl_release(c, "hand", 4, r->value, r), r), RL_STATUS_OK);
        CHECK_INT(rl_sleep_until(w, "hand", 4, 0, 3000), 1);
        rl_client_free(w);
    }
    rl_client_free(c);
}

static void failures(rl_result *r) {
    char err[RL_ERR_LEN];
    rl_client *c = client(wrong_ca, NULL, 300, err);
    CHECK(c != NULL);
    if (c) {
        CHECK(nodes_say(c, r, "certificate verify failed", 300));
        rl_client_free(c);
    }
    c = client(ca, "other.example", 300, err);
    CHECK(c != NULL);
    if (c) {
        CHECK(nodes_say(c, r, "hostname mismatch", 300));
        rl_client_free(c);
    }
    /* stalled before the handshake */
    for (int i = 0; i < NODES; i++) kill(pids[i], SIGSTOP);
    rl_options o;
    rl_options_init(&o);
    o.tls.cafile = ca;
    o.connect_timeout_ms = 300;
    o.reconnect_min_ms = o.reconnect_max_ms = 5000; /* down, and saying why, for long after */
    c = rl_client_new(url_list, NODES, &o, err, sizeof(err));
    CHECK(c != NULL);
    if (c) {
        double t0 = rl_now_ms();
        rl_sleep(c, 400);
        CHECK_INT(verdict(rl_acquire(c, "stalled", 7, 1000, r), r), RL_STATUS_UNAVAILABLE);
        int said = 0; /* decided when quorum became impossible: the last node may be pending */
        for (int i = 0; i < NODES; i++) said += strcmp(r->node[i].errstr, "TLS handshake timed out after 300 ms") == 0;
        CHECK(said >= NODES / 2 + 1);
        CHECK(rl_now_ms() - t0 < 2000); /* nothing blocked */
        rl_client_free(c);
    }
    for (int i = 0; i < NODES; i++) kill(pids[i], SIGCONT);
    /* plain to a TLS port: a failed vote, nothing worse */
    char plain[NODES][64];
    const char *plain_list[NODES];
    for (int i = 0; i < NODES; i++) {
        snprintf(plain[i], sizeof(plain[i]), "redis://127.0.0.1:%d", ports[i]);
        plain_list[i] = plain[i];
    }
    rl_options_init(&o);
    c = rl_client_new(plain_list, NODES, &o, err, sizeof(err));
    CHECK(c != NULL);
    if (c) {
        for (int k = 0; k < 5; k++) CHECK(verdict(rl_acquire(c, "plain", 5, 1000, r), r) != RL_STATUS_OK);
        rl_client_free(c);
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!have_redis_server() || system("command -v openssl >/dev/null 2>&1") != 0) {
        printf("skipped: needs redis-server and openssl\n");
        return 77;
    }
    if (make_certificates() != 0) {
        printf("skipped: openssl could not make the certificates\n");
        sh("rm -rf %s", dir);
        return 77;
    }
    for (int i = 0; i < NODES; i++) {
        ports[i] = free_port();
        pids[i] = start_tls_node(ports[i]);
        snprintf(urls[i], sizeof(urls[i]), "rediss://127.0.0.1:%d", ports[i]);
        url_list[i] = urls[i];
    }
    rl_result *r = calloc(1, sizeof(*r));
    bad_options();
    locks_over_tls(r);
    failures(r);
    free(r);
    stop_all();
    sh("rm -rf %s", dir);
    return check_report("test_tls");
}
