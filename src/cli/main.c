/* main.c - the `pipeshard` command: dispatches to subcommands. Only this file turns
 * an error status into an exit code. */
#include <stdio.h>
#include <string.h>

#include "../cuda/cuda.h"
#include "../tensor/matmul.h"
#include "args.h"
#include "cli.h"

#if __has_include("ps_git_commit.h") /* the build's (CMakeLists.txt) */
#include "ps_git_commit.h"
#endif
#ifndef PS_VERSION
#define PS_VERSION "unknown"
#endif
#ifndef PS_GIT_COMMIT
#define PS_GIT_COMMIT "unknown"
#endif

/* `pipeshard --version`: the release, the commit built, the kernels this CPU gets, the backends. */
static int version(int argc, char **argv) {
    (void)argc, (void)argv;
    printf("pipeshard %s (git %s)\nkernels: %s (the family this CPU gets; PS_ISA overrides)\n", PS_VERSION,
           PS_GIT_COMMIT, ps_matmul_isa());
    if (ps_cuda_built())
        printf("backends: cpu, cuda (%d GPU%s here)\n", ps_cuda_device_count(), ps_cuda_device_count() == 1 ? "" : "s");
    else
        printf("backends: cpu (built without CUDA)\n");
    return 0;
}

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", ps_cli_run, "generate text from a prompt"},
    {"chat", ps_cli_chat, "talk with a model in the terminal, turn after turn"},
    {"serve", ps_cli_serve, "an OpenAI-compatible HTTP server with a chat page"},
    {"inspect", ps_cli_inspect, "describe a GGUF model"},
    {"synth", ps_cli_synth, "write a GGUF model with random weights"},
    {"bench", ps_cli_bench, "measure prefill and decode speed"},
    {"worker", ps_cli_worker, "serve one shard of a split model to a coordinator"},
    {"split", ps_cli_split, "cut a model by layers into shards and write fleet.json"},
    {"plan", ps_cli_plan, "place a model on uneven hosts: order, layers, predicted tok/s"},
    {"probe", ps_cli_probe, "measure this host for plan: memory available, decode speed"},
    {"keygen", ps_cli_keygen, "write a fresh shared key for --key-file"},
    {"version", version, "print the version, git commit, CPU kernels and backends"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: pipeshard COMMAND [options]   (pipeshard COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) return version(argc - 1, argv + 1);
    const char *known[sizeof commands / sizeof commands[0] + 2] = {"--version"};
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
        known[i + 1] = commands[i].name;
    }
    const char *near = ps_arg_suggest(argv[1], known);
    if (near)
        fprintf(stderr, "pipeshard: unknown command '%s'; did you mean '%s'?\n", argv[1], near);
    else
        fprintf(stderr, "pipeshard: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
