#ifndef INFERGATE_CLI_H
#define INFERGATE_CLI_H

/*
 * Sub-commands of the infergate binary. Each takes the arguments after its
 * name (argv[0] is the sub-command) and returns the process exit status:
 * 0 success, 1 run-time failure, 2 usage or configuration error.
 * Each prints its own --help.
 */
int ig_cmd_serve(int argc, char **argv);   /* gateway/serve/serve.c */
int ig_cmd_worker(int argc, char **argv);  /* gateway/worker/worker.c */
int ig_cmd_mkmodel(int argc, char **argv); /* gateway/mkmodel/mkmodel.c */
int ig_cmd_devices(int argc, char **argv); /* gateway/serve/devices_cmd.c */

/* Exit statuses shared by the sub-commands. */
#define IG_EXIT_OK 0
#define IG_EXIT_FAILURE 1
#define IG_EXIT_USAGE 2

#endif
