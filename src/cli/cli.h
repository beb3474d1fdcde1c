/* cli.h - subcommands of the pipeshard binary. Each takes argv starting at the
 * subcommand's name and returns the process exit status. */
#ifndef PS_CLI_H
#define PS_CLI_H

int ps_cli_run(int argc, char **argv);
int ps_cli_chat(int argc, char **argv);
int ps_cli_serve(int argc, char **argv);
int ps_cli_inspect(int argc, char **argv);
int ps_cli_synth(int argc, char **argv);
int ps_cli_bench(int argc, char **argv);
int ps_cli_split(int argc, char **argv);
int ps_cli_plan(int argc, char **argv);
int ps_cli_probe(int argc, char **argv);
int ps_cli_worker(int argc, char **argv);
int ps_cli_keygen(int argc, char **argv);

#endif
