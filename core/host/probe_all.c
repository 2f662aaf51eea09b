/*
 * probe_all.c — rl_host_probe on several nodes at once, for `redlock
 * status`: a thread per node, so that nodes that do not answer cost one
 * timeout between them, not one each.
 *
 * rl_host_probe keeps everything it uses in its own frame and in its out
 * (a blocking hiredis context, a TLS context of its own), so the probes
 * share nothing. Their threads block every signal: the host's handlers run
 * on the thread that called, as they did when the probes ran one by one.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "host.h"

/* One node's probe, as the thread that runs it sees it. */
typedef struct probe_job {
    const char *url;
    const char *key;
    size_t keylen;
    int what, timeout_ms;
    const rl_host_tls *tls;
    rl_host_probe_result *out;
    int rc;
    int threaded; /* it runs on a thread of its own (to be joined) */
} probe_job;

static void *run_job(void *arg) {
    probe_job *j = arg;
    j->rc = rl_host_probe(j->url, j->key, j->keylen, j->what, j->timeout_ms, j->tls, j->out);
    return NULL;
}

int rl_host_probe_all(const char *const *urls, int n, const char *key, size_t keylen, int what, int timeout_ms,
                      const rl_host_tls *tls, rl_host_probe_result *out, int *rc) {
    if (urls == NULL || out == NULL || rc == NULL || n <= 0) return -1;
    probe_job *jobs = calloc((size_t)n, sizeof(*jobs));
    pthread_t *threads = calloc((size_t)n, sizeof(*threads));
    if (jobs == NULL || threads == NULL) {
        free(jobs);
        free(threads);
        return -1;
    }
    sigset_t all, before;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &before);
    for (int i = 0; i < n; i++) {
        jobs[i] = (probe_job){urls[i], key, keylen, what, timeout_ms, tls, &out[i], -1, 0};
        jobs[i].threaded = n > 1 && pthread_create(&threads[i], NULL, run_job, &jobs[i]) == 0;
    }
    pthread_sigmask(SIG_SETMASK, &before, NULL);
    for (int i = 0; i < n; i++) {
        if (!jobs[i].threaded) run_job(&jobs[i]); /* one node, or no thread to be had */
    }
    for (int i = 0; i < n; i++) {
        if (jobs[i].threaded) pthread_join(threads[i], NULL);
        rc[i] = jobs[i].rc;
    }
    free(jobs);
    free(threads);
    return 0;
}
