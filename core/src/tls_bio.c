/* tls_bio.c — the BIO through which OpenSSL reads and writes a TLS
 * connection's socket: recv(2), and send(2) with MSG_NOSIGNAL, because
 * OpenSSL's socket BIO uses write(2) and a write to a reset peer would
 * raise SIGPIPE in a process whose signal dispositions are not ours to
 * change. The socket is the BIO's data (an int fd). */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>

#include "tls_bio.h"

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static int bio_write(BIO *b, const char *data, int len) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    ssize_t w;
    BIO_clear_retry_flags(b);
    do w = send(fd, data, (size_t)len, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(b);
    return (int)w;
}

static int bio_read(BIO *b, char *buf, int len) {
    int fd = (int)(intptr_t)BIO_get_data(b);
    ssize_t got;
    BIO_clear_retry_flags(b);
    do got = recv(fd, buf, (size_t)len, 0);
    while (got < 0 && errno == EINTR);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(b);
    return (int)got;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)b;
    (void)num;
    (void)ptr;
    return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static int bio_create(BIO *b) {
    BIO_set_init(b, 1);
    return 1;
}

static int bio_destroy(BIO *b) {
    (void)b;
    return 1;
}

/* One method for the process, made once (it is never freed: it stays
 * reachable, and a new index per client would run out). */
static void bio_setup(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "redlock socket");
    if (m == NULL) return;
    if (!BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) || !BIO_meth_set_ctrl(m, bio_ctrl) ||
        !BIO_meth_set_create(m, bio_create) || !BIO_meth_set_destroy(m, bio_destroy)) {
        BIO_meth_free(m);
        return;
    }
    bio_method = m;
}

BIO_METHOD *rl_tls_bio_method(void) {
    pthread_once(&bio_once, bio_setup);
    return bio_method;
}
