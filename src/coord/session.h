/* session.h - one generation on a coordinator: a prompt in (text, chat messages or token
 * ids), tokens and their text out, one at a time.
 *
 * A session keeps the sequence's tokens (the prompt, then what it generated: DESIGN.md
 * invariant 3), runs the prompt around the ring on the first step and feeds each sampled
 * token back on the next, stops at the end of text, after n_predict tokens or when the
 * context is full, and turns tokens into text through a streaming detokenizer that never
 * splits a UTF-8 character. `run`, `chat` and `bench --stages` drive generation through it;
 * the HTTP server runs many sequences through the scheduler instead (sched.h).
 *
 *     ps_session_prompt_text(s, text, len, &gp, err, errlen);
 *     ps_session_step st = {0};
 *     while (!st.stop && !ps_session_next(s, &st, err, errlen)) print(st.text, st.len);
 *     ps_session_flush(s, &text, &len);        // the bytes the stream still held back
 *
 * A session runs one sequence on its coordinator (ps_coord_next, on blocks 0, 1, 2, ...): one
 * session per coordinator, not beside a scheduler. */
#ifndef PS_COORD_SESSION_H
#define PS_COORD_SESSION_H

#include <stdbool.h>
#include <stdint.h>

#include "../sample/sample.h"
#include "../tokenize/chat.h"
#include "../tokenize/tokenize.h"
#include "coord.h"
#include "spec.h"

/* Why a generation ended. Never renumbered. */
typedef enum {
    PS_STOP_NONE = 0,      /* still going */
    PS_STOP_EOS = 1,       /* the model ended its text (an end-of-generation token) */
    PS_STOP_LENGTH = 2,    /* n_predict tokens were generated */
    PS_STOP_CONTEXT = 3,   /* the context is full */
    PS_STOP_CANCELLED = 4, /* ps_session_cancel */
    PS_STOP_STOP = 5,      /* a stop string of the request appeared (coord/stop.h; the scheduler) */
    PS_STOP_REASON_COUNT
} ps_stop_reason;

/* "none", "eos", "length", "context", "cancelled", "stop". */
const char *ps_stop_reason_name(ps_stop_reason r);

/* How to generate: sampling, and when to stop. */
typedef struct {
    ps_sample_params sp; /* checked by ps_sample_params_check when a prompt is set */
    int64_t n_predict;   /* tokens to generate; -1 = until end of text or the context is full */
    bool ignore_eos;     /* do not stop at an end-of-generation token */
} ps_gen_params;

/* The defaults of the command line (llama.cpp's): sp = ps_sample_params_cli(), n_predict 128. */
ps_gen_params ps_gen_params_default(void);

typedef struct ps_session ps_session;

/* A session on coordinator c; tok (may be NULL: token ids in and out, and no end-of-text
 * stop) detokenizes. Both are borrowed and must outlive the session. */
ps_status ps_session_create(ps_coord *c, const ps_tok *tok, ps_session **out, char *err, size_t errlen);
/* NULL is a no-op. */
void ps_session_free(ps_session *s);

/* Each prompt call starts a new generation with gp (copied). The stages keep the keys and
 * values of the longest prefix the new prompt shares with the sequence they hold (a chat's
 * earlier turns, a shared system prompt), and the first step runs only the rest: the same
 * tokens as a prompt run whole (DESIGN.md invariant 1), less prefill. A prompt longer than
 * the context is PS_ERR_RANGE, an empty one PS_ERR_ARG: both errors in what the user gave
 * (`run` exits 2 for them). */

/* Text, tokenized with BOS added and special-token strings taken literally. */
ps_status ps_session_prompt_text(ps_session *s, const char *text, size_t len, const ps_gen_params *gp, char *err,
                                 size_t errlen);
/* Chat messages rendered through the model's chat template (tokenizer.chat_template), or
 * the family named by template_name when not NULL (chat.h), with the assistant's turn
 * opened (ps_session_chat_tokens): special-token strings of the template are parsed, those
 * in the messages' contents are text. */
ps_status ps_session_prompt_chat(ps_session *s, const ps_chat_msg *msgs, size_t n, const char *template_name,
                                 const ps_gen_params *gp, char *err, size_t errlen);
