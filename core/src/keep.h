/* keep.h — the keep-alive schedule inside the engine (keep.c): which kept
 * lock is extended when, when one turns lost, when a failed extension is
 * tried again, and the releases of dropped locks. No I/O and no clock: the
 * engine hands it the time, begins its rounds and gives it their results.
 * The public face is redlock.h's rl_engine_keep_* functions. */
#ifndef RL_KEEP_H
#define RL_KEEP_H

#include "deadlines.h"
#include "redlock.h"

/* Which kept lock a round of the schedule is for: the entry, and the
 * entry's round count when it began (a result of an older round, or of an
 * entry since freed, is ignored). Carried by the engine's operation. */
typedef struct rl_keep_ref {
    int entry;
    unsigned seq;
} rl_keep_ref;

/* An id: the entry's generation (the low 31 - KEEP_INDEX_BITS bits of
 * gen) above its index; at most KEEP_MAX_ENTRIES locks kept at once. */
#define KEEP_INDEX_BITS 21
#define KEEP_MAX_ENTRIES (1 << KEEP_INDEX_BITS)

#define KEEP_DROPPING 100 /* beside the public RL_KEEP_*: the owner let go of it; released, then freed */

/* One kept lock (keep.c's entry). Its id is its index with the entry's
 * generation above it (KEEP_INDEX_BITS), so that the id of a lock removed
 * or dropped names nothing when the entry is used again. */
typedef struct rl_kept {
    int state;              /* 0: free; RL_KEEP_HELD, RL_KEEP_LOST, RL_KEEP_RELEASED or KEEP_DROPPING */
    char *resource;
    size_t len;
    int slot;               /* a semaphore's slot held (its key is the slot's), or 0 */
    char value[RL_VALUE_LEN + 1];
    int ttl_ms;             /* what the next extension asks for */
    int margin_ms;
    double valid_until;     /* end of validity, on the driver's clock */
    double next_due;        /* when to extend next */
    double extend_start;    /* when the extension in flight (or the last one) began */
    int extend_ttl;         /* the ttl that extension asked for */
    int unsettled_ttl;      /* > 0: an extension of ours with this ttl (the shortest of them) was
                               decided before every node answered it, and may still reach a node
                               after an extension of the owner's on another connection */
    unsigned unsettled_seq; /* the latest such extension (its seq) */
    unsigned seq;           /* rounds begun for the entry over all its uses: names the one in flight */
    unsigned gen;           /* uses of the entry that ended: part of its id */
    unsigned char busy;     /* a round of it (number seq) is in flight */
    unsigned char release;  /* its release is wanted: queued or in flight */
    unsigned char queued;   /* in the FIFO of releases to begin */
    unsigned char counted;  /* rl_engine_keep_release_all's tally counts it */
    unsigned char lapsed;   /* not extended any more (rl_engine_keep_lapse) */
    double due;             /* queued: since when */
    int prev, next;         /* the FIFO's links; next: the free list's too */
} rl_kept;

typedef struct rl_keep {
    rl_kept *entries;         /* by index (an id's low KEEP_INDEX_BITS) */
    int n, cap;               /* entries used (free ones included), allocated */
    int free_head;            /* a free entry below n, or -1 */
    rl_deadlines deadlines;   /* every HELD entry still extended: its next look */
    int pending_head, pending_tail; /* releases not begun yet, oldest first (-1: none) */
    int npending;
    int releases;             /* releases in flight */
    double retry_at;          /* no release begins before (the engine was full) */
    int releasing, released;  /* rl_engine_keep_release_all's tally */
    double next_sweep;        /* extensions due are begun at most once a tick */
    unsigned long long lost_total; /* entries that turned lost (rl_stats.locks_lost) */
} rl_keep;

void rl_keep_init(rl_keep *k);
void rl_keep_free(rl_keep *k);

/* The earliest moment rl_keep_advance has something to do; -1 if never. */
double rl_keep_deadline(const rl_keep *k);

/* Begin what is due by now: extensions, and releases of dropped locks, as
 * rounds of e (rl_engine_begin_kept). */
void rl_keep_advance(rl_engine *e, rl_keep *k, double now);

/* The result of a round the schedule began (decided at now). */
void rl_keep_result(rl_keep *k, rl_keep_ref ref, const rl_result *r, double now);

/* An extension the schedule began has had its tail answered: every node
 * that had not answered by the decision (r: the result then) has replied
 * since, unless r now says a node's connection was lost (RL_NODE_ERROR). */
void rl_keep_settled(rl_keep *k, rl_keep_ref ref, const rl_result *r);

#endif
