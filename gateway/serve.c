/* Placeholder until the serve role lands; it owns this file. */
#include "infergate/cli.h"

#include <stdio.h>

int ig_cmd_serve(int argc, char **argv)
{
    fprintf(stderr, "infergate serve: not available in this build\n");
    return IG_EXIT_FAILURE;
}
