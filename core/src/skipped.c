/* skipped.c — the values of acquires a suspect node was not sent (skipped.h). */
#include <stdlib.h>
#include <string.h>

#include "skipped.h"

void rl_skipped_note(rl_skipped *k, const char *value) {
    if (k->values == NULL && (k->values = malloc(RL_SKIPPED_MAX * sizeof(*k->values))) == NULL) return;
    memcpy(k->values[k->next], value, RL_VALUE_LEN);
    k->next = (k->next + 1) % RL_SKIPPED_MAX;
    if (k->count < RL_SKIPPED_MAX) k->count++;
}

int rl_skipped_take(rl_skipped *k, const char *value) {
    /* newest first: a release mostly follows its acquire closely */
    for (unsigned n = 0; n < k->count; n++) {
        unsigned i = (k->next + RL_SKIPPED_MAX - 1 - n) % RL_SKIPPED_MAX;
        if (memcmp(k->values[i], value, RL_VALUE_LEN) != 0) continue;
        /* fill the hole with the oldest, which leaves the ring */
        unsigned oldest = (k->next + RL_SKIPPED_MAX - k->count) % RL_SKIPPED_MAX;
        memcpy(k->values[i], k->values[oldest], RL_VALUE_LEN);
        k->count--;
        return 1;
    }
    return 0;
}

void rl_skipped_clear(rl_skipped *k) {
    free(k->values);
    k->values = NULL;
    k->next = k->count = 0;
}
