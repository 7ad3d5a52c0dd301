/* Placeholder until the mkmodel role lands; it owns this file. */
#include "infergate/cli.h"

#include <stdio.h>

int ig_cmd_mkmodel(int argc, char **argv)
{
    fprintf(stderr, "infergate mkmodel: not available in this build\n");
    return IG_EXIT_FAILURE;
}
