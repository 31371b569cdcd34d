/*
 * crc32c.c — CRC-32C (Castagnoli) checksums of slot bytes.
 *
 * The checksum.  CRC-32C is the CRC of iSCSI, ext4 and Btrfs: polynomial
 * 0x1EDC6F41, bit-reflected (0x82F63B78 in the LSB-first form used here),
 * register preset to all ones and final value inverted.  The public
 * function takes and returns the *finished* value, so calls chain:
 *
 *     memos_crc32c(memos_crc32c(0, a, na), b, nb) == memos_crc32c(0, a+b, na+nb)
 *     memos_crc32c(0, "123456789", 9) == 0xE3069283
 *
 * Each path inverts on entry and on exit and works on the raw register in
 * between (reflected shift register: crc = (crc >> 1) ^ (crc & 1 ? POLY : 0)
 * per input bit, input bits xored in at the low end).
 *
 * Two paths, chosen once at run time:
 *
 *   hw   x86-64 with SSE4.2: the crc32 instruction computes exactly this
 *        CRC, 8 bytes per instruction.  Its latency is 3 cycles but one can
 *        start every cycle, so a long buffer is cut into blocks of three
 *        equal lanes, each lane run as an independent CRC (lanes 2 and 3
 *        start from 0), and the lanes are then joined:
 *
 *            | lane 0 (L bytes) | lane 1 (L bytes) | lane 2 (L bytes) |
 *              crc0 (from crc)    crc1 (from 0)      crc2 (from 0)
 *
 *            crc = shift_L(crc0) ^ crc1;  crc = shift_L(crc) ^ crc2
 *
 *        shift_L(c) is the register after feeding L zero bytes into c.  The
 *        CRC is linear over GF(2), so CRC(c, A|B) = shift_|B|(CRC(c, A)) ^
 *        CRC(0, B).  shift_L is itself linear in c: four tables of 256 words
 *        (one per byte of c) give it in four lookups.  Lanes of 8 KiB are
 *        used while 24 KiB remain, then lanes of 256 bytes, then single
 *        words, then single bytes.  The function carries
 *        __attribute__((target("sse4.2"))) so the rest of the build needs no
 *        -msse4.2; it is only called when __builtin_cpu_supports("sse4.2").
 *
 *   sw   everywhere else: slicing-by-8.  T[0] is the usual byte table; T[k]
 *        advances a byte k more zero bytes, so one step folds 8 input bytes
 *        with 8 lookups.  Bytes are read one at a time (no alignment or byte
 *        order assumption; compilers fuse them into a load).
 *
 * Tables (16 KiB in all) are built on first use under pthread_once and read
 * only afterwards.  Locking: none needed.
 */
#include <pthread.h>
#include <string.h>

#include "crc32c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC_HAVE_X86 1
#include <nmmintrin.h>
#else
#define CRC_HAVE_X86 0
#endif

/* ---- types and constants ---- */

#define POLY        0x82F63B78u     /* CRC-32C, reflected */
#define LANE_LONG   8192            /* bytes per lane, long blocks */
#define LANE_SHORT  256             /* bytes per lane, short blocks */

static uint32_t sw_table[8][256];        /* slicing-by-8 */
static uint32_t shift_long[4][256];      /* register + LANE_LONG zero bytes */
static uint32_t shift_short[4][256];     /* register + LANE_SHORT zero bytes */
static int      have_hw;                 /* the crc32 instruction is usable */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* ---- tables ---- */

/* The register after n zero bytes (byte table must be ready). */
static uint32_t zeros(uint32_t crc, size_t n)
{
    while (n--)
        crc = sw_table[0][crc & 0xFF] ^ (crc >> 8);
    return crc;
}

/* shift[j][v] = the register (v << 8j) after n zero bytes: by linearity, the
 * xor of the images of the bits of v << 8j. */
static void build_shift(uint32_t shift[4][256], size_t n)
{
    uint32_t col[32];
    for (int b = 0; b < 32; b++)
        col[b] = zeros(1u << b, n);
    for (int j = 0; j < 4; j++) {
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b))
                    r ^= col[8 * j + b];
            shift[j][v] = r;
        }
    }
}

static void build_tables(void)
{
    for (uint32_t v = 0; v < 256; v++) {
        uint32_t c = v;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (c & 1 ? POLY : 0);
        sw_table[0][v] = c;
    }
    for (uint32_t v = 0; v < 256; v++)
        for (int k = 1; k < 8; k++)
            sw_table[k][v] = (sw_table[k - 1][v] >> 8) ^ sw_table[0][sw_table[k - 1][v] & 0xFF];
    build_shift(shift_long, LANE_LONG);
    build_shift(shift_short, LANE_SHORT);
#if CRC_HAVE_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") != 0;
#endif
}

