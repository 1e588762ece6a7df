// The step35 CLI's subcommands. Each takes its own arguments (argv after the subcommand
// name) and returns the process exit status.
#pragma once

#include <string>
#include <vector>

namespace step35::cli {

using Args = std::vector<std::string>;

int cmd_run(const Args& args);
int cmd_eval(const Args& args);
int cmd_perplexity(const Args& args);
int cmd_tokenize(const Args& args);
int cmd_inspect(const Args& args);
int cmd_make_tiny(const Args& args);
int cmd_bench(const Args& args);
int cmd_quantize(const Args& args);
int cmd_serve(const Args& args);
int cmd_ep_plan(const Args& args);
int cmd_finetune(const Args& args);
int cmd_patch(const Args& args);

}  // namespace step35::cli
