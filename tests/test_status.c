/* test_status.c - ps.c: every status code has its own message; sizes parse and print. */
#include <string.h>

#include "ps.h"
#include "ps_test.h"

/* ps_size_parse: accepted spellings and their values, refusals and their messages. */
static void test_sizes(void) {
    const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"1", 1},
        {"123456789", 123456789},
        {"500M", 500ull << 20},
        {"20G", 20ull << 30},
        {"20g", 20ull << 30},
        {"20GB", 20ull << 30},
        {"20GiB", 20ull << 30},
        {"64k", 64ull << 10},
        {"2T", 2ull << 40},
        {"1.5G", 3ull << 29},
        {"0.5K", 512},
        {"100B", 100},
        {"18446744073709551615", UINT64_MAX},
        {"16777215T", 16777215ull << 40},
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(ok); i++) {
        uint64_t v = 0;
        char err[128] = "";
        PS_CHECK_EQ_INT(ps_size_parse(ok[i].s, &v, err, sizeof err), PS_OK);
        PS_CHECK(v == ok[i].v);
        if (v != ok[i].v) fprintf(stderr, "  %s parsed as %llu\n", ok[i].s, (unsigned long long)v);
    }
    const struct {
        const char *s, *msg;
    } bad[] = {
        {"", "expected a size such as 500M, 20G or a number of bytes, got ''"},
        {"G", "expected a size such as 500M, 20G or a number of bytes, got 'G'"},
        {"5Q", "expected a size such as 500M, 20G or a number of bytes, got '5Q'"},
        {"-5M", "expected a size such as 500M, 20G or a number of bytes, got '-5M'"},
        {"5 M", "expected a size such as 500M, 20G or a number of bytes, got '5 M'"},
        {"5MM", "expected a size such as 500M, 20G or a number of bytes, got '5MM'"},
        {"5Mi", "expected a size such as 500M, 20G or a number of bytes, got '5Mi'"},
        {"1e9", "expected a size such as 500M, 20G or a number of bytes, got '1e9'"},
        {"0", "size '0' is less than one byte"},
        {"0.1", "size '0.1' is less than one byte"},
        {"18446744073709551616", "size '18446744073709551616' is too large (at most 2^64 - 1 bytes)"},
        {"16777216T", "size '16777216T' is too large (at most 2^64 - 1 bytes)"},
        {"99999999999999999999999", "size '99999999999999999999999' is too large (at most 2^64 - 1 bytes)"},
    };
    for (size_t i = 0; i < PS_ARRAY_LEN(bad); i++) {
        uint64_t v = 42;
        char err[128] = "";
        PS_CHECK_EQ_INT(ps_size_parse(bad[i].s, &v, err, sizeof err), PS_ERR_ARG);
        PS_CHECK(v == 42);
        PS_CHECK(strcmp(err, bad[i].msg) == 0);
        if (strcmp(err, bad[i].msg)) fprintf(stderr, "  '%s': got '%s'\n", bad[i].s, err);
    }
    const struct {
        uint64_t v;
        const char *s;
    } fmt[] = {{0, "0 B"},
               {1023, "1023 B"},
               {1024, "1.0 KiB"},
               {440512, "430.2 KiB"},
               {500ull << 20, "500.0 MiB"},
               {20ull << 30, "20.0 GiB"},
               {UINT64_MAX, "16.0 EiB"}};
    for (size_t i = 0; i < PS_ARRAY_LEN(fmt); i++) {
        char out[32];
        ps_size_format(fmt[i].v, out, sizeof out);
        PS_CHECK(strcmp(out, fmt[i].s) == 0);
        if (strcmp(out, fmt[i].s)) fprintf(stderr, "  %llu printed as '%s'\n", (unsigned long long)fmt[i].v, out);
    }
}

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
    test_sizes();
    return ps_test_done();
}
