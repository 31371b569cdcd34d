/*
 * tcheck.h — a minimal test harness for the C unit tests.
 *
 *   CHECK(cond)        records a failure of the running test, goes on
 *   RUN(fn)            runs one test function, counts it passed or failed
 *   return DONE("x")   prints "x: N passed, M failed", returns the exit code
 */
#ifndef MEMOS_TCHECK_H
#define MEMOS_TCHECK_H

#include <stdio.h>

static int t_cur_failed, t_passed, t_failed;

#define CHECK(cond) do {                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, \
                    #cond);                                                 \
            t_cur_failed = 1;                                               \
        }                                                                   \
    } while (0)

#define CHECK_EQ(a, b) do {                                                 \
        long long _a = (long long)(a), _b = (long long)(b);                 \
        if (_a != _b) {                                                     \
            fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", \
                    __FILE__, __LINE__, #a, #b, _a, _b);                    \
            t_cur_failed = 1;                                               \
        }                                                                   \
    } while (0)

#define RUN(fn) do {                                                        \
        t_cur_failed = 0;                                                   \
        fn();                                                               \
        if (t_cur_failed) {                                                 \
            t_failed++;                                                     \
            fprintf(stderr, "FAIL %s\n", #fn);                              \
        } else {                                                            \
            t_passed++;                                                     \
        }                                                                   \
    } while (0)

#define DONE(name) (printf("%s: %d passed, %d failed\n", name, t_passed, t_failed), \
                    t_failed != 0)

#endif /* MEMOS_TCHECK_H */
