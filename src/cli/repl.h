/* repl.h - the interactive conversation of `pipeshard chat`. */
#ifndef PS_CLI_REPL_H
#define PS_CLI_REPL_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "../coord/session.h"

typedef struct {
    ps_gen_params gp;                           /* each answer's sampling and length */
    const char *system;                         /* the first system message, or NULL */
    const char *template_name;                  /* a chat template family, or NULL: the model's */
    bool stats;                                 /* a JSON line per turn on stderr */
    void (*more_stats)(void *ctx, cJSON *line); /* with stats: adds to each turn's line, or NULL */
    void *more_ctx;
} ps_repl_opts;

/* Reads the user's turns from standard input until its end, /exit or an error, and answers
 * each through s, streaming to standard output. Returns the exit status. */
int ps_repl_run(ps_session *s, const ps_repl_opts *o);

#endif
