/* synth.h - the pieces of `pipeshard synth` (a GGUF model with random weights) shared by
 * synth.c (command line, presets, validation), synth_model.c (metadata, tensor plan,
 * weight generation) and synth_vocab.c (a byte-level BPE vocabulary). Internal to the CLI. */
#ifndef PS_CLI_SYNTH_H
#define PS_CLI_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "../ps.h"
#include "../tensor/types.h"

/* The shape and hyper-parameters of the model to write. */
typedef struct {
    char name[64];     /* general.name: the preset's name or "synthetic" */
    char arch[16];     /* "llama", "qwen2" or "qwen3" */
    int n_layer;       /* transformer blocks */
    int dim;           /* embedding width */
    int n_head;        /* query heads */
    int n_head_kv;     /* key/value heads */
    int head_dim;      /* per head; dim / n_head unless given */
    int ffn;           /* feed-forward hidden width */
    int vocab;         /* tokens, specials included */
    int ctx;           /* <arch>.context_length */
    float rope_base;   /* <arch>.rope.freq_base */
    float rms_eps;     /* <arch>.attention.layer_norm_rms_epsilon */
    float rope_factor; /* > 0: write rope_freqs.weight (llama3 scaling with this factor) */
    bool tied;         /* true: no output.weight, the head reuses token_embd */
    char pre[16];      /* tokenizer.ggml.pre: "smollm", "llama-bpe", "qwen2" */
} ps_cli_synth_shape;

/* Which ps_type every matrix gets. Plain types put every 2-D weight in `base`; the _M
 * mixes (mix == true) follow llama.cpp's recipe, see synth_model.c. */
typedef struct {
    const char *name;   /* as the user spells it: "Q4_K_M" */
    ps_type base;       /* type of most matrices */
    ps_type hi;         /* type of the matrices a mix spends more bits on */
    bool mix;           /* apply the _M recipe */
    uint32_t file_type; /* general.file_type (llama_ftype numbering) */
} ps_cli_synth_quant;

/* A byte-level BPE vocabulary: tokens[0..255] are the 256 byte symbols (GPT-2 mapping,
 * by byte value), then merged tokens, then the control tokens. Owns all its strings. */
typedef struct {
    int n_tokens;      /* exactly the requested vocabulary size */
    char **tokens;     /* [n_tokens] NUL-terminated UTF-8 */
    int32_t *types;    /* [n_tokens] 1 normal, 3 control */
    int n_merges;      /* ordered by rank */
    char **merges;     /* [n_merges] "left right", each left+right a token */
    int bos, eos, pad; /* ids of <|endoftext|>, <|im_end|>, <|endoftext|> */
    char *arena;       /* backing store of every string */
} ps_cli_synth_vocab;

#define PS_CLI_SYNTH_N_SPECIAL 3 /* <|endoftext|>, <|im_start|>, <|im_end|> */

/* Builds a vocabulary of exactly n_tokens (>= 256 + PS_CLI_SYNTH_N_SPECIAL) tokens,
 * deterministically: merges learned from a built-in English/code text, then synthetic
 * merges until the size is reached. On failure *v is left empty (free is still safe). */
ps_status ps_cli_synth_vocab_build(int n_tokens, ps_cli_synth_vocab *v, char *err, size_t errlen);
void ps_cli_synth_vocab_free(ps_cli_synth_vocab *v); /* zeroed or built; idempotent */

/* The type of a 2-D weight named `suffix` ("attn_v.weight", "output.weight", ...) of layer
 * il (-1 for embedding/head) in an n_layer model under recipe q, tied or not. */
ps_type ps_cli_synth_tensor_type(const ps_cli_synth_quant *q, const char *suffix, int il, int n_layer, bool tied);

/* The preset named like and the --type recipe named type (head_dim filled in); false after
 * printing the names there are. For `plan --like`. */
bool ps_cli_synth_find(const char *like, const char *type, ps_cli_synth_shape *s, const ps_cli_synth_quant **q);

/* Bytes the model of shape s and recipe q would hold in each layer (n_layer entries), its
 * embedding, and its head (output norm and output, or a copy of the tied embedding), as
 * ps_shard_layer_bytes counts them in a file. */
ps_status ps_cli_synth_sizes(const ps_cli_synth_shape *s, const ps_cli_synth_quant *q, uint64_t *layer_bytes,
                             uint64_t *embed_bytes, uint64_t *head_bytes);

/* Writes the model (metadata, vocabulary, random weights drawn from seed) to path with
 * n_threads generating/quantizing threads. Large K-type tensors are assembled from pools of
 * quantized super-blocks unless exact (see synth_model.c). Reports progress on stderr when
 * show_progress.
 * The GGUF writer renames a finished file into place, so path never holds half a model. */
ps_status ps_cli_synth_write(const ps_cli_synth_shape *s, const ps_cli_synth_quant *q, const ps_cli_synth_vocab *v,
                             uint64_t seed, int n_threads, bool exact, const char *path, bool show_progress, char *err,
                             size_t errlen);

#endif
