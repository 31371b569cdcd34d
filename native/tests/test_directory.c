/* test_directory.c — unit tests of directory.c (being written). */
#include "directory.h"
#include "tcheck.h"

int main(void)
{
    return 0;
}
