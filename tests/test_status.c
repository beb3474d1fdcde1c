/* test_status.c - every status code has its own message. */
#include <string.h>

#include "ps.h"
#include "ps_test.h"

int main(void) {
    for (int s = 0; s < PS_STATUS_COUNT; s++) {
        PS_CHECK(strcmp(ps_strerror((ps_status)s), "unknown status") != 0);
        for (int t = 0; t < s; t++) PS_CHECK(strcmp(ps_strerror((ps_status)s), ps_strerror((ps_status)t)) != 0);
    }
    PS_CHECK(strcmp(ps_strerror(PS_STATUS_COUNT), "unknown status") == 0);
    char err[32];
    PS_CHECK_EQ_INT(ps_errf(err, sizeof err, PS_ERR_FORMAT, "bad %d", 7), PS_ERR_FORMAT);
    PS_CHECK(strcmp(err, "bad 7") == 0);
    PS_CHECK_EQ_INT(ps_errf(NULL, 0, PS_ERR_IO, "x"), PS_ERR_IO);
    return ps_test_done();
}
