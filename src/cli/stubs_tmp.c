/* Temporary: subcommands not written yet. */
#include <stdio.h>
#include "cli.h"
static int todo(const char *n) { fprintf(stderr, "pipeshard %s: not implemented yet\n", n); return 1; }
int ps_cli_run(int argc, char **argv) { (void)argc; (void)argv; return todo("run"); }
int ps_cli_bench(int argc, char **argv) { (void)argc; (void)argv; return todo("bench"); }
