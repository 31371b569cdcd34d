/* test_prefetch.c — unit tests of prefetch.c (being written). */
#include "prefetch.h"
#include "tcheck.h"

int main(void)
{
    return 0;
}
