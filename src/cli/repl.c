/* repl.c - the conversation of `pipeshard chat`: read a line (libedit on a terminal, with
 * line editing and history; plain lines otherwise), answer it through the session, keep the
 * conversation. Each turn renders the whole conversation through the chat template; the
 * session keeps the keys and values of the prefix the stages already hold, so only the new
 * turn is prefilled. */
#include "repl.h"

#include <editline/readline.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tensor/matmul.h"

#define MAX_TURNS 4096 /* messages in one conversation */

/* The session answering now, for the SIGINT handler (NULL between answers). */
static ps_session *volatile answering;
static volatile sig_atomic_t interrupted;

/* Ctrl-C: stops the answer (the session ends it at the next step), never the program. */
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
    ps_session *s = answering;
    if (s) ps_session_cancel(s);
}

typedef struct {
    ps_chat_msg msgs[MAX_TURNS];
    char *owned[MAX_TURNS]; /* the texts of msgs, malloc'd */
    size_t n;
    bool tty;
} conversation;

/* Drops every message but the system message (and frees their texts). */
static void forget(conversation *cv, bool keep_system) {
    size_t keep = keep_system && cv->n && !strcmp(cv->msgs[0].role, "system") ? 1 : 0;
    for (size_t i = keep; i < cv->n; i++) free(cv->owned[i]);
    cv->n = keep;
}

/* Appends a message; false when the conversation is full or memory is out. */
static bool add(conversation *cv, const char *role, const char *text, size_t len) {
    char *t = cv->n < MAX_TURNS ? strndup(text, len) : NULL;
    if (!t) return false;
    cv->owned[cv->n] = t;
    cv->msgs[cv->n++] = (ps_chat_msg){role, t};
    return true;
}

/* One line from the user (malloc'd, without its newline), or NULL at the end of input. */
static char *read_line(const conversation *cv) {
    if (cv->tty) {
        char *line = readline("> ");
        if (line && *line) add_history(line);
        return line;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    if (n && line[n - 1] == '\n') line[n - 1] = 0;
    return line;
}

/* Answers the conversation's last user message, printing as it goes; appends the answer.
 * The --stats line gives the turn's prompt tokens, how many the stages kept, and its speed. */
static ps_status answer(conversation *cv, ps_session *s, const ps_repl_opts *o, char *err, size_t errlen) {
    ps_status st = ps_session_prompt_chat(s, cv->msgs, cv->n, o->template_name, &o->gp, err, errlen);
    if (st) return st;
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    if (!text) return ps_errf(err, errlen, PS_ERR_NOMEM, "out of memory");
    ps_session_step step = {0};
    answering = s;
    while (!step.stop && !(st = ps_session_next(s, &step, err, errlen))) {
        if (step.stop == PS_STOP_EOS || !step.len) continue;
        fwrite(step.text, 1, step.len, stdout);
        fflush(stdout);
        if (len + step.len >= cap) {
            char *t = realloc(text, cap = 2 * (len + step.len));
            if (!t) break;
            text = t;
        }
        memcpy(text + len, step.text, step.len), len += step.len;
    }
    answering = NULL;
    printf("%s\n", step.stop == PS_STOP_CANCELLED ? " [stopped]" : "");
    fflush(stdout);
    if (!st && !add(cv, "assistant", text, len)) st = ps_errf(err, errlen, PS_ERR_NOMEM, "the conversation is full");
    free(text);
    if (!st && o->stats) {
        ps_session_stats ss;
        ps_session_get_stats(s, &ss);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "prompt_tokens", ss.n_prompt);
        cJSON_AddNumberToObject(j, "reused_tokens", ss.n_reused);
        cJSON_AddNumberToObject(j, "generated_tokens", ss.n_generated);
        cJSON_AddNumberToObject(j, "ttft_ms", ss.ttft_s * 1e3);
        cJSON_AddNumberToObject(j, "decode_tok_s", ss.decode_s > 0 ? ss.n_decode / ss.decode_s : 0);
        cJSON_AddStringToObject(j, "stop", ps_stop_reason_name(step.stop));
        if (o->more_stats) o->more_stats(o->more_ctx, j);
        char *line = cJSON_PrintUnformatted(j);
        if (line) fprintf(stderr, "%s\n", line);
        free(line);
        cJSON_Delete(j);
    }
    return st;
}

/* A /command: /reset, /system TEXT, /exit (or /quit), /help. False when it ends the chat. */
static bool command(conversation *cv, const char *line) {
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) return false;
    if (!strcmp(line, "/reset")) {
        forget(cv, true);
        printf("(conversation cleared)\n");
    } else if (!strncmp(line, "/system", 7) && (line[7] == ' ' || !line[7])) {
        const char *sys = line[7] ? line + 8 : "";
        forget(cv, false);
        if (*sys && !add(cv, "system", sys, strlen(sys)))
            printf("(out of memory)\n");
        else
            printf(*sys ? "(system message set; conversation cleared)\n" : "(system message removed)\n");
    } else {
        printf("commands: /reset (forget the conversation), /system TEXT (set the system message and start "
               "again), /exit; Ctrl-C stops an answer, Ctrl-D ends the chat\n");
    }
    return true;
}

int ps_repl_run(ps_session *s, const ps_repl_opts *o) {
    static conversation cv;
    cv.n = 0;
    cv.tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    if (o->system && !add(&cv, "system", o->system, strlen(o->system))) return 1;
    struct sigaction sa = {.sa_handler = on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    rl_catch_signals = 0; /* SIGINT is ours: it interrupts the line being read or the answer */
    if (cv.tty) printf("pipeshard chat (%s): /help for commands, Ctrl-D to end\n", ps_matmul_isa());
    int rc = 0;
    for (;;) {
        interrupted = 0;
        char *line = read_line(&cv);
        if (!line) {
            if (interrupted && cv.tty) { /* Ctrl-C at the prompt: a fresh line, not the end */
                printf("\n");
                continue;
            }
            break;
        }
        bool go_on = true;
        char err[1024] = "";
        if (line[0] == '/')
            go_on = command(&cv, line);
        else if (line[0] && add(&cv, "user", line, strlen(line))) {
            ps_status st = answer(&cv, s, o, err, sizeof err);
            if (st) {
                fprintf(stderr, "pipeshard chat: %s\n", err[0] ? err : ps_strerror(st));
                forget(&cv, true); /* a failed turn leaves no half conversation behind */
                if (st != PS_ERR_RANGE) go_on = false, rc = 1;
            }
        }
        free(line);
        if (!go_on) break;
    }
    if (cv.tty) printf("\n");
    sigaction(SIGINT, &old, NULL);
    forget(&cv, false);
    return rc;
}
