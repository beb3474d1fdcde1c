/* shard.h - cutting a model by layers into shards, and their fingerprints.
 *
 * A shard is a GGUF file holding one stage's tensors: blk.L.* for its layers
 * [layer_begin, layer_end), rope_freqs.weight when the model has it, token_embd.weight on
 * stage 0, output_norm.weight and output.weight on the last stage (a copy of
 * token_embd.weight under the name output.weight when the model ties them). It keeps every
 * metadata key of the model (so <arch>.block_count stays the whole model's) and adds:
 *   pipeshard.shard.version       u32  1
 *   pipeshard.stage.index         u32  K
 *   pipeshard.stage.count         u32  N
 *   pipeshard.layer_begin         u32
 *   pipeshard.layer_end           u32
 *   pipeshard.vocab_size          u32  rows of the embedding / head
 *   pipeshard.model_fingerprint   str  32 hex digits (ps_fingerprint_file of the model)
 *   pipeshard.shard_fingerprint   str  32 hex digits (ps_shard_fingerprint, below)
 * fleet.json, which names the shards of a fleet and where each runs, is the coordinator's
 * (coord/fleet.h). */
#ifndef PS_SHARD_H
#define PS_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "../gguf/gguf.h"
#include "../ps.h"

#define PS_SHARD_MAX_STAGES 64
#define PS_SHARD_MAX_LAYERS 4096 /* a block_count larger than this is refused */

/* XXH3-128 of a whole file's bytes as 32 lowercase hex digits (big-endian: high64 then
 * low64, as Python's xxhash.xxh3_128_hexdigest prints it). */
ps_status ps_fingerprint_file(const char *path, char hex[33], char *err, size_t errlen);

/* Whether s[0..len) is a fingerprint as we write them: exactly 32 lowercase hex digits. */
bool ps_fingerprint_ok(const char *s, size_t len);

/* The model's layer count, "<general.architecture>.block_count" (1..2^20); err says which
 * key is missing or out of range. */
ps_status ps_shard_n_layer(const ps_gguf *g, int *n_layer, char *err, size_t errlen);

/* Bytes of each layer's tensors in g (n_layer entries, caller-allocated), and of the
 * embedding and head (head = output_norm + output, or the tied embedding's size). */
ps_status ps_shard_layer_bytes(const ps_gguf *g, int n_layer, uint64_t *layer_bytes, uint64_t *embed_bytes,
                               uint64_t *head_bytes, char *err, size_t errlen);

/* Default plan: bounds[0] = 0 < bounds[1] < ... < bounds[n_stages] = n_layer such that the
 * largest shard (its layers, plus the embedding on stage 0 and the head on the last) is as
 * small as possible; every stage gets at least one layer. */
ps_status ps_shard_plan(const uint64_t *layer_bytes, int n_layer, uint64_t embed_bytes, uint64_t head_bytes,
                        int n_stages, int *bounds, char *err, size_t errlen);

/* Parses --layers "0:8,8:16,16:30" into bounds (n_stages + 1 entries) and checks that the
 * ranges are non-empty (but the first may be 0:0: stage 0 with the token embedding alone,
 * every layer on the stages after it), contiguous, start at 0, end at n_layer and number
 * n_stages (n_stages <= 0: take the count from the spec, returned in *n_out). */
ps_status ps_shard_parse_layers(const char *spec, int n_layer, int n_stages, int *bounds, int *n_out, char *err,
                                size_t errlen);

typedef void (*ps_shard_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* What ps_shard_split wrote: per stage its file name (in the output directory), its
 * fingerprint (ps_shard_fingerprint) and its size in bytes. */
typedef struct {
    char model_fp[33]; /* ps_fingerprint_file of the model */
    int n_layer;
    char file[PS_SHARD_MAX_STAGES][32];
    char fingerprint[PS_SHARD_MAX_STAGES][33];
    uint64_t bytes[PS_SHARD_MAX_STAGES];
} ps_shard_files;

/* Writes dir/stage-K.gguf for every stage along bounds (dir is created if absent) and
 * describes them in *out. Each file is written to a temporary name and renamed. A shard
 * is refused as input. coord/fleet.h's ps_fleet_split adds fleet.json. */
ps_status ps_shard_split(const char *model_path, int n_stages, const int *bounds, const char *dir,
                         ps_shard_progress_fn progress, void *progress_ctx, ps_shard_files *out, char *err,
                         size_t errlen);

/* The shard metadata of an open GGUF (present = false when it has no pipeshard.* keys,
 * i.e. it is a whole model). Errors when the keys are present but malformed. */
typedef struct {
    bool present;
    int stage_index, stage_count;
    int layer_begin, layer_end;
    int vocab;
    char model_fp[33];
    char shard_fp[33];
} ps_shard_meta;
ps_status ps_shard_meta_read(const ps_gguf *g, ps_shard_meta *out, char *err, size_t errlen);

/* The shard fingerprint: XXH3-128 (hex as above) over model_fp (32 ASCII bytes), then
 * stage_index, stage_count, layer_begin, layer_end (u32 little-endian each), then for every
 * tensor in file order: its name's length (u32) and bytes, type (u32), n_dims (u32), each
 * dim (u64), and its data bytes. Depends on the tensors and the placement, not on the
 * metadata; `split` computes it from the tensors it writes, a worker recomputes it from
 * the file it serves. */
ps_status ps_shard_fingerprint(const ps_gguf *shard, const ps_shard_meta *meta, char hex[33], char *err, size_t errlen);

#endif
