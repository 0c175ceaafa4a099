/*
 * pending.c - placeholders for subcommands whose library parts have not
 * landed yet; each entry goes away when its cmd_*.c file arrives.
 */
#include "cli.h"

static int run_pending(const cli_cmd *self, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_fail(self, "not available in this build yet");
}

#define PENDING(var, nm)                                                              \
    const cli_cmd var = {nm, "(not available in this build yet)",                     \
                         "Usage: kvx " nm "\n\nNot available in this build yet.\n", \
                         run_pending}

PENDING(cli_cmd_convert, "convert");
PENDING(cli_cmd_store, "store");
PENDING(cli_cmd_warmup, "warmup");
PENDING(cli_cmd_demo, "demo");
