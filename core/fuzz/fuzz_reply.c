/* fuzz_reply.c — the reply reader fed arbitrary bytes in arbitrary pieces.
 *
 * Input: one byte k, then k (mod 16) split points of two bytes each, then
 * the stream. The stream goes once to a reader in one feed and once to
 * another in the pieces the split points cut, each feed followed by
 * rl_reader_next until it wants more or refuses the stream (as the engine
 * does). Both must see the same replies (type, integer, length, text,
 * run_id) in the same order, and refuse the stream, or not, alike. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "reply.h"

#define MAX_REPLIES 4096

typedef struct seen {
    rl_reply r[MAX_REPLIES];
    int n;        /* replies taken (those past MAX_REPLIES only counted) */
    int refused;  /* the reader refused the stream */
} seen;

static seen whole, pieces;

/* Take every reply the reader has; stop at the first refusal. */
static void take_all(rl_reader *rd, seen *s) {
    const rl_reply *r;
    int rc;
    while (!s->refused && (rc = rl_reader_next(rd, &r)) != 0) {
        if (rc < 0) {
            s->refused = 1;
            if (rl_reader_error(rd)[0] == '\0') __builtin_trap();
            break;
        }
        if (s->n < MAX_REPLIES) s->r[s->n] = *r;
        s->n++;
    }
}

static void feed(rl_reader *rd, seen *s, const uint8_t *p, size_t len) {
    if (s->refused) return; /* the engine feeds nothing more after a refusal */
    if (rl_reader_feed(rd, (const char *)p, len) != 0) abort(); /* out of memory */
    take_all(rd, s);
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static int same_reply(const rl_reply *a, const rl_reply *b) {
    return a->type == b->type && a->integer == b->integer && a->len == b->len && strcmp(a->str, b->str) == 0 &&
           strcmp(a->run_id, b->run_id) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    size_t k = data[0] % 16;
    if (size < 1 + 2 * k) return 0;
    const uint8_t *stream = data + 1 + 2 * k;
    size_t len = size - 1 - 2 * k;
    size_t cut[17];
    for (size_t i = 0; i < k; i++) {
        size_t v = (size_t)data[1 + 2 * i] << 8 | data[2 + 2 * i];
        cut[i] = (size_t)((v * (unsigned long long)(len + 1)) >> 16); /* anywhere in streams of any length */
    }
    cut[k] = len;
    qsort(cut, k, sizeof(cut[0]), cmp_size);

    rl_reader a = {0}, b = {0};
    if (rl_reader_reset(&a) != 0 || rl_reader_reset(&b) != 0) abort();
    memset(&whole, 0, sizeof(whole));
    memset(&pieces, 0, sizeof(pieces));

    feed(&a, &whole, stream, len);
    size_t at = 0;
    for (size_t i = 0; i <= k; i++) {
        feed(&b, &pieces, stream + at, cut[i] - at); /* empty pieces too */
        at = cut[i];
    }

    if (whole.n != pieces.n || whole.refused != pieces.refused) __builtin_trap();
    int n = whole.n < MAX_REPLIES ? whole.n : MAX_REPLIES;
    for (int i = 0; i < n; i++) {
        const rl_reply *r = &whole.r[i];
        if (!same_reply(r, &pieces.r[i])) __builtin_trap();
        if (r->type < RL_REPLY_STRING) __builtin_trap(); /* RESP3 types (a newer hiredis) keep their own numbers */
        if (strlen(r->str) >= sizeof(r->str) || strlen(r->run_id) > RL_RUN_ID_LEN) __builtin_trap();
        if (r->run_id[0] && strlen(r->run_id) != RL_RUN_ID_LEN) __builtin_trap();
    }
    rl_reader_free(&a);
    rl_reader_free(&b);
    return 0;
}