/* Token ids as they are (no BOS added); one outside the model's vocabulary is PS_ERR_ARG. */
ps_status ps_session_prompt_ids(ps_session *s, const int32_t *ids, int n, const ps_gen_params *gp, char *err,
                                size_t errlen);

/* The token ids of a chat prompt, as ps_session_prompt_chat runs it: msgs rendered through
 * model m's chat template (or template_name's family), the assistant's turn opened when
 * open_turn (ps_session_prompt_chat's; a prefix to capture leaves it closed), and tokenized
 * by tok with the template's special tokens parsed and the contents taken as text
 * (ps_tok_encode_literal), BOS added unless the template writes it. *ids is malloc'd (the
 * caller frees; NULL on failure), *n_ids long. Errors: the template's (no template, an
 * unknown family, messages it refuses: PS_ERR_ARG / PS_ERR_NOT_FOUND / PS_ERR_UNSUPPORTED). */
ps_status ps_session_chat_tokens(const ps_tok *tok, const ps_model *m, const ps_chat_msg *msgs, size_t n,
                                 const char *template_name, bool open_turn, int32_t **ids, size_t *n_ids, char *err,
                                 size_t errlen);

/* Speculative decoding from the next step on (spec.h): each trip after the prompt carries up
 * to o->k guesses of the draft source after the token before, and gives the guesses the last
 * stage keeps and the token after them: the same tokens as without, in fewer trips. k at most
 * the coordinator's max_draft (PS_ERR_ARG otherwise); kind PS_SPEC_OFF turns it off. */
ps_status ps_session_set_spec(ps_session *s, const ps_spec_opts *o, char *err, size_t errlen);

/* Forgets what the stages hold: the next prompt runs whole (for measuring prefill). */
void ps_session_reset(ps_session *s);

/* One step of generation. */
typedef struct {
    int32_t token;    /* the token sampled in this step; -1 when the step sampled none */
    const char *text; /* its text (only complete UTF-8 characters; "" without a tokenizer
                         and for an end-of-text token); owned by the session until the
                         next call */
    size_t len;
    ps_stop_reason stop; /* PS_STOP_NONE: more follow. Otherwise this step ends the
                            generation: with EOS its token is not part of the text or the
                            sequence; with LENGTH or CONTEXT it is the last one */
} ps_session_step;

/* Samples the next token: the first step runs the prompt, later ones feed the token before.
 * After the generation has ended every call returns PS_OK with the same stop and no token. */
ps_status ps_session_next(ps_session *s, ps_session_step *out, char *err, size_t errlen);
/* The bytes the detokenizer still holds back (an incomplete UTF-8 character at the end);
 * owned by the session until the next call. */
void ps_session_flush(ps_session *s, const char **text, size_t *len);
/* Makes the next ps_session_next end the generation (PS_STOP_CANCELLED) without running
 * the model. Safe from another thread or a signal handler. */
void ps_session_cancel(ps_session *s);

/* The sequence so far: prompt then generated tokens; owned by the session, valid until the
 * next prompt. */
const int32_t *ps_session_tokens(const ps_session *s, int *n_tokens, int *n_prompt);

/* Timings of the current generation. */
typedef struct {
    int n_prompt, n_generated;
    int n_reused;               /* prompt tokens whose keys and values were kept from before */
    double ttft_s;              /* prompt around the ring to the first token */
    double decode_s;            /* the steps after the first, summed */
    int n_decode;               /* how many steps decode_s covers */
    int n_held;                 /* positions whose keys and values every stage holds now (what the next
                                   prompt may keep) */
    int n_trips;                /* speculating: trips that carried guesses */
    int n_drafted;              /* ... the guesses they carried */
    int n_kept;                 /* ... and those the last stage kept */
    int n_overlap;              /* ... trips whose guesses were drafted while the trip before was out */
    int by_k[PS_MAX_DRAFT + 1]; /* speculating: the trips after the prompt's by the guesses they carried
                                   (0: plain), the K in use */
} ps_session_stats;
void ps_session_get_stats(const ps_session *s, ps_session_stats *out);

#endif
