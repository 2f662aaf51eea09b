/* replicas.c — the WAIT behind a round's write (see replicas.h). */
#include <stdio.h>

#include "replicas.h"
#include "round.h"

int rl_replicas_timeout(const rl_options *opts) {
    int base = opts->node_timeout_ms < opts->stall_reset_ms ? opts->node_timeout_ms : opts->stall_reset_ms;
    return base / 2 > 0 ? base / 2 : 1;
}

void rl_replicas_init(rl_replicas *r, const rl_url *urls, int n, const rl_options *opts) {
    r->timeout_ms = rl_replicas_timeout(opts);
    for (int i = 0; i < RL_MAX_NODES; i++) {
        int want = i < n ? (urls[i].replicas >= 0 ? urls[i].replicas : opts->replicas) : 0;
        char count[16], timeout[16];
        int clen = snprintf(count, sizeof(count), "%d", want);
        int tlen = snprintf(timeout, sizeof(timeout), "%d", r->timeout_ms);
        r->want[i] = want;
        r->len[i] = want > 0 ? (size_t)snprintf(r->cmd[i], sizeof(r->cmd[i]), "*3\r\n$4\r\nWAIT\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n",
                                                clen, count, tlen, timeout)
                             : 0;
    }
}

int rl_replicas_waits(const rl_replicas *r, int kind, int node) {
    return kind != RL_OP_RELEASE && node >= 0 && node < RL_MAX_NODES && r->want[node] > 0;
}
