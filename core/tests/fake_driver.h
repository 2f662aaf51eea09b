/* fake_driver.h — the driver the engine's unit tests play: one engine (E),
 * the bytes it wants written taken whole, replies fed by hand at times the
 * test picks. Shared by test_engine.c, test_keep.c and test_substream.c. */
#ifndef RL_FAKE_DRIVER_H
#define RL_FAKE_DRIVER_H

#include <stdio.h>
#include <string.h>

#include "check.h"
#include "command.h"
#include "redlock.h"

static rl_engine *E;
static char out[262144]; /* the last bytes taken from a link */
static size_t outlen;

/* A new engine for urls, or NULL (a failed check) with the reason printed. */
static inline rl_engine *engine(const char *const *urls, int n, const rl_options *o) {
    char err[RL_ERR_LEN] = "";
    rl_engine *e = rl_engine_new(urls, n, o, err, sizeof(err));
    if (e == NULL) fprintf(stderr, "rl_engine_new: %s\n", err);
    CHECK(e != NULL);
    return e;
}

/* Take everything link k wants written, as written in full at t; the bytes,
 * NUL-terminated, in out (outlen of them). */
static inline const char *drain(int k, double t) {
    const char *data = NULL;
    outlen = rl_engine_node_output(E, k, &data);
    CHECK(outlen < sizeof(out));
    if (outlen >= sizeof(out)) outlen = sizeof(out) - 1;
    if (outlen) memcpy(out, data, outlen);
    out[outlen] = '\0';
    if (outlen) rl_engine_node_wrote(E, k, outlen, t);
    return out;
}

/* Feed link k the RESP text resp at t; rl_engine_node_feed's answer. */
static inline int feed(int k, const char *resp, double t) {
    return rl_engine_node_feed(E, k, resp, strlen(resp), t);
}

/* Take operation id, which must have finished. */
static inline rl_result take(int id) {
    rl_result r;
    memset(&r, 0, sizeof(r));
    CHECK_INT(rl_engine_take(E, id, &r), 1);
    return r;
}

/* The scripts a fresh connection's setup loads (SCRIPT LOAD), in order,
 * and their SHA1s. */
static const char *const setup_scripts[] = {rl_release_script, rl_extend_script, rl_acquire_slot_script,
                                            rl_release_slot_script};
static const char *const setup_shas[] = {rl_release_sha, rl_extend_sha, rl_acquire_slot_sha, rl_release_slot_sha};
#define SETUP_SCRIPTS 4

/* A node's replies to the setup's script loads. */
static inline const char *loads_reply(void) {
    static char buf[256];
    buf[0] = '\0';
    for (int k = 0; k < SETUP_SCRIPTS; k++)
        snprintf(buf + strlen(buf), sizeof(buf) - strlen(buf), "$40\r\n%s\r\n", setup_shas[k]);
    return buf;
}

/* Node i (asked for, or opened now) connects fresh at t and answers its
 * setup: INFO naming a server of its own, and the script loads. */
static inline void connect_node(int i, double t) {
    char info[256], body[160];
    rl_engine_node_open(E, i, t);
    CHECK_INT(rl_engine_node_wants(E, i) & RL_WANT_CONNECT, RL_WANT_CONNECT);
    CHECK_INT(rl_engine_node_connected(E, i, 1, t), RL_OK);
    drain(i, t);
    int len = snprintf(body, sizeof(body), "# Server\r\nrun_id:%040x\r\n", 0xa0 + i);
    snprintf(info, sizeof(info), "$%d\r\n%s\r\n", len, body);
    CHECK_INT(feed(i, info, t), RL_OK);
    CHECK_INT(feed(i, loads_reply(), t), RL_OK);
}

#endif
