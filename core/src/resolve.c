/* resolve.c — numeric addresses at once, host names on a thread (see resolve.h).
 *
 * A lookup is shared by two parties, the thread that runs getaddrinfo and
 * the node that asked, and counts them (refs). The thread is detached: it
 * stores what it found, wakes a waiter, lets go, and is gone; the node polls
 * or waits with a deadline, and lets go when it has the result or no longer
 * wants it. The last to let go frees the lookup, so neither ever waits for
 * the other to finish. */
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "redlock.h"
#include "resolve.h"

struct rl_lookup {
    pthread_mutex_t mu;
    pthread_cond_t finished;  /* signalled once, when done becomes 1 */
    int refs;                 /* 2 while both the thread and the owner hold it */
    int done;
    int gai;                  /* getaddrinfo's status, 0 on success */
    int sys_errno;            /* errno, for EAI_SYSTEM */
    rl_addrs addrs;
    int port;
    char host[];
};

/* Keep the IPv4 addresses of list, then the IPv6 ones, at most RL_MAX_ADDRS. */
static void collect(const struct addrinfo *list, rl_addrs *out) {
    static const int families[2] = {AF_INET, AF_INET6};
    out->n = 0;
    for (int f = 0; f < 2; f++) {
        for (const struct addrinfo *ai = list; ai != NULL && out->n < RL_MAX_ADDRS; ai = ai->ai_next) {
            if (ai->ai_family != families[f] || ai->ai_addrlen > sizeof(out->addr[0].sa)) continue;
            rl_addr *a = &out->addr[out->n++];
            memset(a, 0, sizeof(*a));
            memcpy(&a->sa, ai->ai_addr, ai->ai_addrlen);
            a->len = ai->ai_addrlen;
        }
    }
}

/* getaddrinfo for a TCP connect to host:port. Return its status; on success
 * *out holds the addresses (and the status is EAI_NONAME if none is IPv4 or
 * IPv6). */
static int lookup(const char *host, int port, int flags, rl_addrs *out) {
    char service[8];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | flags;
    struct addrinfo *list = NULL;
    out->n = 0;
    int rc = getaddrinfo(host, service, &hints, &list);
    if (rc != 0) return rc;
    collect(list, out);
    freeaddrinfo(list);
    return out->n > 0 ? 0 : EAI_NONAME;
}

int rl_resolve_numeric(const char *host, int port, rl_addrs *out) {
    return lookup(host, port, AI_NUMERICHOST, out) == 0 ? 0 : -1;
}

/* Drop one reference; free l when it was the last. */
static void unref(rl_lookup *l) {
    pthread_mutex_lock(&l->mu);
    int last = --l->refs == 0;
    pthread_mutex_unlock(&l->mu);
    if (!last) return;
    pthread_cond_destroy(&l->finished);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

static void *lookup_main(void *arg) {
    rl_lookup *l = arg;
    rl_addrs found;
    int gai = lookup(l->host, l->port, 0, &found);
    int sys_errno = errno;
    pthread_mutex_lock(&l->mu);
    l->addrs = found;
    l->gai = gai;
    l->sys_errno = sys_errno;
    l->done = 1;
    pthread_cond_broadcast(&l->finished);
    pthread_mutex_unlock(&l->mu);
    unref(l);
    return NULL;
}

rl_lookup *rl_lookup_start(const char *host, int port, char *err, size_t errlen) {
    size_t hlen = strlen(host);
    rl_lookup *l = calloc(1, sizeof(*l) + hlen + 1);
    if (l == NULL) return snprintf(err, errlen, "out of memory"), NULL;
    memcpy(l->host, host, hlen + 1);
    l->port = port;
    l->refs = 2;
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0) {
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        rc = pthread_cond_init(&l->finished, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (rc != 0) {
        free(l);
        return snprintf(err, errlen, "cannot start a lookup: %s", strerror(rc)), NULL;
    }
    pthread_mutex_init(&l->mu, NULL);

    /* The thread takes no signals (the program's handlers run on its own
     * threads) and nobody joins it. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    rc = pthread_create(&thread, &attr, lookup_main, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_cond_destroy(&l->finished);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return snprintf(err, errlen, "cannot start a lookup thread: %s", strerror(rc)), NULL;
    }
    return l;
}

int rl_lookup_wait(rl_lookup *l, double deadline_ms) {
    pthread_mutex_lock(&l->mu);
    while (!l->done) {
        double left = deadline_ms - rl_now_ms();
        if (left <= 0) break;
        struct timespec at;
        clock_gettime(CLOCK_MONOTONIC, &at);
        long long ns = (long long)at.tv_nsec + (long long)(left * 1e6);
        at.tv_sec += (time_t)(ns / 1000000000);
        at.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&l->finished, &l->mu, &at);
    }
    int done = l->done;
    pthread_mutex_unlock(&l->mu);
    return done;
}

int rl_lookup_result(rl_lookup *l, rl_addrs *out, char *err, size_t errlen) {
    pthread_mutex_lock(&l->mu);
    int done = l->done, gai = l->gai, sys_errno = l->sys_errno;
    if (done && gai == 0) *out = l->addrs;
    pthread_mutex_unlock(&l->mu);
    if (!done) return 0;
    if (gai == 0) return 1;
    snprintf(err, errlen, "%s", gai == EAI_SYSTEM ? strerror(sys_errno) : gai_strerror(gai));
    return -1;
}

void rl_lookup_drop(rl_lookup *l) {
    if (l != NULL) unref(l);
}
