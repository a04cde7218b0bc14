/* Helpers of the C tests: a failed check prints where and why and exits 1. */
#ifndef RI2N_TEST_COMMON_H
#define RI2N_TEST_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ri2n.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s (errno %d: %s; ri2n: %s)\n",    \
                    __FILE__, __LINE__, #cond, errno, strerror(errno),               \
                    ri2n_last_error());                                              \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* The call failed with exactly this errno, as a negative return and in errno, and said why. */
#define CHECK_FAILS_WITH(ret, expected)                                              \
    do {                                                                             \
        long long r_ = (long long)(ret);                                             \
        int e_ = errno;                                                              \
        if (r_ != -(long long)(expected) || e_ != (expected) ||                      \
            ri2n_last_error()[0] == '\0') {                                          \
            fprintf(stderr, "%s:%d: %s gave %lld, errno %d (%s); expected -%s\n",    \
                    __FILE__, __LINE__, #ret, r_, e_, ri2n_last_error(), #expected); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* The call returned NULL with this errno and said why. */
#define CHECK_NULL_WITH(ptr, expected)                                               \
    do {                                                                             \
        const void *p_ = (ptr);                                                      \
        int e_ = errno;                                                              \
        if (p_ != NULL || e_ != (expected) || ri2n_last_error()[0] == '\0') {        \
            fprintf(stderr, "%s:%d: %s gave %p, errno %d (%s); expected NULL, %s\n", \
                    __FILE__, __LINE__, #ptr, p_, e_, ri2n_last_error(), #expected); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

/* FNV-1a, 64 bits: a checksum of everything that passed. */
static inline uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_START 0xcbf29ce484222325ULL

/* Deterministic pseudo-random bytes (xorshift64*). */
static inline void fill_random(uint64_t *state, unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint64_t x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        p[i] = (unsigned char)((x * 0x2545F4914F6CDD1DULL) >> 56);
    }
}

#endif
