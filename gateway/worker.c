/* Placeholder until the worker role lands; it owns this file. */
#include "infergate/cli.h"

#include <stdio.h>

int ig_cmd_worker(int argc, char **argv)
{
    fprintf(stderr, "infergate worker: not available in this build\n");
    return IG_EXIT_FAILURE;
}
