/* chat.h - chat templates: messages -> the prompt text a model was trained on.
 *
 * GGUF files carry a Jinja template (tokenizer.chat_template). We do not run Jinja:
 * we recognise the template's family from distinctive markers, read the few
 * variant details that change the output (default system prompt, spacing around
 * [INST], knowledge-cutoff lines, ...) from its text, and render in C. For the
 * conversations we support (roles system / user / assistant, string contents) the
 * output equals what the reference template renders with Hugging Face's settings
 * (jinja2, trim_blocks and lstrip_blocks on); tests/test_chat_ref.py checks that with
 * jinja2 on the official templates.
 *
 * Families and their markers:
 *   chatml   <|im_start|> ... <|im_end|>       (SmolLM2, Qwen 2/2.5/3, many fine-tunes)
 *   llama2   [INST] with <<SYS>>               (Llama 2 chat)
 *   mistral  [INST] without <<SYS>>            (Mistral 7B Instruct v0.1 - v0.3)
 *   llama3   <|start_header_id|>               (Llama 3, 3.1, 3.2, 3.3)
 *   gemma    <start_of_turn>                   (Gemma, Gemma 2, Gemma 3)
 *   phi3     <|user|> ... <|end|>              (Phi-3, Phi-3.5)
 *   zephyr   <|user|> ... eos_token            (Zephyr, TinyLlama chat)
 *
 * BOS: where the template writes bos_token (llama2 before every user turn; mistral,
 * llama3 and gemma at the start; any family whose template mentions bos_token) the
 * output contains the BOS *text* (e.g. "<|begin_of_text|>"). Tokenize such a prompt
 * with special tokens parsed and WITHOUT adding another BOS (ps_chat_writes_bos says
 * which case applies); otherwise follow the GGUF's tokenizer.ggml.add_bos_token.
 *
 * Deviations from the reference templates, all documented at ps_chat_apply:
 * templates that raise an exception for a system message (Gemma 1/2, Mistral v0.1)
 * get it folded into the first user turn the way their successors do it. */
#ifndef PS_CHAT_H
#define PS_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "../ps.h"
#include "tokenize.h" /* ps_tok_span */

/* Never renumbered. */
typedef enum {
    PS_CHAT_CHATML = 0,
    PS_CHAT_LLAMA2 = 1,
    PS_CHAT_MISTRAL = 2,
    PS_CHAT_LLAMA3 = 3,
    PS_CHAT_GEMMA = 4,
    PS_CHAT_PHI3 = 5,
    PS_CHAT_ZEPHYR = 6,
    PS_CHAT_FAMILY_COUNT
} ps_chat_family;

/* One message. role: "system", "user" or "assistant"; content: UTF-8 text. Both
 * NUL-terminated and owned by the caller. */
typedef struct {
    const char *role;
    const char *content;
} ps_chat_msg;

/* A family plus the variant details read from a template. Opaque. */
typedef struct ps_chat ps_chat;

/* "chatml", "llama2", ...; "unknown" for a value out of range. Static string. */
const char *ps_chat_family_name(ps_chat_family f);

/* The family for a user's --chat-template NAME (case-sensitive, the names above).
 * An unknown name gives PS_ERR_ARG and a message listing the names. */
ps_status ps_chat_family_from_name(const char *name, ps_chat_family *out, char *err, size_t errlen);

/* Recognises the family of a Jinja template text (NUL-terminated). NULL or "" gives
 * PS_ERR_NOT_FOUND ("the model has no chat template; pass --chat-template NAME ...");
 * a template of no known family gives PS_ERR_UNSUPPORTED ("unrecognised chat template
 * (starts with '...'); pass --chat-template NAME, one of: chatml, llama2, ..."). */
ps_status ps_chat_detect(const char *tmpl, ps_chat_family *out, char *err, size_t errlen);

/* Makes a renderer. With name non-NULL (the user's --chat-template override) the
 * family's canonical variant is used and tmpl is ignored: chatml without a default
 * system prompt, llama2 and mistral v0.3 and llama3 (3.0) and gemma with BOS, phi3
 * as Phi-3.5. Otherwise the family is detected from tmpl (errors as ps_chat_detect)
 * and its variant details are read from it. bos / eos: the text of the model's BOS and
 * EOS tokens (from the GGUF vocabulary); NULL takes the family's usual one ("<s>",
 * "<|begin_of_text|>", "<bos>", ...). The strings are copied. Free with ps_chat_free. */
ps_status ps_chat_create(const char *tmpl, const char *name, const char *bos, const char *eos, ps_chat **out, char *err,
                         size_t errlen);

/* Frees c; NULL is a no-op. */
void ps_chat_free(ps_chat *c);

ps_chat_family ps_chat_get_family(const ps_chat *c);

/* Whether rendered prompts contain BOS text (then tokenize without adding a BOS). */
bool ps_chat_writes_bos(const ps_chat *c);

/* The default system prompt that a chatml template inserts when the first message
 * is not a system message (SmolLM2's "You are a helpful AI assistant named SmolLM,
 * trained by Hugging Face", Qwen 2.5's "You are Qwen, ..."), read from the template
 * text; NULL when there is none. Owned by c. */
const char *ps_chat_default_system(const ps_chat *c);

/* Renders n >= 1 messages, plus the opening of the assistant's turn when
 * add_generation_prompt is set and the family's template writes one (llama2, mistral
 * and Phi-3's old template write none: their prompt already ends with [/INST] or
 * <|assistant|>). snprintf-style: writes at most buflen - 1 bytes and a NUL into buf,
 * and sets *len (if non-NULL) to the full length. buf NULL with buflen 0 only measures.
 * Returns PS_ERR_RANGE when buf is too small (buf then holds a truncated prefix).
 * Errors (PS_ERR_ARG, with a message): an unknown role or NULL content; for llama2,
 * mistral and gemma, roles that do not alternate user/assistant after an optional
 * leading system message, or a system message elsewhere (their templates raise too).
 * Family rules, as their templates: llama2 strips contents (Python str.strip),
 * llama3 and gemma trim them, mistral v0.3 trims assistant contents, the others keep
 * them verbatim. A system message reaching gemma 1/2 or mistral v0.1/v0.2 (whose
 * templates reject it) is put before the first user message followed by "\n\n", as
 * Gemma 3 and Mistral's updated v0.2 template do. Phi-3's old template (the user turn
 * opens <|assistant|>) drops system messages, as that template does. */
ps_status ps_chat_apply(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt, char *buf,
                        size_t buflen, size_t *len, char *err, size_t errlen);

/* As ps_chat_apply, into a malloc'd NUL-terminated string that the caller frees with
 * free(); *out is NULL on failure. */
ps_status ps_chat_apply_alloc(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt,
                              char **out, size_t *len, char *err, size_t errlen);

/* As ps_chat_apply_alloc; *spans (malloc'd, the caller frees) receives where the messages'
 * contents went in the output, *n_spans ranges in order (empty contents have none): what
 * ps_tok_encode_literal keeps from being read as special tokens, so that a message that
 * spells "<|im_end|>" cannot end its turn. */
ps_status ps_chat_apply_spans(const ps_chat *c, const ps_chat_msg *msgs, size_t n, bool add_generation_prompt,
                              char **out, size_t *len, ps_tok_span **spans, size_t *n_spans, char *err, size_t errlen);

#endif
