/* spec.c - drafting for speculative decoding (spec.h). */
#include "spec.h"

#include <string.h>

int ps_spec_ngram(const int32_t *toks, int n_toks, int k, int32_t *out) {
    for (int n = n_toks - 1 < PS_SPEC_NGRAM_MAX ? n_toks - 1 : PS_SPEC_NGRAM_MAX; n >= 1 && k > 0; n--) {
        const int32_t *tail = toks + n_toks - n;
        for (int i = n_toks - n - 1; i >= 0; i--) { /* latest first; toks[i + n] follows the match */
            if (memcmp(toks + i, tail, (size_t)n * sizeof *toks)) continue;
            int m = n_toks - (i + n) < k ? n_toks - (i + n) : k;
            memcpy(out, toks + i + n, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

const char *ps_spec_kind_name(ps_spec_kind k) { return k == PS_SPEC_NGRAM ? "ngram" : "off"; }

ps_status ps_spec_kind_parse(const char *s, ps_spec_kind *out, char *err, size_t errlen) {
    if (!strcmp(s, "ngram")) return *out = PS_SPEC_NGRAM, PS_OK;
    return ps_errf(err, errlen, PS_ERR_ARG, "unknown draft source '%s' (ngram: prompt lookup)", s);
}
