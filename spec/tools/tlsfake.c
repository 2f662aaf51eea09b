/*
 * rl-tlsfake — a TLS server that takes a node's connections and drops them
 * before its first reply, the way a TLS proxy whose backend is down does.
 *
 *   rl-tlsfake MODE CERT KEY PORTFILE
 *
 * Listens on 127.0.0.1, port chosen by the kernel, and writes that port to
 * PORTFILE (see toolsock.h). Serves TLS (1.2 or 1.3) with the certificate
 * CERT and its key KEY, one connection at a time: the handshake, then it
 * reads the client's first bytes and ends the connection according to MODE:
 *
 *   hello-reset reads the ClientHello and closes with a TCP RST, no
 *               handshake (as redis-server at maxclients ends TLS clients)
 *   notify      sends close_notify and closes
 *   ask-notify  asks for a client certificate in the handshake (optional:
 *               none, or any, is accepted), then as notify
 *   ask-reset   asks for a client certificate likewise, then closes with a
 *               TCP RST, sending nothing (as a server refusing the
 *               certificate does when its alert is lost to the reset)
 *
 * Every connection accepted is a line "accept" on stdout. A client that
 * says nothing for 2 s is dropped. Exits on SIGTERM/SIGINT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "toolsock.h"

/* Any client certificate, or none, is fine: the server only asks. */
static int accept_any(int ok, X509_STORE_CTX *store) {
    (void)ok;
    (void)store;
    return 1;
}

/* One connection: handshake, the first read, then the end MODE says
 * (hello: reset after the ClientHello). */
static void serve(SSL_CTX *ctx, int fd, int hello, int reset) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (hello) {
        char hi[4096];
        (void)recv(fd, hi, sizeof hi, 0);
        reset_close(fd);
        return;
    }
    SSL *ssl = SSL_new(ctx);
    if (ssl == NULL || SSL_set_fd(ssl, fd) != 1) die("SSL_new");
    char buf[4096];
    if (SSL_accept(ssl) == 1 && SSL_read(ssl, buf, sizeof buf) > 0) {
        if (reset) {
            SSL_free(ssl);
            reset_close(fd);
            return;
        }
        SSL_shutdown(ssl); /* close_notify */
    }
    ERR_clear_error();
    SSL_free(ssl);
    close(fd);
}

int main(int argc, char **argv) {
    const char *mode = argc == 5 ? argv[1] : "";
    int ask = strcmp(mode, "ask-notify") == 0 || strcmp(mode, "ask-reset") == 0;
    int reset = strcmp(mode, "ask-reset") == 0;
    int hello = strcmp(mode, "hello-reset") == 0;
    if (!ask && !hello && strcmp(mode, "notify") != 0) {
        fprintf(stderr, "usage: rl-tlsfake hello-reset|notify|ask-notify|ask-reset CERT KEY PORTFILE\n");
        return 2;
    }
    tool_init("rl-tlsfake");
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL || SSL_CTX_use_certificate_chain_file(ctx, argv[2]) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, argv[3], SSL_FILETYPE_PEM) != 1) {
        ERR_print_errors_fp(stderr);
        return 1;
    }
    if (ask) SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, accept_any);

    int port;
    int lfd = listen_loopback(&port);
    write_portfile(argv[4], port);
    while (!stop_requested) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int n = poll(&p, 1, 200);
        if (n < 0 && errno != EINTR) die("poll");
        if (n <= 0) continue;
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        printf("accept\n");
        fflush(stdout);
        serve(ctx, fd, hello, reset);
    }
    close(lfd);
    SSL_CTX_free(ctx);
    return 0;
}
