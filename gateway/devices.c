/* Placeholder until the devices role lands; it owns this file. */
#include "infergate/cli.h"

#include <stdio.h>

int ig_cmd_devices(int argc, char **argv)
{
    fprintf(stderr, "infergate devices: not available in this build\n");
    return IG_EXIT_FAILURE;
}
