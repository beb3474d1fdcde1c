/* args.h - strict parsing of command-line values shared by the subcommands. Each parser
 * prints "pipeshard CMD: ..." on stderr and returns false when the value is malformed or
 * out of range, so that callers can `return 2` (usage error). */
#ifndef PS_CLI_ARGS_H
#define PS_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

#include "../net/net.h" /* PS_LINK_MIN_MBPS */
#include "../ps.h"      /* ps_now */

/* The value after flag argv[*i] (advancing *i), or NULL with a message when it is missing. */
const char *ps_arg_value(const char *cmd, int argc, char **argv, int *i);
bool ps_arg_int(const char *cmd, const char *flag, const char *s, long long min, long long max, long long *out);
bool ps_arg_float(const char *cmd, const char *flag, const char *s, double min, double max, double *out);
/* An emulated link rate in Mbit/s: 0 (no limit) or PS_LINK_MIN_MBPS to 1e6. */
bool ps_arg_mbps(const char *cmd, const char *flag, const char *s, double *out);
/* A switch's value: "on" (*out true) or "off". */
bool ps_arg_on_off(const char *cmd, const char *flag, const char *s, bool *out);
/* A local fleet's transport: "tcp" (loopback; *unix_sockets false) or "unix". */
bool ps_arg_transport(const char *cmd, const char *flag, const char *s, bool *unix_sockets);
/* --device: "cpu", "cuda" or "cuda:N" into *out (model.h's PS_DEVICE_*); a GPU must be there
 * (this build has CUDA, the driver sees device N). */
bool ps_arg_device(const char *cmd, const char *flag, const char *s, int *out);
/* A comma-separated list of devices (each as ps_arg_device takes it; at most cap) into
 * devs[0..*n): one per local stage. */
bool ps_arg_devices(const char *cmd, const char *flag, const char *s, int *devs, int cap, int *n);
/* The word in known (NULL-terminated) nearest to word by Damerau-Levenshtein distance (an
 * '=VALUE' tail of word is ignored), or NULL when none is near enough to be a typo of it. */
const char *ps_arg_suggest(const char *word, const char *const *known);
/* Reports argv word a that no parser of `pipeshard CMD` takes and returns 2 (usage error):
 * "unknown option 'A'; did you mean 'X'? (see pipeshard CMD --help)" for a word that starts
 * with '-', else "unexpected argument 'A': HINT" (HINT NULL: see pipeshard CMD --help). */
/* Prints "pipeshard CMD: <message>" on stderr and returns status (the command's exit status). */
int ps_cli_fail(const char *cmd, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int ps_arg_unknown(const char *cmd, const char *a, const char *const *known, const char *hint);
/* Number of CPU cores this process may use (at least 1). */
int ps_cpu_count(void);

#endif
