/*
 * test_crc32c.c — unit tests of crc32c.c: known vectors, chaining, and the
 * hardware path against the table path and a bitwise reference on random
 * buffers of many lengths and alignments.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "tcheck.h"

/* One bit at a time, straight from the definition. */
static uint32_t crc_bitwise(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (crc & 1 ? 0x82F63B78u : 0);
    }
    return ~crc;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void fill(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rnd();
}

static void test_vectors(void)
{
    static const unsigned char zeros[32];
    unsigned char ones[32];
    memset(ones, 0xFF, sizeof ones);
    uint32_t (*fn[])(uint32_t, const void *, size_t) = { memos_crc32c, crc32c_sw, crc32c_hw };
    int nfn = crc32c_have_hw() ? 3 : 2;
    for (int i = 0; i < nfn; i++) {
        CHECK_EQ(fn[i](0, "123456789", 9), 0xE3069283u);
        CHECK_EQ(fn[i](0, "", 0), 0);
        CHECK_EQ(fn[i](0, NULL, 0), 0);
        CHECK_EQ(fn[i](0x12345678u, NULL, 0), 0x12345678u);
        CHECK_EQ(fn[i](0, zeros, 32), 0x8A9136AAu);       /* RFC 3720 B.4 */
        CHECK_EQ(fn[i](0, ones, 32), 0x62A8AB43u);
        CHECK_EQ(fn[i](0, "a", 1), 0xC1D04330u);
    }
}

static void test_chaining(void)
{
    CHECK_EQ(memos_crc32c(memos_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
    size_t n = 100000;
    unsigned char *b = malloc(n);
    fill(b, n);
    uint32_t whole = memos_crc32c(0, b, n);
    CHECK_EQ(whole, crc_bitwise(0, b, n));
    size_t cuts[] = { 0, 1, 7, 8, 255, 256, 769, 8192, 24575, 24576, 24577, 50001, 99999, n };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t k = cuts[i];
        CHECK_EQ(memos_crc32c(memos_crc32c(0, b, k), b + k, n - k), whole);
        CHECK_EQ(crc32c_sw(crc32c_sw(0, b, k), b + k, n - k), whole);
        if (crc32c_have_hw())
            CHECK_EQ(crc32c_hw(crc32c_hw(0, b, k), b + k, n - k), whole);
    }
    /* many small pieces */
    uint32_t c = 0;
    for (size_t at = 0; at < n;) {
        size_t k = rnd() % 5000;
        if (k > n - at)
            k = n - at;
        c = memos_crc32c(c, b + at, k);
        at += k;
    }
    CHECK_EQ(c, whole);
    free(b);
}

/* hw == sw == bitwise for lengths around every boundary of the lane logic
 * (8, 768, 24576) and for all eight alignments, with random seeds. */
static void test_paths_agree(void)
{
    size_t max = 3 * 3 * 8192 + 4096;
    unsigned char *b = malloc(max + 16);
    fill(b, max + 16);
    size_t lens[] = { 0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 256, 257,
                      767, 768, 769, 775, 776, 1023, 1536, 2304, 4096, 8191, 8192,
                      24575, 24576, 24577, 24584, 25000, 49152, 49153, 49160,
                      60000, 3 * 3 * 8192, max };
    int hw = crc32c_have_hw();
    if (!hw)
        fprintf(stderr, "test_crc32c: no SSE4.2 here, table path only\n");
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (size_t a = 0; a < 16; a++) {
            uint32_t seed = (a & 1) ? rnd() : 0;
            size_t n = lens[i];
            uint32_t sw = crc32c_sw(seed, b + a, n);
            if (n <= 30000 || a == 3)
                CHECK_EQ(sw, crc_bitwise(seed, b + a, n));
            if (hw)
                CHECK_EQ(crc32c_hw(seed, b + a, n), sw);
            CHECK_EQ(memos_crc32c(seed, b + a, n), sw);
        }
    }
    /* random lengths and offsets */
    for (int k = 0; k < 2000; k++) {
        size_t n = rnd() % (max - 64);
        if (k % 2)
            n %= 2048;
        size_t a = rnd() % 64;
        uint32_t seed = rnd();
        uint32_t sw = crc32c_sw(seed, b + a, n);
        if (hw)
            CHECK_EQ(crc32c_hw(seed, b + a, n), sw);
        if (k % 50 == 0)
            CHECK_EQ(sw, crc_bitwise(seed, b + a, n));
    }
    free(b);
}

/* A flipped bit anywhere changes the sum. */
/* memos_crc32c_zeros agrees with the CRC of that many zero bytes. */
static void test_zeros(void)
{
    static unsigned char zeros[300000];
    const size_t ns[] = { 0, 1, 2, 3, 4, 5, 8, 15, 16, 17, 255, 256, 4096, 65536, 299999 };
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (uint32_t seed = 0; seed < 3; seed++) {
            uint32_t crc = seed * 0x9E3779B9u;
            CHECK_EQ(memos_crc32c_zeros(crc, ns[i]), memos_crc32c(crc, zeros, ns[i]));
        }
}

static void test_detects_flips(void)
{
    size_t n = 30000;
    unsigned char *b = malloc(n);
    fill(b, n);
    uint32_t good = memos_crc32c(0, b, n);
    for (int k = 0; k < 500; k++) {
        size_t at = rnd() % n;
        unsigned char bit = (unsigned char)(1u << (rnd() % 8));
        b[at] ^= bit;
        CHECK(memos_crc32c(0, b, n) != good);
        b[at] ^= bit;
    }
    CHECK_EQ(memos_crc32c(0, b, n), good);
    free(b);
}

int main(void)
{
    RUN(test_vectors);
    RUN(test_chaining);
    RUN(test_paths_agree);
    RUN(test_detects_flips);
    RUN(test_zeros);
    return DONE("test_crc32c");
}
