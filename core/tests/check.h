/* check.h — the few assertions the C unit tests need. A failed check prints
 * where and why and makes the test exit 1 at the end. */
#ifndef RL_CHECK_H
#define RL_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                \
    do {                                                                           \
        check_count++;                                                             \
        if (!(cond)) {                                                             \
            check_failures++;                                                      \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                          \
    } while (0)

#define CHECK_INT(a, b)                                                                          \
    do {                                                                                         \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                    \
        check_count++;                                                                           \
        if (va_ != vb_) {                                                                        \
            check_failures++;                                                                    \
            fprintf(stderr, "%s:%d: %s == %lld, expected %lld\n", __FILE__, __LINE__, #a, va_, vb_); \
        }                                                                                        \
    } while (0)

#define CHECK_STR(a, b)                                                                         \
    do {                                                                                        \
        const char *sa_ = (a), *sb_ = (b);                                                      \
        check_count++;                                                                          \
        if (strcmp(sa_, sb_) != 0) {                                                            \
            check_failures++;                                                                   \
            fprintf(stderr, "%s:%d: %s == \"%s\", expected \"%s\"\n", __FILE__, __LINE__, #a, sa_, sb_); \
        }                                                                                       \
    } while (0)

static int check_report(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
