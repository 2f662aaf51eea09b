/* value.c — randomness: lock values (20 bytes from getrandom(2), hex-encoded)
 * and the jitter generator behind rl_random.
 *
 * getrandom is called for a batch of values at a time (one syscall per
 * RL_VALUE_BATCH acquisitions). The batch is per thread, and a forked child
 * throws its inherited batch away, so two processes never share a value. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "redlock.h"
#include "value.h"

#define RL_VALUE_BYTES (RL_VALUE_LEN / 2)
#define RL_VALUE_BATCH 32

static _Thread_local unsigned char pool[RL_VALUE_BYTES * RL_VALUE_BATCH];
static _Thread_local size_t pool_used = sizeof(pool);
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static unsigned fork_generation; /* bumped in every forked child */

static void discard_pool_in_child(void) {
    pool_used = sizeof(pool);
    fork_generation++;
}

static void register_atfork(void) {
    pthread_atfork(NULL, NULL, discard_pool_in_child);
}

static int refill_pool(void) {
    size_t got = 0;
    while (got < sizeof(pool)) {
        ssize_t n = getrandom(pool + got, sizeof(pool) - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    pool_used = 0;
    return 0;
}

int rl_value_generate(char *out) {
    static const char hex[] = "0123456789abcdef";
    pthread_once(&atfork_once, register_atfork);
    if (pool_used + RL_VALUE_BYTES > sizeof(pool) && refill_pool() != 0) {
        out[0] = '\0';
        return -1;
    }
    const unsigned char *bytes = pool + pool_used;
    for (int i = 0; i < RL_VALUE_BYTES; i++) {
        out[2 * i] = hex[bytes[i] >> 4];
        out[2 * i + 1] = hex[bytes[i] & 15];
    }
    out[RL_VALUE_LEN] = '\0';
    memset(pool + pool_used, 0, RL_VALUE_BYTES);
    pool_used += RL_VALUE_BYTES;
    return 0;
}

const char *rl_label_refusal(const char *label) {
    size_t len = strnlen(label, RL_LABEL_MAX + 1);
    if (len > RL_LABEL_MAX) return "is longer than 15 characters (RL_LABEL_MAX)";
    for (size_t i = 0; i < len; i++)
        if (label[i] <= ' ' || label[i] > '~' || label[i] == '/')
            return "may hold printable ASCII characters only, no '/' and no space";
    return NULL;
}

int rl_value_generate_labelled(char *out, const char *label) {
    size_t len = strlen(label);
    if (len == 0) return rl_value_generate(out);
    char random[RL_VALUE_LEN + 1];
    if (rl_value_generate(random) != 0) {
        out[0] = '\0';
        return -1;
    }
    memcpy(out, label, len);
    out[len] = '/';
    memcpy(out + len + 1, random, RL_VALUE_LEN - len - 1);
    out[RL_VALUE_LEN] = '\0';
    return 0;
}

/* Without getrandom (an old kernel, a seccomp filter): a seed that still
 * differs between processes and threads started together — the clock in
 * nanoseconds, the pid and this thread's stack address, mixed (splitmix64's
 * finaliser). Jitter only: lock values never fall back to this. */
static unsigned long long fallback_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long x = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    x ^= (unsigned long long)getpid() << 32;
    x ^= (unsigned long long)(size_t)&ts;
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x ? x : 0x9E3779B97F4A7C15ull;
}

/* xorshift64* state per thread, seeded from getrandom on first use and again
 * in a forked child, so no two processes share a jitter sequence. */
static _Thread_local unsigned long long jitter_state;
static _Thread_local unsigned jitter_generation;

unsigned rl_fork_generation(void) {
    pthread_once(&atfork_once, register_atfork);
    return fork_generation;
}

double rl_random(void) {
    pthread_once(&atfork_once, register_atfork);
    if (jitter_state == 0 || jitter_generation != fork_generation) {
        unsigned long long seed = 0;
        while (getrandom(&seed, sizeof(seed), 0) < 0 && errno == EINTR) continue;
        if (seed == 0) seed = fallback_seed();
        jitter_state = seed;
        jitter_generation = fork_generation;
    }
    jitter_state ^= jitter_state >> 12;
    jitter_state ^= jitter_state << 25;
    jitter_state ^= jitter_state >> 27;
    return (double)((jitter_state * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