static inline void tables_ready(void)
{
    pthread_once(&tables_once, build_tables);
}

/* ---- sw: slicing-by-8 ---- */

uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
    tables_ready();
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (n >= 8) {
        c ^= (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
             (uint32_t)p[3] << 24;
        c = sw_table[7][c & 0xFF] ^ sw_table[6][(c >> 8) & 0xFF] ^
            sw_table[5][(c >> 16) & 0xFF] ^ sw_table[4][c >> 24] ^
            sw_table[3][p[4]] ^ sw_table[2][p[5]] ^
            sw_table[1][p[6]] ^ sw_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = sw_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return ~c;
}

/* ---- hw: SSE4.2, three lanes ---- */

#if CRC_HAVE_X86

static inline uint32_t shift(const uint32_t t[4][256], uint32_t c)
{
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
}

static inline uint64_t load64(const unsigned char *p)
{
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

/* lanes of `lane` bytes at p, p+lane, p+2*lane while 3*lane remain. */
#define THREE_LANES(lane, table)                                             \
    while (n >= 3 * (size_t)(lane)) {                                        \
        uint64_t c1 = 0, c2 = 0;                                             \
        const unsigned char *end = p + (lane);                               \
        do {                                                                 \
            c0 = _mm_crc32_u64(c0, load64(p));                               \
            c1 = _mm_crc32_u64(c1, load64(p + (lane)));                      \
            c2 = _mm_crc32_u64(c2, load64(p + 2 * (lane)));                  \
            p += 8;                                                          \
        } while (p < end);                                                   \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c1;                      \
        c0 = shift(table, (uint32_t)c0) ^ (uint32_t)c2;                      \
        p += 2 * (size_t)(lane);                                             \
        n -= 3 * (size_t)(lane);                                             \
    }

__attribute__((target("sse4.2")))
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n)
{
    tables_ready();
    const unsigned char *p = buf;
    uint64_t c0 = (uint32_t)~crc;
    /* Align to 8 so the word loads do not straddle cache lines. */
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    THREE_LANES(LANE_LONG, shift_long)
    THREE_LANES(LANE_SHORT, shift_short)
    while (n >= 8) {
        c0 = _mm_crc32_u64(c0, load64(p));
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return ~(uint32_t)c0;
}

int crc32c_have_hw(void)
{
    tables_ready();
    return have_hw;
}

#else /* !CRC_HAVE_X86 */

uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n)
{
    return crc32c_sw(crc, buf, n);
}

int crc32c_have_hw(void)
{
    return 0;
}

#endif

/* ---- API ---- */

uint32_t memos_crc32c(uint32_t crc, const void *buf, size_t n)
{
    tables_ready();
    return have_hw ? crc32c_hw(crc, buf, n) : crc32c_sw(crc, buf, n);
}

/* ---- zeros ---- */

/* The CRC register is linear over GF(2) in zero input: one zero bit maps
 * reg to (reg >> 1) ^ (reg & 1 ? POLY : 0).  A matrix of 32 columns (the
 * images of the basis vectors) applies it; squaring doubles the bits, so n
 * zero bytes cost O(log n) squarings (the technique of zlib's
 * crc32_combine). */
static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (int i = 0; vec; i++, vec >>= 1)
        if (vec & 1)
            sum ^= mat[i];
    return sum;
}

static void gf2_square(uint32_t *sq, const uint32_t *mat)
{
    for (int i = 0; i < 32; i++)
        sq[i] = gf2_times(mat, mat[i]);
}

uint32_t memos_crc32c_zeros(uint32_t crc, uint64_t n)
{
    if (n == 0)
        return crc;
    uint32_t odd[32], even[32];
    odd[0] = 0x82F63B78u;                   /* one zero bit */
    for (int i = 1; i < 32; i++)
        odd[i] = 1u << (i - 1);
    gf2_square(even, odd);                  /* two */
    gf2_square(odd, even);                  /* four */
    uint32_t reg = ~crc;
    for (;;) {
        gf2_square(even, odd);              /* 8, 32, 128, ... bits */
        if (n & 1)
            reg = gf2_times(even, reg);
        n >>= 1;
        if (!n)
            break;
        gf2_square(odd, even);              /* 16, 64, ... bits */
        if (n & 1)
            reg = gf2_times(odd, reg);
        n >>= 1;
        if (!n)
            break;
    }
    return ~reg;
}
