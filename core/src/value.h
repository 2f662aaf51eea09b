/* value.h — random lock values. */
#ifndef RL_VALUE_H
#define RL_VALUE_H

/* Write RL_VALUE_LEN hex characters of fresh randomness (20 bytes from
 * getrandom(2)) and a NUL into out. Return 0, or -1 if the kernel gave no
 * randomness (out is then left empty). Thread-safe and fork-safe. */
int rl_value_generate(char *out);

/* rl_value_generate, carrying label (NUL-terminated, checked by
 * rl_label_refusal; "" for none) first: label "/" then random hex, RL_VALUE_LEN
 * characters in all. Return as rl_value_generate. */
int rl_value_generate_labelled(char *out, const char *label);

/* NULL if label may be carried in lock values (rl_options.label: "" or 1 to
 * RL_LABEL_MAX printable ASCII characters, no '/', no space), else why not. */
const char *rl_label_refusal(const char *label);

/* A count that changes in every forked child: what was drawn before a fork
 * (an id meant to be unique per process) is drawn again after it. */
unsigned rl_fork_generation(void);

#endif
