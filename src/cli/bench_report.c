/* bench_report.c - what both modes of `pipeshard bench` (bench.c, bench_stages.c) report
 * with: a median or other quantile of repetitions, and the JSON fields they share. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tensor/matmul.h"
#include "bench.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ps_bench_quantile(double *v, int n, double q) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double x = q * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

cJSON *ps_bench_json(const bench_opts *o) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->model);
    cJSON_AddStringToObject(j, "isa", ps_matmul_isa());
    cJSON_AddStringToObject(j, "activations", ps_act_name(o->act));
    char dev[16];
    cJSON_AddStringToObject(j, "device", ps_device_name(o->device, dev, sizeof dev));
    cJSON_AddNumberToObject(j, "threads", (double)o->threads);
    cJSON_AddNumberToObject(j, "n_prompt", (double)o->n_prompt);
    cJSON_AddNumberToObject(j, "n_gen", (double)o->n_gen);
    return j;
}

void ps_bench_json_print(cJSON *j) {
    char *txt = cJSON_PrintUnformatted(j);
    printf("%s\n", txt);
    free(txt);
    cJSON_Delete(j);
}
