/* names.c — the index of names (see names.h): linear probing over a
 * power-of-two table, places of removed names marked gone until the next
 * growth sweeps them out. */
#include <stdlib.h>
#include <string.h>

#include "names.h"

enum { RL_NAME_EMPTY = -1, RL_NAME_GONE = -2 };

/* FNV-1a over the name's bytes. */
static unsigned hash_of(const char *name, size_t len) {
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)name[i]) * 16777619u;
    return h;
}

static int same(const rl_name_entry *x, const char *name, size_t len, unsigned hash) {
    return x->value >= 0 && x->hash == hash && x->len == len && (len == 0 || memcmp(x->name, name, len) == 0);
}

/* Put an entry into a table with a free place for it (no growth). Entries
 * of one name keep the order they were added in: each goes to the first
 * empty place of its probe. */
static void place(rl_name_entry *table, size_t cap, rl_name_entry x) {
    size_t i = x.hash & (cap - 1);
    while (table[i].value != RL_NAME_EMPTY) i = (i + 1) & (cap - 1);
    table[i] = x;
}

/* Make room for one more name: a table at most three quarters full
 * (gone places counted), rebuilt without them. 0, or -1 when out of memory. */
static int room_for_one(rl_names *m) {
    if ((m->live + m->gone + 1) * 4 <= m->cap * 3) return 0;
    size_t cap = 16;
    while ((m->live + 1) * 2 > cap) cap *= 2;
    rl_name_entry *table = malloc(cap * sizeof(*table));
    if (table == NULL) return -1;
    for (size_t i = 0; i < cap; i++) table[i].value = RL_NAME_EMPTY;
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].value >= 0) place(table, cap, m->e[i]);
    free(m->e);
    m->e = table;
    m->cap = cap;
    m->gone = 0;
    return 0;
}

int rl_names_add(rl_names *m, const char *name, size_t len, int value) {
    if (value < 0 || room_for_one(m) != 0) return -1;
    rl_name_entry x = {name, len, hash_of(name, len), value};
    place(m->e, m->cap, x);
    m->live++;
    return 0;
}

/* The place of name's first entry (under value, if value >= 0), or -1. */
static long locate(const rl_names *m, const char *name, size_t len, int value) {
    if (m->cap == 0) return -1;
    unsigned hash = hash_of(name, len);
    for (size_t i = hash & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const rl_name_entry *x = &m->e[i];
        if (x->value == RL_NAME_EMPTY) return -1;
        if (same(x, name, len, hash) && (value < 0 || x->value == value)) return (long)i;
    }
}

int rl_names_find(const rl_names *m, const char *name, size_t len) {
    long i = locate(m, name, len, -1);
    return i < 0 ? -1 : m->e[i].value;
}

void rl_names_remove(rl_names *m, const char *name, size_t len, int value) {
    long i = locate(m, name, len, value);
    if (i < 0) return;
    m->e[i].value = RL_NAME_GONE;
    m->live--;
    m->gone++;
}

void rl_names_free(rl_names *m) {
    free(m->e);
    memset(m, 0, sizeof(*m));
}
