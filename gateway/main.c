/*
 * infergate: one binary, several roles. main() only dispatches to the
 * sub-command; each role lives in its own module.
 */
#include "infergate/cli.h"
#include "infergate/pool.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"serve", ig_cmd_serve, "run the gateway of one region (default)"},
    {"worker", ig_cmd_worker, "run one execution-core instance serving a model"},
    {"mkmodel", ig_cmd_mkmodel, "write a random-weight Llama-family model in HF layout"},
    {"devices", ig_cmd_devices, "list the CPU, GPUs and MIG instances found"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: infergate [--version] [--help] <command> [<args>]\n\n"
                 "An inference serving gateway: OpenAI-style HTTP in front of local\n"
                 "GPU/MIG/CPU instances and remote regional sites.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nWith no command, `serve` runs on the embedded default config.\n"
                 "`infergate <command> --help` describes the flags of each command.\n");
}

int main(int argc, char **argv)
{
    /* A worker started by a gateway's pool dies with it, even when the
     * gateway is killed with SIGKILL: no orphans holding a GPU. */
    const char *parent = getenv("IG_PARENT_PID");
    if (parent != NULL && ig_process_die_with_parent(atoi(parent)) != 0) {
        fprintf(stderr, "infergate: parent %s is gone; exiting\n", parent);
        return IG_EXIT_FAILURE;
    }
    /* Per-request memory comes and goes at a high rate; without these glibc
     * gives the top of the heap back to the kernel (brk) again and again,
     * which measured ~3.6% of a proxying gateway's CPU. */
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
    mallopt(M_TOP_PAD, 16 << 20);
    if (argc < 2)
        return ig_cmd_serve(1, (char *[]){"serve", NULL});
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        usage(stdout);
        return IG_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("infergate %s\n", IG_VERSION);
        return IG_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(name, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    }
    /* Flags without a command belong to serve: `infergate --config x.json`. */
    if (name[0] == '-') {
        argv[0] = "serve";
        return ig_cmd_serve(argc, argv);
    }
    fprintf(stderr, "infergate: unknown command '%s'\n\n", name);
    usage(stderr);
    return IG_EXIT_USAGE;
}
