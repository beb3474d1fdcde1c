/* keygen.c - `pipeshard keygen`: write a fresh shared key for --key-file. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../net/net.h"
#include "args.h"
#include "cli.h"

static void keygen_usage(FILE *f) {
    fprintf(f, "usage: pipeshard keygen -o FILE [--force]\n"
               "  -o, --output FILE   where to write the key: 32 random bytes, mode 0600 (readable by you only)\n"
               "  --force             replace FILE if it exists\n"
               "Give the same file to every worker and to the coordinator with --key-file FILE.\n");
}

int ps_cli_keygen(int argc, char **argv) {
    const char *out = NULL;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return keygen_usage(stdout), 0;
        if (!strcmp(a, "--force")) {
            force = true;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (!(out = ps_arg_value("keygen", argc, argv, &i))) return 2;
        } else {
            static const char *const known[] = {"--help", "--force", "-o", "--output", NULL};
            return ps_arg_unknown("keygen", a, known, "give the key file with -o FILE");
        }
    }
    if (!out || !*out) {
        fprintf(stderr, "pipeshard keygen: no key file given (-o FILE)\n");
        return 2;
    }
    char err[1024];
    if (ps_net_key_write(out, force, err, sizeof err)) {
        fprintf(stderr, "pipeshard keygen: %s\n", err);
        return 1;
    }
    printf("pipeshard keygen: wrote a fresh 32-byte key to %s (mode 0600); give it to every worker and to the "
           "coordinator with --key-file %s\n",
           out, out);
    return 0;
}
