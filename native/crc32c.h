/*
 * crc32c.h — CRC-32C (Castagnoli), see crc32c.c.
 *
 * memos_crc32c (declared in memos.h) picks the fastest path at run time.  The
 * two paths are exposed here for the unit test, which checks that they agree.
 * Thread-safe: the tables are built once (pthread_once) and then only read.
 */
#ifndef MEMOS_CRC32C_H
#define MEMOS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

/* Portable slicing-by-8 table path; same contract as memos_crc32c. */
uint32_t crc32c_sw(uint32_t crc, const void *buf, size_t n);
/* 1 if the SSE4.2 crc32 instruction is usable on this CPU (x86-64 only). */
int      crc32c_have_hw(void);
/* Hardware path; call only when crc32c_have_hw() (else it is crc32c_sw). */
uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t n);

#endif /* MEMOS_CRC32C_H */
