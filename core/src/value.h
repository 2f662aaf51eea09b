/* value.h — random lock values. */
#ifndef RL_VALUE_H
#define RL_VALUE_H

/* Write RL_VALUE_LEN hex characters of fresh randomness (20 bytes from
 * getrandom(2)) and a NUL into out. Return 0, or -1 if the kernel gave no
 * randomness (out is then left empty). Thread-safe and fork-safe. */
int rl_value_generate(char *out);

/* A count that changes in every forked child: what was drawn before a fork
 * (an id meant to be unique per process) is drawn again after it. */
unsigned rl_fork_generation(void);

#endif
