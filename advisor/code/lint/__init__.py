"""`advisor lint`: a static check of a training script for mistakes that waste GPU memory or time.

The script is parsed, never run or imported: only its syntax tree (stdlib `ast`) is read, with simple
data flow inside one function (which names hold a loss, a model, a CUDA device, a batch). Each rule is a
small function in `RULES`; it yields `LintFinding`s that name the line, what is wrong, why it costs
memory or time, and the code change that fixes it.

The parsed script (`script.Script`) carries the facts every rule shares (`grad_mode`, `values`, `models`,
`loops`); the rules live in one module per family: `autograd` (a loss kept with its graph, evaluation
with autograd on), `loading` (DataLoader workers, pinned memory, non_blocking copies), `gpu_use` (float16
BatchNorm, DataParallel, empty_cache in the loop). `rules.RULES` lists them; `run` runs them.

JSON output (`advisor lint --json`) is a list of objects, one per finding, sorted by file and line:

    {"file": "train.py",        # the path as given on the command line
     "line": 12, "col": 9,      # 1-based position of the offending expression
     "rule": "loss-accumulation",
     "title": "loss tensor accumulated across iterations",
     "what": "...",             # this occurrence, quoting the code
     "why": "...",              # what it costs (same text for every finding of a rule)
     "fix": "..."}              # the concrete code change

A finding is silenced by a comment on its line: `# advisor: ignore` (all rules) or
`# advisor: ignore[rule-id, other-rule]`.
"""

from advisor.code.lint.lint_command import add_lint_arguments, lint_command, print_findings
from advisor.code.lint.lint_findings import LintError, LintFinding
from advisor.code.lint.rules import RULES, Rule
from advisor.code.lint.run import expand_paths, lint_file, lint_source, lint_tree, parse_source, read_source, \
    script_findings

__all__ = ["LintError", "LintFinding", "RULES", "Rule", "add_lint_arguments", "expand_paths", "lint_command",
           "lint_file", "lint_source", "lint_tree", "parse_source", "print_findings", "read_source", "script_findings"]
