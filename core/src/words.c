/* words.c — the stable short words for statuses and node states, and the version. */
#include "redlock.h"

/* Return the word for an RL_STATUS_* code; "invalid" for anything else. */
const char *rl_status_word(int status) {
    switch (status) {
    case RL_STATUS_PENDING: return "pending";
    case RL_STATUS_OK: return "ok";
    case RL_STATUS_BUSY: return "busy";
    case RL_STATUS_UNAVAILABLE: return "unavailable";
    case RL_STATUS_TIMEOUT: return "timeout";
    case RL_STATUS_NOT_HELD: return "not held";
    default: return "invalid";
    }
}

/* Return the word for an RL_NODE_* state; "invalid" for anything else. */
const char *rl_node_state_word(int state) {
    switch (state) {
    case RL_NODE_PENDING: return "pending";
    case RL_NODE_OK: return "ok";
    case RL_NODE_TAKEN: return "taken";
    case RL_NODE_ERROR: return "error";
    case RL_NODE_TIMEOUT: return "timeout";
    default: return "invalid";
    }
}

/* Return the library version string: the header's (CMakeLists.txt checks it
 * is the project's). */
const char *rl_version(void) {
    return RL_VERSION;
}
